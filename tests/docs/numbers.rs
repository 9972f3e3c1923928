//! Every number README.md gives in a link's text is in the section the
//! link points at: a figure quoted in the README is the measurement's
//! own, and when a measurement is run again the README's figure must
//! follow it (or lose its link, and this test says which).

use crate::links::slug;
use crate::manifests::root;

/// The numbers of `text`, thousands separators dropped: `1,002` is
/// `1002`, `25.0` stays `25.0`.
fn numbers(text: &str) -> Vec<String> {
    let number = regex::Regex::new(r"\d[\d,]*(\.\d+)?").unwrap();
    number
        .find_iter(text)
        .map(|found| {
            found
                .as_str()
                .trim_end_matches(',')
                .replace(',', "")
                .to_string()
        })
        .collect()
}

/// The section of `page` under the heading whose id is `anchor`: up to
/// the next heading of its level or above.
fn section(page: &str, anchor: &str) -> Option<String> {
    let mut lines = page.lines().peekable();
    let mut fenced = false;
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let level = line.chars().take_while(|c| *c == '#').count();
        if fenced || level == 0 || slug(&line[level..]) != anchor {
            continue;
        }
        let mut body = String::new();
        for line in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            let inner = line.chars().take_while(|c| *c == '#').count();
            if !fenced && inner > 0 && inner <= level && line[inner..].starts_with(' ') {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
        return Some(body);
    }
    None
}

#[test]
fn every_number_a_readme_link_quotes_is_in_the_section_it_links() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let link = regex::Regex::new(r"\[([^\]]*\d[^\]]*)\]\(([^)#\s]+\.md)#([^)\s]+)\)").unwrap();
    let mut checked = 0;
    for found in link.captures_iter(&readme) {
        let (text, file, anchor) = (&found[1], &found[2], &found[3]);
        let page = std::fs::read_to_string(root().join(file)).unwrap();
        let body = section(&page, anchor).unwrap_or_else(|| {
            panic!("README.md links {file}#{anchor}, which has no such section")
        });
        let present = numbers(&body);
        for number in numbers(text) {
            assert!(
                present.contains(&number),
                "README.md quotes {number} in \"{text}\", which {file}#{anchor} does not contain"
            );
            checked += 1;
        }
    }
    assert!(checked >= 25, "{checked} numbers");
}

#[test]
fn a_number_the_section_lacks_is_found() {
    let page = "# A\n\n## Memory\n\nRSS 31.2 MiB at 10,000.\n\n## CPU\n\n7 %\n";
    let memory = numbers(&section(page, "memory").unwrap());
    assert!(memory.contains(&"31.2".to_string()));
    assert!(memory.contains(&"10000".to_string()));
    assert!(
        !memory.contains(&"7".to_string()),
        "the next section is not this one's"
    );
    assert!(!memory.contains(&"31".to_string()), "31 is not 31.2");
    assert_eq!(numbers("601.2/s and 1,002."), ["601.2", "1002"]);
}
