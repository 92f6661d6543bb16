//! ramgrid's server: listeners, connections, dispatch from requests to the store, config, metrics
//! and shutdown. The binary `ramgrid-server` is a thin `main` over this library so that tests can
//! run a server in-process on port 0.

#![warn(missing_docs)]

pub mod auth;
pub mod buffers;
pub mod cluster;
pub mod compute;
pub mod config;
pub mod conn;
mod convert;
pub mod dashboard;
pub mod export;
pub mod http;
pub mod io;
pub mod ledger;
pub mod log;
pub mod memcache;
pub mod meta;
pub mod metrics;
pub mod native;
pub mod node;
pub mod peer;
pub mod peer_pool;
pub mod persist;
pub mod repair;
pub mod replica_check;
pub mod replicate;
pub mod run;
pub mod server;
pub mod shm;
pub mod stats;
pub mod tls;
pub mod wal;

pub use config::Config;
/// The memcached requests' execution, where it was before the server was split by protocol.
pub use memcache::dispatch;
pub use run::{parse_args, run_until, Args, Stopped};
pub use server::{start, ServerHandle};
