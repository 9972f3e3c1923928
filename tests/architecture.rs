//! Guards on the layering described in the README: the engine is pure
//! (no I/O, no clock, no tasks), and triggers measure without deciding,
//! sleeping or caching.

use std::path::Path;

fn sources(dir: &str) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "rs"))
            .filter(|path| path.file_name().is_some_and(|name| name != "tests.rs"))
            .map(|path| {
                (
                    path.display().to_string(),
                    std::fs::read_to_string(&path).unwrap(),
                )
            })
            .collect();
    files.sort();
    assert!(!files.is_empty(), "no sources in {dir}");
    files
}

fn assert_free_of(dir: &str, forbidden: &[&str]) {
    for (path, text) in sources(dir) {
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in forbidden {
                assert!(
                    !code.contains(word),
                    "{path}:{}: `{word}` does not belong in {dir}: {line}",
                    number + 1
                );
            }
        }
    }
}

#[test]
fn the_engine_has_no_io_clock_or_tasks() {
    assert_free_of(
        "src/engine",
        &[
            "tokio",
            "std::time",
            "SystemTime",
            "Instant",
            "std::fs",
            "std::net",
            "std::thread",
            "spawn",
        ],
    );
}

/// A trigger may move a blocking client call off the runtime
/// (`spawn_blocking` for librdkafka) but starts no background work.
#[test]
fn triggers_measure_without_sleeping_caching_or_spawning() {
    assert_free_of(
        "scalers",
        &[
            "tokio::time",
            "sleep",
            "tokio::spawn(",
            "std::thread",
            "crate::driver",
            "crate::engine",
        ],
    );
}
