//! Auth profiles (`[auth.<name>]` in hoist's config): credentials a
//! trigger names with `authRef` instead of carrying them, resolved on
//! each use so that rotated files and changed variables are picked up.
//!
//! The name comes from a ScaledObject, which any tenant can write; the
//! profile's `namespaces` (written by the operator) say which tenants'
//! ScaledObjects may use it, checked against the namespace the driver
//! tracks the trigger under.

use std::collections::BTreeMap;

use crate::config::{AuthProfile, AuthValue, Settings};
use crate::metadata::{AuthParams, MetadataError};

/// The auth profiles, resolved on demand so rotated files are picked up
/// by the next trigger that uses them.
#[derive(Debug, Clone, Default)]
pub struct AuthProfiles {
    profiles: BTreeMap<String, AuthProfile>,
}

impl AuthProfiles {
    pub fn new(profiles: BTreeMap<String, AuthProfile>) -> Self {
        Self { profiles }
    }

    /// The `[auth.<name>]` profiles of hoist's config.
    pub fn from_settings(settings: &Settings) -> Self {
        Self::new(settings.auth.clone())
    }

    /// Reads every value of the profile `name` for a ScaledObject in
    /// `namespace`, refused unless the profile lists that namespace.
    /// `None`: no ScaledObject asks (`hoist probe`, run by the operator).
    pub fn resolve_for(
        &self,
        name: &str,
        namespace: Option<&str>,
    ) -> Result<AuthParams, MetadataError> {
        if let (Some(profile), Some(namespace)) = (self.profiles.get(name), namespace)
            && !profile.allows(namespace)
        {
            return Err(MetadataError::AuthProfileDenied {
                profile: name.to_string(),
                namespace: namespace.to_string(),
            });
        }
        self.resolve(name)
    }

    /// The profiles every namespace may use (`namespaces = ["*"]`).
    pub fn open_to_all(&self) -> Vec<&str> {
        self.profiles
            .iter()
            .filter(|(_, profile)| profile.open_to_all())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Logs a warning for each profile every namespace may use: in a
    /// shared cluster any tenant can then borrow its credentials.
    pub fn warn_open_to_all(&self) {
        for profile in self.open_to_all() {
            tracing::warn!(
                profile,
                "auth profile has namespaces = [\"*\"]: a ScaledObject in any namespace can use its credentials"
            );
        }
    }

    /// Reads every value of the profile `name`, whoever asks.
    fn resolve(&self, name: &str) -> Result<AuthParams, MetadataError> {
        let profile = self.profiles.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
            MetadataError::AuthProfile {
                profile: name.to_string(),
                reason: if known.is_empty() {
                    "hoist's config defines no auth profiles".to_string()
                } else {
                    format!(
                        "not defined in hoist's config (defined: {})",
                        known.join(", ")
                    )
                },
            }
        })?;
        let fail = |reason: String| MetadataError::AuthProfile {
            profile: name.to_string(),
            reason,
        };
        let mut params = AuthParams::new();
        for (param, value) in &profile.params {
            let resolved = match value {
                AuthValue::Literal(literal) => literal.clone(),
                AuthValue::Env { env } => std::env::var(env).map_err(|_| {
                    fail(format!(
                        "`{param}` reads environment variable `{env}`, which is not set"
                    ))
                })?,
                AuthValue::File { file } => std::fs::read_to_string(file).map_err(|error| {
                    fail(format!("`{param}` reads `{}`: {error}", file.display()))
                })?,
            };
            params.insert(param.to_ascii_lowercase(), resolved);
        }
        Ok(params)
    }

    /// Every profile that cannot be resolved now, with the reason.
    pub fn problems(&self) -> Vec<MetadataError> {
        self.profiles
            .keys()
            .filter_map(|name| self.resolve(name).err())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    #[test]
    fn profiles_resolve_literals_env_and_files_and_name_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let secret_file = dir.path().join("password");
        std::fs::write(&secret_file, "from-file").unwrap();
        let file = dir.path().join("hoist.toml");
        std::fs::write(
            &file,
            format!(
                r#"
[auth.orders-redis]
namespaces = ["orders"]
username = "app"
password = {{ file = "{}" }}
[auth.broken]
namespaces = ["*"]
password = {{ env = "HOIST_TEST_SURELY_UNSET_VARIABLE" }}
"#,
                secret_file.display()
            ),
        )
        .unwrap();
        let settings = Settings::load(Some(&file), Vec::new(), &Overrides::default()).unwrap();
        let profiles = AuthProfiles::from_settings(&settings);
        let params = profiles
            .resolve_for("orders-redis", Some("orders"))
            .unwrap();
        assert_eq!(params["username"], "app");
        assert_eq!(params["password"], "from-file");
        assert_eq!(profiles.open_to_all(), ["broken"]);

        let problems = profiles.problems();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .to_string()
                .contains("HOIST_TEST_SURELY_UNSET_VARIABLE")
        );

        let err = profiles.resolve_for("missing", Some("orders")).unwrap_err();
        assert!(err.to_string().contains("broken, orders-redis"), "{err}");
    }

    #[test]
    fn a_profile_is_refused_outside_its_namespaces_naming_both() {
        let profiles = AuthProfiles::new(
            [(
                "orders-redis".to_string(),
                AuthProfile::new(&["orders"], [("password", AuthValue::Literal("pw".into()))]),
            )]
            .into(),
        );
        let err = profiles
            .resolve_for("orders-redis", Some("shop"))
            .unwrap_err();
        assert_eq!(
            err,
            MetadataError::AuthProfileDenied {
                profile: "orders-redis".into(),
                namespace: "shop".into()
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("`orders-redis`") && message.contains("`shop`"),
            "{message}"
        );
        assert!(!message.contains("pw"), "{message}");
        assert_eq!(
            profiles
                .resolve_for("orders-redis", Some("orders"))
                .unwrap()["password"],
            "pw"
        );
        // The operator's own probe names no namespace.
        assert!(profiles.resolve_for("orders-redis", None).is_ok());
    }
}
