//! Guards on the layering described in docs/development.md: `config` is the bottom
//! layer (every module reads settings; it reads none of theirs), `metrics`
//! knows nothing of the parts it counts for, the engine is pure (no I/O,
//! no clock, no tasks), and triggers measure without deciding, sleeping or
//! caching; and modules import one way: no circle between the modules of
//! any directory, in every crate of `src/` and in `scalers/`.
//!
//! The module tree is read as rustc reads it: from each crate root through
//! its `mod` items (`#[path]` followed), every file whole, test modules
//! included, parsed with `syn`. A module uses another when one of its
//! paths (a `use` tree, grouped or nested, or a path in code) starting with
//! `crate::`, `super::` or `self::` leads into it; a name the parent
//! imports (`pub use scaling::Scaling`) is followed to where it leads.
//! Paths written inside macro calls are token streams to `syn` and are not
//! seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` (recursively), or the one file named.
fn sources(dir: &str) -> Vec<(String, String)> {
    fn walk(path: &Path, files: &mut Vec<PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), files);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path.to_path_buf());
        }
    }
    let mut paths = Vec::new();
    walk(&root().join(dir), &mut paths);
    let mut files: Vec<(String, String)> = paths
        .into_iter()
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

/// Fails on any of `forbidden` in the code of `dir` (comments aside);
/// `tests.rs` files are left out: a test may use a clock or a task to
/// drive what it checks.
fn assert_free_of(dir: &str, forbidden: &[&str]) {
    for (path, text) in sources(dir) {
        if path.ends_with("/tests.rs") {
            continue;
        }
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

/// A module path from its crate's root (`["driver", "table"]`).
type ModulePath = Vec<String>;

/// One module of a crate, as read from its file (or its inline block).
#[derive(Default)]
struct Module {
    file: PathBuf,
    /// Absolute paths (within the crate) its code names.
    uses: Vec<ModulePath>,
    /// The names its `use` items bind, and what they lead to; children
    /// see them through `super::`.
    bindings: BTreeMap<String, ModulePath>,
}

/// The modules of one crate.
#[derive(Default)]
struct Crate {
    modules: BTreeMap<ModulePath, Module>,
    files: BTreeSet<PathBuf>,
}

impl Crate {
    fn read(root_file: &Path) -> Self {
        let mut krate = Crate::default();
        let dir = root_file.parent().unwrap().to_path_buf();
        krate.read_file(root_file, Vec::new(), dir);
        krate
    }

    /// Reads the module at `path` from `file`; its `mod name;` children
    /// live in `children_dir`.
    fn read_file(&mut self, file: &Path, path: ModulePath, children_dir: PathBuf) {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        self.files.insert(file.canonicalize().unwrap());
        self.read_items(file, &parsed.items, path, children_dir);
    }

    fn read_items(
        &mut self,
        file: &Path,
        items: &[syn::Item],
        path: ModulePath,
        children_dir: PathBuf,
    ) {
        let mut collector = Collector::default();
        for item in items {
            collector.visit_item(item);
        }
        let children: BTreeSet<String> = collector
            .modules
            .iter()
            .map(|child| child.name.clone())
            .collect();
        let mut module = Module {
            file: file.to_path_buf(),
            ..Default::default()
        };
        for (written, bound) in collector.use_paths {
            if let Some(absolute) = absolute(&path, &written, &children) {
                if let Some(name) = bound {
                    module.bindings.insert(name, absolute.clone());
                }
                module.uses.push(absolute);
            }
        }
        for written in collector.code_paths {
            if let Some(absolute) = absolute(&path, &written, &children) {
                module.uses.push(absolute);
            }
        }
        self.modules.insert(path.clone(), module);
        for ChildModule {
            name,
            items,
            attribute_path,
        } in collector.modules
        {
            let mut child = path.clone();
            child.push(name.clone());
            match items {
                Some(items) => {
                    self.read_items(file, items, child, children_dir.join(&name));
                }
                None => {
                    let file_dir = file.parent().unwrap();
                    let child_file = match attribute_path {
                        Some(written) => file_dir.join(written),
                        None => {
                            let flat = children_dir.join(format!("{name}.rs"));
                            if flat.is_file() {
                                flat
                            } else {
                                children_dir.join(&name).join("mod.rs")
                            }
                        }
                    };
                    let child_dir = if child_file.file_name().is_some_and(|n| n == "mod.rs") {
                        child_file.parent().unwrap().to_path_buf()
                    } else {
                        child_file.with_extension("")
                    };
                    self.read_file(&child_file, child, child_dir);
                }
            }
        }
    }

    /// Where `target` leads once the names modules bind are followed:
    /// `crate::driver::Scaling` is `crate::driver::scaling::Scaling` when
    /// `driver` imports it from there.
    fn resolve(&self, mut target: ModulePath) -> ModulePath {
        for _ in 0..16 {
            let mut followed = None;
            for at in 0..target.len() {
                let Some(module) = self.modules.get(&target[..at]) else {
                    break;
                };
                if self.modules.contains_key(&target[..=at]) {
                    continue;
                }
                if let Some(bound) = module.bindings.get(&target[at])
                    && bound[..] != target[..=at]
                {
                    let mut next = bound.clone();
                    next.extend_from_slice(&target[at + 1..]);
                    followed = Some(next);
                }
                break;
            }
            match followed {
                Some(next) => target = next,
                None => break,
            }
        }
        target
    }

    /// Which module of a directory uses which of its siblings: by the
    /// parent's path, each child's uses. `why` keeps one file per edge.
    fn graphs(&self) -> BTreeMap<ModulePath, Graph> {
        let mut graphs: BTreeMap<ModulePath, Graph> = BTreeMap::new();
        for (from, module) in &self.modules {
            for target in &module.uses {
                let to = self.resolve(target.clone());
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common >= from.len() || common >= to.len() {
                    continue;
                }
                let parent = from[..common].to_vec();
                let mut sibling = parent.clone();
                sibling.push(to[common].clone());
                if !self.modules.contains_key(&sibling) {
                    // An item of the parent itself.
                    continue;
                }
                let graph = graphs.entry(parent).or_default();
                let (a, b) = (from[common].clone(), to[common].clone());
                graph
                    .why
                    .entry((a.clone(), b.clone()))
                    .or_insert_with(|| format!("{} uses {}", module.file.display(), to.join("::")));
                graph.edges.entry(a).or_default().insert(b);
            }
        }
        graphs
    }
}

#[derive(Default)]
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    why: BTreeMap<(String, String), String>,
}

/// `written` (as in the source, relative to module `at`) from the crate
/// root; None for another crate's path (`std::`, `tokio::`).
fn absolute(
    at: &ModulePath,
    written: &[String],
    children: &BTreeSet<String>,
) -> Option<ModulePath> {
    let (first, rest) = written.split_first()?;
    let mut path = match first.as_str() {
        "crate" => Vec::new(),
        "self" => at.clone(),
        "super" => {
            let mut path = at.clone();
            path.pop()?;
            path
        }
        // A child module named without `self::` (edition 2018 paths).
        name if children.contains(name) => {
            let mut path = at.clone();
            path.push(name.to_string());
            path
        }
        _ => return None,
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                path.pop()?;
            }
            "self" => {}
            name => path.push(name.to_string()),
        }
    }
    Some(path)
}

