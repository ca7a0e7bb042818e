//! The manual's commands are the binary's: every `fanout …` command line the docs show — in
//! README.md, origin/README.md and the book under docs/src, in `sh` code blocks and in inline
//! code — names subcommands and flags that `fanout`'s command line (`fanout_origin::cli::Cli`,
//! asked through clap) has. A renamed or removed flag fails here, naming the document and the
//! line, until the docs follow.

// Test code: a failed expect is a failed test.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use clap::CommandFactory;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The documents whose commands are checked: (path from the root, text).
fn documents() -> Vec<(String, String)> {
    let root = root();
    let mut paths = vec!["README.md".to_string(), "origin/README.md".to_string()];
    let book = root.join("docs/src");
    let mut chapters: Vec<String> = std::fs::read_dir(&book)
        .expect("docs/src")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/src/{n}"))
        .collect();
    chapters.sort();
    paths.extend(chapters);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root.join(&p)).expect("a document");
            (p, text)
        })
        .collect()
}

/// One command line found in a document: where, and its words after `fanout`.
#[derive(Debug, PartialEq)]
struct Shown {
    line: usize,
    words: Vec<String>,
}

/// Shell words, roughly: whitespace-separated, quotes removed (their content kept whole).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                has = true;
            }
            None if c.is_whitespace() => {
                if has || !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                has = false;
            }
            None => cur.push(c),
        }
    }
    if has || !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The commands of a shell line that run `fanout` (or `cargo run … -p fanout-origin -- ARGS`):
/// the line is cut at `|`, `&&`, `||` and `;`, and in each piece the command word is the first
/// after variable assignments and wrappers like `sudo` or `env`. Each command's words after
/// `fanout` run up to a redirection or a comment.
fn fanout_commands(line: &str) -> Vec<Vec<String>> {
    let words = shell_words(line);
    let wrappers = ["sudo", "env", "exec", "time", "nice", "nohup", "command"];
    let is_fanout = |w: &str| w == "fanout" || w.ends_with("/fanout");
    let mut out = Vec::new();
    for piece in words.split(|w| ["|", "||", "&&", ";", "&"].contains(&w.as_str())) {
        let mut rest = piece
            .iter()
            .skip_while(|w| w.contains('=') || wrappers.contains(&w.as_str()));
        let args: Vec<&String> = match rest.next() {
            Some(w) if is_fanout(w) => rest.collect(),
            Some(w) if w == "cargo" && piece.iter().any(|w| w == "fanout-origin") => {
                match piece.iter().position(|w| w == "--") {
                    Some(i) if piece.iter().any(|w| w == "run") => piece[i + 1..].iter().collect(),
                    _ => continue,
                }
            }
            _ => continue,
        };
        let redirect = |w: &str| w.starts_with('>') || w.starts_with('<') || w.starts_with("2>");
        out.push(
            args.into_iter()
                .take_while(|w| !redirect(w) && !w.starts_with('#') && *w != ")")
                .cloned()
                .collect(),
        );
    }
    out
}

/// Every `fanout` command line of a Markdown document: the lines of `sh`/`bash`/`shell`/
/// `console` code blocks (a trailing `\` joins the next line) and the inline code spans that
/// start with `fanout `.
fn shown_commands(text: &str) -> Vec<Shown> {
    let mut out = Vec::new();
    let mut fence: Option<bool> = None; // Some(checked?) inside a block
    let mut prose = String::new(); // the text outside blocks, one line per line
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fence = match fence {
                None => {
                    let lang = trimmed.trim_start_matches('`').trim();
                    Some(matches!(lang, "sh" | "bash" | "shell" | "console"))
                }
                Some(_) => None,
            };
            prose.push('\n');
            continue;
        }
        match fence {
            Some(true) => {
                let body = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
                let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
                if let Some(head) = body.strip_suffix('\\') {
                    joined.push_str(head);
                    joined.push(' ');
                    pending = Some((start, joined));
                } else {
                    joined.push_str(body);
                    for words in fanout_commands(&joined) {
                        out.push(Shown { line: start, words });
                    }
                }
                prose.push('\n');
            }
            Some(false) => prose.push('\n'),
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    // Inline code: the odd pieces between backticks (a span may wrap onto the next line).
    let mut line = 1;
    for (k, piece) in prose.split('`').enumerate() {
        if k % 2 == 1 {
            let span = piece.replace('\n', " ");
            if span.trim().starts_with("fanout ") {
                for words in fanout_commands(span.trim()) {
                    out.push(Shown { line, words });
                }
            }
        }
        line += piece.matches('\n').count();
    }
    out.sort_by_key(|s| s.line);
    out
}

/// What is wrong with one command line, checked against `cli` (built, so that `--help` and the
/// global flags are on every subcommand); None when clap knows every subcommand and flag.
fn check_words(cli: &clap::Command, words: &[String]) -> Option<String> {
    let mut cmd = cli;
    let mut path = vec!["fanout".to_string()];
    let mut i = 0;
    while i < words.len() {
        let w = words[i].trim_matches(|c| c == '[' || c == ']');
        i += 1;
        // Nothing, an ellipsis, stdin, or a placeholder (`<command>`, `ID`, `URL`).
        let placeholder = w.starts_with('<')
            || (!w.starts_with('-')
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == '-'));
        if w.is_empty() || w == "…" || w == "..." || w == "-" || placeholder {
            continue;
        }
        if let Some(long) = w.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            let Some(arg) = cmd.get_arguments().find(|a| {
                a.get_long() == Some(name)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&name))
            }) else {
                return Some(format!("`{}` has no flag --{name}", path.join(" ")));
            };
            if !inline
                && arg.get_action().takes_values()
                && arg.get_num_args().is_none_or(|n| n.min_values() > 0)
            {
                i += 1; // its value
            }
            continue;
        }
        if let Some(short) = w.strip_prefix('-').filter(|s| s.chars().count() == 1) {
            let c = short.chars().next().expect("one character");
            let Some(arg) = cmd.get_arguments().find(|a| a.get_short() == Some(c)) else {
                return Some(format!("`{}` has no flag -{c}", path.join(" ")));
            };
            if arg.get_action().takes_values() {
                i += 1;
            }
            continue;
        }
        if cmd.has_subcommands() {
            let alternatives: Vec<&str> = w.split('|').collect();
            for a in &alternatives {
                if cmd.find_subcommand(a).is_none() {
                    return Some(format!("`{}` has no subcommand {a}", path.join(" ")));
                }
            }
            if alternatives.len() > 1 {
                return None; // several subcommands at once: nothing after them is one command
            }
            cmd = cmd.find_subcommand(w).expect("checked above");
            path.push(w.to_string());
            continue;
        }
        // A positional argument (an id, a URL, a placeholder).
    }
    None
}

