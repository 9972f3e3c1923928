//! docs/troubleshooting.md is held to the code's own error types (the
//! `thiserror` types under src/ and scalers/): every type a user can meet
//! has a section whose heading names it, and every message the page
//! quotes (each line of a ```text block) is one of the `#[error("…")]`
//! messages of the types its section names, `<placeholder>`s standing for
//! the message's `{fields}`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::manifests::{root, snippets};

const PAGE: &str = "docs/troubleshooting.md";

/// The error types a user meets: in KEDA's status, hoist's log, `hoist`'s
/// output, an HTTP answer of the interceptor.
const USER_FACING: &[&str] = &[
    "AtomError",
    "CallerError",
    "ClientKeyError",
    "ClientTlsInvalid",
    "ClusterError",
    "ConfigError",
    "ConnectionStringError",
    "DecideError",
    "GroupOffsetsError",
    "HostError",
    "InterceptorError",
    "MetadataError",
    "ObserveError",
    "PathError",
    "PersistError",
    "PollError",
    "ProbeError",
    "ReloadError",
    "ReviewError",
    "RouteError",
    "RpcError",
    "SendError",
    "ServerError",
    "SignError",
    "SimulateError",
    "TlsError",
    "TrackError",
    "TriggerAuthError",
    "UpstreamError",
];

/// Error types no user sees, and why.
const INTERNAL: &[(&str, &str)] = &[];

/// A thiserror type: its name and its messages.
#[derive(Debug)]
struct ErrorType {
    name: String,
    messages: Vec<String>,
}

/// A Rust string literal's text.
fn unescape(literal: &str) -> String {
    literal
        .replace("\\\\", "\u{0}")
        .replace("\\\"", "\"")
        .replace("\\n", "\n")
        .replace('\u{0}', "\\")
}

/// Every thiserror type of the `.rs` files under `dir`.
fn error_types(dir: &Path, found: &mut Vec<ErrorType>) {
    let derive = regex::Regex::new(r"#\[derive\([^)]*thiserror::Error[^)]*\)\]").unwrap();
    let name = regex::Regex::new(r"pub (?:enum|struct) (\w+)").unwrap();
    let message = regex::Regex::new(r#"#\[error\(\s*"((?:[^"\\]|\\.)*)""#).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            error_types(&path, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for start in derive.find_iter(&text) {
            let rest = &text[start.end()..];
            let named = name
                .captures(rest)
                .unwrap_or_else(|| panic!("{}: a thiserror type without a name", path.display()));
            // The type ends at its first closing line: `}` of an enum or a
            // struct, `;` of a tuple struct.
            let body_start = named.get(0).unwrap().end();
            let end = rest[body_start..]
                .find("\n}")
                .map_or(rest.len(), |at| body_start + at);
            let end = rest[body_start..]
                .find(");\n")
                .filter(|at| body_start + at < end)
                .map_or(end, |at| body_start + at);
            found.push(ErrorType {
                name: named[1].to_string(),
                messages: message
                    .captures_iter(&rest[..end])
                    .map(|m| unescape(&m[1]))
                    .collect(),
            });
        }
    }
}

fn all_error_types() -> Vec<ErrorType> {
    let mut found = Vec::new();
    error_types(&root().join("src"), &mut found);
    error_types(&root().join("scalers"), &mut found);
    found
}

/// A message format as a regex over whole lines: each `{field}` any text.
fn pattern(format: &str) -> regex::Regex {
    let format = format.replace("{{", "\u{1}").replace("}}", "\u{2}");
    let field = regex::Regex::new(r"\{[^{}]*\}").unwrap();
    let literal = |text: &str| regex::escape(&text.replace('\u{1}', "{").replace('\u{2}', "}"));
    let mut out = String::from("^");
    let mut last = 0;
    for found in field.find_iter(&format) {
        out.push_str(&literal(&format[last..found.start()]));
        out.push_str(".+");
        last = found.end();
    }
    out.push_str(&literal(&format[last..]));
    out.push('$');
    regex::Regex::new(&out).unwrap()
}

