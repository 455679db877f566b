//! Standard output for listings that may be piped into `head`: a closed pipe ends the
//! listing quietly instead of panicking, as `println!` does.

use std::io::Write;

/// Writes `lines` to stdout, one per line; stops at the first write error (a reader that
/// went away, such as `head`, closes the pipe: there is no one left to tell).
pub(super) fn lines<I, S>(lines: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in lines {
        if writeln!(out, "{}", line.as_ref()).is_err() {
            return;
        }
    }
    let _ = out.flush();
}
