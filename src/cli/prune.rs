//! `outbox prune`.

use clap::Args;

use crate::db::DatabaseUrl;

/// Flags of `outbox prune`.
#[derive(Debug, Args)]
pub(super) struct PruneArgs {}

pub(super) fn run(_url: &DatabaseUrl, _args: PruneArgs) -> crate::Result<()> {
    Err(crate::Error::Runtime("prune: not written yet".into()))
}
