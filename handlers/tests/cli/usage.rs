//! Usage: help, version, bad flags (no database is touched); unreachable or unsupported
//! databases.

use crate::binary::{entries, outbox, run, workdir, DATABASE_COMMANDS, DOWN_PG_URL};

const SUBCOMMANDS: [&str; 8] = [
    "migrate", "enqueue", "drain", "run", "stats", "demo", "prune", "bench",
];

#[test]
fn top_level_help_lists_every_subcommand() {
    let dir = workdir();
    let out = run(outbox(dir.path()).arg("--help")).expect_code(0);
    out.stdout_has("Usage: outbox").stdout_has("--database-url");
    for sub in SUBCOMMANDS {
        assert!(
            out.stdout.lines().any(|l| l.trim_start().starts_with(sub)),
            "--help does not list {sub}:\n{}",
            out.stdout
        );
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "--help touched a database"
    );
}

#[test]
fn every_subcommand_has_help() {
    let dir = workdir();
    for sub in SUBCOMMANDS {
        run(outbox(dir.path()).args([sub, "--help"]))
            .expect_code(0)
            .stdout_has(&format!("Usage: outbox {sub}"));
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "--help touched a database"
    );
}

#[test]
fn version_prints_the_package_version() {
    let dir = workdir();
    run(outbox(dir.path()).arg("--version"))
        .expect_code(0)
        .stdout_has(&format!("outbox {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn unknown_flags_exit_2() {
    let dir = workdir();
    run(outbox(dir.path()).arg("--frobnicate"))
        .expect_code(2)
        .stderr_has("--frobnicate");
    run(outbox(dir.path()).args(["drain", "--frobnicate"]))
        .expect_code(2)
        .stderr_has("--frobnicate");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

#[test]
fn invalid_arguments_exit_2() {
    let dir = workdir();
    // No subcommand.
    run(&mut outbox(dir.path()))
        .expect_code(2)
        .stderr_has("Usage: outbox");
    // A value of the wrong type.
    run(outbox(dir.path()).args(["demo", "--tasks", "lots"]))
        .expect_code(2)
        .stderr_has("--tasks");
    // A duration that does not parse.
    run(outbox(dir.path()).args(["run", "--poll-interval", "soon"]))
        .expect_code(2)
        .stderr_has("--poll-interval");
    // Values out of range, refused before any database is touched.
    run(outbox(dir.path()).args(["demo", "--tasks", "0"]))
        .expect_code(2)
        .stderr_has("--tasks");
    run(outbox(dir.path()).args(["run", "--poll-interval", "5ms"]))
        .expect_code(2)
        .stderr_has("poll-interval must be at least 10ms");
    run(outbox(dir.path()).args(["drain", "--threads", "0"]))
        .expect_code(2)
        .stderr_has("threads must be between 1 and 1024");
    // Flags that conflict.
    run(outbox(dir.path()).args(["demo", "--enqueue-only", "--check"]))
        .expect_code(2)
        .stderr_has("--check");
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "bad usage touched a database"
    );
}

// ---------------------------------------------------------------------------------------------
// Unreachable or unsupported databases
// ---------------------------------------------------------------------------------------------

#[test]
fn server_down_fails_with_cannot_connect() {
    let dir = workdir();
    for args in DATABASE_COMMANDS {
        run(outbox(dir.path())
            .args(["--database-url", DOWN_PG_URL])
            .args(args))
        .expect_code(1)
        .stderr_has("cannot connect")
        .stderr_has(DOWN_PG_URL);
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a failed PostgreSQL connection fell back to a file"
    );
}

#[test]
fn unsupported_scheme_exits_2() {
    let dir = workdir();
    for args in DATABASE_COMMANDS {
        run(outbox(dir.path())
            .env("DATABASE_URL", "mariadb://x/y")
            .args(args))
        .expect_code(2)
        .stderr_has("unsupported scheme \"mariadb\"");
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "an unsupported URL fell back to a file"
    );
}

#[test]
fn a_string_that_names_no_backend_plainly_exits_2_and_creates_no_file() {
    let dir = workdir();
    for (url, why) in [
        ("dbname=app host=db", "libpq keyword/value string"),
        ("postgres:/db/app", "unsupported scheme \"postgres\""),
    ] {
        for args in DATABASE_COMMANDS {
            run(outbox(dir.path()).env("DATABASE_URL", url).args(args))
                .expect_code(2)
                .stderr_has(why);
        }
    }
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "a string that is not a URL was taken for a file"
    );
}
