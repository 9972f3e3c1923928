//! Guards on the layering described in the README: `config` is the bottom
//! layer (every module reads settings; it reads none of theirs), `metrics`
//! knows nothing of the parts it counts for, the engine is pure (no I/O,
//! no clock, no tasks), and triggers measure without deciding, sleeping or
//! caching.

use std::path::Path;

/// The `.rs` files of a directory, or the one file named.
fn sources(dir: &str) -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let paths: Vec<_> = if path.is_file() {
        vec![path]
    } else {
        std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect()
    };
    let mut files: Vec<(String, String)> = paths
        .into_iter()
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
fn config_reads_nothing_of_hoist() {
    assert_free_of("src/config", &["crate::"]);
}

/// A part's own metrics live with that part (the interceptor's route
/// metrics in `interceptor/route_metrics.rs`).
#[test]
fn metrics_reads_nothing_of_hoist() {
    assert_free_of("src/metrics.rs", &["crate::", "super::"]);
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
