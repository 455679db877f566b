//! The databases of a [`Fleet`](crate::Fleet), each with its worker once started: at the
//! fleet's start, or later, once a database that could not be reached at the start can be.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use super::engine::{Seat, Shared, Worker};
use super::run::{FIRST_OUTAGE_PAUSE, MAX_OUTAGE_PAUSE};
use super::settings::Settings;
use super::slots::Share;
use super::ticker::sleep_unless;
use crate::db::{DatabaseUrl, DbPool};
use crate::error::{Error, Result};
use crate::migrate::ensure_migrated;
use crate::registry::Registry;

/// One database of a fleet: its place in the execution pool, its label in the log, and its
/// worker once started.
pub(super) struct Member {
    pub(super) url: DatabaseUrl,
    pub(super) share: Option<Share>,
    pub(super) label: Option<Arc<str>>,
    pub(super) worker: OnceLock<Worker>,
    /// Held by an attempt to start the worker: one at a time (`Fleet::run_once` may meet a
    /// running loop's).
    pub(super) starting: Mutex<()>,
}

/// What starting a fleet's worker takes, at the fleet's start or later: the execution pool
/// and the stop flag the workers share, the handlers, the settings.
pub(super) struct Starter {
    pub(super) shared: Shared,
    pub(super) registry: Registry,
    pub(super) settings: Settings,
}

impl Starter {
    /// Starts `member`'s worker on `pool`.
    pub(super) fn start<'m>(&self, member: &'m Member, pool: DbPool) -> Result<&'m Worker> {
        let seat = Seat {
            shared: &self.shared,
            share: member.share,
            label: member.label.clone(),
        };
        let (registry, settings) = (self.registry.clone(), self.settings.clone());
        let worker = Worker::start(&member.url, pool, registry, settings, Some(seat))?;
        // Under `member.starting` (or at the fleet's start, before any loop runs): set here.
        Ok(member.worker.get_or_init(|| worker))
    }

    /// `member`'s worker, started now if it was not: tried once, or, with `retry`, again with
    /// backoff whatever the failure (a server not back yet, a database being created or
    /// migrated) until it starts or the fleet stops (then the last failure). Logs each new
    /// failure, and the same one again at each try once the backoff is at its longest.
    pub(super) fn worker_of<'m>(&self, member: &'m Member, retry: bool) -> Result<&'m Worker> {
        let (since, mut pause, mut said) = (Instant::now(), FIRST_OUTAGE_PAUSE, String::new());
        loop {
            let tried = {
                let _starting = (member.starting.lock()).unwrap_or_else(PoisonError::into_inner);
                if let Some(worker) = member.worker.get() {
                    return Ok(worker);
                }
                open(&member.url, self.settings.pool_size(), &member.label)
                    .and_then(|pool| self.start(member, pool))
            };
            match tried {
                Ok(worker) => {
                    log::warn!(
                        "its worker started, {:?} after the first try",
                        since.elapsed()
                    );
                    return Ok(worker);
                }
                Err(e) if retry => {
                    let text = e.to_string();
                    if text != said || pause == MAX_OUTAGE_PAUSE {
                        log::warn!("not started yet, trying again in {pause:?}: {text}");
                        said = text;
                    }
                    sleep_unless(pause, &self.shared.stopping);
                    if self.is_stopping() {
                        return Err(e);
                    }
                    pause = (pause * 2).min(MAX_OUTAGE_PAUSE);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }
}

/// A pool to `url`, its schema checked, whose failures to connect are logged with `label`.
pub(super) fn open(url: &DatabaseUrl, size: u32, label: &Option<Arc<str>>) -> Result<DbPool> {
    url.require_existing()?;
    let pool = url.pool_labelled(size, label.clone())?;
    crate::db::pool::on_live_conn(&pool, "worker start", ensure_migrated)?;
    Ok(pool)
}

/// Whether `e` says that the server of `url` could not be reached (down, refusing
/// connections, or gone mid-check), which a fleet waits out, rather than that the database is
/// not fit to serve (not migrated; an SQLite file, missing or not, has no server).
pub(super) fn is_unreachable(url: &DatabaseUrl, e: &Error) -> bool {
    url.backend() != crate::Backend::Sqlite
        && (matches!(e, Error::Connect { .. } | Error::Pool { .. }) || e.is_connection_lost())
}
