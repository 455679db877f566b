//! The guide's shell transcripts, run: every ```console block of `docs/guide/src/*.md` (a
//! `$ command` line, then what it prints) is replayed against the real `outbox` binary on a
//! scratch SQLite database, and what each command prints must be what the guide shows.
//!
//! A block starts from a state the guide describes in prose (dead tasks, nodes, a crontab
//! file); the setup below builds it with the binary's own commands where they can, and with an
//! `INSERT` where only a running fleet could (live nodes), so the guide shows the commands a
//! reader types and nothing of the scaffolding. A live node is an `async_node` row whose
//! heartbeat was just written and whose `domains` column holds what a node publishes
//! (`outbox::domain::NodeDomains`); where the guide's story has the nodes apply a change
//! between two commands, their next heartbeat is an `UPDATE` of that column between them. A
//! schedule is its row of `async_schedule` and its last tick's task. Every console block must
//! have a setup here: one that has none fails the test, so a new transcript is checked.
//!
//! Comparison is line by line after [`normalise`], which stands in for what changes from run
//! to run: timestamps, ages and durations, `user@host` actors and `host:pid` node names, and
//! the width of the columns (runs of blanks count as one). Everything else — ids, states,
//! counts, messages, exit codes (`$ echo $?`) — must match.
//!
//! (trycmd would run `.md` files too, but gives no hidden setup and shows `? 2` for an exit
//! status; this keeps the guide a transcript a reader would see.)

use std::path::Path;

use serde_json::{json, Value};

use crate::binary::{outbox, outbox_on, run, workdir};
use crate::support::TestDb;

/// The guide's chapters, by file name (the same files the doctests include).
const GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide/src");

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

/// The state a transcript starts from: where its commands run, and SQL run on the scratch
/// database after some of its steps (by index: the live nodes' next heartbeat).
struct Setup {
    database: Database,
    after: Vec<(usize, String)>,
}

/// One domain as a node publishes it (`outbox::domain::DomainUse`), its slot use given as
/// `[reserved, borrowed, running, queued]` (none stuck); each node's queue is 64.
fn domain_use(
    domain: &str,
    mode: &str,
    keywords: &[&str],
    threads: usize,
    used: [usize; 4],
) -> Value {
    let [reserved, borrowed, running, queued] = used;
    json!({
        "domain": domain, "mode": mode, "keywords": keywords, "threads": threads,
        "reserved": reserved, "borrowed": borrowed, "running": running, "queued": queued,
        "stuck": 0, "queue": 64, "timeout_ms": 30_000, "paused": false, "released": false,
    })
}

/// The SQLite clock's now, as the engine writes times.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

/// A live node: alive, its heartbeat just written, publishing `domains` on `threads` threads.
fn live_node(db: &TestDb, name: &str, threads: usize, domains: &[Value]) {
    let published = json!({"threads": threads, "domains": domains});
    db.exec(&format!(
        "INSERT INTO async_node (name, heartbeat_at, state, domains) \
         VALUES ('{name}', {NOW}, 'alive', '{published}')"
    ));
}

/// The node `name`'s next heartbeat, publishing `domains` on `threads` threads.
fn heartbeat(name: &str, threads: usize, domains: &[Value]) -> String {
    let published = json!({"threads": threads, "domains": domains});
    format!(
        "UPDATE async_node SET heartbeat_at = {NOW}, domains = '{published}' WHERE name = '{name}'"
    )
}

/// The three nodes of 8 threads that run `payments` (`RESERVED 4`, its row set as the guide
/// sets it), idle.
fn payments_fleet(db: &TestDb, command: &dyn Fn(&[&str])) {
    for name in ["app-1:4711", "app-2:4711", "app-3:4711"] {
        live_node(
            db,
            name,
            8,
            &[
                domain_use("default", "max", &["mail.send", "points.credit"], 4, [0; 4]),
                domain_use(
                    "payments",
                    "reserved",
                    &["payment.capture"],
                    4,
                    [4, 0, 0, 0],
                ),
            ],
        );
    }
    command(&[
        "domain",
        "set",
        "payments",
        "--keywords",
        "payment.capture",
        "--reserved",
        "4",
    ]);
}

