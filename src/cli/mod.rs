//! The operator CLI, as library code: a binary builds its [`Registry`] and calls [`main`].
//!
//! Exit codes: 0 success; 1 the command failed (the message on stderr names what failed);
//! 2 bad usage (unknown flag, invalid argument, invalid task, URL or configuration); 3 a
//! handler hung past its task timeout and the worker exited to free what it held.
//!
//! A binary with commands of its own (the `outbox` binary adds `demo` and `bench`) parses
//! its own `clap` command line, flattening [`DatabaseArgs`] and [`Command`] into it, and
//! calls [`run`] and [`exit_code`].

mod args;
mod cancel;
mod domain;
mod enqueue;
mod fleet;
mod observe;
mod progress;
mod prune;
mod schedules;
mod stats;
mod strategy;
mod tenant;
#[cfg(feature = "web")]
mod web;
mod work;

// The operator's commands of tasks, nodes and the audit (`crate::ops`).
mod audit;
mod filter;
mod list;
mod nodes;
mod out;
mod retry;
mod show;
mod table;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use args::WorkerArgs;
pub use domain::{DomainArgs, PauseArgs};
pub use enqueue::EnqueueArgs;
pub use observe::ObserveArgs;
pub use out::printable;
pub use progress::{Progress, ProgressStyle};
pub use prune::PruneArgs;
pub use schedules::SchedulesArgs;
pub use stats::StatsArgs;
pub use strategy::StrategyArgs;
pub use tenant::TenantArgs;
#[cfg(feature = "web")]
pub use web::WebArgs;
pub use work::RunArgs;

pub use audit::AuditArgs;
pub use cancel::CancelArgs;
pub use list::ListArgs;
pub use nodes::NodesArgs;
pub use retry::{RetryArgs, CONFIRM_ABOVE};
pub use show::ShowArgs;

use crate::db::{DatabaseUrl, DEFAULT_DATABASE_URL};
use crate::error::{Error, Result};
use crate::registry::Registry;
use out::say;

/// Runs the CLI with the process's arguments and `registry`'s handlers; returns the exit code.
/// Last, it calls [`settle`]: from then on the process opens no server connection, so call it
/// as the last thing `main` does ([`main_from`] does not settle).
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     let mut registry = outbox::Registry::new();
///     registry.register("mail.send", |_task: &outbox::TaskContext, _tx: &mut outbox::TaskTx| Ok(()));
///     outbox::cli::main(registry)
/// }
/// ```
pub fn main(registry: Registry) -> ExitCode {
    let code = main_from(std::env::args_os(), registry);
    settle();
    code
}

/// Runs the CLI with the given arguments (the first is the program name).
pub fn main_from<I, T>(args: I, registry: Registry) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // clap prints help and version to stdout with exit 0, usage errors to stderr with 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    finish(
        cli.database
            .urls()
            .and_then(|urls| run_on(cli.command, &urls, registry)),
    )
}

/// Prints a command's error (`outbox: …` on stderr) and turns the result into the exit code.
pub fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Every variant's message already includes its cause; it may quote a biz_id or a
            // server's text, escaped for the terminal as all output for people.
            eprintln!("outbox: {}", printable(&e.to_string()));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Refuses new server connections and waits until none is being opened: call it last before
/// the process exits ([`main`] does). A command's pools may still be opening a connection on
/// their own threads, and a thread inside the client library while the process exits can
/// abort it ([`crate::db::prepare_exit`]). Waits at most 3 s, so that a server that does not
/// answer delays no exit for long: an opening that takes longer waits on the network, not
/// inside the library.
pub fn settle() {
    if !crate::db::prepare_exit(std::time::Duration::from_secs(3)) {
        log::warn!("a database connection was still being opened at exit");
    }
}

/// 2 for input the user can fix on the command line, 1 for everything else.
pub fn exit_code(error: &Error) -> u8 {
    match error {
        Error::OnDatabase { source, .. } => exit_code(source),
        Error::InvalidKeyword { .. }
        | Error::InvalidBizId { .. }
        | Error::InvalidPayload { .. }
        | Error::PayloadTooLarge { .. }
        | Error::InvalidTask { .. }
        | Error::InvalidDatabaseUrl { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidDomain { .. }
        | Error::DomainNotFound { .. }
        | Error::Schedule(_) => 2,
        _ => 1,
    }
}

/// Run business side-effects reliably, after the fact.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(subcommand)]
    command: Command,
}

/// `--database-url` (or `DATABASE_URL`), shared by every command.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Database URL: postgres://… or postgresql://… for PostgreSQL; sqlite://PATH or a file
    /// path for SQLite. The backend is chosen from the scheme alone. `run` and `drain` take
    /// it repeated, to serve several databases of one backend (DATABASE_URL is one URL).
    // `hide_env_values`: help names DATABASE_URL but never shows its value, which may hold
    // a password.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = DEFAULT_DATABASE_URL,
        global = true,
        action = clap::ArgAction::Append
    )]
    database_url: Vec<String>,
}

impl DatabaseArgs {
    /// The parsed URL ([`Error::InvalidDatabaseUrl`] when it names no backend plainly;
    /// [`Error::InvalidConfig`] when `--database-url` was given more than once).
    pub fn url(&self) -> Result<DatabaseUrl> {
        match self.database_url.as_slice() {
            [one] => DatabaseUrl::parse(one),
            several => Err(fleet::only_one(several.len())),
        }
    }

