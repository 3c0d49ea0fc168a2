//! The guide held to the tree and to the code, so that it cannot drift:
//! - the code map in `docs/ARCHITECTURE.md` names every module of every crate (each `.rs` file under
//!   `src/` and `crates/*/src/`, and each folder of them), and README's names every crate and every
//!   top-level module of the service; neither names a file or folder that does not exist;
//! - every relative link in README.md and docs/*.md leads to a file that exists, and every
//!   `#anchor` to a heading of its target, by GitHub's slug of the heading;
//! - the statements `docs/protocol.md` shows for a payment are the ones a payment runs.
//!
//! How a code map reads (a `text` block under `## Code map`): each entry is a line that starts,
//! after its indentation, with one or more names separated by `, `, each a file or a folder (ending
//! in `/`), then two spaces or more and what it holds. A name is relative to the folder named alone
//! on the nearest line above it that is indented less; a line indented 16 spaces or more carries on
//! the description above it. A folder named stands for its own module (`mod.rs`, `lib.rs`, `main.rs`).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use reqwest::StatusCode;

use crate::helpers::{TestApp, new_key, payment_body, record_statements, statements};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const README: &str = include_str!("../../README.md");
const ARCHITECTURE: &str = include_str!("../../docs/ARCHITECTURE.md");
const PROTOCOL: &str = include_str!("../../docs/protocol.md");

/// Where a code map's line stops being an entry and carries on the description above it.
const CONTINUATION: usize = 16;

#[test]
fn the_architecture_code_map_names_every_module_of_every_crate_and_nothing_else() {
    let named = code_map("docs/ARCHITECTURE.md", ARCHITECTURE);
    let mut roots = vec![PathBuf::from("src")];
    roots.extend(crates().into_iter().map(|krate| krate.join("src")));
    let missing: Vec<String> =
        roots.iter().flat_map(|root| modules(root, None)).filter(|m| !m.named_in(&named)).map(|m| m.path).collect();
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md's code map does not name: {missing:#?}");
}

#[test]
fn the_readme_code_map_names_every_crate_and_every_module_of_the_service() {
    let named = code_map("README.md", README);
    let unnamed_crates: Vec<String> = crates()
        .into_iter()
        .map(|krate| format!("{}/", krate.display()))
        .filter(|krate| !named.iter().any(|name| name.starts_with(krate.as_str())))
        .collect();
    assert!(unnamed_crates.is_empty(), "README's code map does not name: {unnamed_crates:?}");
    let missing: Vec<String> = modules(Path::new("crates/service/src"), Some(1))
        .into_iter()
        .filter(|m| !m.named_in(&named))
        .map(|m| m.path)
        .collect();
    assert!(missing.is_empty(), "README's code map does not name: {missing:#?}");
}

/// The crates' table in docs/ARCHITECTURE.md: each crate of the workspace, with exactly the crates
/// of the workspace it depends on, and those its tests depend on besides, as its `Cargo.toml` says.
#[test]
fn the_architecture_crates_table_is_what_each_cargo_toml_says() {
    let row = regex::Regex::new(r"^\| `(payments[a-z-]*)` \| `([^`]+)` \| ([^|]+) \| ([^|]+) \|$").unwrap();
    let mut shown = BTreeSet::new();
    for captures in ARCHITECTURE.lines().filter_map(|line| row.captures(line)) {
        let (name, folder) = (&captures[1], captures[2].trim_end_matches('/'));
        // The root crate's sources are in `src/`, its manifest at the root.
        let manifest_folder = if folder == "src" { "" } else { folder };
        let manifest = std::fs::read_to_string(Path::new(ROOT).join(manifest_folder).join("Cargo.toml"))
            .unwrap_or_else(|error| panic!("docs/ARCHITECTURE.md: {name} in {folder}: {error}"));
        assert!(manifest.contains(&format!("\nname = \"{name}\"\n")), "{folder}/Cargo.toml is not {name}'s");
        let listed = |cell: &str| -> BTreeSet<String> {
            cell.split(", ")
                .map(|name| name.trim().trim_matches('`').to_owned())
                .filter(|name| name != "nothing")
                .collect()
        };
        assert_eq!(
            listed(&captures[3]),
            workspace_dependencies(&manifest, "dependencies"),
            "docs/ARCHITECTURE.md: what {name} is on"
        );
        assert_eq!(
            listed(&captures[4]),
            workspace_dependencies(&manifest, "dev-dependencies"),
            "docs/ARCHITECTURE.md: what {name}'s tests are also on"
        );
        shown.insert(folder.to_owned());
    }
    let mut folders: BTreeSet<String> = crates().iter().map(|krate| krate.display().to_string()).collect();
    folders.insert("src".to_owned());
    assert_eq!(shown, folders, "docs/ARCHITECTURE.md's crates");
}

