//! `outbox retry`: one dead or cancelled task, or every one a filter matches, back to
//! pending; audited ([`crate::ops::retry_task`], [`crate::ops::retry_matching`]).

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;

use super::filter::FilterArgs;
use super::out::say;
use crate::db::DatabaseUrl;
use crate::error::{Error, Result};
use crate::ops::{retry_matching, retry_task, validate_retry, Filter, Matched};
use crate::task::TaskState;

/// A retry by filter of more tasks than this asks for a confirmation (or `--yes`).
pub const CONFIRM_ABOVE: u64 = 1000;

/// The flags of `outbox retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The id of a dead or cancelled task (or retry many with --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    id: Option<i64>,
    /// Retry every dead and cancelled task the filter flags match (--state dead or
    /// cancelled; none: both).
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    filter: FilterArgs,
    /// With --all: count the tasks it would retry, and change nothing.
    #[arg(long, requires = "all")]
    dry_run: bool,
    /// With --all: do not ask before retrying more than 1000 tasks (needed without a
    /// terminal).
    #[arg(long, requires = "all")]
    yes: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: RetryArgs) -> Result<()> {
    // clap drops `requires = "all"` when the id (which conflicts with --all) is given: a
    // `--dry-run` next to an id must not retry for real.
    if !args.all && (args.dry_run || args.yes) {
        return Err(Error::InvalidConfig {
            setting: "retry",
            reason: "--dry-run and --yes go with --all".into(),
        });
    }
    match args.id {
        Some(id) => {
            if !args.filter.is_empty() {
                return Err(Error::InvalidConfig {
                    setting: "retry",
                    reason: "takes an id or, with --all, filter flags; not both".into(),
                });
            }
            run_one(url, id, args.json)
        }
        None => run_matching(url, &args),
    }
}

fn run_one(url: &DatabaseUrl, id: i64, json: bool) -> Result<()> {
    let mut conn = super::cancel::connect(url)?;
    let result = retry_task(&mut conn, id, &super::actor())?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "id": result.id,
                "retried": result.retried,
                "state": result.state.as_str(),
                "parent_pruned": result.parent_pruned,
            })
        );
    } else if result.retried && result.state == TaskState::Blocked {
        say!(
            "task {} is blocked again, until its parents are done",
            result.id
        );
    } else if result.retried {
        say!("task {} is pending again", result.id);
    } else if result.parent_pruned {
        say!(
            "task {} is {} and stays so: {PARENT_PRUNED}, so the outcome it depended on is \
             gone; nothing written",
            result.id,
            result.state
        );
    } else {
        say!(
            "task {} is {}: only a dead or cancelled task is retried; nothing written",
            result.id,
            result.state
        );
    }
    Ok(())
}

/// Why a dead or cancelled task is not retried.
const PARENT_PRUNED: &str = "a parent it waited for was pruned";

/// ` (3 left as they are: …)` after a retry by filter's count, when it skipped tasks.
fn skipped_note(skipped: u64) -> String {
    match skipped {
        0 => String::new(),
        1 => format!(" (1 left as it is: {PARENT_PRUNED})"),
        n => format!(" ({n} left as they are: {PARENT_PRUNED})"),
    }
}

fn run_matching(url: &DatabaseUrl, args: &RetryArgs) -> Result<()> {
    let filter = args.filter.filter();
    // Checked before connecting: bad usage is reported as such.
    validate_retry(&filter)?;
    let mut conn = super::cancel::connect(url)?;
    let actor = super::actor();
    let would = retry_matching(&mut conn, &filter, true, &actor)?;
    let outcome = if args.dry_run {
        would
    } else if would.matched == 0 {
        // Nothing to write; not a dry run for all that.
        Matched {
            dry_run: false,
            ..would
        }
    } else {
        if would.matched > CONFIRM_ABOVE && !args.yes {
            confirm_on_terminal(would.matched, &filter)?;
        }
        retry_matching(&mut conn, &filter, false, &actor)?
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&outcome).expect("an outcome serialises")
        );
    } else if outcome.matched == 0 && outcome.skipped == 0 {
        say!("no dead or cancelled task matches; nothing written");
    } else if outcome.matched == 0 {
        say!(
            "no dead or cancelled task can be retried{}; nothing written",
            skipped_note(outcome.skipped)
        );
    } else if outcome.dry_run {
        say!(
            "{} dead or cancelled task(s) match{}; nothing written (--dry-run)",
            outcome.matched,
            skipped_note(outcome.skipped)
        );
    } else {
        say!(
            "retried {} task(s){}",
            outcome.changed,
            skipped_note(outcome.skipped)
        );
    }
    Ok(())
}

/// Asks on the terminal before retrying `n` tasks; without one, refuses (use `--yes`).
fn confirm_on_terminal(n: u64, filter: &Filter) -> Result<()> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Error::InvalidConfig {
            setting: "retry",
            reason: format!(
                "of {n} tasks (over {CONFIRM_ABOVE}) needs --yes without a terminal to \
                 confirm on; nothing written"
            ),
        });
    }
    let mut stderr = std::io::stderr();
    if confirm(n, filter, &mut stdin.lock(), &mut stderr) {
        Ok(())
    } else {
        Err(Error::NotConfirmed {
            change: format!("retry of {n} tasks"),
        })
    }
}

/// Asks whether to retry `n` tasks on `output`; true when `input`'s answer is yes.
fn confirm(n: u64, filter: &Filter, input: &mut impl BufRead, output: &mut impl Write) -> bool {
    let (target, _) = filter.describe();
    let _ = write!(
        output,
        "retry {n} dead or cancelled task(s) ({target})? [y/N] "
    );
    let _ = output.flush();
    let mut answer = String::new();
    if input.read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_yes_confirms() {
        let filter = Filter::default().keyword("mail.send");
        for (answer, yes) in [
            ("y\n", true),
            ("YES\n", true),
            ("\n", false),
            ("no\n", false),
            ("", false),
        ] {
            let mut out = Vec::new();
            assert_eq!(
                confirm(1500, &filter, &mut answer.as_bytes(), &mut out),
                yes,
                "{answer:?}"
            );
            let asked = String::from_utf8(out).unwrap();
            assert_eq!(
                asked,
                "retry 1500 dead or cancelled task(s) (keyword=mail.send)? [y/N] "
            );
        }
    }
}
