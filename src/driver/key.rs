//! How KEDA names a trigger: its ScaledObject and its whole metadata map.

use std::collections::HashMap;
use std::sync::Arc;

/// Who is asking: KEDA identifies a trigger by its ScaledObject and its
/// whole metadata map (one ScaledObject may have several triggers).
///
/// Keys compare and hash by `identity`, all of the above in one buffer:
/// with thousands of triggers asked in turn, comparing a dozen separately
/// allocated strings cost a cache miss each on every call. The metadata
/// lives only there (read back by [`TriggerKey::metadata`]), and the
/// trigger map's key shares the buffer: a tracked trigger holds its
/// metadata once, not three times.
#[derive(Debug, Clone)]
pub struct TriggerKey {
    pub namespace: String,
    pub name: String,
    pub(super) identity: Arc<[u8]>,
}

impl PartialEq for TriggerKey {
    fn eq(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

impl Eq for TriggerKey {}

impl TriggerKey {
    pub fn new(namespace: String, name: String, metadata: HashMap<String, String>) -> Self {
        Self::from_parts(namespace, name, metadata.into_iter().collect())
    }

    pub(super) fn from_parts(
        namespace: String,
        name: String,
        mut metadata: Vec<(String, String)>,
    ) -> Self {
        metadata.sort_unstable();
        let strings = || {
            [&namespace, &name]
                .into_iter()
                .chain(metadata.iter().flat_map(|(key, value)| [key, value]))
        };
        let mut identity = Vec::with_capacity(strings().map(|s| s.len() + 4).sum());
        for string in strings() {
            push_length_prefixed(&mut identity, string);
        }
        Self {
            identity: identity.into(),
            namespace,
            name,
        }
    }

    /// What every identity of ScaledObject `namespace/name` starts with.
    pub(super) fn object_prefix(namespace: &str, name: &str) -> Vec<u8> {
        let mut prefix = Vec::with_capacity(namespace.len() + name.len() + 8);
        push_length_prefixed(&mut prefix, namespace);
        push_length_prefixed(&mut prefix, name);
        prefix
    }

    /// Which trigger of its ScaledObject this is, whatever the values of
    /// its `FromEnv` keys: the identity with those values left out (their
    /// names stay: adding or removing such a key is an edit of the
    /// trigger, not a new value of it). None when it has none: the
    /// identity is the slot.
    pub(super) fn slot(&self) -> Option<Vec<u8>> {
        if !self.metadata().any(|(name, _)| is_from_env(name)) {
            return None;
        }
        let mut slot = Self::object_prefix(&self.namespace, &self.name);
        for (name, value) in self.metadata() {
            push_length_prefixed(&mut slot, name);
            push_length_prefixed(&mut slot, if is_from_env(name) { "" } else { value });
        }
        Some(slot)
    }

    /// Namespace, name and sorted metadata, each length-prefixed.
    pub(super) fn identity(&self) -> &[u8] {
        &self.identity
    }

    /// The length-prefixed strings of `identity`, in order.
    fn strings(&self) -> impl Iterator<Item = &str> {
        let mut rest: &[u8] = &self.identity;
        std::iter::from_fn(move || {
            let (length, tail) = rest.split_first_chunk::<4>()?;
            let length = u32::from_le_bytes(*length) as usize;
            let (string, tail) = tail.split_at_checked(length)?;
            rest = tail;
            // Written from `String`s in `from_parts`: always UTF-8.
            std::str::from_utf8(string).ok()
        })
    }

    /// The metadata, sorted by key.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut strings = self.strings().skip(2);
        std::iter::from_fn(move || Some((strings.next()?, strings.next()?)))
    }

    /// The bytes `limits.max_metadata_bytes` counts: name, namespace,
    /// metadata keys and values.
    pub(super) fn size(&self) -> usize {
        self.strings().map(str::len).sum()
    }

    pub fn metadata_map(&self) -> HashMap<String, String> {
        self.metadata()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }
}

fn is_from_env(key: &str) -> bool {
    key.ends_with("FromEnv")
}

/// Length-prefixed: no two different keys share an identity, and a
/// ScaledObject's identities share a prefix.
fn push_length_prefixed(buffer: &mut Vec<u8>, string: &str) {
    let length = u32::try_from(string.len()).unwrap_or(u32::MAX);
    buffer.extend_from_slice(&length.to_le_bytes());
    buffer.extend_from_slice(string.as_bytes());
}
