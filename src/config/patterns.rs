//! Patterns in hoist's settings: `host:port` globs (`limits.allowed_sources`,
//! `interceptor.allowed_upstreams`) and host name globs
//! (`interceptor.allowed_hosts`). `*` is the only wildcard.

/// A `host:port` pattern of `limits.allowed_sources`.
#[derive(Debug, Clone)]
pub struct SourcePattern {
    pattern: regex::Regex,
}

impl SourcePattern {
    pub fn new(text: &str) -> Result<Self, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("`{text}` is not host:port (use `*` for any port)"))?;
        if host.is_empty() || (port != "*" && port.parse::<u16>().is_err()) {
            return Err(format!("`{text}` is not host:port (use `*` for any port)"));
        }
        let pattern = regex::Regex::new(&format!("^{}:{}$", glob(host), glob(port)))
            .map_err(|e| format!("`{text}`: {e}"))?;
        Ok(Self { pattern })
    }

    pub fn allows(&self, endpoint: &str) -> bool {
        self.pattern.is_match(&endpoint.to_ascii_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::HostPattern;
    use super::SourcePattern;

    #[test]
    fn host_and_port_globs() {
        let cluster = SourcePattern::new("*.svc.cluster.local:*").unwrap();
        assert!(cluster.allows("redis.orders.svc.cluster.local:6379"));
        assert!(!cluster.allows("redis.example.com:6379"));
        assert!(!cluster.allows("svc.cluster.local.evil.com:6379"));
        let exact = SourcePattern::new("kafka-?.prod:9092").unwrap();
        assert!(exact.allows("kafka-?.prod:9092"));
        assert!(!exact.allows("kafka-1.prod:9092"), "only `*` is a wildcard");
        let port = SourcePattern::new("10.1.2.*:6379").unwrap();
        assert!(port.allows("10.1.2.7:6379"));
        assert!(!port.allows("10.1.2.7:6380"));
        for bad in ["no-port", ":6379", "host:port"] {
            assert!(SourcePattern::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_globs() {
        let team = HostPattern::new("*.team-a.example.com").unwrap();
        assert!(team.allows("Shop.Team-A.example.com"));
        assert!(!team.allows("team-a.example.com.evil.io"));
        assert!(!team.allows("shop.team-b.example.com"));
        for bad in ["", "host:80", "http://host", "a/b"] {
            assert!(HostPattern::new(bad).is_err(), "{bad:?}");
        }
    }
}

/// `*` matches any run of characters; everything else is literal.
fn glob(part: &str) -> String {
    regex::escape(part).replace("\\*", ".*")
}

/// A host name pattern of `interceptor.allowed_hosts`.
#[derive(Debug, Clone)]
pub struct HostPattern {
    pattern: regex::Regex,
}

impl HostPattern {
    pub fn new(text: &str) -> Result<Self, String> {
        if text.is_empty() || text.contains([':', '/', ' ', '@']) {
            return Err(format!(
                "`{text}` is not a host name pattern (no port, scheme or path)"
            ));
        }
        let pattern = regex::Regex::new(&format!("^{}$", glob(&text.to_ascii_lowercase())))
            .map_err(|e| format!("`{text}`: {e}"))?;
        Ok(Self { pattern })
    }

    pub fn allows(&self, host: &str) -> bool {
        self.pattern.is_match(&host.to_ascii_lowercase())
    }
}
