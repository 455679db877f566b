//! The guide's shell transcripts, run: every ```console block of `docs/guide/src/*.md` (a
//! `$ command` line, then what it prints) is replayed against the real `outbox` binary on a
//! scratch SQLite database, and what each command prints must be what the guide shows.
//!
//! A block starts from a state the guide describes in prose (dead tasks, nodes, a crontab
//! file); the setup below builds it with the binary's own commands where they can, and with an
//! `INSERT` where only a running fleet could (live nodes), so the guide shows the commands a
//! reader types and nothing of the scaffolding. Blocks that need what one test cannot make
//! (several live workers under load, keywords this binary has no handler for) are listed in
//! `NOT_REPLAYED` with the reason; a console block that is neither replayed nor listed fails
//! the test, so a new transcript is checked or consciously left out.
//!
//! Comparison is line by line after [`normalise`], which stands in for what changes from run
//! to run: timestamps, ages and durations, `user@host` actors and `host:pid` node names, and
//! the width of the columns (runs of blanks count as one). Everything else — ids, states,
//! counts, messages, exit codes (`$ echo $?`) — must match.
//!
//! (trycmd would run `.md` files too, but gives no hidden setup and shows `? 2` for an exit
//! status; this keeps the guide a transcript a reader would see.)

use std::path::Path;

use crate::binary::{outbox, outbox_on, run, workdir};
use crate::support::TestDb;

/// The guide's chapters, by file name (the same files the doctests include).
const GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide/src");

/// Console blocks not replayed, by chapter and first command, and why.
const NOT_REPLAYED: &[(&str, &str, &str)] = &[
    (
        "cron.md",
        "outbox schedules",
        "its schedules (metrics.flush, report.daily) are keywords this binary has no handler for",
    ),
    (
        "domains.md",
        "outbox domain set payments --keywords payment.capture --reserved 4",
        "the slot use of three live nodes under load",
    ),
    (
        "domains.md",
        "outbox domain set payments --reserved 8",
        "a live node of 8 threads",
    ),
    (
        "domains.md",
        "outbox domain release payments",
        "three live nodes",
    ),
    ("domains.md", "outbox pause slow", "five live nodes"),
    ("domains.md", "outbox pause mail.send", "three live nodes"),
];

/// One ```console block: its chapter and its `$` commands, each with the lines it prints.
#[derive(Debug)]
struct Transcript {
    chapter: String,
    steps: Vec<(String, Vec<String>)>,
}

impl Transcript {
    fn first_command(&self) -> &str {
        self.steps.first().map_or("", |(command, _)| command)
    }
}

/// Every ```console block of the guide.
fn transcripts() -> Vec<Transcript> {
    let mut chapters: Vec<_> = std::fs::read_dir(GUIDE)
        .expect("read the guide's directory")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    chapters.sort();
    let mut out = Vec::new();
    for path in chapters {
        let text = std::fs::read_to_string(&path).expect("read a chapter");
        let chapter = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```console" {
                continue;
            }
            let mut steps: Vec<(String, Vec<String>)> = Vec::new();
            for line in lines.by_ref() {
                if line.trim_start().starts_with("```") {
                    break;
                }
                match line.strip_prefix("$ ") {
                    Some(command) => steps.push((without_comment(command), Vec::new())),
                    None => steps
                        .last_mut()
                        .unwrap_or_else(|| panic!("{chapter}: a console block not opened by `$ `"))
                        .1
                        .push(line.to_owned()),
                }
            }
            out.push(Transcript {
                chapter: chapter.clone(),
                steps,
            });
        }
    }
    out
}

/// A command without its trailing `# comment` (written after two blanks or more).
fn without_comment(command: &str) -> String {
    match command.find("  #") {
        Some(at) => command[..at].trim_end().to_owned(),
        None => command.trim_end().to_owned(),
    }
}

/// A command line's words, with '…' and "…" quoting as a shell reads them.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = None::<String>;
    let mut quote = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The text with what varies between runs replaced: see the module's comment.
