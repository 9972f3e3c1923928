//! Which engines scale which target, so that an outside change of one
//! Deployment wakes its engines at the cost of a lookup, whatever the
//! number of engines. An engine files itself under the target its
//! ScaledObject names when it reads the object, and moves when an edit
//! points it elsewhere; a stopped engine leaves.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// (namespace, kind, name) of a scale target.
type Target = (String, String, String);

#[derive(Default)]
pub struct TargetIndex {
    /// The names of the ScaledObjects whose engines scale each target (an
    /// engine's namespace is its target's). Most targets have one: a
    /// `Vec` costs a tenth of a tree's node.
    engines: Mutex<HashMap<Target, Vec<String>>>,
}

impl TargetIndex {
    /// Files engine `namespace/name` under `kind/target` instead of
    /// `previous` (if any). An engine already stopped (`stopped`
    /// cancelled) is not filed: its last read may finish after it left,
    /// and it must not come back. Checked under the lock `leave` takes.
    pub fn file(
        &self,
        namespace: &str,
        name: &str,
        previous: Option<(&str, &str)>,
        (kind, target): (&str, &str),
        stopped: &CancellationToken,
    ) {
        let mut engines = self.lock();
        if let Some(previous) = previous {
            remove(&mut engines, namespace, name, previous);
        }
        if stopped.is_cancelled() {
            return;
        }
        let names = engines
            .entry((namespace.to_string(), kind.to_string(), target.to_string()))
            .or_default();
        if !names.iter().any(|filed| filed == name) {
            names.push(name.to_string());
        }
    }

    /// Takes engine `namespace/name` out from under `kind/target`.
    pub fn leave(&self, namespace: &str, name: &str, (kind, target): (&str, &str)) {
        remove(&mut self.lock(), namespace, name, (kind, target));
    }

    /// The ScaledObjects (by name, in `namespace`) whose engines scale
    /// `kind` `namespace/target`.
    pub fn engines_of(&self, namespace: &str, kind: &str, target: &str) -> Vec<String> {
        // A borrowed tuple key needs an owned one to look up; three short
        // strings per outside change, not per engine.
        let key = (namespace.to_string(), kind.to_string(), target.to_string());
        self.lock().get(&key).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Target, Vec<String>>> {
        self.engines.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn remove(
    engines: &mut HashMap<Target, Vec<String>>,
    namespace: &str,
    name: &str,
    (kind, target): (&str, &str),
) {
    let key = (namespace.to_string(), kind.to_string(), target.to_string());
    if let Some(names) = engines.get_mut(&key) {
        names.retain(|filed| filed != name);
        if names.is_empty() {
            engines.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_follows_its_target_and_leaves_when_stopped() {
        let index = TargetIndex::default();
        let running = CancellationToken::new();
        index.file("shop", "web", None, ("Deployment", "app"), &running);
        index.file("shop", "jobs", None, ("Deployment", "app"), &running);
        assert_eq!(
            index.engines_of("shop", "Deployment", "app"),
            ["web", "jobs"]
        );
        assert!(index.engines_of("shop", "StatefulSet", "app").is_empty());
        assert!(index.engines_of("other", "Deployment", "app").is_empty());

        // An edit points `web` at another Deployment.
        index.file(
            "shop",
            "web",
            Some(("Deployment", "app")),
            ("Deployment", "app-v2"),
            &running,
        );
        assert_eq!(index.engines_of("shop", "Deployment", "app"), ["jobs"]);
        assert_eq!(index.engines_of("shop", "Deployment", "app-v2"), ["web"]);

        index.leave("shop", "jobs", ("Deployment", "app"));
        assert!(index.engines_of("shop", "Deployment", "app").is_empty());
    }

    #[test]
    fn a_stopped_engines_late_read_does_not_file_it_again() {
        let index = TargetIndex::default();
        let stopped = CancellationToken::new();
        index.file("shop", "web", None, ("Deployment", "app"), &stopped);
        stopped.cancel();
        index.leave("shop", "web", ("Deployment", "app"));
        index.file(
            "shop",
            "web",
            Some(("Deployment", "app")),
            ("Deployment", "app"),
            &stopped,
        );
        assert!(index.engines_of("shop", "Deployment", "app").is_empty());
    }
}
