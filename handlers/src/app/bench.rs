//! `outbox bench`: see [`crate::bench`].

use std::time::Duration;

use clap::{Args, ValueEnum};

use outbox::cli::parse_duration;
use outbox::{ClaimStyle, DatabaseUrl, Strategy};

use crate::bench::fair::{fair_bench, FairFigures};
use crate::bench::latency::latency_bench;
use crate::bench::{drain_bench, median, DrainBench, DrainFigures, Mode};

/// Which modes to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum ModeArg {
    /// One transaction per task.
    Strict,
    /// Chunks of --commit-batch tasks per transaction.
    Batched,
    /// Both, strict first.
    Both,
}

/// Flags of `outbox bench`.
#[derive(Debug, Args)]
pub(super) struct BenchArgs {
    /// No-op tasks drained (and timed) per run.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Pending tasks in the table when the drain starts [default: --tasks]; the drain takes
    /// the first --tasks of them (e.g. --backlog 1000000 --tasks 10000 for the scale test).
    #[arg(long)]
    backlog: Option<usize>,
    /// Runs per configuration; the figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Which commit modes to measure.
    #[arg(long, value_enum, default_value = "both")]
    mode: ModeArg,
    /// Execution threads [default: 4 × cores, at most 16; 1 on SQLite].
    #[arg(long)]
    threads: Option<usize>,
    /// Tasks (chunks, in batched mode) that may wait for a thread [default: 8 × threads; 128
    /// on SQLite unless --threads is given; in batched mode, as many chunks as threads].
    #[arg(long)]
    queue: Option<usize>,
    /// Tasks per transaction in batched mode (and rows per transaction of its reference).
    #[arg(long, default_value_t = 50)]
    commit_batch: usize,
    /// How the worker claims: auto (lock in batched mode, stamp in strict), stamp or lock.
    #[arg(long = "claim", default_value_t = ClaimStyle::Auto)]
    claim_style: ClaimStyle,
    /// The no-op handler opens its transaction (`tx.conn()`), as a handler that writes to the
    /// database does: the completion is then `BEGIN; UPDATE; COMMIT` instead of one statement.
    #[arg(long)]
    open_tx: bool,
    /// Give the tasks tenants: spread over this many (`t0`, `t1`, …) in turn [default: none].
    #[arg(long, default_value_t = 0)]
    tenants: usize,
    /// With --tenants: give each tenant this `max_running` (claimed apart, within it).
    #[arg(long, requires = "tenants")]
    max_running: Option<i32>,
    /// With --tenants: give each tenant this `max_queued` (checked at each enqueue; the
    /// enqueue's rate is `enqueue_per_s`).
    #[arg(long, requires = "tenants")]
    max_queued: Option<i32>,
    /// Spread the tasks over this many keywords (`bench.noop`, `bench.noop.1`, …) in turn.
    #[arg(long, default_value_t = 1)]
    keywords: usize,
    /// Give each task a payload of this many bytes (a JSON object of one string, at least 10
    /// bytes; 0: the empty payload), at most 60000 (the schema's limit is 65536).
    #[arg(long, default_value_t = 0)]
    payload_bytes: usize,
    /// Configure this many domains, one per keyword after the first (`bench.noop.1` …):
    /// odd ones RESERVED 1, even ones MAX half the threads; needs --keywords above it.
    #[arg(long, default_value_t = 0)]
    domains: usize,
    /// Print the claim statement's plan (EXPLAIN) at the backlog.
    #[arg(long)]
    explain: bool,
    /// Measure the latency from a producer's commit to the handler's start instead of
    /// throughput: with LISTEN/NOTIFY (PostgreSQL), and with polling only.
    #[arg(long)]
    latency: bool,
    /// Tasks timed per latency measurement with LISTEN (polling takes a tenth as many).
    #[arg(long, default_value_t = 200)]
    latency_samples: usize,
    /// The poll interval of the latency measurement with polling only.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Measure fair claiming instead of throughput: tenant `large` holds --backlog due tasks
    /// [default here: 200000] and tenant `small` enqueues --fair-small tasks, 10 ms apart,
    /// while a `run` worker drains; then tenants of weights 3 and 1 hold --tasks tasks each
    /// and a drain takes --tasks of them.
    #[arg(long, conflicts_with_all = ["latency", "explain"])]
    fair: bool,
    /// With --fair: the small tenant's tasks.
    #[arg(long, default_value_t = 100, requires = "fair")]
    fair_small: usize,
    /// Drain with a metrics endpoint (a port of the system's choice), scraped every second.
    #[arg(long, conflicts_with_all = ["latency", "fair"])]
    metrics: bool,
    /// Measure what the metrics cost: --runs interleaved rounds of a drain without metrics
    /// and one with them (scraped every second), on fresh scratch databases; the figure is
    /// the median of the rounds' ratios (no reference is measured).
    #[arg(long, conflicts_with_all = ["latency", "fair", "metrics", "explain"])]
    metrics_cost: bool,
    /// One JSON object per line per measured configuration.
    #[arg(long)]
    json: bool,

