//! Standard output for people, and for programs.
//!
//! What people read is escaped: a task's biz_id, tenant, keyword or error is written by
//! producers, with plain SQL as often as through [`crate::enqueue`], and may hold ESC, OSC,
//! BEL or newlines that would redraw the operator's terminal or forge a line of output. Every
//! human-readable line goes through [`printable`] ([`lines`], [`say!`]); JSON output
//! ([`json_lines`], `println!` of a serialised value) stays exact: its strings are JSON's own
//! escapes.
//!
//! Listings may be piped into `head`: a closed pipe ends them quietly instead of panicking,
//! as `println!` does.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write;

/// `text` with every control character written as an escape, for a terminal: `\n`, `\r`,
/// `\t`, `\x1b` (ESC), `\x07` (BEL) and the other C0 controls and DEL as `\xNN`; the C1
/// controls (U+0080 to U+009F, which some terminals obey as ESC sequences) and the
/// bidirectional overrides and isolates (U+202A to U+202E, U+2066 to U+2069, which reorder
/// what is shown) as `\u{…}`. Other text, a backslash included, is left as it is.
///
/// ```
/// use outbox::cli::printable;
/// assert_eq!(printable("order-42"), "order-42");
/// assert_eq!(printable("a\x1b]0;pwned\x07\nb"), r"a\x1b]0;pwned\x07\nb");
/// assert_eq!(printable("\u{202e}txt.exe"), r"\u{202e}txt.exe");
/// ```
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str(r"\n"),
            '\r' => out.push_str(r"\r"),
            '\t' => out.push_str(r"\t"),
            c if c.is_ascii_control() => {
                let _ = write!(out, r"\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, r"\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether `c` must not reach a terminal as it is.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Prints one line for people (`format!`'s arguments), escaped with [`printable`].
macro_rules! say {
    () => {
        $crate::cli::out::lines([""])
    };
    ($($arg:tt)*) => {
        $crate::cli::out::lines([format!($($arg)*)])
    };
}
pub(crate) use say;

/// Writes `lines` for people to stdout, one per line, each escaped with [`printable`]; stops
/// at the first write error (a reader that went away, such as `head`, closes the pipe: there
/// is no one left to tell).
pub(super) fn lines<I, S>(lines: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    write_lines(
        lines
            .into_iter()
            .map(|line| printable(line.as_ref()).into_owned()),
    );
}

/// Writes `lines` of JSON to stdout as they are, one per line; stops at the first write
/// error, as [`lines`].
pub(super) fn json_lines<I, S>(lines: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    write_lines(lines);
}

fn write_lines<I, S>(lines: I)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(printable("plain ü 漢字 \\n"), "plain ü 漢字 \\n");
        assert_eq!(
            printable("\x1b[2J\x1b]0;pwned\x07\r\n\t\x7f\0"),
            r"\x1b[2J\x1b]0;pwned\x07\r\n\t\x7f\x00"
        );
        assert_eq!(printable("\u{9b}31m \u{2067}x"), r"\u{9b}31m \u{2067}x");
    }
}
