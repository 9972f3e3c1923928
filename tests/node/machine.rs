//! What the node may leave on the machine, read before `up` and after
//! `down` to compare: network namespaces, interfaces, `ip_forward`,
//! mounts, iptables chains and cgroups.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// What the node may leave on the machine, to compare before and after.
#[derive(Debug, PartialEq, Eq)]
pub struct MachineState {
    netns: BTreeSet<String>,
    ip_forward: String,
    links: BTreeSet<String>,
}

impl MachineState {
    pub fn read() -> Self {
        Self {
            netns: lines(&run("ip", &["netns", "list"]))
                .map(|line| line.split_whitespace().next().unwrap_or("").to_string())
                .collect(),
            ip_forward: std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                .unwrap()
                .trim()
                .to_string(),
            links: lines(&run("ip", &["-o", "link", "show"]))
                .filter_map(|line| {
                    let name = line.split(": ").nth(1)?;
                    Some(name.split('@').next().unwrap_or(name).to_string())
                })
                .collect(),
        }
    }
}

pub fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_string)
}

/// Every mount at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_str().unwrap();
    lines(&run("findmnt", &["-rn", "-o", "TARGET"]))
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// Every KUBE-* chain in iptables and ip6tables.
pub fn kube_chains() -> Vec<String> {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|save| {
            lines(&run(save, &[]))
                .filter(|line| line.starts_with(":KUBE-"))
                .map(|line| format!("{save}: {line}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every directory named `kubepods` in any cgroup hierarchy.
pub fn kubepods_cgroups() -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![(Path::new("/sys/fs/cgroup").to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            if entry.file_name() == "kubepods" {
                found.push(path.display().to_string());
            } else if depth < 3 {
                stack.push((path, depth + 1));
            }
        }
    }
    found
}
