//! Aligned tables for people: each column as wide as its widest cell, each cell escaped for
//! the terminal ([`super::printable`]).

use super::printable;

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Align {
    Left,
    Right,
}

/// `header` and `rows` as aligned columns separated by two spaces; the last column is never
/// padded (it may hold long text). Cells are escaped before they are measured.
pub(super) fn render(header: &[(&str, Align)], rows: &[Vec<String>]) -> Vec<String> {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| printable(c).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|(h, _)| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            match header[i].1 {
                Align::Right => {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                }
                Align::Left if i == last => out.push_str(cell),
                Align::Left => {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(header.iter().map(|(h, _)| *h).collect())];
    for row in &rows {
        lines.push(line(row.iter().map(String::as_str).collect()));
    }
    lines
}

/// A cell of free text (an error): its first line, escaped, cut to `max` characters (`…`
/// marks a cut).
pub(super) fn cell(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("");
    let more = first.len() < text.trim_end().len();
    cut(&printable(first), max, more)
}

/// A cell of a name (a biz_id, a tenant): the whole of it escaped, a newline included, cut to
/// `max` characters.
pub(super) fn name(text: &str, max: usize) -> String {
    cut(&printable(text), max, false)
}

/// `text` cut to `max` characters, `…` marking the cut (or `more` text after it).
fn cut(text: &str, max: usize, more: bool) -> String {
    if text.chars().count() <= max && !more {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// An age in seconds, as people read it: `42s`, `3m12s`, `5h03m`, `2d04h`.
pub(super) fn age(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let lines = render(
            &[
                ("id", Align::Right),
                ("state", Align::Left),
                ("error", Align::Left),
            ],
            &[
                vec!["7".into(), "dead".into(), "boom".into()],
                vec!["1234".into(), "cancelled".into(), String::new()],
            ],
        );
        assert_eq!(
            lines,
            [
                "  id  state      error",
                "   7  dead       boom",
                "1234  cancelled",
            ]
        );
    }

    #[test]
    fn cells_keep_their_first_line_cut_to_size() {
        assert_eq!(cell("short", 10), "short");
        assert_eq!(cell("a very long message", 7), "a very…");
        assert_eq!(cell("first\nsecond", 20), "first…");
        assert_eq!(cell("\x1b]0;x\x07 boom\nat", 20), r"\x1b]0;x\x07 boom…");
        assert_eq!(name("a\nb", 20), r"a\nb");
        assert_eq!(name("order\x1b[2J-42", 10), r"order\x1b…");
    }

    #[test]
    fn cells_are_escaped_before_they_are_measured() {
        let lines = render(
            &[("biz_id", Align::Left), ("n", Align::Right)],
            &[
                vec!["a\x07".into(), "1".into()],
                vec!["bcdef".into(), "2".into()],
            ],
        );
        assert_eq!(lines, ["biz_id  n", r"a\x07   1", "bcdef   2"]);
    }

    #[test]
    fn ages_read_plainly() {
        assert_eq!(age(0.4), "0s");
        assert_eq!(age(192.0), "3m12s");
        assert_eq!(age(5.0 * 3600.0 + 180.0), "5h03m");
        assert_eq!(age(2.0 * 86_400.0 + 4.0 * 3600.0), "2d04h");
    }
}