    /// Every URL given, parsed, in order (at least one).
    pub fn urls(&self) -> Result<Vec<DatabaseUrl>> {
        self.database_url
            .iter()
            .map(|url| DatabaseUrl::parse(url))
            .collect()
    }
}

/// The library's commands.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum Command {
    /// Apply the embedded schema migrations (safe to run from several processes at once).
    Migrate,
    /// Enqueue one task (for scripts and operators; programs enqueue in their own transaction).
    Enqueue(enqueue::EnqueueArgs),
    /// Run every due task, print a summary, and exit: for cron.
    Drain(WorkerArgs),
    /// Run as a long-lived worker until SIGINT or SIGTERM.
    Run(work::RunArgs),
    /// Tasks per keyword and state, the oldest due task, keywords this binary's handlers do
    /// not serve, and the domains' slot use on the live nodes.
    Stats(stats::StatsArgs),
    /// Delete finished tasks older than a cutoff, so that the table does not keep growing.
    Prune(prune::PruneArgs),
    /// Cancel a task by id, or by --keyword and --biz-id, or every unfinished task of a
    /// keyword or tenant with --all: never claimed again, a running handler's completion
    /// fenced out.
    Cancel(cancel::CancelArgs),
    /// Put a dead or cancelled task back to pending, due now, its failures reset; or, with
    /// --all, every one the filter flags match (--dry-run counts them).
    Retry(retry::RetryArgs),
    /// Tenants' quotas: `max_queued` checked at enqueue, `max_running` fleet-wide at claim.
    Tenant(tenant::TenantArgs),
    /// Task domains' run-time control: list them with their slot use, set one's keywords,
    /// mode, queue or timeout, force-release one.
    Domain(domain::DomainArgs),
    /// Pause a domain or a keyword: nothing of it is claimed; running tasks finish.
    Pause(domain::PauseArgs),
    /// Resume a paused (or released) domain, or a paused keyword.
    Resume(domain::PauseArgs),
    /// Cron schedules: each one the fleet runs, with its expression, last tick, the state
    /// of that tick's task, and next tick.
    Schedules(schedules::SchedulesArgs),
    /// List tasks, a page at a time: filter by state, keyword, tenant, biz_id and age.
    List(list::ListArgs),
    /// Show one task whole: every column, its error chain, its parents and children.
    Show(show::ShowArgs),
    /// The worker nodes, live and gone: heartbeat age and running tasks of each.
    Nodes(nodes::NodesArgs),
    /// The operators' changes (who, what, which tasks, how many rows), newest first.
    Audit(audit::AuditArgs),
    /// Serve the dashboard (read-only unless --allow-actions; loopback unless --addr says
    /// otherwise) until SIGINT or SIGTERM.
    #[cfg(feature = "web")]
    Web(web::WebArgs),
}

/// Runs one of the library's commands on `url` with `registry`'s handlers.
///
/// Each command checks its own input first, so that bad usage is reported as such before any
/// database is touched; commands that work an existing database then refuse a missing SQLite
/// file ([`DatabaseUrl::require_existing`]).
pub fn run(command: Command, url: &DatabaseUrl, registry: Registry) -> Result<()> {
    match command {
        Command::Migrate => {
            // A migration's statement may rightly run long (an index built on a large
            // table): no reply timeout unless the URL sets one.
            let mut conn = url.clone().unless_reply_timeout_set().connect()?;
            let applied = crate::migrate::run_migrations(&mut conn)?;
            if applied.is_empty() {
                say!("schema up to date ({})", url.masked());
            } else {
                say!(
                    "applied {} migration(s): {}",
                    applied.len(),
                    applied.join(", ")
                );
            }
            Ok(())
        }
        Command::Enqueue(args) => enqueue::run(url, args),
        Command::Drain(args) => work::drain(url, registry, args),
        Command::Run(args) => work::run(url, registry, args),
        Command::Stats(args) => stats::run(url, &registry, args),
        Command::Prune(args) => prune::run(url, args),
        Command::Cancel(args) => cancel::run(url, args),
        Command::Retry(args) => retry::run(url, args),
        Command::Tenant(args) => tenant::run(url, args),
        Command::Domain(args) => domain::run(url, args),
        Command::Pause(args) => domain::run_pause(url, args, true),
        Command::Resume(args) => domain::run_pause(url, args, false),
        Command::Schedules(args) => schedules::run(url, args),
        Command::List(args) => list::run(url, args),
        Command::Show(args) => show::run(url, args),
        Command::Nodes(args) => nodes::run(url, args),
        Command::Audit(args) => audit::run(url, args),
        #[cfg(feature = "web")]
        Command::Web(args) => web::run(url, args),
    }
}

/// Runs one of the library's commands on `urls`: `drain` and `run` serve every database
/// given (docs/guide/src/sharding.md); the other commands take exactly
/// one.
pub fn run_on(command: Command, urls: &[DatabaseUrl], registry: Registry) -> Result<()> {
    match (command, urls) {
        (command, [url]) => run(command, url, registry),
        (Command::Drain(args), urls) => fleet::drain(urls, registry, args),
        (Command::Run(args), urls) => fleet::run(urls, registry, args),
        (_, urls) => Err(fleet::only_one(urls.len())),
    }
}

/// Who runs this command, for the audit: `$USER@host`.
fn actor() -> String {
    crate::ops::local_actor()
}

/// Parses durations written like `500ms`, `5s`, `10m`, `2h`, `7d`.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 5s, 10m, 2h, 7d)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("soon").is_err());
    }
}