    // Claim strategies.
    /// Measure a claim strategy's drain throughput against default's instead: a fleet of
    /// --nodes nodes (processes of this binary) drains --tasks tasks together with the
    /// strategy and then with default, in turn for --runs rounds (PostgreSQL).
    #[arg(long, conflicts_with_all = ["latency", "explain", "fair"])]
    strategy: Option<Strategy>,
    /// With --strategy weight: the first node's weight (the others weigh 1), and its
    /// threads' multiple: a node of weight N stands for a machine N times as large.
    #[arg(long, default_value_t = 2, requires = "strategy")]
    weight: u32,
    /// With --strategy: nodes in the fleet (each with --threads threads, default 4).
    #[arg(long, default_value_t = 3, requires = "strategy")]
    nodes: usize,
    /// With --strategy least_count: the nodes' slack [default: their threads].
    #[arg(long, requires = "strategy")]
    slack: Option<usize>,
    /// Run as one node of a --strategy fleet (started by the benchmark itself).
    #[arg(long, hide = true, requires = "strategy")]
    node: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: BenchArgs) -> anyhow::Result<()> {
    let backlog = args.backlog.unwrap_or(args.tasks);
    if !(1..=100).contains(&args.runs) {
        return Err(outbox::Error::InvalidConfig {
            setting: "runs",
            reason: format!("must be between 1 and 100, not {}", args.runs),
        }
        .into());
    }
    if args.tasks == 0 || backlog < args.tasks || backlog > 100_000_000 {
        return Err(outbox::Error::InvalidConfig {
            setting: "tasks",
            reason: format!(
                "must be more than 0 and at most the backlog ({backlog}, itself at most 100000000), not {}",
                args.tasks
            ),
        }
        .into());
    }
    if args.keywords == 0 || args.keywords > 100 || args.domains >= args.keywords {
        return Err(outbox::Error::InvalidConfig {
            setting: "keywords",
            reason: format!(
                "must be between 1 and 100 and more than --domains ({}), not {}",
                args.domains, args.keywords
            ),
        }
        .into());
    }
    if args.payload_bytes > 60_000 {
        return Err(outbox::Error::InvalidConfig {
            setting: "payload-bytes",
            reason: format!(
                "must be at most 60000 (the schema's limit is 65536), not {}",
                args.payload_bytes
            ),
        }
        .into());
    }
    if let (Some(strategy), true) = (args.strategy, args.node) {
        let node = crate::bench::strategy::FleetNode {
            strategy,
            weight: args.weight,
            threads: args
                .threads
                .unwrap_or(crate::bench::strategy::DEFAULT_NODE_THREADS),
            slack: args.slack,
            nodes: args.nodes,
        };
        return crate::bench::strategy::fleet_node(url, &node);
    }
    if let Some(strategy) = args.strategy {
        let bench = crate::bench::strategy::FleetDrain {
            strategy,
            weight: args.weight,
            nodes: args.nodes,
            tasks: args.tasks,
            threads: args
                .threads
                .unwrap_or(crate::bench::strategy::DEFAULT_NODE_THREADS),
            slack: args.slack,
        };
        return super::bench_strategy::run(url, &bench, args.runs, args.json);
    }
    if args.latency {
        return latency(url, &args);
    }
    if args.fair {
        return fair(url, &args);
    }
    let modes: &[Mode] = match args.mode {
        ModeArg::Strict => &[Mode::Strict],
        ModeArg::Batched => &[Mode::Batched],
        ModeArg::Both => &[Mode::Strict, Mode::Batched],
    };
    let backend = url.backend().name();
    if !args.json {
        println!(
            "outbox bench on {backend}: {} no-op tasks drained of a backlog of {backlog}, {} run(s) per mode; scratch databases",
            args.tasks, args.runs
        );
    }
    for &mode in modes {
        let bench = DrainBench {
            mode,
            tasks: args.tasks,
            backlog,
            threads: args.threads,
            queue: args.queue,
            commit_batch: args.commit_batch,
            claim_style: args.claim_style,
            explain: args.explain,
            open_tx: args.open_tx,
            tenants: args.tenants,
            max_running: args.max_running,
            max_queued: args.max_queued,
            keywords: args.keywords,
            payload_bytes: args.payload_bytes,
            domains: args.domains,
            metrics: args.metrics,
            reference: true,
        };
        if args.metrics_cost {
            super::bench_metrics::report(url, &bench, args.runs, args.json)?;
            continue;
        }
        let mut runs: Vec<DrainFigures> = Vec::new();
        for run in 1..=args.runs {
            let figures = drain_bench(
                url,
                &DrainBench {
                    explain: bench.explain && run == 1,
                    ..bench.clone()
                },
            )?;
            if !figures.plan.is_empty() && !args.json {
                println!("claim plan at a backlog of {backlog}:");
                for line in &figures.plan {
                    println!("    {line}");
                }
            }
            if !args.json {
                println!(
                    "  {:<7} run {run}/{}: {:>7.0} tasks/s, reference {:>7.0}/s, ratio {:.2}; enqueue {:>7.0}/s; {:.2} CPU s; peak RSS {:.0} MiB",
                    mode.name(),
                    args.runs,
                    figures.tasks_per_s,
                    figures.reference_per_s,
                    figures.ratio,
                    figures.enqueue_per_s,
                    figures.cpu_s,
                    figures.rss_mib
                );
            }
            runs.push(figures);
        }
        report(backend, &bench, &runs, args.json);
    }
    Ok(())
}