/// The paths of one module's items (not of its inline child modules,
/// which are modules of their own).
#[derive(Default)]
struct Collector<'a> {
    /// Each `use` path, and the name it binds (None for a glob).
    use_paths: Vec<(Vec<String>, Option<String>)>,
    code_paths: Vec<Vec<String>>,
    modules: Vec<ChildModule<'a>>,
}

/// A `mod` item: inline (its items) or in a file (`#[path]`, when given).
struct ChildModule<'a> {
    name: String,
    items: Option<&'a [syn::Item]>,
    attribute_path: Option<String>,
}

impl Collector<'_> {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let ident = name.ident.to_string();
                if ident == "self" {
                    let bound = prefix.last().cloned();
                    self.use_paths.push((prefix.clone(), bound));
                } else {
                    let mut path = prefix.clone();
                    path.push(ident.clone());
                    self.use_paths.push((path, Some(ident)));
                }
            }
            syn::UseTree::Rename(rename) => {
                let mut path = prefix.clone();
                let ident = rename.ident.to_string();
                if ident != "self" {
                    path.push(ident);
                }
                self.use_paths.push((path, Some(rename.rename.to_string())));
            }
            syn::UseTree::Glob(_) => self.use_paths.push((prefix.clone(), None)),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'a> Visit<'a> for Collector<'a> {
    fn visit_item_use(&mut self, item: &'a syn::ItemUse) {
        let mut prefix = Vec::new();
        self.use_tree(&mut prefix, &item.tree);
    }

    fn visit_item_mod(&mut self, item: &'a syn::ItemMod) {
        let attribute_path = item.attrs.iter().find_map(|attribute| {
            let syn::Meta::NameValue(pair) = &attribute.meta else {
                return None;
            };
            if !pair.path.is_ident("path") {
                return None;
            }
            match &pair.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }) => Some(text.value()),
                _ => None,
            }
        });
        self.modules.push(ChildModule {
            name: item.ident.to_string(),
            items: item.content.as_ref().map(|(_, items)| &items[..]),
            attribute_path,
        });
    }

    /// `scalers/mod.rs` declares its triggers' modules through its
    /// `registry!` macro (one word per trigger): those words are `mod`
    /// items too. Other macro calls declare no module here.
    fn visit_item_macro(&mut self, item: &'a syn::ItemMacro) {
        if item.mac.path.is_ident("registry") {
            let names = item
                .mac
                .parse_body_with(
                    syn::punctuated::Punctuated::<syn::Ident, syn::Token![,]>::parse_terminated,
                )
                .expect("registry!(a, b, ...)");
            for name in names {
                self.modules.push(ChildModule {
                    name: name.to_string(),
                    items: None,
                    attribute_path: None,
                });
            }
        }
        syn::visit::visit_item_macro(self, item);
    }

    fn visit_path(&mut self, path: &'a syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1
            && path.leading_colon.is_none()
            && matches!(segments[0].as_str(), "crate" | "super" | "self")
        {
            self.code_paths.push(segments);
        }
        syn::visit::visit_path(self, path);
    }
}

