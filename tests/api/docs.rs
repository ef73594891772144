//! The README and the pages of `docs/` link to each other and to the
//! repository's files by relative paths; when a section moves, a link that
//! pointed at it must move too. These read every page as GitHub renders it
//! (links outside code, headings' anchors as GitHub spells them) and fail
//! naming each link that leads nowhere. The README also stays short: the
//! deep-dives live in `docs/`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every Markdown page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a page outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// A heading's anchor as GitHub makes it: lower case, letters, digits,
/// `-` and `_` kept, spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a page: its headings' slugs, a repeated one with
/// GitHub's `-1`, `-2`, … suffix.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut anchors = HashSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug = slug(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.iter().filter(|s| **s == slug).count();
        anchors.insert(if n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        seen.push(slug);
    }
    anchors
}

/// The targets of a line's links and images, `[text](target)`, outside
/// inline code.
fn link_targets(line: &str) -> Vec<String> {
    let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    outside_code
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split_whitespace().next().unwrap_or("").to_owned())
        .collect()
}

/// What is wrong with a relative link of `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let file = if file.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(file)
    };
    if !file.exists() {
        return Some(format!("{target}: no file {}", file.display()));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if file.extension().is_some_and(|e| e == "md") {
        let text = std::fs::read_to_string(&file).unwrap();
        if !anchors(&text).contains(anchor) {
            return Some(format!(
                "{target}: no heading `#{anchor}` in {}",
                file.display()
            ));
        }
    }
    None
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_leads_to_a_file_and_heading_that_exist() {
    let mut links = 0;
    let mut broken_links = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                links += 1;
                if let Some(why) = broken(&page, &target) {
                    let name = page.strip_prefix(root()).unwrap().display();
                    broken_links.push(format!("{name}:{n}: {why}"));
                }
            }
        }
    }
    assert!(
        links > 50,
        "only {links} links found: is the parser reading the pages?"
    );
    assert!(
        broken_links.is_empty(),
        "links that lead nowhere:\n{}",
        broken_links.join("\n")
    );
}

#[test]
fn the_link_check_knows_githubs_anchors_and_finds_a_missing_file_or_heading() {
    let text = "# fencehook\n## Inbox mode: accept now, book asynchronously\n\
                ## Not built yet / left out\n## `fencehook send`: one per scheme\n\
                ## A payment's whole life\n## Notes\n## Notes\n```sh\n# not a heading\n```\n";
    let found = anchors(text);
    for anchor in [
        "inbox-mode-accept-now-book-asynchronously",
        "not-built-yet--left-out",
        "fencehook-send-one-per-scheme",
        "a-payments-whole-life",
        "notes",
        "notes-1",
    ] {
        assert!(found.contains(anchor), "{anchor} not in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        link_targets("see [a](docs/a.md#x) and ![b](b.png) but not `[c](c.md)`"),
        ["docs/a.md#x", "b.png"]
    );
    let readme = root().join("README.md");
    assert_eq!(broken(&readme, "docs/reference.md#settings"), None);
    assert_eq!(broken(&readme, "https://example.com/nowhere"), None);
    assert!(broken(&readme, "docs/nowhere.md").is_some());
    assert!(broken(&readme, "docs/reference.md#no-such-heading").is_some());
    assert!(broken(&readme, "#no-such-heading").is_some());
}

#[test]
fn the_readme_is_read_in_ten_minutes_and_its_deep_dives_live_in_docs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move the detail into docs/"
    );
    for page in [
        "docs/design.md",
        "docs/lifecycle.md",
        "docs/inbox.md",
        "docs/failures.md",
        "docs/console.md",
        "docs/development.md",
    ] {
        let name = &page["docs/".len()..];
        assert!(
            readme.contains(&format!("]({page})")),
            "the README does not link {name}"
        );
    }
}
