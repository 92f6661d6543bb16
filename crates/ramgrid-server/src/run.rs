//! Running a server to the end: parse the flags, start, print the listening line, wait for SIGTERM,
//! SIGINT or the caller's stop, shut down. The `ramgrid-server` binary and the Python binding's
//! `run_server` (a server inside a Python process) both go through here, so they behave alike.

use std::io::Write;
use std::time::Duration;

use clap::Parser;

use crate::config::Config;

/// How often [`run_until`] asks its `stop` callback.
pub const STOP_POLL: Duration = Duration::from_millis(200);

/// What a command line asks for.
#[derive(Debug)]
pub enum Args {
    /// Run a server with this configuration (already validated).
    Run(Box<Config>),
    /// Print this text (`--help`, `--version`) and exit successfully.
    Print(String),
}

/// Parses `ramgrid-server`'s flags (`args` without the program name) and validates the result.
/// `Err` carries the message for the user: a bad flag, or an unsafe or contradictory configuration.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let argv = std::iter::once("ramgrid-server".to_string()).chain(args);
    let config = match Config::try_parse_from(argv) {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            return Ok(Args::Print(e.to_string()))
        }
        Err(e) => return Err(e.to_string()),
    };
    config.validate()?;
    Ok(Args::Run(Box::new(config)))
}

/// Why [`run_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// SIGTERM or SIGINT arrived.
    Signal,
    /// The `stop` callback returned true.
    Asked,
}

/// Installs the log subscriber (`log.rs`), starts a server with `config`, prints `ramgrid-server listening on ADDR` on stdout (scripts
/// and tests read the port from this exact line), then blocks until SIGTERM or SIGINT arrives or
/// `stop` (asked every [`STOP_POLL`]) returns true, and shuts the server down.
///
/// The signal handlers are installed before the server starts, so a signal sent at any moment
/// after the listening line (a supervisor's stop, a test's) shuts it down cleanly: never the
/// default action, which would kill it with connections and files open. A process that installs
/// its own handlers too (Python's SIGINT flag) sees the signal as well, and may use `stop` to
/// notice it.
pub fn run_until(config: &Config, mut stop: impl FnMut() -> bool) -> anyhow::Result<Stopped> {
    use tokio::signal::unix::{signal, SignalKind};
    crate::log::init(&config.log, config.log_format).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        )
    };
    let handle = crate::server::start(config)?;
    let waited = (|| {
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "ramgrid-server listening on {}", handle.local_addr())?;
            out.flush()?;
        }
        rt.block_on(async {
            loop {
                tokio::select! {
                    _ = term.recv() => return Ok(Stopped::Signal),
                    _ = int.recv() => return Ok(Stopped::Signal),
                    _ = tokio::time::sleep(STOP_POLL) => {}
                }
                if stop() {
                    return Ok(Stopped::Asked);
                }
            }
        })
    })();
    handle.shutdown();
    waited.map_err(|e: std::io::Error| e.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn help_is_printed_not_run_and_bad_flags_are_errors() {
        match parse_args(args(&["--help"])) {
            Ok(Args::Print(text)) => assert!(text.contains("--listen"), "{text}"),
            other => panic!("expected help text, got {other:?}"),
        }
        let e = parse_args(args(&["--no-such-flag"])).unwrap_err();
        assert!(e.contains("--no-such-flag"), "{e}");
        let e = parse_args(args(&["--token", " "])).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        assert!(matches!(
            parse_args(args(&["--listen", "127.0.0.1:0"])),
            Ok(Args::Run(_))
        ));
    }

    #[test]
    fn run_until_serves_until_asked_to_stop() {
        let Ok(Args::Run(config)) = parse_args(args(&["--listen", "127.0.0.1:0"])) else {
            panic!("config");
        };
        let mut asked = 0;
        let why = run_until(&config, || {
            asked += 1;
            asked == 2
        })
        .unwrap();
        assert_eq!(why, Stopped::Asked);
        assert_eq!(asked, 2);
    }
}
