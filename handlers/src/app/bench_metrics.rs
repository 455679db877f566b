//! `outbox bench --metrics-cost`: the report of what serving metrics costs a drain.

use outbox::DatabaseUrl;

use crate::bench::metrics_cost::metrics_cost;
use crate::bench::DrainBench;

/// Measures and prints what the metrics cost a drain of `bench` (see
/// [`crate::bench::metrics_cost`]).
pub(super) fn report(
    url: &DatabaseUrl,
    bench: &DrainBench,
    runs: usize,
    json: bool,
) -> anyhow::Result<()> {
    let backend = url.backend().name();
    let mode = bench.mode.name();
    let cost = metrics_cost(url, bench, runs, |round, r| {
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "backend": backend, "mode": mode, "metrics_cost_round": round,
                    "without_per_s": r.without_per_s.round(), "with_per_s": r.with_per_s.round(),
                    "ratio": (r.ratio * 1000.0).round() / 1000.0, "scrapes": r.scrapes,
                    "without_cpu_us": (r.without_cpu_us * 10.0).round() / 10.0,
                    "with_cpu_us": (r.with_cpu_us * 10.0).round() / 10.0,
                })
            );
        } else {
            println!(
                "  {mode:<7} round {round}/{}: without metrics {:>7.0} tasks/s ({:.1} CPU µs/task), with {:>7.0} tasks/s ({:.1} CPU µs/task, {} scrapes), ratio {:.3}",
                runs, r.without_per_s, r.without_cpu_us, r.with_per_s, r.with_cpu_us, r.scrapes, r.ratio
            );
        }
    })?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "backend": backend, "mode": mode, "metrics_cost": true, "tasks": bench.tasks,
                "rounds": cost.rounds.len(),
                "without_per_s": cost.without_per_s.round(), "with_per_s": cost.with_per_s.round(),
                "ratio": (cost.ratio * 1000.0).round() / 1000.0,
                "without_cpu_us": (cost.without_cpu_us * 10.0).round() / 10.0,
                "with_cpu_us": (cost.with_cpu_us * 10.0).round() / 10.0,
                "ratio_runs": cost.rounds.iter().map(|r| (r.ratio * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "{backend} {mode}: metrics cost, median of {} interleaved rounds: {:.0} tasks/s with metrics (scraped every second) against {:.0} without; ratio {:.3}; CPU {:.1} µs per task against {:.1}\n",
            cost.rounds.len(), cost.with_per_s, cost.without_per_s, cost.ratio, cost.with_cpu_us, cost.without_cpu_us
        );
    }
    Ok(())
}
