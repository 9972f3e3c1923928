//! The layering the code relies on, checked on the sources: `config` is
//! the bottom layer (every other module may read settings, so it may read
//! none of theirs), `metrics` knows nothing of the parts it counts for, and
//! the engine has no I/O and no clock of its own (its decisions are values
//! of what it is given, so they replay the same in tests and `simulate`).

use std::path::{Path, PathBuf};

/// Every `.rs` file at or under `path` (relative to the crate root).
fn sources(path: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if root.is_file() {
        return vec![root];
    }
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    assert!(!files.is_empty(), "no sources under {path}");
    files
}

/// Lines of code (comments cut off) in `path` that contain any of `banned`.
fn offending_lines(path: &str, banned: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(path) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if let Some(word) = banned.iter().find(|word| code.contains(*word)) {
                found.push(format!(
                    "{}:{}: `{word}` in: {}",
                    file.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn config_imports_nothing_of_hoist() {
    let found = offending_lines("src/config", &["crate::"]);
    assert!(
        found.is_empty(),
        "move what config needs down into it:\n{}",
        found.join("\n")
    );
}

#[test]
fn metrics_imports_nothing_of_hoist() {
    let found = offending_lines("src/metrics.rs", &["crate::", "super::"]);
    assert!(
        found.is_empty(),
        "a part's own metrics live with that part:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_engine_has_no_io_and_no_clock() {
    let banned = [
        "Instant::now",
        "SystemTime::now",
        "tokio::time",
        "tokio::net",
        "tokio::spawn",
        "std::net",
        "std::fs",
        "std::thread",
        "reqwest",
        "crate::driver",
        "crate::interceptor",
        "crate::server",
    ];
    let found = offending_lines("src/engine", &banned);
    assert!(
        found.is_empty(),
        "the engine is handed time and readings; it reads neither:\n{}",
        found.join("\n")
    );
}

/// The checks above would pass on files they cannot see; make sure they
/// see what they should by finding something that is there.
#[test]
fn the_checks_read_the_sources() {
    assert!(!offending_lines("src/config", &["pub struct Settings"]).is_empty());
    assert!(!offending_lines("src/metrics.rs", &["pub struct Metrics"]).is_empty());
    assert!(!offending_lines("src/engine", &["pub struct Rules"]).is_empty());
}
