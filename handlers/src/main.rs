//! The `outbox` binary: the engine's CLI with the handlers of this package.

use std::process::ExitCode;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    outbox_handlers::main(outbox_handlers::registry())
}