/// Prints the medians of a configuration's runs.
fn report(backend: &str, bench: &DrainBench, runs: &[DrainFigures], json: bool) {
    let med = |f: fn(&DrainFigures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let commit_batch = match bench.mode {
        Mode::Strict => 1,
        Mode::Batched => bench.commit_batch,
    };
    let reference = match commit_batch {
        1 => "single-row transactions".to_owned(),
        k => format!("{k}-row transactions"),
    };
    let connections = runs.first().map_or(0, |r| r.reference_connections);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "backend": backend,
                "mode": bench.mode.name(),
                "tasks": bench.tasks,
                "backlog": bench.backlog,
                "threads": runs.first().map_or(0, |r| r.threads),
                "commit_batch": commit_batch,
                "payload_bytes": bench.payload_bytes,
                "claim": runs.first().map_or(bench.claim_style, |r| r.claim).to_string(),
                "handler": bench.handler_name(),
                "runs": runs.len(),
                "tasks_per_s": med(|r| r.tasks_per_s).round(),
                "reference": reference,
                "reference_connections": connections,
                "reference_per_s": med(|r| r.reference_per_s).round(),
                "ratio": (med(|r| r.ratio) * 1000.0).round() / 1000.0,
                "enqueue_per_s": med(|r| r.enqueue_per_s).round(),
                "insert_reference_per_s": med(|r| r.insert_reference_per_s).round(),
                "enqueue_ratio": (med(|r| r.enqueue_per_s / r.insert_reference_per_s) * 1000.0).round() / 1000.0,
                "cpu_s": (med(|r| r.cpu_s) * 100.0).round() / 100.0,
                "rss_mib": (runs.iter().map(|r| r.rss_mib).fold(0.0, f64::max) * 10.0).round() / 10.0,
                "tasks_per_s_runs": runs.iter().map(|r| r.tasks_per_s.round()).collect::<Vec<_>>(),
                "ratio_runs": runs.iter().map(|r| (r.ratio * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            })
        );
        return;
    }
    println!(
        "{backend} {} ({} claims, {} handler, median of {}): {:.0} tasks/s; reference ({reference}, {connections} connections) {:.0} rows/s; ratio {:.2}; enqueue {:.0} tasks/s ({:.2}× plain 1000-row INSERTs); {:.2} CPU s per {} tasks ({:.0} µs per task); peak RSS {:.0} MiB\n",
        bench.mode.name(),
        runs.first().map_or(bench.claim_style, |r| r.claim),
        bench.handler_name(),
        runs.len(),
        med(|r| r.tasks_per_s),
        med(|r| r.reference_per_s),
        med(|r| r.ratio),
        med(|r| r.enqueue_per_s),
        med(|r| r.enqueue_per_s / r.insert_reference_per_s),
        med(|r| r.cpu_s),
        bench.tasks,
        med(|r| r.cpu_s) * 1e6 / bench.tasks as f64,
        runs.iter().map(|r| r.rss_mib).fold(0.0, f64::max),
    );
}

