//! The configuration reference (docs/guide/src/configuration.md) against the command line
//! itself: its tables are written by hand, for the prose, and this test keeps them from
//! drifting from clap's definition of every command.
//!
//! - Every command (`outbox domain set`, …) has a row in the commands table, and every long
//!   flag it takes is named in that row, or, for the commands that run tasks (`drain`, `run`,
//!   `demo`: a superset of `drain`'s flags), in the worker options table.
//! - Every flag a row names exists on that command; every flag of the worker options table
//!   exists on `run`.
//! - A flag with a default in clap (`default_value`) shows that default in its row.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;

use super::Cli;

const CHAPTER: &str = include_str!("../../../docs/guide/src/configuration.md");

/// Flags every command has, or that the chapter's opening paragraphs document.
const EVERYWHERE: &[&str] = &["help", "version", "database-url"];

/// A command's long flags, with clap's default value when it has one.
type Flags = BTreeMap<String, Option<String>>;

/// Every command that has no subcommands of its own, by its path (`domain set`), with its flags.
fn commands() -> BTreeMap<String, Flags> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, Flags>) {
        let subcommands: Vec<_> = cmd
            .get_subcommands()
            .filter(|sub| sub.get_name() != "help")
            .collect();
        if subcommands.is_empty() {
            let flags = cmd
                .get_arguments()
                .filter(|arg| !arg.is_hide_set())
                .filter_map(|arg| {
                    let long = arg.get_long()?;
                    // A switch's `false` is no default worth writing down.
                    let default = arg.get_default_values();
                    let takes_value = arg.get_action().takes_values();
                    let default = (takes_value && !default.is_empty()).then(|| {
                        default
                            .iter()
                            .map(|v| v.to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .join(",")
                    });
                    Some((long.to_owned(), default))
                })
                .filter(|(long, _)| !EVERYWHERE.contains(&long.as_str()))
                .collect();
            out.insert(path.to_owned(), flags);
        }
        for sub in subcommands {
            let path = format!("{path} {}", sub.get_name()).trim().to_owned();
            walk(sub, &path, out);
        }
    }
    let mut cli = Cli::command();
    cli.build();
    let mut out = BTreeMap::new();
    walk(&cli, "", &mut out);
    out
}

/// The rows of the chapter's table whose header starts with `header`: each row's cells.
fn table(header: &str) -> Vec<Vec<String>> {
    let mut lines = CHAPTER.lines().skip_while(|line| !line.starts_with(header));
    assert!(
        lines.next().is_some(),
        "configuration.md: no table `{header}`"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            // `\|` inside a cell is a literal bar, not a column.
            let line = line.replace("\\|", "\u{1}");
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.replace('\u{1}', "|").trim().to_owned())
                .collect()
        })
        .collect()
}

/// The `--flags` named in `text`.
fn flags_in(text: &str) -> BTreeSet<String> {
    text.split("--")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect::<String>()
        })
        .filter(|flag| !flag.is_empty())
        .collect()
}

/// Whether `text` contains `word` with no letter, digit or `-` next to it.
fn has_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || c == '-' || c == '_' || c == '.';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(part) && !after.is_some_and(part)
    })
}

/// The commands a cell of the commands table names, each with the flags it is shown with: a
/// code span `outbox a b …` names the longest command path its words spell and gives it the
/// span's flags; the flags of a span that names no command (`[--json]` after several) go to
/// every command of the cell.
fn commands_named(cell: &str, known: &BTreeMap<String, Flags>) -> Vec<(String, BTreeSet<String>)> {
    let mut named = Vec::new();
    let mut shared = BTreeSet::new();
    for span in cell.split('`').skip(1).step_by(2) {
        let path = span.strip_prefix("outbox ").and_then(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            (1..=words.len())
                .rev()
                .map(|n| words[..n].join(" "))
                .find(|path| known.contains_key(path))
        });
        match path {
            Some(path) => named.push((path, flags_in(span))),
            None => shared.extend(flags_in(span)),
        }
    }
    for (_, flags) in &mut named {
        flags.extend(shared.iter().cloned());
    }
    named
}

#[test]
fn configuration_reference_matches_the_command_line() {
    let commands = commands();
    let drain: BTreeSet<String> = commands["drain"].keys().cloned().collect();
    let worker_options: Flags = commands["run"]
        .iter()
        .filter(|(flag, _)| *flag != "json")
        .map(|(flag, default)| (flag.clone(), default.clone()))
        .collect();
    let mut problems = Vec::new();

    // The commands table: one or more rows per command, its flags in the first cell.
    let mut documented: BTreeMap<String, (BTreeSet<String>, String)> = BTreeMap::new();
    for row in table("| command |") {
        let named = commands_named(&row[0], &commands);
        if named.is_empty() {
            problems.push(format!("commands table: row `{}` names no command", row[0]));
        }
        for (path, flags) in named {
            let entry = documented.entry(path).or_default();
            entry.0.extend(flags);
            entry.1.push_str(&row.join(" "));
        }
    }
    for (path, flags) in &commands {
        let Some((named, row)) = documented.get(path) else {
            problems.push(format!("`outbox {path}` has no row in the commands table"));
            continue;
        };
        let runs_tasks = drain.iter().all(|flag| flags.contains_key(flag));
        for (flag, default) in flags {
            if runs_tasks && worker_options.contains_key(flag) && flag != "json" {
                continue; // the worker options table's, checked below
            }
            if !named.contains(flag) {
                problems.push(format!("`outbox {path} --{flag}` is not in its row"));
            } else if let Some(default) = default {
                if !has_word(row, default) {
                    problems.push(format!(
                        "`outbox {path} --{flag}`: its row does not show its default `{default}`"
                    ));
                }
            }
        }
        for flag in named {
            if !flags.contains_key(flag) && !EVERYWHERE.contains(&flag.as_str()) {
                problems.push(format!(
                    "the row of `outbox {path}` names --{flag}, which it has not"
                ));
            }
        }
    }

    // The worker options table: the flags of `drain` and `run` (`run`'s own marked so).
    let mut in_table = BTreeSet::new();
    for row in table("| option |") {
        let flags = flags_in(&row[0]);
        for flag in &flags {
            match worker_options.get(flag) {
                None => problems.push(format!("worker options: --{flag} is not a flag of `run`")),
                Some(Some(default)) if !has_word(&row[1], default) => problems.push(format!(
                    "worker options: --{flag}'s default `{default}` is not in `{}`",
                    row[1]
                )),
                Some(_) => {}
            }
        }
        in_table.extend(flags);
    }
    for flag in worker_options.keys() {
        if !in_table.contains(flag) {
            problems.push(format!(
                "worker option --{flag} is not in the worker options table"
            ));
        }
    }
    if !has_word(CHAPTER, "--database-url") {
        problems.push("--database-url is not in the chapter".to_owned());
    }

    assert!(
        problems.is_empty(),
        "docs/guide/src/configuration.md has drifted from the command line:\n  {}",
        problems.join("\n  ")
    );
}
