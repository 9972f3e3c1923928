//! The token this hoist presents as a client of another hoist's admin
//! port (a split interceptor following the scaler, the scaler reading
//! interceptors, `hoist status`): the server side is `admin::auth`.

use std::path::PathBuf;

/// The token this hoist presents to another hoist's admin port
/// (`admin.auth.token_file`), read at every request: kubelet rotates
/// projected tokens in place.
#[derive(Debug, Clone)]
pub struct TokenFile(PathBuf);

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The token, or none when the file is missing or empty (then no
    /// header is sent: a loopback admin port needs none).
    pub fn read(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.0).ok()?;
        let token = text.trim();
        (!token.is_empty()).then(|| token.to_string())
    }

    /// `request` with the token, when there is one.
    pub fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.read() {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let file = TokenFile::new(&path);
        assert_eq!(file.read(), None, "missing: no token");
        std::fs::write(&path, "first\n").unwrap();
        assert_eq!(file.read().as_deref(), Some("first"));
        std::fs::write(&path, "rotated").unwrap();
        assert_eq!(file.read().as_deref(), Some("rotated"));
    }
}
