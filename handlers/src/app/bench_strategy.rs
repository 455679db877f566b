//! `outbox bench --strategy S`: see [`crate::bench::strategy`].

use outbox::Strategy;

use crate::bench::median;
use crate::bench::strategy::{fleet_drain, FleetDrain, FleetFigures};

/// Runs `rounds` rounds, each a drain of the fleet with `bench.strategy` and one with
/// `default`, their order alternating from round to round; prints each round and the medians.
pub(super) fn run(
    url: &outbox::DatabaseUrl,
    bench: &FleetDrain,
    rounds: usize,
    json: bool,
) -> anyhow::Result<()> {
    let strategy = bench.strategy;
    let threads: Vec<String> = (0..bench.nodes)
        .map(|i| match (strategy, i) {
            (Strategy::Weight, 0) => (bench.threads * bench.weight as usize).to_string(),
            _ => bench.threads.to_string(),
        })
        .collect();
    if !json {
        println!(
            "outbox bench --strategy {strategy}: {} node processes (threads {}{}) drain {} no-op tasks together, {strategy} and default in turn, {rounds} round(s); scratch databases",
            bench.nodes,
            threads.join("/"),
            match (strategy, bench.slack) {
                (Strategy::Weight, _) => format!(", weights {}/1…", bench.weight),
                (Strategy::LeastCount, Some(slack)) => format!(", slack {slack}"),
                (Strategy::LeastCount, None) => ", slack = threads".to_owned(),
                _ => String::new(),
            },
            bench.tasks,
        );
    }
    let mut pairs: Vec<(FleetFigures, FleetFigures)> = Vec::new();
    for round in 1..=rounds {
        let (first, second) = match round % 2 {
            1 => (Strategy::Default, strategy),
            _ => (strategy, Strategy::Default),
        };
        let a = fleet_drain(url, bench, first)?;
        let b = fleet_drain(url, bench, second)?;
        let (default, chosen) = match first {
            Strategy::Default => (a, b),
            _ => (b, a),
        };
        if !json {
            println!(
                "  round {round}/{rounds}: {strategy} {:>6.0} tasks/s ({}), default {:>6.0} tasks/s ({}): {:.2}×",
                chosen.tasks_per_s,
                shares(&chosen),
                default.tasks_per_s,
                shares(&default),
                chosen.tasks_per_s / default.tasks_per_s
            );
        }
        pairs.push((chosen, default));
    }
    let med = |f: &dyn Fn(&(FleetFigures, FleetFigures)) -> f64| {
        median(&pairs.iter().map(f).collect::<Vec<_>>())
    };
    let chosen = med(&|p| p.0.tasks_per_s);
    let default = med(&|p| p.1.tasks_per_s);
    let ratio = med(&|p| p.0.tasks_per_s / p.1.tasks_per_s);
    let owned = pairs.iter().filter_map(|p| p.0.owned).collect::<Vec<_>>();
    let owned = (!owned.is_empty()).then(|| median(&owned));
    if json {
        println!(
            "{}",
            serde_json::json!({
                "backend": "postgres",
                "mode": "strategy",
                "strategy": strategy.as_str(),
                "nodes": bench.nodes,
                "threads": threads,
                "weight": (strategy == Strategy::Weight).then_some(bench.weight),
                "slack": (strategy == Strategy::LeastCount).then_some(bench.slack.unwrap_or(bench.threads)),
                "tasks": bench.tasks,
                "rounds": rounds,
                "tasks_per_s": chosen.round(),
                "default_tasks_per_s": default.round(),
                "ratio": (ratio * 1000.0).round() / 1000.0,
                "ratio_runs": pairs.iter().map(|p| (p.0.tasks_per_s / p.1.tasks_per_s * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                "owned_fraction": owned.map(|o| (o * 10000.0).round() / 10000.0),
            })
        );
        return Ok(());
    }
    println!(
        "postgres {strategy} (median of {rounds} interleaved rounds): {chosen:.0} tasks/s against default's {default:.0} tasks/s on the same fleet: {ratio:.2}× (median of the rounds' ratios){}",
        match owned {
            Some(o) => format!("; {:.1}% of the tasks run by the node owning their id", o * 100.0),
            None => String::new(),
        }
    );
    Ok(())
}

/// `a/b/c` tasks per node, and the owners' fraction when there is one.
fn shares(figures: &FleetFigures) -> String {
    let per_node: Vec<String> = figures.per_node.iter().map(u64::to_string).collect();
    match figures.owned {
        Some(o) => format!("{} by node, {:.1}% by owner", per_node.join("/"), o * 100.0),
        None => format!("{} by node", per_node.join("/")),
    }
}
