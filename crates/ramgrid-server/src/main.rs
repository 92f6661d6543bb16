//! `ramgrid-server`: parse flags, then `ramgrid_server::run_until`: start the server, print the bound
//! address, wait for SIGTERM/SIGINT, shut down.

use clap::Parser;
use ramgrid_server::Config;

fn main() -> anyhow::Result<()> {
    // clap prints help or a bad flag's message and exits (2 for a bad flag) by itself.
    let config = Config::parse();
    ramgrid_server::run_until(&config, || false)?;
    Ok(())
}