fn problems_in(docs: &[(String, String)]) -> Vec<String> {
    let mut cli = fanout_origin::cli::Cli::command();
    cli.build();
    let mut out = Vec::new();
    for (path, text) in docs {
        for shown in shown_commands(text) {
            if let Some(p) = check_words(&cli, &shown.words) {
                out.push(format!(
                    "{path}:{}: fanout {}: {p}",
                    shown.line,
                    shown.words.join(" ")
                ));
            }
        }
    }
    out
}

#[test]
fn every_command_the_docs_show_is_the_binarys() {
    let docs = documents();
    let shown: usize = docs.iter().map(|(_, t)| shown_commands(t).len()).sum();
    assert!(
        shown > 50,
        "found only {shown} fanout commands in the docs: is the parser blind?"
    );
    let problems = problems_in(&docs);
    println!("{shown} fanout command lines checked");
    assert!(
        problems.is_empty(),
        "the docs show fanout commands the binary does not have:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_check_catches_a_wrong_flag_and_a_wrong_subcommand() {
    let doc = [
        "Run `fanout subscriber add ID URL --lane edge`, then `fanout status --json`.",
        "```sh",
        "export FANOUT_API_TOKEN=x",
        "fanout subscriber add sub_1 https://a.example/h -t 'video.*' \\",
        "  --rate-per-sec 10 --burst-size 20     # a flag that does not exist",
        "fanout deliveries --status dead | jq .  # fine: the pipe ends the command",
        "podman run --name fanout -p 8080:8080 img  # fanout is a value here, not the command",
        "echo '{}' | FANOUT_SERVER=x fanout sned",
        "cargo run -q --release -p fanout-origin -- listn",
        "```",
        "```",
        "fanout listen: output, not a command --nope",
        "```",
        "And `fanout customer list|show|forget` wraps",
        "",
        "`fanout subscriber",
        "add --no-such-flag`.",
    ]
    .join("\n");
    let found = problems_in(&[("doc.md".to_string(), doc)]);
    assert_eq!(
        found,
        [
            "doc.md:4: fanout subscriber add sub_1 https://a.example/h -t video.* --rate-per-sec 10 --burst-size 20: `fanout subscriber add` has no flag --burst-size",
            "doc.md:8: fanout sned: `fanout` has no subcommand sned",
            "doc.md:9: fanout listn: `fanout` has no subcommand listn",
            "doc.md:14: fanout customer list|show|forget: `fanout customer` has no subcommand forget",
            "doc.md:16: fanout subscriber add --no-such-flag: `fanout subscriber add` has no flag --no-such-flag",
        ]
    );
}

/// The flags of `cmd` and its subcommands that `book` never names as `--flag`, and the
/// subcommands it never shows as `fanout a b`; hidden ones are not the user's.
fn undocumented(cmd: &clap::Command, path: &str, book: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !path.is_empty() && !book.contains(&format!("fanout {path}")) {
        out.push(format!("fanout {path}"));
    }
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        let shown = format!("--{long}");
        let named = book.match_indices(&shown).any(|(i, _)| {
            !book[i + shown.len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
        if !named {
            out.push(format!("fanout {path} {shown}").replace("  ", " "));
        }
    }
    // clap's own `help` subcommand is not the user's to look up.
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let sub_path = format!("{path} {}", sub.get_name()).trim().to_string();
        out.extend(undocumented(sub, &sub_path, book));
    }
    out
}

#[test]
fn every_subcommand_and_flag_is_in_the_manual() {
    let book: String = documents()
        .into_iter()
        .filter(|(p, _)| p.starts_with("docs/src/"))
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join("\n");
    let mut cli = fanout_origin::cli::Cli::command();
    cli.build();
    let missing = undocumented(&cli, "", &book);
    assert!(
        missing.is_empty(),
        "the manual (docs/src) never names these (the CLI reference is docs/src/cli.md, serve's \
         flags docs/src/operating.md):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_completeness_check_catches_an_undocumented_flag_and_subcommand() {
    let cmd = clap::Command::new("fanout")
        .subcommand(
            clap::Command::new("status")
                .arg(
                    clap::Arg::new("json")
                        .long("json")
                        .action(clap::ArgAction::SetTrue),
                )
                .arg(
                    clap::Arg::new("jsonl")
                        .long("jsonl")
                        .action(clap::ArgAction::SetTrue),
                ),
        )
        .subcommand(clap::Command::new("purge"))
        .subcommand(clap::Command::new("reaper").hide(true));
    let book = "Run `fanout status --json` (not --jsonl-ish).";
    assert_eq!(
        undocumented(&cmd, "", book),
        ["fanout status --jsonl", "fanout purge"]
    );
}
