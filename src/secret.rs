//! A string that must never be printed: passwords, keys, connection strings.

use std::fmt;

/// Holds a secret value. `Debug` prints a mask and there is no `Display`, so
/// a secret cannot slip into a log line or an error message by accident;
/// reading it takes an explicit [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("\"***\"")
        }
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

/// A per-process fingerprint of secrets, for telling two credentials apart
/// (e.g. in a poller's identity) without keeping them in clear. The hasher
/// keys are random per process, so the number means nothing elsewhere.
pub fn fingerprint(secrets: &[&Secret]) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::sync::OnceLock;

    static KEYS: OnceLock<std::hash::RandomState> = OnceLock::new();
    let mut hasher = KEYS.get_or_init(std::hash::RandomState::new).build_hasher();
    for secret in secrets {
        secret.0.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_masks_the_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "\"***\"");
        assert_eq!(secret.expose(), "hunter2");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
    }
}
