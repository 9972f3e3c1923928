//! Trigger metadata as KEDA sends it, read with KEDA's own lookup rules.
//!
//! KEDA's typed config looks a parameter up under each of its names, in a
//! per-parameter order of places: the trigger metadata, the resolved
//! environment and the TriggerAuthentication params. hoist gets the same
//! three places in a different form: KEDA already resolved `<name>FromEnv`
//! keys into values (the key keeps its name), and auth params come from an
//! auth profile in hoist's own config instead of a TriggerAuthentication.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

/// Values from an auth profile (already read from their env vars or
/// files) or from a TriggerAuthentication's Secrets.
/// Keys are lower-case: auth params are matched without regard to case,
/// since environment variables (one way to set them) lose it.
pub type AuthParams = BTreeMap<String, String>;

/// Bad metadata: always names the key and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("missing required key `{key}`: {reason}")]
    Missing { key: String, reason: String },
    #[error("invalid `{key}`: {reason}")]
    Invalid { key: String, reason: String },
    /// The auth profile named by `authRef` cannot be used. This is hoist's
    /// configuration, not the ScaledObject's, so it maps to a different code.
    #[error("auth profile `{profile}`: {reason}")]
    AuthProfile { profile: String, reason: String },
    /// The ScaledObject's namespace is not in the profile's `namespaces`:
    /// someone named another team's credentials (PermissionDenied).
    #[error(
        "auth profile `{profile}` may not be used from namespace `{namespace}`: its `namespaces` does not list it (the operator adds it to [auth.{profile}] namespaces if it should)"
    )]
    AuthProfileDenied { profile: String, namespace: String },
}

impl MetadataError {
    pub fn missing(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Missing {
            key: key.into(),
            reason: reason.into(),
        }
    }

    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// One place a parameter can come from, as in KEDA's `order=` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `metadata[name]`.
    Metadata,
    /// `metadata[name + "FromEnv"]`, which KEDA has already resolved.
    Env,
    /// The auth profile named by `authRef`.
    Auth,
}

/// A parameter that was found, with the key it was found under (for errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'a> {
    pub key: String,
    pub value: &'a str,
}

/// One key a trigger reads, as its page's parameter list gives it. Each
/// trigger declares all of its keys (`KEYS` in its file); its parser reads
/// through `Params::declaring`, which refuses (in debug builds, so every
/// test of a parser checks it) to look up a key the list does not have,
/// or in a place the list does not give. tests/docs.rs holds each
/// trigger's page to this list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub required: bool,
    pub default: Absent,
    pub place: Place,
}

/// What a trigger uses when a key is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    /// No value: the key is required, or its absence means "none".
    None,
    /// A value the key could be set to with the same effect as leaving
    /// it out (tests/docs.rs sets it and compares).
    Value(&'static str),
    /// A default that is not a value of the key (a setting of hoist's
    /// config, "every topic"): the page's default cell quotes this text.
    Described(&'static str),
}

/// Where a key may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The trigger's metadata (or `<key>FromEnv`, resolved by KEDA).
    Metadata,
    /// Only an auth profile or a TriggerAuthentication.
    Auth,
    /// Either.
    Both,
    /// An auth profile, or `<key>FromEnv` in the metadata (never the
    /// key itself in metadata: a credential written in clear).
    AuthOrEnv,
}

impl Key {
    pub const fn optional(name: &'static str, default: Absent) -> Self {
        Self {
            name,
            required: false,
            default,
            place: Place::Metadata,
        }
    }

    pub const fn required(name: &'static str) -> Self {
        Self {
            name,
            required: true,
            default: Absent::None,
            place: Place::Metadata,
        }
    }

    /// The same key, written in `place`.
    pub const fn in_(self, place: Place) -> Self {
        Self { place, ..self }
    }

    fn allows(&self, origin: Origin) -> bool {
        match origin {
            Origin::Metadata => matches!(self.place, Place::Metadata | Place::Both),
            Origin::Env => self.place != Place::Auth,
            Origin::Auth => self.place != Place::Metadata,
        }
    }
}

/// Read access to one trigger's metadata and auth params.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    metadata: &'a HashMap<String, String>,
    auth: &'a AuthParams,
    /// The keys the reader declared, when it declared them.
    declared: Option<&'static [Key]>,
}

impl<'a> Params<'a> {
    pub fn new(metadata: &'a HashMap<String, String>, auth: &'a AuthParams) -> Self {
        Self {
            metadata,
            auth,
            declared: None,
        }
    }

    /// The same params, for a reader that reads only `keys`.
    pub fn declaring(self, keys: &'static [Key]) -> Self {
        Self {
            declared: Some(keys),
            ..self
        }
    }