fn normalise(line: &str) -> String {
    let is_word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        // 2026-11-24T15:19:35.948Z
        let rest: String = chars[i..].iter().take(11).collect();
        let timestamp = rest.len() == 11
            && rest.char_indices().all(|(k, c)| match k {
                4 | 7 => c == '-',
                10 => c == 'T',
                _ => c.is_ascii_digit(),
            });
        if timestamp {
            let end = chars[i..]
                .iter()
                .position(|&c| c == 'Z')
                .map_or(chars.len(), |p| i + p + 1);
            out.push_str("<time>");
            i = end;
            continue;
        }
        // A word: a duration, an actor, a node name, or itself.
        if is_word(chars[i]) || chars[i] == '@' || chars[i] == ':' {
            let start = i;
            while i < chars.len()
                && (is_word(chars[i])
                    || (chars[i] == '@' && i + 1 < chars.len() && is_word(chars[i + 1]))
                    || (chars[i] == ':'
                        && i + 1 < chars.len()
                        && chars[i + 1].is_ascii_digit()
                        && chars[start].is_ascii_alphabetic()))
            {
                i += 1;
            }
            if i == start {
                out.push(chars[i]);
                i += 1;
                continue;
            }
            let word: String = chars[start..i].iter().collect();
            // What follows, its blanks as normalised (the demo pads its numbers).
            let rest = chars[i..].iter().collect::<String>();
            let rest = format!(" {}", rest.split_whitespace().collect::<Vec<_>>().join(" "));
            let number = word.parse::<f64>().is_ok();
            out.push_str(if number && rest.starts_with(" tasks/s") {
                "<rate>"
            } else if number && VARYING_COUNTS.iter().any(|after| rest.starts_with(after)) {
                "<count>"
            } else if is_duration(&word) {
                "<duration>"
            } else if word.contains('@') {
                "<actor>"
            } else if word.contains(':') {
                "<node>"
            } else {
                &word
            });
            continue;
        }
        if chars[i].is_whitespace() {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            out.push(' ');
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out.trim().to_owned()
}

/// What follows a count that depends on the threads' timing (the demo's CallerRuns counts).
const VARYING_COUNTS: &[&str] = &[
    " tasks itself when the pool was full",
    " tasks queued while it waited",
];

/// `2s`, `12m03s`, `6h05m`, `0.06s`, `11ms`.
fn is_duration(word: &str) -> bool {
    let mut rest = word;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d"]
            .into_iter()
            .find(|unit| rest.starts_with(unit));
        let Some(unit) = unit else { return false };
        rest = &rest[unit.len()..];
        parts += 1;
    }
    parts > 0
}

/// Where a transcript's commands run.
enum Database {
    /// The scratch database, named by `DATABASE_URL`.
    Scratch,
    /// No `DATABASE_URL`: the default, `outbox.db` in the working directory.
    Default,
}

/// Builds the state a transcript starts from, in `dir` and `db`; `None` for a transcript this
/// test does not know.
fn set_up(transcript: &Transcript, db: &TestDb, dir: &Path) -> Option<Database> {
    let command = |args: &[&str]| {
        run(outbox_on(db, dir).args(args)).expect_code(0);
    };
    match (transcript.chapter.as_str(), transcript.first_command()) {
        // "its third line reads: 0 0 25 * * * report.daily"
        ("cron.md", "outbox run --crontab jobs.cron") => std::fs::write(
            dir.join("jobs.cron"),
            "# sec min hour dom mon dow keyword\n0 0 3 * * * points.credit\n0 0 25 * * * report.daily\n",
        )
        .expect("write jobs.cron"),
        // "demo creates outbox.db (SQLite) in the working directory"
        ("getting-started.md", "outbox demo") => return Some(Database::Default),
        // Two orders whose biz_id the handler refuses (dead at once), a coupon chained after
        // the first (cancelled with it), a task no handler serves; one drain, then two nodes
        // that are live (heartbeats just written) besides the drain's, gone.
        ("operator-commands.md", "outbox list") => {
            let order = r#"{"user_id":7,"amount_cents":12000}"#;
            for (biz_id, tenant) in [("A-17", "shop-eu"), ("A-18", "shop-us")] {
                let args = ["enqueue", "points.credit", biz_id, "--data", order, "--tenant", tenant];
                command(&args);
            }
            command(&[
                "enqueue",
                "coupon.grant",
                "A-17",
                "--after",
                "1",
                "--data",
                r#"{"coupon":"WELCOME","user_id":7}"#,
            ]);
            command(&["enqueue", "mail.send", "1001", "--tenant", "shop-eu"]);
            command(&["drain"]);
            db.exec("INSERT INTO async_node (name) VALUES ('web-1:40022')");
            db.exec("INSERT INTO async_node (name) VALUES ('web-2:41187')");
        }
        _ => return None,
    }
    Some(Database::Scratch)
}