#[test]
fn every_relative_link_and_anchor_in_the_readme_and_the_guide_resolves() {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut guide: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .map(|path| path.strip_prefix(ROOT).unwrap().to_owned())
        .collect();
    guide.sort();
    pages.extend(guide);

    let mut anchors = HashMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(Path::new(ROOT).join(page)).unwrap();
        for target in links(&text) {
            checked += 1;
            let (file, anchor) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let file = if file.is_empty() { page.clone() } else { normalise(&page.parent().unwrap().join(file)) };
            if !Path::new(ROOT).join(&file).exists() {
                broken.push(format!("{}: {target}: no {}", page.display(), file.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|extension| extension != "md") {
                broken.push(format!("{}: {target}: an anchor in a file that is not Markdown", page.display()));
                continue;
            }
            let slugs = anchors
                .entry(file.clone())
                .or_insert_with(|| headings(&std::fs::read_to_string(Path::new(ROOT).join(&file)).unwrap()));
            if !slugs.contains(anchor) {
                broken.push(format!("{}: {target}: no heading #{anchor} in {}", page.display(), file.display()));
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: is the reading of links broken?");
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// The statements docs/protocol.md shows (each a `sql` block after a `<!-- statement: NAME -->`
/// line) are, word for word, the two a payment runs once its process knows its gateway (the
/// first payment of a process asks between the claim and `started`, which then runs alone).
#[tokio::test]
async fn the_guides_statements_of_a_payment_are_the_ones_it_runs() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);
    let before = statements(&database).executed.len();

    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);

    let ran: Vec<String> = statements(&database).executed[before..]
        .iter()
        .map(|sql| sql.split_once(" -- binds: ").map_or(sql.as_str(), |(sql, _)| sql).to_owned())
        .collect();
    let shown = shown_statements(PROTOCOL);
    let names: Vec<&str> = shown.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["claim + started", "charge_created + finished"], "docs/protocol.md's statements");
    assert_eq!(ran.len(), shown.len(), "a payment ran: {ran:#?}");
    for ((name, shown), ran) in shown.iter().zip(&ran) {
        if let Some(at) = first_difference(shown, ran) {
            let from = |text: &str| text.split_whitespace().skip(at).take(12).collect::<Vec<_>>().join(" ");
            panic!(
                "docs/protocol.md's `{name}` is not what a payment runs, from word {at}:\n  shown: {}\n  runs:  {}\nIt runs:\n{ran}",
                from(shown),
                from(ran)
            );
        }
    }
}

/// The names a code map's entries give, as paths from the repository's root; each must exist.
fn code_map(page: &str, text: &str) -> BTreeSet<String> {
    let block = code_map_block(page, text);
    let mut folders: Vec<(usize, String)> = Vec::new();
    let mut named = BTreeSet::new();
    for line in block.lines().filter(|line| !line.trim().is_empty()) {
        let indent = line.len() - line.trim_start().len();
        if indent >= CONTINUATION {
            continue;
        }
        let names = line.trim_start().split("  ").next().unwrap();
        let names: Vec<&str> = names.split(", ").map(str::trim).collect();
        folders.retain(|(at, _)| *at < indent);
        let parent = folders.last().map_or("", |(_, folder)| folder.as_str()).to_owned();
        for name in &names {
            assert!(
                name.ends_with('/') || name.contains('.'),
                "{page}'s code map: {name:?} (in {line:?}) is neither a file nor a folder"
            );
            let path = format!("{parent}{name}");
            let on_disk = Path::new(ROOT).join(&path);
            assert!(on_disk.exists(), "{page}'s code map names {path}, which does not exist");
            assert_eq!(
                on_disk.is_dir(),
                path.ends_with('/'),
                "{page}'s code map: {path} is a folder only if it ends in /"
            );
            named.insert(path);
        }
        if let [folder] = names[..]
            && folder.ends_with('/')
        {
            folders.push((indent, format!("{parent}{folder}")));
        }
    }
    named
}

/// The `text` block of `text`'s `## Code map`.
fn code_map_block<'t>(page: &str, text: &'t str) -> &'t str {
    let (_, section) = text.split_once("\n## Code map\n").unwrap_or_else(|| panic!("{page} has no `## Code map`"));
    let (_, block) = section.split_once("```text\n").unwrap_or_else(|| panic!("{page}'s code map has no text block"));
    block.split_once("```").unwrap().0
}

/// The crates of this workspace that a manifest's `[section]` names.
fn workspace_dependencies(manifest: &str, section: &str) -> BTreeSet<String> {
    let header = format!("[{section}]");
    manifest
        .lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split(['.', ' ', '=']).next())
        .filter(|name| name.starts_with("payments-"))
        .map(str::to_owned)
        .collect()
}