    /// The first non-blank value, trying every origin in `order` and within
    /// it every name, as KEDA does. Values are trimmed.
    pub fn find(&self, names: &[&str], order: &[Origin]) -> Option<Found<'a>> {
        if let Some(keys) = self.declared {
            for name in names {
                let key = keys.iter().find(|key| key.name == *name);
                debug_assert!(
                    key.is_some_and(|key| order.iter().all(|origin| key.allows(*origin))),
                    "`{name}` read from {order:?} is not in the trigger's KEYS that way"
                );
            }
        }
        for origin in order {
            for name in names {
                let (key, value) = match origin {
                    Origin::Metadata => (name.to_string(), self.metadata.get(*name)),
                    Origin::Env => {
                        let key = format!("{name}FromEnv");
                        let value = self.metadata.get(&key);
                        (key, value)
                    }
                    Origin::Auth => (
                        format!("{name} (auth profile)"),
                        self.auth.get(&name.to_ascii_lowercase()),
                    ),
                };
                if let Some(value) = value.map(|v| v.trim()).filter(|v| !v.is_empty()) {
                    return Some(Found { key, value });
                }
            }
        }
        None
    }

    pub fn string(&self, names: &[&str], order: &[Origin]) -> Option<String> {
        self.find(names, order).map(|found| found.value.to_string())
    }

    /// A required value; `hint` tells the user what to put there.
    pub fn required(
        &self,
        names: &[&str],
        order: &[Origin],
        hint: &str,
    ) -> Result<Found<'a>, MetadataError> {
        self.find(names, order)
            .ok_or_else(|| MetadataError::missing(names[0], hint))
    }

    /// A number (integer or float, by `T`), or `default` when absent.
    pub fn number<T: FromStr>(
        &self,
        names: &[&str],
        order: &[Origin],
        default: T,
    ) -> Result<T, MetadataError> {
        match self.find(names, order) {
            None => Ok(default),
            Some(found) => found.value.parse::<T>().map_err(|_| {
                let kind = if std::any::type_name::<T>().starts_with('f') {
                    "a number"
                } else {
                    "an integer"
                };
                MetadataError::invalid(found.key, format!("`{}` is not {kind}", found.value))
            }),
        }
    }

    /// A boolean with Go's `strconv.ParseBool` spellings, or `default`.
    pub fn boolean(
        &self,
        names: &[&str],
        order: &[Origin],
        default: bool,
    ) -> Result<bool, MetadataError> {
        match self.find(names, order) {
            None => Ok(default),
            Some(found) => parse_go_bool(found.value).ok_or_else(|| {
                MetadataError::invalid(
                    found.key,
                    format!("`{}` is not a boolean (use true or false)", found.value),
                )
            }),
        }
    }

    /// A comma-separated list, each element trimmed, as KEDA splits slices.
    pub fn list(&self, names: &[&str], order: &[Origin]) -> Option<(String, Vec<String>)> {
        self.find(names, order).map(|found| {
            let items = found
                .value
                .split(',')
                .map(|item| item.trim().to_string())
                .collect();
            (found.key, items)
        })
    }
}

/// Go's `strconv.ParseBool`, which KEDA uses for every boolean key.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn order_decides_which_origin_wins() {
        let md = metadata(&[("username", "from-md"), ("usernameFromEnv", "from-env")]);
        let auth: AuthParams = [("username".to_string(), "from-auth".to_string())].into();
        assert_eq!(
            Params::new(&md, &auth)
                .string(&["userName"], &[Origin::Auth])
                .unwrap(),
            "from-auth"
        );
        let params = Params::new(&md, &auth);
        let value = |order: &[Origin]| params.string(&["username"], order);
        assert_eq!(value(&[Origin::Metadata, Origin::Env]).unwrap(), "from-md");
        assert_eq!(value(&[Origin::Env, Origin::Metadata]).unwrap(), "from-env");
        assert_eq!(value(&[Origin::Auth, Origin::Env]).unwrap(), "from-auth");
    }

    #[test]
    fn blank_values_count_as_absent() {
        let md = metadata(&[("address", "  "), ("addresses", "a:1")]);
        let auth = AuthParams::new();
        let found = Params::new(&md, &auth)
            .find(&["address", "addresses"], &[Origin::Metadata])
            .unwrap();
        assert_eq!(found.key, "addresses");
        assert_eq!(found.value, "a:1");
    }

    #[test]
    fn bad_numbers_name_the_key_and_value() {
        let md = metadata(&[("listLengthFromEnv", "AA")]);
        let auth = AuthParams::new();
        let err = Params::new(&md, &auth)
            .number::<i64>(&["listLength"], &[Origin::Metadata, Origin::Env], 5)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid `listLengthFromEnv`: `AA` is not an integer"
        );
    }

    const DECLARED: &[Key] = &[
        Key::optional("listLength", Absent::Value("5")),
        Key::optional("password", Absent::None).in_(Place::AuthOrEnv),
    ];

    #[test]
    fn a_declared_key_is_read_where_it_is_declared() {
        let md = metadata(&[("listLength", "7"), ("passwordFromEnv", "p")]);
        let auth = AuthParams::new();
        let params = Params::new(&md, &auth).declaring(DECLARED);
        assert_eq!(
            params.number(&["listLength"], &[Origin::Metadata], 5),
            Ok(7)
        );
        let password = params.string(&["password"], &[Origin::Auth, Origin::Env]);
        assert_eq!(password.as_deref(), Some("p"));
    }

    /// Looks `name` up in `origin` through `DECLARED`.
    fn read_declared(name: &str, origin: Origin) {
        let (md, auth) = (metadata(&[]), AuthParams::new());
        Params::new(&md, &auth)
            .declaring(DECLARED)
            .find(&[name], &[origin]);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "`listName` read from [Metadata] is not in the trigger's KEYS")]
    fn reading_an_undeclared_key_panics_in_debug_builds() {
        read_declared("listName", Origin::Metadata);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "`password` read from [Metadata] is not in the trigger's KEYS")]
    fn reading_a_key_where_it_is_not_declared_panics_in_debug_builds() {
        read_declared("password", Origin::Metadata);
    }

    #[test]
    fn go_booleans() {
        for yes in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(yes), Some(true), "{yes}");
        }
        for no in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(no), Some(false), "{no}");
        }
        assert_eq!(parse_go_bool("yes"), None);
    }

    #[test]
    fn lists_are_split_and_trimmed() {
        let md = metadata(&[("hosts", "   a, b,    c ")]);
        let auth = AuthParams::new();
        let (key, items) = Params::new(&md, &auth)
            .list(&["host", "hosts"], &[Origin::Metadata])
            .unwrap();
        assert_eq!(key, "hosts");
        assert_eq!(items, ["a", "b", "c"]);
    }
}
