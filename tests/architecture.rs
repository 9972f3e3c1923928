//! Guards on the layering described in docs/development.md: `config` is the bottom
//! layer (every module reads settings; it reads none of theirs), `metrics`
//! knows nothing of the parts it counts for, the engine is pure (no I/O,
//! no clock, no tasks), and triggers measure without deciding, sleeping or
//! caching; and modules import one way (no circles), at the top and
//! inside the interceptor and config.

use std::collections::{BTreeMap, BTreeSet};
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

/// What each module of `dir` (a file or a folder directly in it) names of
/// its siblings through `prefix` (`crate::` at the top, `super::` or
/// `crate::interceptor::` inside), outside tests and comments.
fn module_graph(dir: &str, prefixes: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if (path.is_dir() || path.extension().is_some_and(|e| e == "rs"))
            && !["mod", "lib", "main", "bin", "tests"].contains(&name.as_str())
        {
            modules.insert(name);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in &modules {
        let file = root.join(format!("{module}.rs"));
        let folder = root.join(module);
        let mut texts = Vec::new();
        if file.is_file() {
            texts.push(std::fs::read_to_string(&file).unwrap());
        }
        let has_code = folder.is_dir()
            && std::fs::read_dir(&folder).unwrap().any(|entry| {
                let path = entry.unwrap().path();
                path.extension().is_some_and(|e| e == "rs")
                    && path.file_name().is_some_and(|n| n != "tests.rs")
            });
        if has_code {
            for (_, text) in sources(&format!("{dir}/{module}")) {
                texts.push(text);
            }
        }
        let mut uses = BTreeSet::new();
        for text in texts {
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines() {
                let line = line.split("//").next().unwrap_or_default();
                for prefix in prefixes {
                    for (at, _) in line.match_indices(prefix) {
                        let rest = &line[at + prefix.len()..];
                        let name: String = rest
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if modules.contains(&name) && name != *module {
                            uses.insert(name);
                        }
                    }
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Layers flow one way: no module reaches back to one that reaches it
/// (a circle makes every module in it a part of every other).
#[test]
fn modules_form_no_circle() {
    for (dir, prefixes) in [
        ("src", &["crate::"][..]),
        ("src/interceptor", &["super::", "crate::interceptor::"][..]),
        ("src/config", &["super::", "crate::config::"][..]),
    ] {
        let graph = module_graph(dir, prefixes);
        assert!(graph.len() > 2, "{dir}: no modules found");
        if let Some(circle) = cycle(&graph) {
            panic!("{dir}: a circle of imports: {}", circle.join(" -> "));
        }
    }
}