/// Whether a quoted line is `format` with its fields filled in; a
/// `<placeholder>` of the page may stand for any field. A format that is
/// only a field (`{0}`: a message made elsewhere) quotes nothing.
fn quotes(line: &str, format: &str) -> bool {
    let field = regex::Regex::new(r"\{[^{}]*\}").unwrap();
    if field.replace_all(format, "").is_empty() {
        return false;
    }
    let placeholder = regex::Regex::new(r"<[^<>]+>").unwrap();
    let pattern = pattern(format);
    pattern.is_match(line) || pattern.is_match(&placeholder.replace_all(line, "x"))
}

/// The page's sections (`## ` headings): the type names in backticks in
/// the heading, and the lines of the section's ```text blocks.
fn sections() -> Vec<(String, BTreeSet<String>, Vec<String>)> {
    let page = Path::new(PAGE);
    let text = std::fs::read_to_string(root().join(page)).unwrap();
    // Backticked CamelCase words of a heading are type names (`probe`, a
    // command, is not).
    let named = regex::Regex::new(r"`([A-Z]\w+)`").unwrap();
    let mut sections: Vec<(String, BTreeSet<String>, Vec<String>)> = Vec::new();
    let blocks = snippets::blocks(page);
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if let Some(heading) = line.strip_prefix("## ").filter(|_| !fenced) {
            let types = named
                .captures_iter(heading)
                .map(|c| c[1].to_string())
                .collect();
            sections.push((heading.to_string(), types, Vec::new()));
        }
        let at = format!("{PAGE}:{}", number + 1);
        if let Some(block) = blocks.iter().find(|b| b.at == at && b.lang == "text") {
            let (heading, ..) = sections
                .last()
                .unwrap_or_else(|| panic!("{at}: a quoted message outside a section"));
            assert!(!heading.is_empty());
            let section = sections.last_mut().unwrap();
            section.2.extend(
                block
                    .text
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(String::from),
            );
        }
    }
    sections
}

#[test]
fn every_error_type_is_classified_as_user_facing_or_internal() {
    let found: BTreeSet<String> = all_error_types().into_iter().map(|t| t.name).collect();
    let listed: BTreeSet<String> = USER_FACING
        .iter()
        .copied()
        .chain(INTERNAL.iter().map(|(name, _)| *name))
        .map(String::from)
        .collect();
    assert!(found.len() >= 20, "{found:?}");
    assert_eq!(
        found, listed,
        "a thiserror type is new or gone: list it in USER_FACING (and give it a \
         section of {PAGE}) or in INTERNAL with the reason"
    );
}

#[test]
fn troubleshooting_has_a_section_for_every_user_facing_error_and_quotes_only_real_messages() {
    let types: BTreeMap<String, Vec<String>> = all_error_types()
        .into_iter()
        .map(|t| (t.name, t.messages))
        .collect();
    let sections = sections();
    let covered: BTreeSet<&String> = sections.iter().flat_map(|(_, names, _)| names).collect();
    for name in USER_FACING {
        assert!(
            covered.contains(&name.to_string()),
            "{PAGE} has no section naming `{name}` in its heading"
        );
    }
    let mut quoted = 0;
    for (heading, names, lines) in &sections {
        for name in names {
            assert!(
                types.contains_key(name),
                "{heading}: `{name}` is no error type"
            );
        }
        for line in lines {
            quoted += 1;
            let formats = names.iter().flat_map(|name| &types[name]);
            assert!(
                formats.clone().any(|format| quotes(line, format)),
                "{PAGE}, {heading}: `{line}` is none of the messages of {names:?}"
            );
        }
    }
    assert!(quoted >= 60, "{quoted} messages quoted");
}

#[test]
fn a_quote_matches_its_format_only() {
    let format = "invalid `{key}`: {reason}";
    assert!(quotes(
        "invalid `listLength`: `AA` is not an integer",
        format
    ));
    assert!(quotes("invalid `<key>`: <reason>", format));
    assert!(!quotes("invalid listLength", format));
    assert!(!quotes("missing required key `listName`: x", format));
    assert!(quotes(
        "the app did not answer within 4m",
        "the app did not answer within {}"
    ));
    assert!(quotes("a {b}", "a {{b}}"));
    assert!(!quotes("anything", "{0}"));
}
