//! Crontab files (`outbox run --crontab FILE`): schedules for registered keywords, without
//! code, as graphile-worker's crontab does.
//!
//! One schedule per line: the six cron fields (optionally after `TZ=Area/City`), the keyword
//! (optionally followed by `?fill=DURATION`, the backfill window), then optional JSON data,
//! the payload of each tick's task. Blank lines and lines starting with `#` are ignored.
//!
//! ```text
//! # sec min hour dom mon dow  keyword               data
//! 0     0   3    *   *   *    report.daily          {"format": "pdf"}
//! 0/10  *   *    *   *   ?    metrics.flush
//! TZ=Europe/Paris 0 0 9 * * MON-FRI  mail.digest?fill=2h
//! ```

use std::path::Path;

use super::{Schedule, ScheduleError};
use crate::registry::Registry;
use crate::task::validate_keyword;

/// One schedule of a crontab file.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CrontabEntry {
    /// The line it is on (1-based).
    pub line: usize,
    /// The keyword it schedules.
    pub keyword: String,
    /// The schedule, with its backfill and data.
    pub schedule: Schedule,
}

/// Reads and parses the crontab file `path` ([`parse_crontab`]).
pub fn parse_crontab_file(path: &Path) -> Result<Vec<CrontabEntry>, ScheduleError> {
    let text = std::fs::read_to_string(path).map_err(|e| ScheduleError::Crontab {
        path: path.display().to_string(),
        line: None,
        reason: format!("cannot read it: {e}"),
    })?;
    parse_crontab(&text, &path.display().to_string())
}

