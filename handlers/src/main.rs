//! The `outbox` binary: the engine's CLI with the handlers of this package.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    // env_logger's own layout, with the message escaped for the terminal: log lines quote
    // biz_ids, tenants and errors that producers wrote (`outbox::cli::printable`). In a
    // process serving several databases, a line about one of them names it first, as the
    // reports do (`outbox::log_database`).
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, record| {
            let style = buf.default_level_style(record.level());
            let database = outbox::log_database()
                .map(|db| format!("{db}: "))
                .unwrap_or_default();
            writeln!(
                buf,
                "[{} {style}{:<5}{style:#} {}] {}",
                buf.timestamp(),
                record.level(),
                record.target(),
                outbox::cli::printable(&format!("{database}{}", record.args()))
            )
        })
        .init();
    outbox_handlers::main(outbox_handlers::registry())
}
