//! Structured logs: one line per event on stderr, through `tracing`.
//!
//! `--log` (env `RAMGRID_LOG`) takes `tracing-subscriber`'s filter syntax: a level (`info`, the
//! default) or per-module directives (`warn,ramgrid_server::repair=debug`). Raft's own chatter is
//! kept at `warn` unless a directive names `openraft`. `--log-format json` (env
//! `RAMGRID_LOG_FORMAT`) writes one JSON object per line (`timestamp`, `level`, `target`, and the
//! event's fields, its message under `fields.message`) for log shippers; `text` (the default) is
//! for people.
//!
//! The events (docs/metrics.md, "Logs"): the server started; a spec installed; a table's
//! current version switched; a connection refused for its token; connections refused at
//! `--max-conns` (at most one line a second, with the count since the last); repair, fail-over,
//! rejoin and metadata-group changes; data-directory loads and failures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing_subscriber::EnvFilter;

/// The log line formats `--log-format` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-11-26T10:00:00.123Z  INFO ramgrid_server::server: message key=value ...`
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's log subscriber. A process that already has one (a server hosted in a
/// process that set up its own logging, or a second server in one test process) keeps it.
pub fn init(filter: &str, format: LogFormat) -> Result<(), String> {
    let mut directives = filter.to_owned();
    if !filter.contains("openraft") {
        directives.push_str(",openraft=warn");
    }
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| format!("invalid --log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

/// A log line for a burst of like events, at most once per second: `note()` counts one event and
/// returns how many to report when a line is due now (the count since the last line).
pub struct Throttle {
    last_second: AtomicU64,
    pending: AtomicU64,
}

impl Throttle {
    /// A throttle with nothing counted (a `static`).
    pub const fn new() -> Throttle {
        Throttle {
            last_second: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        }
    }

    /// Counts one event; `Some(count)` when a line is due now.
    pub fn note(&self) -> Option<u64> {
        let n = self.pending.fetch_add(1, Ordering::Relaxed) + 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_second.load(Ordering::Relaxed);
        if now > last
            && self
                .last_second
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.pending.fetch_sub(n, Ordering::Relaxed);
            return Some(n);
        }
        None
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_gives_one_line_with_its_count() {
        let t = Throttle::new();
        assert_eq!(t.note(), Some(1)); // the first event of a second is reported at once
        let later: Vec<_> = (0..100).filter_map(|_| t.note()).collect();
        // Within the same second nothing more is due (the clock may tick once meanwhile).
        assert!(later.len() <= 1, "{later:?}");
    }

    #[test]
    fn a_bad_filter_is_an_error() {
        assert!(init("info,[bad", LogFormat::Text).is_err());
    }
}