#[test]
fn the_guides_console_transcripts_are_what_the_binary_prints() {
    let transcripts = transcripts();
    assert!(!transcripts.is_empty(), "no console block in {GUIDE}");
    let mut problems = Vec::new();
    let mut replayed = 0;
    for transcript in &transcripts {
        let key = (transcript.chapter.as_str(), transcript.first_command());
        if NOT_REPLAYED.iter().any(|&(c, f, _)| (c, f) == key) {
            continue;
        }
        let db = TestDb::sqlite();
        let dir = workdir();
        let Some(database) = set_up(transcript, &db, dir.path()) else {
            problems.push(format!(
                "{}: the console block `$ {}` has no setup here and is not in NOT_REPLAYED",
                key.0, key.1
            ));
            continue;
        };
        let mut last_status = 0;
        for (command, expected) in &transcript.steps {
            let actual: Vec<String> = if command == "echo $?" {
                vec![last_status.to_string()]
            } else {
                let words = words(command);
                assert_eq!(words[0], "outbox", "{}: `$ {command}`", transcript.chapter);
                let mut cmd = match database {
                    Database::Scratch => outbox_on(&db, dir.path()),
                    Database::Default => outbox(dir.path()),
                };
                let out = cmd
                    .env("USER", "alice")
                    .args(&words[1..])
                    .output()
                    .unwrap_or_else(|e| panic!("cannot run `{command}`: {e}"));
                last_status = out.status.code().unwrap_or(-1);
                let text = String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr);
                text.lines().map(str::to_owned).collect()
            };
            let want: Vec<String> = expected.iter().map(|l| normalise(l)).collect();
            let got: Vec<String> = actual.iter().map(|l| normalise(l)).collect();
            if want != got {
                let at = (0..want.len().max(got.len()))
                    .find(|&n| want.get(n) != got.get(n))
                    .unwrap_or(0);
                problems.push(format!(
                    "{}: `$ {command}` prints\n{}\n  where the guide shows\n{}\n  \
                     (line {}, normalised: {:?} where the guide has {:?})",
                    transcript.chapter,
                    actual.join("\n"),
                    expected.join("\n"),
                    at + 1,
                    got.get(at),
                    want.get(at)
                ));
            }
        }
        replayed += 1;
    }
    for (chapter, first, _) in NOT_REPLAYED {
        if !transcripts
            .iter()
            .any(|t| (t.chapter.as_str(), t.first_command()) == (*chapter, *first))
        {
            problems.push(format!(
                "NOT_REPLAYED names `$ {first}` in {chapter}, which has no such block"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of the guide's console transcripts differ from the binary:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
    assert!(replayed >= 3, "only {replayed} transcripts replayed");
}

#[test]
fn normalising_keeps_what_matters() {
    assert_eq!(
        normalise("ran 16 tasks itself when the pool was full (CallerRuns) and 0 tasks queued while it waited"),
        "ran <count> tasks itself when the pool was full (CallerRuns) and <count> tasks queued while it waited"
    );
    assert_eq!(
        normalise("placed 1000 orders in 0.06s, each"),
        "placed 1000 orders in <duration>, each"
    );
    assert_eq!(
        normalise(" 1  dead   points.credit  A-17    shop-eu         1  12m  biz_id is bad"),
        "1 dead points.credit A-17 shop-eu 1 <duration> biz_id is bad"
    );
    assert_eq!(
        normalise("created_at   2026-11-24T15:19:35.948Z (12m03s ago)"),
        "created_at <time> (<duration> ago)"
    );
    assert_eq!(
        normalise(r#"{"at":"2026-11-24T15:31:40.112Z","actor":"alice@ops1","id":2}"#),
        r#"{"at":"<time>","actor":"<actor>","id":2}"#
    );
    assert_eq!(
        normalise(" 3  web-2:41187  live  2s"),
        "3 <node> live <duration>"
    );
    assert_eq!(
        normalise("in 0.10s (19641 tasks/s): 2000 done"),
        "in <duration> (<rate> tasks/s): 2000 done"
    );
    assert_eq!(
        normalise("crontab jobs.cron line 3: cron"),
        "crontab jobs.cron line 3: cron"
    );
    assert_eq!(
        words(r#"outbox enqueue k 1 --data '{"a": 1}'"#)[5],
        r#"{"a": 1}"#
    );
}
