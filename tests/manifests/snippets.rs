//! The docs' Markdown pages (README.md, docs/**.md, deploy/README.md) and
//! the YAML they show: every ```yaml block, and the KEDA objects among
//! them. A block that is only a trigger list (`triggers:`, as the README
//! shows one per scaler) is taken as the `triggers` of a ScaledObject in
//! namespace `orders`, where the shipped config's auth profiles are.

use std::path::{Path, PathBuf};

use yaml_rust2::Yaml;

use super::{parse, root};

/// Every Markdown page of the docs, relative to the crate.
pub fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/README.md"),
    ];
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root().join(&dir)).unwrap() {
            let path = dir.join(entry.unwrap().file_name());
            if root().join(&path).is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// A fenced block of a page: where it starts (`page:line`), its
/// language and its text.
pub struct Block {
    pub at: String,
    pub lang: String,
    pub text: String,
}

/// Every fenced block of `page`.
pub fn blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let fence = lines[at].trim_start();
        if let Some(lang) = fence.strip_prefix("```") {
            let indent = lines[at].len() - fence.len();
            let end = (at + 1..lines.len())
                .find(|&i| lines[i].trim_start() == "```")
                .unwrap_or_else(|| panic!("{}:{}: an unclosed block", page.display(), at + 1));
            let body: Vec<&str> = lines[at + 1..end]
                .iter()
                .map(|line| line.get(indent..).unwrap_or(""))
                .collect();
            blocks.push(Block {
                at: format!("{}:{}", page.display(), at + 1),
                lang: lang.trim().to_string(),
                text: body.join("\n") + "\n",
            });
            at = end;
        }
        at += 1;
    }
    blocks
}

/// Every ```yaml block of every page.
pub fn yaml_blocks() -> Vec<Block> {
    pages()
        .iter()
        .flat_map(|page| blocks(page))
        .filter(|block| block.lang == "yaml")
        .collect()
}

/// A block that is only a trigger list, as the `triggers` of a
/// ScaledObject of its own, named after where it is.
fn as_scaled_object(block: &Block) -> Option<String> {
    let first = block
        .text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))?;
    if first.trim() != "triggers:" {
        return None;
    }
    let indent = first.len() - first.trim_start().len();
    let name = format!(
        "snippet-{}",
        block
            .at
            .to_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    );
    let triggers: String = block
        .text
        .lines()
        .map(|line| format!("  {}\n", line.get(indent..).unwrap_or("")))
        .collect();
    Some(format!(
        "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata:\n  name: {name}\n  namespace: orders\nspec:\n  scaleTargetRef:\n    name: {name}\n{triggers}"
    ))
}

/// Every KEDA object the docs show (trigger lists as ScaledObjects), with
/// where it is.
pub fn keda_objects() -> Vec<(String, Yaml)> {
    let mut objects = Vec::new();
    for block in yaml_blocks() {
        let text = as_scaled_object(&block).unwrap_or_else(|| block.text.clone());
        for doc in parse(&block.at, &text) {
            let api = doc["apiVersion"].as_str().unwrap_or_default();
            if api.starts_with("keda.sh/") {
                objects.push((block.at.clone(), doc));
            }
        }
    }
    objects
}