/// The crates of the workspace, but the root one: `crates/<name>`.
fn crates() -> Vec<PathBuf> {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("Cargo.toml").exists())
        .map(|path| path.strip_prefix(ROOT).unwrap().to_owned())
        .collect();
    crates.sort();
    crates
}

/// A module: a `.rs` file, or a folder of them, as a path from the repository's root (a folder's
/// ends in `/`).
struct Module {
    path: String,
}

impl Module {
    /// Named itself, or, for a folder's own module, by its folder.
    fn named_in(&self, named: &BTreeSet<String>) -> bool {
        let own_module = ["mod.rs", "lib.rs", "main.rs"].iter().find_map(|root| self.path.strip_suffix(root));
        named.contains(&self.path) || own_module.is_some_and(|folder| named.contains(folder))
    }
}

/// The modules under `root` (a path from the repository's root), the root folder among them, down
/// to `depth` levels below it if given.
fn modules(root: &Path, depth: Option<usize>) -> Vec<Module> {
    let mut found = vec![Module { path: format!("{}/", root.display()) }];
    let mut entries: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join(root))
        .unwrap_or_else(|error| panic!("{}: {error}", root.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for entry in entries {
        let path = entry.strip_prefix(ROOT).unwrap();
        if entry.is_dir() && has_rust(&entry) {
            match depth {
                Some(1) => found.push(Module { path: format!("{}/", path.display()) }),
                _ => found.extend(modules(path, depth.map(|depth| depth - 1))),
            }
        } else if entry.extension().is_some_and(|extension| extension == "rs") {
            found.push(Module { path: path.display().to_string() });
        }
    }
    found
}

/// Whether `folder` holds Rust files, at any depth (a folder of scripts does not).
fn has_rust(folder: &Path) -> bool {
    std::fs::read_dir(folder).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        path.extension().is_some_and(|extension| extension == "rs") || (path.is_dir() && has_rust(&path))
    })
}

/// The relative links of a Markdown text (inline, images, and reference definitions), outside code.
fn links(text: &str) -> Vec<String> {
    let inline = regex::Regex::new(r#"\]\(([^)\s]+)(?:\s+"[^"]*")?\)"#).unwrap();
    let definition = regex::Regex::new(r"^\s*\[[^\]]+\]:\s+(\S+)").unwrap();
    let code = regex::Regex::new(r"`[^`]*`").unwrap();
    let absolute = regex::Regex::new(r"^[a-zA-Z][a-zA-Z0-9+.-]*:").unwrap();
    let mut links = Vec::new();
    for line in prose(text) {
        let line = code.replace_all(line, "");
        let found = inline.captures_iter(&line).chain(definition.captures_iter(&line));
        links.extend(found.map(|captures| captures[1].to_owned()).filter(|target| !absolute.is_match(target)));
    }
    links
}

/// The lines of a Markdown text outside its fenced blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors GitHub gives a Markdown text's headings: each heading's text as shown, lower case,
/// with every character but letters, digits, `-`, `_` and spaces dropped and each space a `-`; a
/// slug met again gets `-1`, `-2`, ...
fn headings(text: &str) -> BTreeSet<String> {
    let link = regex::Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut slugs = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let shown = link.replace_all(line[hashes..].trim(), "$1");
        let slug: String = shown
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let times = seen.entry(slug.clone()).or_default();
        slugs.insert(if *times == 0 { slug } else { format!("{slug}-{times}") });
        *times += 1;
    }
    slugs
}

/// `path` without `.` and `..` (`docs/../README.md` is `README.md`).
fn normalise(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::CurDir => {}
            part => normal.push(part),
        }
    }
    normal
}

/// The statements a text shows: each `sql` block right after a `<!-- statement: NAME -->` line.
fn shown_statements(text: &str) -> Vec<(String, String)> {
    let mut shown = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.trim().strip_prefix("<!-- statement: ").and_then(|rest| rest.strip_suffix(" -->")) else {
            continue;
        };
        assert_eq!(lines.next().map(str::trim), Some("```sql"), "the statement {name} is not followed by a sql block");
        let block: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
        shown.push((name.to_owned(), block.join("\n")));
    }
    shown
}

/// Where two statements first differ, word by word (white space compared as one space), if they do.
fn first_difference(shown: &str, ran: &str) -> Option<usize> {
    let (shown, ran): (Vec<&str>, Vec<&str>) = (shown.split_whitespace().collect(), ran.split_whitespace().collect());
    shown.iter().zip(&ran).position(|(a, b)| a != b).or((shown.len() != ran.len()).then(|| shown.len().min(ran.len())))
}
