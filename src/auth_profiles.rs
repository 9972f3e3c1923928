//! Auth profiles (`[auth.<name>]` in hoist's config): credentials a
//! trigger names with `authProfile` instead of carrying them, resolved on
//! each use so that rotated files and changed variables are picked up.

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

    /// Reads every value of the profile `name`.
    pub fn resolve(&self, name: &str) -> Result<AuthParams, MetadataError> {
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
        for (param, value) in profile {
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
username = "app"
password = {{ file = "{}" }}
[auth.broken]
password = {{ env = "HOIST_TEST_SURELY_UNSET_VARIABLE" }}
"#,
                secret_file.display()
            ),
        )
        .unwrap();
        let settings = Settings::load(Some(&file), Vec::new(), &Overrides::default()).unwrap();
        let profiles = AuthProfiles::from_settings(&settings);
        let params = profiles.resolve("orders-redis").unwrap();
        assert_eq!(params["username"], "app");
        assert_eq!(params["password"], "from-file");

        let problems = profiles.problems();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0]
                .to_string()
                .contains("HOIST_TEST_SURELY_UNSET_VARIABLE")
        );

        let err = profiles.resolve("missing").unwrap_err();
        assert!(err.to_string().contains("broken, orders-redis"), "{err}");
    }
}
