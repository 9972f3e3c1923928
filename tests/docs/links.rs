//! Every relative link of the docs resolves: the file (or directory)
//! exists, and an `#anchor` names a heading of the page it points at, by
//! GitHub's rule for heading ids.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::manifests::{root, snippets};

/// The id GitHub gives a heading: lower case, every character that is
/// not a letter, a digit, `-`, `_` or a space dropped, spaces as `-`.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `text` without its fenced blocks (their lines left empty, so line
/// numbers hold) and without inline code spans' contents.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let code = regex::Regex::new(r"`[^`\n]*`").unwrap();
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return String::new();
            }
            if fenced {
                return String::new();
            }
            // A link's text may be code; its target never is.
            code.replace_all(line, "`c`").into_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The heading ids of a page, duplicates numbered as GitHub numbers them.
pub fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    let mut fenced = false;
    let mut ids = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let id = slug(heading);
        let unique = (0..)
            .map(|n| {
                if n == 0 {
                    id.clone()
                } else {
                    format!("{id}-{n}")
                }
            })
            .find(|candidate| !ids.contains(candidate))
            .unwrap();
        ids.insert(unique);
    }
    ids
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                assert!(out.pop(), "{} leaves the repository", path.display());
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of `page` that does not resolve: (line, target).
pub fn broken(page: &Path) -> Vec<(usize, String)> {
    let text = prose(&std::fs::read_to_string(root().join(page)).unwrap());
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for found in link.captures_iter(&text) {
        let target = &found[1];
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let line = text[..found.get(0).unwrap().start()].lines().count();
        let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
        let file = if file.is_empty() {
            page.to_path_buf()
        } else {
            normalize(&dir.join(file))
        };
        let resolves =
            root().join(&file).exists() && (anchor.is_empty() || anchors(&file).contains(anchor));
        if !resolves {
            broken.push((line, target.to_string()));
        }
    }
    broken
}

#[test]
fn github_heading_ids_are_made_as_github_makes_them() {
    assert_eq!(slug("The admin port's callers"), "the-admin-ports-callers");
    assert_eq!(
        slug("`http` and `tcp` (the interceptor)"),
        "http-and-tcp-the-interceptor"
    );
    assert_eq!(
        slug("Explain and replay: `/status`, `hoist status`, `simulate`, `decide`"),
        "explain-and-replay-status-hoist-status-simulate-decide"
    );
    assert_eq!(
        slug("3. HTTP interceptor: a direct HTTP/1.1 path, 0.83× nginx's CPU per request"),
        "3-http-interceptor-a-direct-http11-path-083-nginxs-cpu-per-request"
    );
}

#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    let pages = snippets::pages();
    assert!(pages.len() >= 15, "{pages:?}");
    let mut links = 0;
    let mut failures = Vec::new();
    for page in &pages {
        let text = prose(&std::fs::read_to_string(root().join(page)).unwrap());
        links += text.matches("](").count();
        for (line, target) in broken(page) {
            failures.push(format!("{}:{line}: {target}", page.display()));
        }
    }
    assert!(links > 100, "{links} links");
    assert!(
        failures.is_empty(),
        "links that resolve nowhere: {failures:#?}"
    );
}

#[test]
fn a_broken_link_or_anchor_is_found() {
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "# Top\n\n## A section\n\n[ok](#a-section) [no](#b-section) [file](page.md#top) \
         [gone](missing.md) `[code](missing.md)`\n\n```md\n[fenced](missing.md)\n```\n",
    )
    .unwrap();
    let relative = page.strip_prefix(root()).unwrap();
    let found: Vec<String> = broken(relative).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["#b-section", "missing.md"]);
}