/// A circle in `graph`, if there is one.
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

/// The crates whose sources live in `src/` and `scalers/`.
fn crates() -> Vec<(&'static str, Crate)> {
    let mut crates = vec![
        ("hoist", Crate::read(&root().join("src/lib.rs"))),
        ("hoist (bin)", Crate::read(&root().join("src/main.rs"))),
    ];
    for entry in std::fs::read_dir(root().join("src/bin")).unwrap() {
        let path = entry.unwrap().path();
        let main = if path.is_dir() {
            path.join("main.rs")
        } else {
            path
        };
        crates.push(("a src/bin crate", Crate::read(&main)));
    }
    crates
}

/// No file goes unread: every `.rs` file of `src/` and `scalers/` is a
/// module of one of the crates.
#[test]
fn every_source_file_is_read() {
    let read: BTreeSet<PathBuf> = crates()
        .iter()
        .flat_map(|(_, krate)| krate.files.iter().cloned())
        .collect();
    for dir in ["src", "scalers"] {
        for (path, _) in sources(dir) {
            let path = Path::new(&path).canonicalize().unwrap();
            assert!(
                read.contains(&path),
                "{} is no module of any crate",
                path.display()
            );
        }
    }
    let hoist = Crate::read(&root().join("src/lib.rs"));
    for module in [
        &["driver", "tests"][..],
        &["driver", "poller", "tests"],
        &["scalers", "kafka"],
        &["interceptor", "http", "direct"],
    ] {
        let module: ModulePath = module.iter().map(|s| s.to_string()).collect();
        assert!(
            hoist.modules.contains_key(&module),
            "{} not read",
            module.join("::")
        );
    }
}

/// Layers flow one way: no module reaches back to one that reaches it
/// (a circle makes every module in it a part of every other), among the
/// modules of any directory.
#[test]
fn modules_form_no_circle() {
    let mut circles = Vec::new();
    let mut levels = 0;
    for (name, krate) in crates() {
        for (parent, graph) in krate.graphs() {
            levels += 1;
            if let Some(circle) = cycle(&graph.edges) {
                let steps: Vec<String> = circle
                    .windows(2)
                    .map(|pair| graph.why[&(pair[0].clone(), pair[1].clone())].clone())
                    .collect();
                circles.push(format!(
                    "{name}, in {}: {}\n    {}",
                    if parent.is_empty() {
                        "the crate root".to_string()
                    } else {
                        parent.join("::")
                    },
                    circle.join(" -> "),
                    steps.join("\n    ")
                ));
            }
        }
    }
    assert!(levels > 5, "too few directories with imports: {levels}");
    assert!(
        circles.is_empty(),
        "circles of imports:\n{}",
        circles.join("\n")
    );
}

/// The test sees what it is meant to: a circle written in the ways the
/// tree writes imports is found.
#[test]
fn a_circle_is_found_however_the_imports_are_written() {
    let dir = tempfile_dir();
    std::fs::write(
        dir.join("lib.rs"),
        "mod a;\nmod b;\n#[path = \"elsewhere/c.rs\"]\nmod c;\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
    std::fs::write(dir.join("a.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
    // Grouped and nested, through `super::`.
    std::fs::write(
        dir.join("a/inner.rs"),
        "use super::super::{c::{self, Other}, x};\npub struct Thing;\n",
    )
    .unwrap();
    // Past a test module: read whole.
    std::fs::write(
        dir.join("b.rs"),
        "#[cfg(test)]\nmod tests {}\nfn f() { let _ = crate::a::Thing; }\n",
    )
    .unwrap();
    std::fs::write(dir.join("elsewhere/c.rs"), "use crate::b::f as g;\n").unwrap();
    let krate = Crate::read(&dir.join("lib.rs"));
    let graphs = krate.graphs();
    let circle = cycle(&graphs[&Vec::new()].edges).expect("a -> c -> b -> a");
    assert_eq!(circle.len(), 4, "{circle:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hoist-architecture-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
