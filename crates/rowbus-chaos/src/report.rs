//! What a scenario found: its counts, whether the run is valid, and how it is shown (a
//! table, or JSON); and the progress shown while it runs.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use super::time::human;

/// One scenario's result.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub scenario: &'static str,
    pub database: &'static str,
    /// How long faults were injected (the scenario's `--duration`).
    pub faulted: Duration,
    /// How long draining took afterwards.
    pub drained: Duration,
    /// (name, value, meaning), in order.
    pub counts: Vec<(String, u64, &'static str)>,
    /// Why the run is invalid; empty when it is valid.
    pub problems: Vec<String>,
}

/// Count rows from static names.
pub(crate) fn rows(list: Vec<(&'static str, u64, &'static str)>) -> Vec<(String, u64, &'static str)> {
    list.into_iter().map(|(name, value, meaning)| (name.to_owned(), value, meaning)).collect()
}

impl Report {
    pub(crate) fn valid(&self) -> bool {
        self.problems.is_empty()
    }

    pub(crate) fn get(&self, name: &str) -> u64 {
        self.counts.iter().find(|(n, _, _)| *n == name).map_or(0, |(_, v, _)| *v)
    }

    /// Adds a problem when `count` is not zero.
    pub(crate) fn require_zero(&mut self, name: &str) {
        let value = self.get(name);
        if value != 0 {
            self.problems.push(format!("{name} = {value}, must be 0"));
        }
    }

    /// The table printed at the end of a run.
    pub(crate) fn table(&self) -> String {
        let verdict = if self.valid() { "VALID".to_owned() } else { "INVALID".to_owned() };
        let mut out = format!(
            "{} on {}: {} under faults, drained in {}: {verdict}\n",
            self.scenario,
            self.database,
            human(self.faulted),
            human(self.drained)
        );
        let width = self.counts.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
        for (name, value, meaning) in &self.counts {
            out.push_str(&format!("  {name:<width$}  {value:>9}  {meaning}\n"));
        }
        for problem in &self.problems {
            out.push_str(&format!("  ! {problem}\n"));
        }
        out
    }

    pub(crate) fn json(&self) -> Value {
        let mut counts = Map::new();
        for (name, value, _) in &self.counts {
            counts.insert(name.clone(), json!(value));
        }
        json!({
            "scenario": self.scenario,
            "database": self.database,
            "valid": self.valid(),
            "faulted_s": self.faulted.as_secs_f64(),
            "drained_s": self.drained.as_secs_f64(),
            "counts": counts,
            "problems": self.problems,
        })
    }
}

/// A progress bar over the faulted phase (on a terminal), or a status line every 10% of
/// it on stderr (in a log).
pub(crate) struct Progress {
    bar: ProgressBar,
    started: Instant,
    total: Duration,
    printed: Option<Instant>,
    label: String,
}

impl Progress {
    pub(crate) fn new(label: String, total: Duration) -> Self {
        let bar = ProgressBar::new(total.as_secs().max(1));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} s {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.clone());
        Progress { bar, started: Instant::now(), total, printed: None, label }
    }

    /// Shows the elapsed time and `status`.
    pub(crate) fn update(&mut self, status: &str) {
        let elapsed = self.started.elapsed();
        if self.bar.is_hidden() {
            let every = (self.total / 10).max(Duration::from_secs(5));
            if self.printed.is_none_or(|at| at.elapsed() >= every) {
                self.printed = Some(Instant::now());
                eprintln!("rowbus-chaos: {} {}/{}: {status}", self.label, human(elapsed), human(self.total));
            }
        } else {
            self.bar.set_position(elapsed.as_secs().min(self.total.as_secs()));
            self.bar.set_message(status.to_owned());
        }
    }

    /// Says what happens now the faulted phase is over.
    pub(crate) fn phase(&mut self, status: &str) {
        if self.bar.is_hidden() {
            eprintln!("rowbus-chaos: {}: {status}", self.label);
        } else {
            self.bar.set_message(status.to_owned());
        }
    }

    pub(crate) fn finish(self) {
        self.bar.finish_and_clear();
    }
}
