//! docs/getting-started.md read as steps: the blocks it marks with
//! `<!-- walkthrough: VERB [NAME] [(why)] -->`, what each shows, and
//! what the page's text is pointed at where a test stands in for
//! something. Shared by tests/walkthrough.rs (the control plane without a
//! node, stand-ins for pods) and tests/node.rs (the page on a real node).

#![allow(dead_code)] // each test uses its own part

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use crate::controlplane::{ControlPlane, replicas, trajectory};

pub const PAGE: &str = "docs/getting-started.md";

/// A loaded 2-core machine, KEDA's first reconcile, and the page's own
/// cooldowns (30 s and 20 s) with room to spare.
pub const LIMIT: Duration = Duration::from_secs(180);

/// One marked block of the page.
#[derive(Debug)]
pub struct Step {
    pub verb: String,
    pub name: String,
    /// The block's language (`sh`, `yaml`).
    pub lang: String,
    pub body: String,
    /// The next `text` block before the next marked one: what the page
    /// says the step shows.
    pub shown: Option<String>,
}

/// The page's marked blocks, in order.
pub fn steps(page: &str) -> Vec<Step> {
    let marker =
        regex::Regex::new(r"^<!-- walkthrough: (\S+)(?: ([^\s(]+))?(?: \(.*\))? -->$").unwrap();
    let lines: Vec<&str> = page.lines().collect();
    // Every fenced block: (first line of the fence, language, body).
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        if let Some(lang) = lines[at].strip_prefix("```") {
            let end = (at + 1..lines.len())
                .find(|&i| lines[i] == "```")
                .unwrap_or_else(|| panic!("{PAGE}:{}: an unclosed block", at + 1));
            blocks.push((at, lang.to_string(), lines[at + 1..end].join("\n") + "\n"));
            at = end;
        }
        at += 1;
    }
    let markers: Vec<(usize, regex::Captures)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| marker.captures(line).map(|c| (i, c)))
        .collect();
    assert!(
        lines.iter().filter(|l| l.contains("walkthrough:")).count() == markers.len(),
        "{PAGE}: a `walkthrough:` comment this test cannot read"
    );
    markers
        .iter()
        .enumerate()
        .map(|(n, (line, found))| {
            let next_marker = markers.get(n + 1).map_or(lines.len(), |(l, _)| *l);
            let mut after = blocks.iter().filter(|(start, ..)| start > line);
            let (start, lang, body) = after
                .next()
                .unwrap_or_else(|| panic!("{PAGE}:{}: a marker with no block", line + 1));
            let shown = blocks
                .iter()
                .find(|(at, lang, _)| at > start && *at < next_marker && lang == "text")
                .map(|(_, _, body)| body.clone());
            Step {
                verb: found[1].to_string(),
                name: found.get(2).map_or("", |m| m.as_str()).to_string(),
                lang: lang.clone(),
                body: body.clone(),
                shown,
            }
        })
        .collect()
}

/// Where the page's addresses point here, each used at least once.
pub struct StandIns {
    pub replacements: Vec<(String, String)>,
    pub used: BTreeMap<String, usize>,
}

impl StandIns {
    pub fn apply(&mut self, text: &str) -> String {
        let mut text = text.to_string();
        for (from, to) in &self.replacements {
            let count = text.matches(from.as_str()).count();
            *self.used.entry(from.clone()).or_default() += count;
            text = text.replace(from.as_str(), to);
        }
        text
    }

    pub fn assert_all_used(&self) {
        for (from, _) in &self.replacements {
            assert!(
                self.used.get(from).copied().unwrap_or(0) > 0,
                "{PAGE} no longer says `{from}`, which the test points at its stand-in"
            );
        }
    }
}

/// The numbers of a `kubectl get -w -o custom-columns` output.
pub fn counts(shown: &str) -> Vec<i32> {
    shown
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// `-n NAMESPACE` of a kubectl command.
pub fn namespace_of(command: &str) -> String {
    let found = regex::Regex::new(r"-n (\S+)").unwrap();
    found
        .captures(command)
        .unwrap_or_else(|| panic!("no `-n` in `{command}`"))[1]
        .to_string()
}

/// `sh -c line` as the cluster's admin.
pub fn shell(admin: &Path, line: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .args(["-c", line])
        .env("KUBECONFIG", admin)
        .output()
        .unwrap()
}

/// `sh -c line` as the cluster's admin, which must succeed.
pub fn must_shell(plane: &ControlPlane, line: &str) {
    let output = shell(&plane.admin_kubeconfig, line);
    assert!(
        output.status.success(),
        "`{line}`: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The values file a `helm install` names.
pub fn values_file(helm: &str) -> &str {
    let file = regex::Regex::new(r"--values (\S+)").unwrap();
    file.captures(helm)
        .expect("helm install --values")
        .get(1)
        .unwrap()
        .as_str()
}

/// The Deployment the watch step names goes through exactly the numbers
/// the page shows. `begin` runs once where it stands has been read (a
/// request sent then is seen to change it).
pub async fn replicas_as_shown(client: &kube::Client, step: &Step, begin: impl FnOnce()) {
    let wanted = counts(step.shown.as_deref().expect("the page shows the counts"));
    assert!(wanted.len() >= 2, "{PAGE}: a watch shows a change");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace_of(&step.body));
    let name = step.name.as_str();
    let before = replicas(&deployments, name).await.expect("the Deployment");
    begin();
    let from_before = |seen: &[i32]| -> Vec<i32> {
        std::iter::once(before)
            .chain(seen.iter().copied().skip_while(|now| *now == before))
            .collect()
    };
    let seen = trajectory(
        LIMIT,
        &format!("{name} to go {wanted:?}"),
        || replicas(&deployments, name),
        |seen| {
            let seen = from_before(seen);
            seen.len() >= wanted.len() || seen.last() != wanted.get(seen.len() - 1)
        },
    )
    .await;
    let seen = from_before(&seen);
    eprintln!("walkthrough: {name} went {seen:?}");
    assert_eq!(seen, wanted, "{name}'s replicas, as {PAGE} shows them");
}
