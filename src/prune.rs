//! Pruning: deleting finished tasks older than a cutoff, so that the table does not keep
//! growing. (To be written: see `outbox prune`.)
