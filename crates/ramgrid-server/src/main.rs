//! `ramgrid-server`: parse flags, start the server, print the bound address, wait for SIGTERM/SIGINT.

use std::io::Write;

use clap::Parser;
use ramgrid_server::Config;

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    ramgrid_server::log::init(&config.log, config.log_format).map_err(anyhow::Error::msg)?;
    let handle = ramgrid_server::start(&config)?;
    {
        // Scripts and tests read the port from this exact line (port 0 picks a free one).
        let mut out = std::io::stdout().lock();
        writeln!(out, "ramgrid-server listening on {}", handle.local_addr())?;
        out.flush()?;
    }
    wait_for_signal()?;
    handle.shutdown();
    Ok(())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_signal() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok::<_, std::io::Error>(())
    })?;
    Ok(())
}
