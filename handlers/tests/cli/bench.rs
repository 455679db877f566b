//! `bench`.

use crate::binary::{entries, outbox, outbox_on, run, workdir};
use crate::db::tasks_in;
use crate::every_backend;
use crate::support::TestDb;

every_backend! {
    fn bench_reports_every_configuration_as_json_and_leaves_nothing_behind(db: &TestDb) {
        let dir = workdir();
        let out = run(outbox_on(db, dir.path()).args([
            "bench", "--tasks", "300", "--runs", "2", "--commit-batch", "10", "--payload-bytes",
            "1000", "--json",
        ]))
        .expect_code(0);
        let lines: Vec<serde_json::Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{}", out.stdout);
        for (line, mode) in lines.iter().zip(["strict", "batched"]) {
            assert_eq!(line["backend"], db.backend().name());
            assert_eq!(line["mode"], mode);
            assert_eq!(line["tasks"], 300);
            assert_eq!(line["runs"], 2);
            for field in ["tasks_per_s", "reference_per_s", "ratio", "rss_mib", "enqueue_per_s", "cpu_s"] {
                assert!(line[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {line}");
            }
        }
        assert_eq!(lines[1]["commit_batch"], 10);
        assert_eq!(lines[1]["payload_bytes"], 1000);
        // The URL's own database was not touched: bench works on scratch databases.
        assert_eq!(tasks_in(db, "pending") + tasks_in(db, "done"), 0);
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "bench wrote into the working directory");
    }
}

#[test]
fn bench_latency_reports_listen_and_poll() {
    let db = &TestDb::postgres();
    let dir = workdir();
    let out = run(outbox_on(db, dir.path()).args([
        "bench",
        "--latency",
        "--latency-samples",
        "20",
        "--poll-interval",
        "100ms",
        "--json",
    ]))
    .expect_code(0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(lines[0]["wake"], "listen");
    assert_eq!(lines[0]["samples"], 20);
    assert_eq!(lines[1]["wake"], "poll 100ms");
    for line in &lines {
        assert!(line["p50_ms"].as_f64().is_some(), "{line}");
        assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
    }
}

#[test]
fn bench_rejects_bad_settings() {
    let dir = workdir();
    for args in [
        &["bench", "--runs", "0"][..],
        &["bench", "--tasks", "0"],
        &["bench", "--tasks", "100", "--backlog", "10"],
        &["bench", "--commit-batch", "0", "--mode", "batched"],
        &["bench", "--payload-bytes", "60001"],
    ] {
        run(outbox(dir.path()).args(args)).expect_code(2);
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}
