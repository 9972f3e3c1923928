//! README.md's "Try it in five minutes" runs as written: its shell
//! blocks, in order, with bash, on the machine `scripts/test.sh` prepares,
//! and what they print and draw is what the README shows.
//!
//! Three things differ from a reader's run, each because a test shares
//! the machine: `cargo build` is the build the test command already made
//! (this binary's `hoist`, in `target/debug` as the README's `PATH` line
//! expects); Redis listens on a free port instead of 6379 (in the
//! commands and in the output alike); and the commands run in a directory
//! of their own, which links the repository's `scripts` and `docs`, so
//! `aca.svg` is written there. The Redis the commands start is shut down
//! at the end, as the README says.

mod support;

use std::path::Path;
use std::process::Command;

use support::free_port;

const SECTION: &str = "## Try it in five minutes, without a cluster";
const BUILD: &str = "cargo build && ";

/// The fenced blocks of the README's section: (language, text).
fn blocks() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split_once(SECTION)
        .unwrap_or_else(|| panic!("README.md has `{SECTION}`"))
        .1;
    let section = section.split("\n## ").next().unwrap();
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let text: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((lang.to_string(), text.join("\n") + "\n"));
        }
    }
    blocks
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Shuts the Redis the commands started down, however the test ends.
struct Redis(u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = Command::new("redis-cli")
            .args(["-p", &self.0.to_string(), "shutdown", "nosave"])
            .output();
    }
}

fn run(dir: &Path, script: &str) -> String {
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "README's commands failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_five_minute_try_runs_as_written_and_shows_what_the_readme_shows() {
    let blocks = blocks();
    let shape: Vec<&str> = blocks.iter().map(|(lang, _)| lang.as_str()).collect();
    assert_eq!(shape, ["sh", "text", "sh"], "the section's blocks");
    let (probe, shown, simulate) = (&blocks[0].1, &blocks[1].1, &blocks[2].1);

    // The directory the commands run in: the repository's scripts and
    // docs, and target/debug holding the hoist the test command built.
    let dir = tempfile::tempdir().unwrap();
    let hoist = Path::new(env!("CARGO_BIN_EXE_hoist"));
    std::fs::create_dir(dir.path().join("target")).unwrap();
    std::os::unix::fs::symlink(hoist.parent().unwrap(), dir.path().join("target/debug")).unwrap();
    for linked in ["scripts", "docs"] {
        std::os::unix::fs::symlink(root().join(linked), dir.path().join(linked)).unwrap();
    }

    let port = free_port();
    let _redis = Redis(port);
    let with_port = |text: &str| text.replace("6379", &port.to_string());
    assert_eq!(
        probe.matches(BUILD).count(),
        1,
        "the README builds hoist with `{BUILD}…` once:\n{probe}"
    );
    assert!(probe.contains("export PATH=\"$PWD/target/debug:$PATH\""));
    let printed = run(dir.path(), &with_port(&probe.replacen(BUILD, "", 1)));
    let shown = with_port(shown);
    assert!(
        printed.ends_with(&shown),
        "hoist probe printed\n{printed}\nREADME.md shows\n{shown}"
    );

    // The PATH line of the first block holds for the second, as in the
    // reader's shell.
    let script = format!("export PATH=\"$PWD/target/debug:$PATH\"\n{simulate}");
    run(dir.path(), &script);
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let image = regex::Regex::new(r"!\[[^\]]*\]\(([^)]+\.svg)\)").unwrap();
    let shown = image
        .captures(readme.split_once(SECTION).unwrap().1)
        .expect("the section shows the plot")[1]
        .to_string();
    let drawn = std::fs::read_to_string(dir.path().join("aca.svg")).unwrap();
    assert_eq!(
        drawn,
        std::fs::read_to_string(root().join(&shown)).unwrap(),
        "the plot the README shows ({shown}) is the one its command draws"
    );
}
