//! Field names that some servers read as one of the fields hoist writes,
//! frames by, or keeps to one connection.
//!
//! Who sends them: any client of the proxy. CGI and the servers that
//! follow it (Rack, PHP, WSGI and Puma's CVE-2024-45614) read a field as
//! `HTTP_` + its name upper-cased with `-` made `_`, so `X_Forwarded_For`
//! and `X-Forwarded-For` land in one variable, the client's value beside
//! hoist's or in its place. hoist drops the `-` spelling and writes its
//! own; the `_` spellings of those names are dropped too, on both paths,
//! whoever the peer is (a trusted proxy passes its clients' fields on).
//!
//! Other names with `_` pass: they fold onto no field hoist vouches for,
//! and a client could send their `-` spelling anyway, so dropping them
//! (nginx's `underscores_in_headers off`) would break apps that use them
//! and protect nothing hoist promises.

/// The guarded names that contain a `-` (only those have another
/// spelling): forwarding fields, framing fields and hop-by-hop fields.
const GUARDED: [&str; 11] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "http2-settings",
];

/// Whether `name` is a guarded name spelled with `_` for some `-` (in any
/// case). Names without `_` are the `-` spelling, each path's own concern.
pub fn is_underscore_alias(name: &str) -> bool {
    // Most names have no `_`: one scan, nothing compared.
    if !name.as_bytes().contains(&b'_') {
        return false;
    }
    GUARDED.iter().any(|guarded| {
        guarded.len() == name.len()
            && guarded.bytes().zip(name.bytes()).all(|(want, got)| {
                want == if got == b'_' {
                    b'-'
                } else {
                    got.to_ascii_lowercase()
                }
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underscore_spellings_of_guarded_names_fold_onto_them() {
        for name in [
            "X_Forwarded_For",
            "x_forwarded-for",
            "X_REAL_IP",
            "X_Forwarded_Proto",
            "X_Forwarded_Host",
            "Transfer_Encoding",
            "Content_Length",
            "Keep_Alive",
            "Proxy_Authorization",
        ] {
            assert!(is_underscore_alias(name), "{name}");
        }
        for name in [
            "X-Forwarded-For",
            "Content-Length",
            "X_Request_Id",
            "api_key",
            "X_Forwarded_Fo",
            "X__Forwarded_For",
        ] {
            assert!(!is_underscore_alias(name), "{name}");
        }
    }
}
