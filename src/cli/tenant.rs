//! `outbox tenant set|list|remove`.

use clap::{Args, Subcommand};

use super::out::say;
use crate::db::DatabaseUrl;
use crate::migrate::ensure_migrated;
use crate::tenant::{remove_tenant, set_tenant, tenants, Tenant, TenantLimits};

/// The subcommands of `outbox tenant`.
#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Create or change a tenant's limits; a limit left out keeps its value.
    Set {
        /// The tenant, as tasks carry it (1 to 128 bytes).
        tenant: String,
        /// Pending and blocked tasks at most: a number, or `none` for unlimited.
        #[arg(long, value_name = "N|none", value_parser = parse_limit, allow_negative_numbers = true)]
        max_queued: Option<Limit>,
        /// Running tasks at most across the fleet: a number, or `none` for unlimited.
        #[arg(long, value_name = "N|none", value_parser = parse_limit, allow_negative_numbers = true)]
        max_running: Option<Limit>,
        /// Its share of each claim against the other tenants with tasks due (at least 1;
        /// a tenant without a row weighs 1).
        #[arg(long, value_name = "W", value_parser = parse_weight, allow_negative_numbers = true)]
        weight: Option<i32>,
        /// Print the tenant as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List the tenants with their limits and their queued and running tasks.
    List {
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant's row: it becomes unlimited.
    Remove {
        /// The tenant.
        tenant: String,
    },
}

/// A weight of at least 1.
fn parse_weight(text: &str) -> Result<i32, String> {
    let n: i32 = text
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if n < 1 {
        return Err(format!("must be at least 1, not {n}"));
    }
    Ok(n)
}

/// A limit given on the command line (`None`: unlimited).
#[derive(Debug, Clone, Copy)]
struct Limit(Option<i32>);

/// `none` (or `unlimited`), or a limit of at least 0.
fn parse_limit(text: &str) -> Result<Limit, String> {
    if matches!(text, "none" | "unlimited") {
        return Ok(Limit(None));
    }
    let n: i32 = text
        .parse()
        .map_err(|_| "expected a whole number or `none`".to_owned())?;
    if n < 0 {
        return Err(format!("must be at least 0, not {n}"));
    }
    Ok(Limit(Some(n)))
}

pub(super) fn run(url: &DatabaseUrl, args: TenantArgs) -> crate::Result<()> {
    // Checked before connecting: bad usage is reported as such, whatever the database.
    if let TenantCommand::Set { tenant, .. } | TenantCommand::Remove { tenant } = &args.command {
        crate::tenant::validate_name(tenant)?;
    }
    url.require_existing()?;
    let mut conn = url.connect()?;
    ensure_migrated(&mut conn)?;
    match args.command {
        TenantCommand::Set {
            tenant,
            max_queued,
            max_running,
            weight,
            json,
        } => {
            let mut limits = TenantLimits::default();
            if let Some(limit) = max_queued {
                limits = limits.max_queued(limit.0);
            }
            if let Some(limit) = max_running {
                limits = limits.max_running(limit.0);
            }
            if let Some(weight) = weight {
                limits = limits.weight(weight);
            }
            let row = set_tenant(&mut conn, &tenant, &limits, &super::actor())?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&row).expect("a tenant serialises")
                );
            } else {
                say!("{}", line(&row));
            }
        }
        TenantCommand::List { json } => {
            let rows = tenants(&mut conn)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&rows).expect("tenants serialise")
                );
            } else if rows.is_empty() {
                say!("no tenants with a row: every tenant is unlimited");
            } else {
                for row in &rows {
                    say!("{}", line(row));
                }
            }
        }
        TenantCommand::Remove { tenant } => {
            remove_tenant(&mut conn, &tenant, &super::actor())?;
            say!("tenant {tenant:?} removed: unlimited");
        }
    }
    Ok(())
}

fn line(t: &Tenant) -> String {
    let limit = |l: Option<i32>| l.map_or_else(|| "none".to_owned(), |n| n.to_string());
    format!(
        "{}: queued {}/{}, running {}/{}, weight {} (set {} by {})",
        t.tenant,
        t.queued,
        limit(t.max_queued),
        t.running,
        limit(t.max_running),
        t.weight,
        t.updated_at,
        t.updated_by
    )
}
