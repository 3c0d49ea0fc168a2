//! The walkthroughs, run as written against a fresh `payments serve` in embedded mode: README's
//! short one and the guide's full one (`docs/walkthrough.md`), each by the same harness. Every
//! `sh` block in the section is run with bash (the service's and the mock gateway's addresses put
//! in for the ones shown), and what it prints is held to the block shown after it: every status
//! line, in order; every header named; every body field shown. Neither text can drift from the
//! service.
//!
//! How a shown block is read: a line `...` stands for lines left out; in a body, a value that
//! differs from run to run (an id, a timestamp, a request id, or any value written with `...` in
//! it) only has to be there, with the same shape; every other field must be there with exactly the
//! value shown. A `json` block is one JSON document written over several lines.

use std::sync::LazyLock;

use regex::Regex;

use crate::helpers::Process;

/// The addresses the walkthroughs' commands use, and where `serve` listens by default.
const SHOWN_API: &str = "http://127.0.0.1:8080";
const SHOWN_GATEWAY: &str = "http://127.0.0.1:8081";

#[tokio::test]
async fn the_readme_walkthrough_answers_as_written() {
    let steps = walkthrough(include_str!("../../README.md"), "## A walkthrough with curl");
    assert!(steps.len() >= 8, "README's walkthrough's steps: {}", steps.len());
    run_as_written("README", &steps).await;
}

#[tokio::test]
async fn the_guides_walkthrough_answers_as_written() {
    let steps = walkthrough(include_str!("../../docs/walkthrough.md"), "# A walkthrough with curl");
    assert!(steps.len() >= 12, "the guide's walkthrough's steps: {}", steps.len());
    run_as_written("docs/walkthrough.md", &steps).await;
}

/// Runs `steps` in order against a fresh `serve`, each after the first block (which defines the
/// helpers every later block uses), and holds what each prints to what `text` shows.
async fn run_as_written(text: &str, steps: &[Step]) {
    let data = std::env::temp_dir().join(format!("payments-walkthrough-{}", uuid::Uuid::new_v4().simple()));
    let data = data.to_str().unwrap();
    let env = [
        ("PAYMENTS_DATA_DIR", data),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0"),
        ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
    ];
    let serve = Process::start(&["serve"], &env, payments_service::startup::LISTENING).await;
    let gateway = serve.mock_gateway_url().await;
    let workdir = tempdir();
    let prelude = steps[0].commands.clone();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_payments")).parent().unwrap().to_owned();
    let path = format!("{}:{}", binary.display(), std::env::var("PATH").unwrap_or_default());

    for (number, step) in steps.iter().enumerate().skip(1) {
        let script = format!("{prelude}\n{}", step.commands)
            .replace(SHOWN_API, serve.url.trim_end_matches('/'))
            .replace(SHOWN_GATEWAY, &gateway);
        let output = tokio::process::Command::new("bash")
            .args(["-c", &script])
            .current_dir(&workdir)
            // `payments` is the binary the tests run, as a reader's is the one `cargo build` made.
            .env("PATH", &path)
            .output()
            .await
            .expect("running bash");
        assert!(output.status.success(), "{text}, step {number} failed: {}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8(output.stdout).unwrap();
        if let Err(mismatch) = compare(&step.shown, &printed) {
            panic!(
                "{text}, step {number}:\n{}\n-- {text} shows --\n{}\n-- it printed --\n{printed}\n-- {mismatch}",
                step.commands, step.shown
            );
        }
    }
    std::fs::remove_dir_all(&workdir).ok();
    let _ = std::fs::remove_dir_all(data);
}

/// One step: the commands of an `sh` block, and what the text shows they print (the block after).
struct Step {
    commands: String,
    shown: String,
}

/// The steps of the section of `text` under `heading` (a whole line), in order, up to the next
/// heading of the same level or above. A `sh` block with no block after it shows nothing.
fn walkthrough(text: &str, heading: &str) -> Vec<Step> {
    let section = section(text, heading);
    let mut blocks = Vec::new();
    let mut lines = section.iter().copied();
    while let Some(line) = lines.next() {
        let Some(language) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|line| !line.starts_with("```")).collect();
        let body = match language {
            // One document, written over several lines.
            "json" => body.iter().map(|line| line.trim()).collect::<Vec<_>>().join(""),
            _ => body.join("\n"),
        };
        blocks.push((language.to_owned(), body));
    }
    let mut steps = Vec::new();
    let mut blocks = blocks.into_iter().peekable();
    while let Some((language, commands)) = blocks.next() {
        assert_eq!(language, "sh", "a shown block with no commands before it: {commands}");
        let shown = match blocks.peek() {
            Some((language, _)) if language != "sh" => blocks.next().unwrap().1,
            _ => String::new(),
        };
        steps.push(Step { commands, shown });
    }
    steps
}