/// Builds the state a transcript starts from, in `dir` and `db`; `None` for a transcript this
/// test does not know.
fn set_up(transcript: &Transcript, db: &TestDb, dir: &Path) -> Option<Setup> {
    let command = |args: &[&str]| {
        run(outbox_on(db, dir).args(args)).expect_code(0);
    };
    let mut after = Vec::new();
    match (transcript.chapter.as_str(), transcript.first_command()) {
        // "its third line reads: 0 0 25 * * * report.daily"
        ("cron.md", "outbox run --crontab jobs.cron") => std::fs::write(
            dir.join("jobs.cron"),
            "# sec min hour dom mon dow keyword\n0 0 3 * * * points.credit\n0 0 25 * * * report.daily\n",
        )
        .expect("write jobs.cron"),
        // Two schedules a node of another program ran (this one has no handler for their
        // keywords): each row with its last tick, and that tick's task, done.
        ("cron.md", "outbox schedules") => {
            for (id, keyword, expression, tick) in [
                (6, "metrics.flush", "0/10 * * * * ?", "2026-11-24 14:35:20.000"),
                (7, "report.daily", "0 0 3 * * *", "2026-11-24 03:00:00.000"),
            ] {
                db.exec(&format!(
                    "INSERT INTO async_schedule (keyword, expression, since, last_tick, updated_at, updated_by) \
                     VALUES ('{keyword}', '{expression}', '2026-11-20 09:12:44.108', '{tick}', '{tick}', 'app-1:4711')"
                ));
                let biz_id = format!("cron:{}Z", tick[..19].replace(' ', "T"));
                db.exec(&format!(
                    "INSERT INTO async_task (id, keyword, biz_id, state, created_at, run_at, finished_at) \
                     VALUES ({id}, '{keyword}', '{biz_id}', 'done', '{tick}', '{tick}', '{tick}')"
                ));
            }
        }
        // "demo creates outbox.db (SQLite) in the working directory"
        ("getting-started.md", "outbox demo") => {
            return Some(Setup {
                database: Database::Default,
                after,
            })
        }
        // Three live nodes of 8 threads that run payment.capture under default; once the row
        // is set, their next heartbeat publishes payments as they run it under load.
        ("domains.md", "outbox domain set payments --keywords payment.capture --reserved 4") => {
            let nodes = [
                ("app-1:4711", [3, 2], [4, 1, 5, 1]),
                ("app-2:4711", [3, 1], [4, 1, 5, 1]),
                ("app-3:4711", [3, 1], [4, 0, 4, 1]),
            ];
            for (name, _, _) in nodes {
                let keywords = ["mail.send", "payment.capture", "points.credit"];
                live_node(db, name, 8, &[domain_use("default", "max", &keywords, 8, [0; 4])]);
            }
            for (name, [running, queued], payments) in nodes {
                let domains = [
                    domain_use("default", "max", &["mail.send", "points.credit"], 4, [0, 0, running, queued]),
                    domain_use("payments", "reserved", &["payment.capture"], 4, payments),
                ];
                after.push((0, heartbeat(name, 8, &domains)));
            }
        }
        // Node 1 is gone; nodes 2 and 3 have 16 threads, node 4 (app-2:4711) 8.
        ("domains.md", "outbox domain set payments --reserved 8") => {
            db.exec("INSERT INTO async_node (name, state) VALUES ('app-2:4690', 'gone')");
            for (name, threads) in [("app-1:4711", 16), ("app-3:4711", 16), ("app-2:4711", 8)] {
                let domains = [
                    domain_use("default", "max", &["mail.send", "points.credit"], threads - 4, [0; 4]),
                    domain_use("payments", "reserved", &["payment.capture"], 4, [4, 0, 0, 0]),
                ];
                live_node(db, name, threads, &domains);
            }
            command(&["domain", "set", "payments", "--keywords", "payment.capture", "--reserved", "4"]);
        }
        ("domains.md", "outbox domain release payments") => payments_fleet(db, &command),
        // Five live nodes: two run `slow` (report.build), three have no such domain.
        ("domains.md", "outbox pause slow") => {
            for name in ["app-1:4711", "app-2:4711"] {
                let domains = [
                    domain_use("default", "max", &["mail.send", "points.credit"], 8, [0; 4]),
                    domain_use("slow", "max", &["report.build"], 2, [0; 4]),
                ];
                live_node(db, name, 8, &domains);
            }
            for name in ["app-3:4711", "app-4:4711", "app-5:4711"] {
                let keywords = ["mail.send", "points.credit", "report.build"];
                live_node(db, name, 8, &[domain_use("default", "max", &keywords, 8, [0; 4])]);
            }
        }
        // Three live nodes that run mail.send in their domain `mail`.
        ("domains.md", "outbox pause mail.send") => {
            for name in ["app-1:4711", "app-2:4711", "app-3:4711"] {
                let domains = [
                    domain_use("default", "max", &["points.credit"], 8, [0; 4]),
                    domain_use("mail", "max", &["mail.send"], 2, [0; 4]),
                ];
                live_node(db, name, 8, &domains);
            }
        }
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
    Some(Setup {
        database: Database::Scratch,
        after,
    })
}

#[test]
fn the_guides_console_transcripts_are_what_the_binary_prints() {
    let transcripts = transcripts();
    assert!(!transcripts.is_empty(), "no console block in {GUIDE}");
    let mut problems = Vec::new();
    let mut replayed = 0;
    for transcript in &transcripts {
        let key = (transcript.chapter.as_str(), transcript.first_command());
        let db = TestDb::sqlite();
        let dir = workdir();
        let Some(Setup { database, after }) = set_up(transcript, &db, dir.path()) else {
            problems.push(format!(
                "{}: the console block `$ {}` has no setup here",
                key.0, key.1
            ));
            continue;
        };
        let mut last_status = 0;
        for (step, (command, expected)) in transcript.steps.iter().enumerate() {
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
            for (_, sql) in after.iter().filter(|(at, _)| *at == step) {
                db.exec(sql);
            }
        }
        replayed += 1;
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