/// Fair claiming's figures, medians of --runs runs.
fn fair(url: &DatabaseUrl, args: &BenchArgs) -> anyhow::Result<()> {
    let backlog = args.backlog.unwrap_or(200_000);
    let runs: Vec<FairFigures> = (0..args.runs)
        .map(|_| fair_bench(url, backlog, args.fair_small, args.tasks, args.threads))
        .collect::<anyhow::Result<_>>()?;
    let med = |f: fn(&FairFigures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let ratio = |r: &FairFigures| r.heavy_done as f64 / r.light_done.max(1) as f64;
    let figures = serde_json::json!({
        "backend": url.backend().name(),
        "mode": "fair",
        "runs": runs.len(),
        "backlog": backlog,
        "small": args.fair_small,
        "small_p50_ms": round(med(|r| r.small_p50_ms)),
        "small_p99_ms": round(med(|r| r.small_p99_ms)),
        "large_p50_ms": round(med(|r| r.large_p50_ms)),
        "large_p99_ms": round(med(|r| r.large_p99_ms)),
        "claim_cycle_ms": round(med(|r| r.claim_cycle_ms)),
        "weighted": args.tasks,
        "weighted_ratio": (med(ratio) * 100.0).round() / 100.0,
        "weighted_ratio_runs": runs.iter().map(|r| (ratio(r) * 100.0).round() / 100.0).collect::<Vec<_>>(),
    });
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "{} fair claiming (median of {}): tenant small's {} tasks waited p50 {} ms, p99 {} ms from due to claimed, behind tenant large's backlog of {backlog} (whose tasks claimed meanwhile waited p50 {} ms, p99 {} ms); a claim every {} ms meanwhile; weights 3:1 served {}:1 over {} tasks",
            figures["backend"].as_str().unwrap_or_default(),
            runs.len(),
            args.fair_small,
            figures["small_p50_ms"],
            figures["small_p99_ms"],
            figures["large_p50_ms"],
            figures["large_p99_ms"],
            figures["claim_cycle_ms"],
            figures["weighted_ratio"],
            args.tasks
        );
    }
    Ok(())
}

/// Commit-to-start latency with LISTEN (PostgreSQL only) and with polling.
fn latency(url: &DatabaseUrl, args: &BenchArgs) -> anyhow::Result<()> {
    let backend = url.backend().name();
    let mut configurations = Vec::new();
    if url.backend() == outbox::Backend::Postgres {
        configurations.push((true, args.latency_samples));
    }
    configurations.push((false, (args.latency_samples / 10).max(5)));
    for (listen, samples) in configurations {
        let figures = latency_bench(url, listen, args.poll_interval, samples)?;
        let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
        let how = if listen {
            "listen".to_owned()
        } else {
            format!("poll {}", humantime::format_duration(args.poll_interval))
        };
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "backend": backend,
                    "mode": "latency",
                    "wake": how,
                    "samples": figures.samples,
                    "p50_ms": ms(figures.p50),
                    "p99_ms": ms(figures.p99),
                    "max_ms": ms(figures.max),
                })
            );
        } else {
            println!(
                "{backend} latency, commit to handler start ({how}, {} tasks): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                figures.samples,
                ms(figures.p50),
                ms(figures.p99),
                ms(figures.max)
            );
        }
    }
    Ok(())
}