/// The lines of `text` under `heading`, up to the next heading of its level or above (a line in a
/// fenced block, such as a shell comment, is no heading).
fn section<'t>(text: &'t str, heading: &str) -> Vec<&'t str> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = text.lines().skip_while(|line| *line != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    let mut fenced = false;
    lines
        .take_while(|line| {
            fenced ^= line.starts_with("```");
            let hashes = line.chars().take_while(|c| *c == '#').count();
            fenced || !(1..=level).contains(&hashes) || !line[hashes..].starts_with(' ')
        })
        .collect()
}

/// Holds what was printed to what the text shows (see the module's docs).
fn compare(shown: &str, printed: &str) -> Result<(), String> {
    let printed: Vec<&str> = printed.lines().map(|line| line.trim_end_matches('\r')).collect();
    let statuses = |lines: &mut dyn Iterator<Item = &str>| lines.filter(|line| line.starts_with("HTTP/")).count();
    let (shown_statuses, printed_statuses) = (statuses(&mut shown.lines()), statuses(&mut printed.iter().copied()));
    if shown_statuses != printed_statuses {
        return Err(format!("{shown_statuses} responses shown, {printed_statuses} printed"));
    }
    // Where the current response starts, and how far its lines were matched.
    let (mut response, mut at) = (0, 0);
    for expected in shown.lines().map(str::trim_end).filter(|line| !line.is_empty() && *line != "...") {
        if expected.starts_with("HTTP/") {
            // The next response must be this one.
            let next = printed[at..].iter().position(|line| line.starts_with("HTTP/")).map(|i| at + i);
            match next {
                Some(i) if printed[i] == expected => (response, at) = (i + 1, i + 1),
                _ => return Err(format!("expected the status line {expected:?} next")),
            }
            continue;
        }
        // A header is looked for among the current response's, in any order; a body line in the
        // rest of the current response.
        let end = printed[at..].iter().position(|line| line.starts_with("HTTP/")).map_or(printed.len(), |i| at + i);
        let header = is_header(expected);
        let from = if header { response } else { at };
        match printed[from..end].iter().position(|line| matches(expected, line)) {
            Some(_) if header => {}
            Some(i) => at = from + i + 1,
            None => return Err(format!("nothing printed matches {expected:?}")),
        }
    }
    Ok(())
}

/// Whether one printed line is what one shown line shows: the same header (its name in any
/// case), or a body with every field shown.
fn matches(shown: &str, printed: &str) -> bool {
    if is_header(shown) {
        let (name, value) = shown.split_once(": ").unwrap();
        return printed.split_once(": ").is_some_and(|(n, v)| n.eq_ignore_ascii_case(name) && v == value);
    }
    let fields = fields(shown);
    !fields.is_empty() && fields.iter().all(|field| field.is_in(printed))
}

fn is_header(line: &str) -> bool {
    static HEADER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[A-Za-z-]+: ").unwrap());
    HEADER.is_match(line)
}

