//! A request's path as routes are matched by and apps receive it:
//! percent-encoded unreserved characters decoded (RFC 3986 §6.2.2.2, so
//! `%2e` is a dot and `%61pi` is `api`), then dot segments removed (RFC
//! 3986 §5.2.4).
//!
//! Who sends it: any client of the proxy. Without this, `/api/../admin`
//! or `/api/%2e%2e/admin` matched the `/api` route and reached its app,
//! which resolves the dots itself and serves `/admin`: a client could
//! reach paths of an app that the route table does not give it. An
//! encoded `/` or `\` would let a segment hide a separator the app may
//! decode later, so such a path is refused unless the operator allows it
//! (`interceptor.allow_encoded_slashes`); a raw `\` is always refused
//! (some servers take it for `/`).

use std::borrow::Cow;

/// Why a path is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error(
        "the path holds an encoded `/` or `\\` (%2F, %5C), which the interceptor refuses (interceptor.allow_encoded_slashes)"
    )]
    EncodedSlash,
    #[error("the path holds a `\\`")]
    Backslash,
    /// `/api/..;x=y/admin`: servlet containers drop `;x=y` and then
    /// resolve the `..` hoist did not see as one.
    #[error("the path holds a dot segment with parameters (`..;` or `.;`)")]
    DotSegmentParameters,
}

/// The normalised `path` (the path of a request target, without its
/// query); borrowed, without a copy, when it has nothing to normalise.
pub fn normalize(path: &str, allow_encoded_slashes: bool) -> Result<Cow<'_, str>, PathError> {
    // The common case costs one scan and no allocation.
    if !path.bytes().any(|b| matches!(b, b'.' | b'%' | b'\\')) {
        return Ok(Cow::Borrowed(path));
    }
    if path.contains('\\') {
        return Err(PathError::Backslash);
    }
    let decoded = if path.contains('%') {
        decode_unreserved(path, allow_encoded_slashes)?
    } else {
        Cow::Borrowed(path)
    };
    if decoded
        .split('/')
        .any(|s| s.starts_with("..;") || s.starts_with(".;"))
    {
        return Err(PathError::DotSegmentParameters);
    }
    if !decoded.starts_with('/') || !decoded.split('/').any(|s| s == "." || s == "..") {
        return Ok(decoded);
    }
    Ok(Cow::Owned(remove_dot_segments(&decoded)))
}

/// Decodes `%XX` where XX is an unreserved character (ALPHA, DIGIT, `-`,
/// `.`, `_`, `~`); every other escape stays as sent.
fn decode_unreserved(path: &str, allow_encoded_slashes: bool) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'%' || at + 2 >= bytes.len() {
            at += 1;
            continue;
        }
        let Some(byte) = hex(bytes[at + 1])
            .zip(hex(bytes[at + 2]))
            .map(|(h, l)| h << 4 | l)
        else {
            at += 1;
            continue;
        };
        if matches!(byte, b'/' | b'\\') && !allow_encoded_slashes {
            return Err(PathError::EncodedSlash);
        }
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            let out = out.get_or_insert_with(|| String::with_capacity(path.len()));
            out.push_str(&path[copied..at]);
            out.push(char::from(byte));
            copied = at + 3;
        }
        at += 3;
    }
    Ok(match out {
        Some(mut out) => {
            out.push_str(&path[copied..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(path),
    })
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// RFC 3986 §5.2.4 for an absolute path: `.` segments go, `..` removes
/// the segment before it (never above the root); empty segments stay.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut segments = path.split('/').skip(1).peekable();
    let mut ends_in_directory = false;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            "." => ends_in_directory = last,
            ".." => {
                kept.pop();
                ends_in_directory = last;
            }
            other => {
                kept.push(other);
                ends_in_directory = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if ends_in_directory || out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> String {
        normalize(path, false).unwrap().into_owned()
    }

    #[test]
    fn dot_segments_go_as_rfc_3986_says() {
        // RFC 3986 §5.4's examples, as absolute paths.
        let cases = [
            ("/a/b/c/./../../g", "/a/g"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/../../x", "/x"),
            ("/a//b/../c", "/a//c"),
            ("/a/b/", "/a/b/"),
            ("/api/../admin", "/admin"),
            ("/api/%2e%2e/admin", "/admin"),
            ("/api/%2E%2e/admin", "/admin"),
            ("/api/.%2e/admin", "/admin"),
            ("/api/%2e/orders", "/api/orders"),
            ("/%61pi/x", "/api/x"),
            ("/a/..b/c", "/a/..b/c"),
            ("/file.txt", "/file.txt"),
            ("/50%25/%20x", "/50%25/%20x"),
            ("/bad%zz%", "/bad%zz%"),
            ("*", "*"),
        ];
        for (path, expected) in cases {
            assert_eq!(normal(path), expected, "{path}");
        }
    }

    #[test]
    fn plain_paths_are_not_copied() {
        assert!(matches!(
            normalize("/api/orders", false),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(
            normalize("/file.txt", false),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn encoded_slashes_and_backslashes_are_refused_unless_allowed() {
        for path in ["/api%2F..%2Fadmin", "/a%2fb", "/a%5Cb", "/a%5cb"] {
            assert_eq!(
                normalize(path, false),
                Err(PathError::EncodedSlash),
                "{path}"
            );
        }
        assert_eq!(normal_allowed("/a%2Fb/../c"), "/c");
        assert_eq!(normal_allowed("/a%2F..%2Fb"), "/a%2F..%2Fb");
        assert_eq!(normalize("/a\\..\\b", true), Err(PathError::Backslash));
    }

    fn normal_allowed(path: &str) -> String {
        normalize(path, true).unwrap().into_owned()
    }

    #[test]
    fn dot_segments_with_parameters_are_refused() {
        for path in [
            "/api/..;/admin",
            "/api/.;x=1/admin",
            "/api/%2e%2e;jsessionid=1/admin",
        ] {
            assert_eq!(
                normalize(path, false),
                Err(PathError::DotSegmentParameters),
                "{path}"
            );
        }
        assert_eq!(
            normalize("/api/v1;x=1/a..b", false).unwrap(),
            "/api/v1;x=1/a..b"
        );
    }
}
