//! The `outbox` binary: the engine's CLI with the handlers of this package.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    // env_logger's own layout, with the message escaped for the terminal: log lines quote
    // biz_ids, tenants and errors that producers wrote (`outbox::cli::printable`).
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, record| {
            let style = buf.default_level_style(record.level());
            writeln!(
                buf,
                "[{} {style}{:<5}{style:#} {}] {}",
                buf.timestamp(),
                record.level(),
                record.target(),
                outbox::cli::printable(&record.args().to_string())
            )
        })
        .init();
    outbox_handlers::main(outbox_handlers::registry())
}
