//! The task filter flags shared by `outbox list` and `outbox retry --all`.

use std::time::Duration;

use clap::Args;

use super::parse_duration;
use crate::ops::Filter;
use crate::task::TaskState;

/// Which tasks: every flag given must hold.
#[derive(Debug, Clone, Default, Args)]
pub(super) struct FilterArgs {
    /// Only tasks in these states (repeat the flag or separate with commas): pending,
    /// blocked, running, done, dead, cancelled.
    #[arg(long, value_name = "STATE", value_delimiter = ',', value_parser = parse_state)]
    state: Vec<TaskState>,
    /// Only tasks of this keyword.
    #[arg(long)]
    keyword: Option<String>,
    /// Only tasks of this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Only the task with this business key (one per keyword).
    #[arg(long)]
    biz_id: Option<String>,
    /// Only tasks created more than this long ago (database clock), e.g. 1h, 7d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Only tasks created at most this long ago (database clock), e.g. 10m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    newer_than: Option<Duration>,
}

impl FilterArgs {
    /// Whether any flag is given.
    pub(super) fn is_empty(&self) -> bool {
        self.filter() == Filter::default()
    }

    /// The library's filter.
    pub(super) fn filter(&self) -> Filter {
        let mut filter = Filter::default();
        for state in &self.state {
            filter = filter.state(*state);
        }
        if let Some(keyword) = &self.keyword {
            filter = filter.keyword(keyword.clone());
        }
        if let Some(tenant) = &self.tenant {
            filter = filter.tenant(tenant.clone());
        }
        if let Some(biz_id) = &self.biz_id {
            filter = filter.biz_id(biz_id.clone());
        }
        if let Some(age) = self.older_than {
            filter = filter.older_than(age);
        }
        if let Some(age) = self.newer_than {
            filter = filter.newer_than(age);
        }
        filter
    }
}

/// A state as stored (`dead`).
fn parse_state(text: &str) -> Result<TaskState, String> {
    text.parse::<TaskState>().map_err(|_| {
        let states: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
        format!("expected one of {}", states.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        filter: FilterArgs,
    }

    #[test]
    fn states_repeat_or_split_on_commas() {
        let args = Test::try_parse_from(["t", "--state", "dead,cancelled", "--state", "dead"])
            .unwrap()
            .filter;
        assert_eq!(
            args.filter().states,
            [TaskState::Dead, TaskState::Cancelled]
        );
        assert!(!args.is_empty());
        assert!(Test::try_parse_from(["t"]).unwrap().filter.is_empty());
    }

    #[test]
    fn bad_states_and_durations_are_usage_errors() {
        let error = Test::try_parse_from(["t", "--state", "finished"])
            .err()
            .unwrap();
        assert!(
            error
                .to_string()
                .contains("expected one of blocked, pending"),
            "{error}"
        );
        let error = Test::try_parse_from(["t", "--older-than", "soon"])
            .err()
            .unwrap();
        assert!(error.to_string().contains("--older-than"), "{error}");
    }
}
