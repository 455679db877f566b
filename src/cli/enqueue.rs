//! `outbox enqueue`.

use std::time::Duration;

use clap::Args;

use super::out::say;
use crate::cancel::state_of;
use crate::db::DatabaseUrl;
use crate::driver::driver;
use crate::enqueue::enqueue;
use crate::migrate::ensure_migrated;
use crate::task::NewTask;

/// The flags of `outbox enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The handler's keyword: 1 to 64 characters of a-z 0-9 . _ : -
    keyword: String,
    /// The business key (such as an order number); enqueueing it twice yields one task.
    biz_id: String,
    /// The payload, as JSON.
    #[arg(long, default_value = "{}")]
    data: String,
    /// Run no earlier than this long from now (e.g. 30s, 10m).
    #[arg(long, value_parser = super::parse_duration)]
    delay: Option<Duration>,
    /// The tenant, the unit of quotas.
    #[arg(long)]
    tenant: Option<String>,
    /// Lower runs first (negative numbers allowed).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i16,
    /// Attempts before the task is dead [default: the worker's].
    #[arg(long)]
    max_attempts: Option<i32>,
    /// Make the task a child of task ID: it waits (blocked) until ID is done, and is
    /// cancelled if ID ends dead or cancelled. Repeat for a task with several parents.
    #[arg(long = "after", value_name = "ID")]
    after: Vec<i64>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(url: &DatabaseUrl, args: EnqueueArgs) -> crate::Result<()> {
    let mut task = NewTask::new(args.keyword, args.biz_id)
        .payload_json(args.data)
        .priority(args.priority)
        .delay(args.delay.unwrap_or_default());
    if let Some(tenant) = args.tenant {
        task = task.tenant(tenant);
    }
    if let Some(max) = args.max_attempts {
        task = task.max_attempts(max);
    }
    for parent in &args.after {
        task = task.after(*parent);
    }
    // Validate before connecting: bad input is reported as such even when the database is
    // down, and nothing is written. The payload's size depends on the backend's stored form:
    // the enqueue measures it.
    task.validate(crate::task::DEFAULT_MAX_PAYLOAD_BYTES, &|_, _| 0)?;
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    let result = enqueue(&mut conn, &task)?;
    let state = state_of(driver(&mut conn), result.id, "task enqueue", || {
        result.id.to_string()
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": result.id, "created": result.created, "state": state.as_str(), "keyword": task.keyword(), "biz_id": task.biz_id()})
        );
    } else if result.created {
        say!(
            "created task {} ({} {}), {}",
            result.id,
            task.keyword(),
            task.biz_id(),
            state.as_str()
        );
    } else {
        say!(
            "task {} already exists for {} {}; nothing written",
            result.id,
            task.keyword(),
            task.biz_id()
        );
    }
    Ok(())
}