/// A `"name":value` shown in a body.
#[derive(Debug)]
struct Field {
    name: String,
    value: String,
    /// Differs from run to run: only its presence and shape are compared.
    varies: Option<&'static Regex>,
}

impl Field {
    fn is_in(&self, printed: &str) -> bool {
        match self.varies {
            None => printed.contains(&format!("\"{}\":{}", self.name, self.value)),
            Some(shape) => {
                let pattern = format!(r#""{}":"({})""#, regex::escape(&self.name), shape.as_str());
                Regex::new(&pattern).unwrap().is_match(printed)
            }
        }
    }
}

fn fields(shown: &str) -> Vec<Field> {
    static FIELD: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#""([A-Za-z_]+)":("(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?|true|false|null)"#).unwrap()
    });
    static SHAPES: LazyLock<Vec<(Regex, Regex)>> = LazyLock::new(|| {
        let shape = |shown: &str, printed: &str| (Regex::new(shown).unwrap(), Regex::new(printed).unwrap());
        vec![
            shape(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", r"[0-9a-f-]{36}"),
            shape(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$", r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z"),
            shape(r"^(ch|re|req|evt|acct|we|wa)_", r"(ch|re|req|evt|acct|we|wa)_[A-Za-z0-9]+"),
            shape(r"^whsec_", r"whsec_[A-Za-z0-9+/=]+"),
            // Elided by hand.
            shape(r"\.\.\.", r"[^\x22]*"),
        ]
    });
    FIELD
        .captures_iter(shown)
        .map(|capture| {
            let (name, value) = (capture[1].to_owned(), capture[2].to_owned());
            let text = value.trim_matches('"');
            let varies = value
                .starts_with('"')
                .then(|| SHAPES.iter().find(|(shown, _)| shown.is_match(text)).map(|(_, printed)| printed))
                .flatten();
            Field { name, value, varies }
        })
        .collect()
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("payments-walkthrough-run-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).unwrap();
    dir
}

#[test]
fn a_shown_body_is_held_field_by_field() {
    let shown =
        r#"{"id":"01a201b1-403b-7713-8cbf-b168bb4bbbf2","status":"succeeded","amount":1000,...,"at":"...12.3Z"}"#;
    let printed = r#"{"id":"01a2aaaa-403b-7713-8cbf-b168bb4bbbf2","amount":1000,"status":"succeeded","at":"2026-11-23T10:12.3Z"}"#;
    assert!(matches(shown, printed));
    assert!(!matches(shown, &printed.replace("1000", "1001")), "a value shown is held exactly");
    assert!(!matches(shown, &printed.replace("\"at\"", "\"on\"")), "a varying value must still be there");
    assert!(matches("retry-after: 2", "Retry-After: 2"));
    assert!(!matches("retry-after: 2", "retry-after: 1"));
    assert!(compare("HTTP/1.1 201 Created\n...\n{\"a\":1}", "HTTP/1.1 201 Created\nx: y\n\n{\"a\":1}\n").is_ok());
    assert!(
        compare("HTTP/1.1 201 Created\nb: 2\na: 1", "HTTP/1.1 201 Created\na: 1\nb: 2").is_ok(),
        "headers in any order"
    );
    assert!(compare("HTTP/1.1 201 Created", "HTTP/1.1 503 Service Unavailable").is_err());
    assert!(compare("HTTP/1.1 201 Created", "HTTP/1.1 201 Created\nHTTP/1.1 201 Created").is_err());
}

#[test]
fn a_section_ends_at_the_next_heading_of_its_level_or_above() {
    let text = "# Guide\nintro\n## Steps\n```sh\n# a comment, no heading\necho\n```\n### A step\nmore\n## Next\nafter\n# Other\n";
    assert_eq!(section(text, "## Steps"), ["```sh", "# a comment, no heading", "echo", "```", "### A step", "more"]);
    assert_eq!(section(text, "# Guide").last(), Some(&"after"), "a chapter runs to the next title");
}