/// Parses the text of a crontab file named `path` (for the errors): every line is checked —
/// the expression, the keyword's form, the backfill, the data, a keyword on two lines — and
/// the first error is a [`ScheduleError::Crontab`] naming the file, the line and what is
/// wrong. Whether each keyword has a handler is checked by [`Registry::add_crontab`].
pub fn parse_crontab(text: &str, path: &str) -> Result<Vec<CrontabEntry>, ScheduleError> {
    let mut entries: Vec<CrontabEntry> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let at = |reason: String| ScheduleError::Crontab {
            path: path.to_owned(),
            line: Some(line),
            reason,
        };
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let entry = parse_line(content, line).map_err(at)?;
        if let Some(first) = entries.iter().find(|e| e.keyword == entry.keyword) {
            return Err(at(format!(
                "keyword {:?} is scheduled again (first on line {}): one schedule per keyword",
                entry.keyword, first.line
            )));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// One line that is neither blank nor a comment.
fn parse_line(content: &str, line: usize) -> Result<CrontabEntry, String> {
    let mut rest = content;
    let mut fields: Vec<&str> = Vec::new();
    // The zone prefix, then six fields, then the keyword.
    let mut wanted = 7;
    while fields.len() < wanted {
        let Some((token, after)) = next_token(rest) else {
            return Err(too_short(&fields, wanted > 7));
        };
        if fields.is_empty() && (token.starts_with("TZ=") || token.starts_with("CRON_TZ=")) {
            wanted += 1;
        }
        fields.push(token);
        rest = after;
    }
    let keyword_token = fields.pop().expect("seven or eight tokens");
    let expression = fields.join(" ");
    let (keyword, options) = match keyword_token.split_once('?') {
        Some((keyword, options)) => (keyword, Some(options)),
        None => (keyword_token, None),
    };
    validate_keyword(keyword).map_err(|e| e.to_string())?;
    let mut schedule = Schedule::parse(&expression).map_err(|e| e.to_string())?;
    for option in options.into_iter().flat_map(|o| o.split('&')) {
        match option.split_once('=') {
            Some(("fill", value)) => {
                let window = humantime::parse_duration(value)
                    .map_err(|e| format!("fill={value}: {e} (write durations like 30m, 2h, 1d)"))?;
                schedule = schedule.backfill(window);
            }
            _ => {
                return Err(format!(
                    "unknown option {option:?} after keyword {keyword:?} (known: fill=DURATION)"
                ))
            }
        }
    }
    let data = rest.trim();
    if !data.is_empty() {
        let value: serde_json::Value = serde_json::from_str(data)
            .map_err(|e| format!("data for keyword {keyword:?} is not valid JSON: {e}"))?;
        schedule = schedule.data(value);
    }
    Ok(CrontabEntry {
        line,
        keyword: keyword.to_owned(),
        schedule,
    })
}

/// What is wrong with a line of only `words` (all it has; `zoned`: the first is `TZ=…`): the
/// count of what the user wrote, the format, and, for six words, the likely cause — a
/// five-field crontab line (no seconds) or six fields without a keyword.
fn too_short(words: &[&str], zoned: bool) -> String {
    let (need, zone) = if zoned { (8, "TZ=…, ") } else { (7, "") };
    let n = words.len();
    let mut message = format!(
        "{n} word{} where a schedule needs {need} or more: {zone}six cron fields with seconds \
         first (sec min hour dom mon dow), then a keyword, then optional JSON data",
        if n == 1 { "" } else { "s" }
    );
    let schedule = &words[usize::from(zoned)..];
    if let [fields @ .., last] = schedule {
        if schedule.len() == 6 {
            if validate_keyword(last).is_ok() {
                let mut fixed: Vec<&str> = words[..usize::from(zoned)].to_vec();
                fixed.push("0");
                fixed.extend(fields);
                fixed.push(last);
                message.push_str(&format!(
                    "; a five-field crontab line (min hour dom mon dow) takes its seconds \
                     first: {:?}",
                    fixed.join(" ")
                ));
            } else {
                message.push_str("; the keyword is missing after the six cron fields");
            }
        }
    }
    message
}

/// The next whitespace-separated token of `text` and what follows it.
fn next_token(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((&text[..end], &text[end..]))
}

impl Registry {
    /// Adds the schedules of the crontab file `path` ([`parse_crontab_file`]) to registered
    /// keywords; returns how many. A keyword with no handler, or one already scheduled, is
    /// a [`ScheduleError::Crontab`] naming the file and the line. Nothing is added unless
    /// every line is good.
    pub fn add_crontab(&mut self, path: &Path) -> Result<usize, ScheduleError> {
        let entries = parse_crontab_file(path)?;
        let mut scheduled = self.clone();
        for entry in &entries {
            let at = |reason: String| ScheduleError::Crontab {
                path: path.display().to_string(),
                line: Some(entry.line),
                reason,
            };
            match scheduled.add_schedule(&entry.keyword, entry.schedule.clone()) {
                Ok(_) => {}
                Err(ScheduleError::UnknownKeyword { keyword }) => {
                    let known: Vec<&str> = self.keywords().collect();
                    return Err(at(format!(
                        "keyword {keyword:?} has no handler in this program (its keywords: {})",
                        known.join(", ")
                    )));
                }
                Err(e) => return Err(at(e.to_string())),
            }
        }
        *self = scheduled;
        Ok(entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> (Option<usize>, String) {
        match parse_crontab(text, "jobs.cron") {
            Err(ScheduleError::Crontab { path, line, reason }) => {
                assert_eq!(path, "jobs.cron");
                (line, reason)
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn lines_comments_zones_options_and_data() {
        let text = "\
# a comment

0 0 3 * * *   report.daily   {\"format\": \"pdf\", \"to\": [\"a b\"]}
0/10 * * * * ?  metrics.flush
  TZ=Europe/Paris 0 0 9 * * MON-FRI mail.digest?fill=2h
";
        let entries = parse_crontab(text, "jobs.cron").unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(
            (entries[0].line, entries[0].keyword.as_str()),
            (3, "report.daily")
        );
        assert_eq!(entries[0].schedule.expression(), "0 0 3 * * *");
        assert_eq!(
            entries[0].schedule.payload(),
            Some(&serde_json::json!({"format": "pdf", "to": ["a b"]}))
        );
        assert_eq!(entries[1].schedule.payload(), None);
        assert_eq!(
            entries[1].schedule.backfill_window(),
            std::time::Duration::ZERO
        );
        assert_eq!(entries[2].keyword, "mail.digest");
        assert_eq!(entries[2].schedule.time_zone(), "Europe/Paris");
        assert_eq!(
            entries[2].schedule.backfill_window(),
            std::time::Duration::from_secs(7200)
        );
    }

    #[test]
    fn each_bad_line_names_its_line_and_what_is_wrong() {
        let (line, reason) = error("\n0 0 3 * * * report.daily\n0 0 3 * * report.weekly\n");
        assert_eq!(line, Some(3));
        assert_eq!(
            reason,
            "6 words where a schedule needs 7 or more: six cron fields with seconds first \
             (sec min hour dom mon dow), then a keyword, then optional JSON data; a five-field \
             crontab line (min hour dom mon dow) takes its seconds first: \
             \"0 0 0 3 * * report.weekly\""
        );
        let (line, reason) = error("0 0 25 * * * report.daily");
        assert_eq!(line, Some(1));
        assert!(
            reason.starts_with("cron expression \"0 0 25 * * *\": "),
            "{reason}"
        );
        let (_, reason) = error("0 0 3 * * * report.daily {\"format\": pdf}");
        assert!(
            reason.starts_with("data for keyword \"report.daily\" is not valid JSON"),
            "{reason}"
        );
        let (_, reason) = error("0 0 3 * * * Report.Daily");
        assert!(
            reason.contains("invalid keyword \"Report.Daily\""),
            "{reason}"
        );
        let (_, reason) = error("0 0 3 * * * report.daily?fill=soon");
        assert!(reason.starts_with("fill=soon: "), "{reason}");
        let (_, reason) = error("0 0 3 * * * report.daily?every=2h");
        assert!(reason.contains("unknown option \"every=2h\""), "{reason}");
        let (line, reason) = error("0 0 3 * * * a\n0 0 4 * * * a");
        assert_eq!(line, Some(2));
        assert!(
            reason.contains("scheduled again (first on line 1)"),
            "{reason}"
        );
        let (_, reason) = error("TZ=Nowhere/Else 0 0 3 * * * a");
        assert!(reason.contains("unknown time zone"), "{reason}");
        let (_, reason) = error("TZ=Europe/Paris 0 0 3 * * *");
        assert_eq!(
            reason,
            "7 words where a schedule needs 8 or more: TZ=…, six cron fields with seconds \
             first (sec min hour dom mon dow), then a keyword, then optional JSON data; the \
             keyword is missing after the six cron fields"
        );
        let (_, reason) = error("TZ=Europe/Paris 30 9 * * mail.digest");
        assert!(
            reason.starts_with("6 words where a schedule needs 8 or more: "),
            "{reason}"
        );
        let (_, reason) = error("*/5 * * * *");
        assert_eq!(
            reason,
            "5 words where a schedule needs 7 or more: six cron fields with seconds first \
             (sec min hour dom mon dow), then a keyword, then optional JSON data"
        );
        let (_, reason) = error("@daily report.daily");
        assert!(
            reason.starts_with("2 words where a schedule needs 7 or more: "),
            "{reason}"
        );
    }

    #[test]
    fn an_empty_file_has_no_schedules() {
        assert!(parse_crontab("\n# nothing\n   \n", "f").unwrap().is_empty());
    }
}
