//! The flags that watch a worker from outside: the metrics endpoint and the dead-task hook
//! (docs/guide/src/metrics.md).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::parse_duration;
use crate::worker::WorkerConfig;

/// `--metrics-addr`, `--on-dead` and `--on-dead-timeout`, shared by the commands that run
/// tasks.
#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics on http://ADDR/metrics and a health check on /healthz (200
    /// while this node's heartbeat is fresh, 503 otherwise), e.g. 127.0.0.1:9187.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// A command run by `sh -c` when a task becomes dead, with OUTBOX_TASK_ID,
    /// OUTBOX_KEYWORD, OUTBOX_BIZ_ID, OUTBOX_TENANT and OUTBOX_ERROR in its environment
    /// (never the payload); run off the worker's threads, one at a time.
    #[arg(long, value_name = "CMD")]
    on_dead: Option<String>,
    /// How long the --on-dead command may run before it is killed.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    on_dead_timeout: Duration,
}

impl ObserveArgs {
    /// `config` with these flags applied.
    pub fn apply(&self, mut config: WorkerConfig) -> WorkerConfig {
        config.metrics_addr = self.metrics_addr;
        config.on_dead = self.on_dead.clone();
        config.on_dead_timeout = self.on_dead_timeout;
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        observe: ObserveArgs,
    }

    #[test]
    fn a_metrics_address_must_be_an_ip_and_a_port() {
        assert!(Test::try_parse_from(["t", "--metrics-addr", "127.0.0.1:9187"]).is_ok());
        for bad in ["localhost:9187", "9187", "127.0.0.1"] {
            assert!(
                Test::try_parse_from(["t", "--metrics-addr", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_empty_hook_is_refused() {
        let args = Test::try_parse_from(["t", "--on-dead", " "])
            .unwrap()
            .observe;
        let err = args
            .apply(WorkerConfig::default())
            .resolve(crate::Backend::Sqlite)
            .unwrap_err();
        assert!(err.to_string().contains("on-dead"), "{err}");
    }
}
