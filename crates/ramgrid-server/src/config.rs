//! Server configuration: command-line flags (names kept stable for scripts) and size parsing.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// `ramgrid-server` flags. Benchmarks and operations scripts depend on `--listen`, `--threads`, `--memory`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ramgrid-server",
    version,
    about = "ramgrid server: memcached-compatible in-memory store"
)]
pub struct Config {
    /// Address to listen on. Loopback by default; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:11211", env = "RAMGRID_LISTEN")]
    pub listen: SocketAddr,
    /// Worker threads (connections are spread over them round-robin).
    #[arg(long, default_value_t = default_threads(), env = "RAMGRID_THREADS")]
    pub threads: usize,
    /// Memory limit for cached items, e.g. 64MiB, 1GiB, 512m.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, env = "RAMGRID_MEMORY")]
    pub memory: u64,
    /// Largest item (key + value + overhead), like memcached's -I.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub max_item_size: u64,
    /// Most simultaneous client connections; further ones are refused with a SERVER_ERROR line.
    #[arg(long, default_value_t = 4096)]
    pub max_conns: usize,
    /// Refuse writes with `SERVER_ERROR out of memory` instead of evicting (memcached's -M).
    #[arg(long)]
    pub no_evict: bool,
    /// Longest command line accepted before the connection is closed.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub max_line: u64,
    /// Close a connection whose pending replies could not be written for this many seconds (a client that stopped reading).
    #[arg(long, default_value_t = 30)]
    pub write_timeout_secs: u64,
    /// Refuse `flush_all` (memcached's -F).
    #[arg(long)]
    pub disable_flush_all: bool,
    /// Lock shards in the cache index.
    #[arg(long, default_value_t = 256)]
    pub shards: usize,
    /// Memory limit for native tables (authoritative data: never evicted; writes past it are refused).
    #[arg(long, default_value = "1GiB", value_parser = parse_size, env = "RAMGRID_TABLE_MEMORY")]
    pub table_memory: u64,
    /// Memory for connection buffers beyond each connection's small fixed base, across all
    /// connections and both protocols (large requests and replies wait for it, see buffers.rs).
    #[arg(long, default_value = "64MiB", value_parser = parse_size, env = "RAMGRID_BUFFER_MEMORY")]
    pub buffer_memory: u64,
    /// Largest native frame body accepted; a larger length prefix closes the connection. HELLO
    /// announces the smaller of this and a quarter of `--buffer-memory`.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub max_frame: u64,
    /// Cluster spec file: one `host:port` (or `server host:port`) per line, in order, `#` comments; the same file clients read. Without it the server waits for SET_SPEC or learns the spec from --join peers.
    #[arg(long, env = "RAMGRID_CLUSTER_SPEC")]
    pub cluster_spec: Option<std::path::PathBuf>,
    /// Peers to learn the cluster spec and tables from when this server has no spec (a server
    /// restarted, or added): comma-separated `host:port`s. It then copies its partitions from
    /// their replicas before serving them (docs/membership.md).
    #[arg(long, env = "RAMGRID_JOIN", value_delimiter = ',')]
    pub join: Vec<String>,
    /// How long a server may fail to answer the metadata group's leader before it is failed
    /// over (taken out of the spec, its partitions re-replicated from their other replicas). A
    /// server cut off from the group stops serving one second sooner (its lease).
    #[arg(long, default_value_t = 5000, env = "RAMGRID_FAILURE_TIMEOUT_MS")]
    pub failure_timeout_ms: u64,
    /// How often this server compares the partitions it is the primary of with their other
    /// replicas, and has one that differs copy them in again (docs/replication.md); 0: never.
    #[arg(long, default_value_t = 60_000, env = "RAMGRID_REPLICA_CHECK_MS")]
    pub replica_check_ms: u64,
    /// Auth token: native clients present it in HELLO, memcached clients as the password of memcached's
    /// text-protocol authentication. Required to listen on a non-loopback address; never empty.
    #[arg(long, env = "RAMGRID_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// With a token: close a connection that has not authenticated within this many seconds.
    #[arg(long, default_value_t = 10)]
    pub auth_timeout_secs: u64,
    /// TLS certificate chain (PEM, leaf first). With it every connection on the port, both
    /// protocols, is TLS (docs/tls.md); the token is still required off loopback.
    #[arg(long, env = "RAMGRID_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "RAMGRID_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Require a client certificate signed by this CA (PEM) on every connection. Peers then
    /// present their own --tls-cert as their client certificate.
    #[arg(long, env = "RAMGRID_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// The CA (PEM) that signed the peers' certificates, to verify them on server-to-server
    /// connections; defaults to --tls-client-ca.
    #[arg(long, env = "RAMGRID_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Data directory: tables created with durability "snapshot" write each sealed version
    /// here and are loaded from it at start (docs/durability.md). Without
    /// it every table lives in memory only.
    #[arg(long, env = "RAMGRID_DATA_DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// The control plane's state directory: this server's Raft node id, vote and log
    /// (docs/control-plane.md). A server restarted with it rejoins the metadata group as the voter
    /// it was, even when its tables are gone (no --data-dir), so a restart never costs the group a
    /// voter. Default: `DATA_DIR/meta` with --data-dir; without either the server is a new Raft
    /// node at every start (its old id stays a voter until the leader replaces it).
    #[arg(long, env = "RAMGRID_META_DIR")]
    pub meta_dir: Option<std::path::PathBuf>,
    /// Shared memory for client processes on this host (docs/shared-memory.md): the directory of
    /// the Unix socket through which they map sealed versions (`shm-<ip>-<port>.sock`). `auto`:
    /// `$XDG_RUNTIME_DIR/ramgrid`, else `/tmp/ramgrid-<uid>`; `off`: no socket.
    #[arg(long, env = "RAMGRID_SHM_DIR", default_value = "auto")]
    pub shm_dir: String,
    /// Serve HTTP on this address (alias --http): Prometheus metrics at `/metrics` and the live
    /// dashboard at `/` (docs/dashboard.md); off by default. A non-loopback address needs --token
    /// (both then require it there) or --insecure-no-auth (metrics open to all, dashboard shut).
    #[arg(long, visible_alias = "http", env = "RAMGRID_METRICS")]
    pub metrics: Option<SocketAddr>,
    /// Allow listening on a non-loopback address without a token. Anyone who can reach the port can read and write everything.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Log filter: a level (error, warn, info, debug, trace) or per-module directives, e.g. `info,ramgrid_server::repair=debug`. Logs go to stderr, one line per event
    #[arg(long = "log", env = "RAMGRID_LOG", default_value = "info")]
    pub log: String,
    /// Log line format: `text` for people, `json` (one object per line) for log shippers
    #[arg(long, env = "RAMGRID_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: crate::log::LogFormat,
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

impl Config {
    /// A configuration for tests and embedding: loopback, free port, small memory.
    pub fn for_tests() -> Config {
        Config::parse_from([
            "ramgrid-server",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--memory",
            "64MiB",
        ])
    }

    /// Refuses configurations that are unsafe or contradictory, with a message saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(token) = &self.token {
            // An empty secret would let every client in: refuse it rather than read it as "no auth".
            if token.trim().is_empty() {
                return Err(
                    "the auth token (--token or RAMGRID_TOKEN) is empty: an empty token would \
                            let anyone in; set a real secret, or unset it on a loopback address"
                        .to_string(),
                );
            }
        }
        if !self.listen.ip().is_loopback() && self.token.is_none() && !self.insecure_no_auth {
            return Err(format!(
                "refusing to listen on non-loopback address {} without an auth token: pass --token (or RAMGRID_TOKEN), \
                 or --insecure-no-auth to accept that anyone who reaches the port can read and write all data",
                self.listen
            ));
        }
        if self.threads == 0 || self.threads > 1024 {
            return Err(format!(
                "--threads must be between 1 and 1024, got {}",
                self.threads
            ));
        }
        if self.max_item_size < 1024 || self.max_item_size > (1 << 30) {
            return Err(format!(
                "--max-item-size must be between 1KiB and 1GiB, got {}",
                self.max_item_size
            ));
        }
        // The largest memcached request (a line and a data block) must fit in the buffer budget.
        if self.buffer_memory < 2 * (self.max_item_size + self.max_line) {
            return Err(format!(
                "--buffer-memory ({}) must be at least twice --max-item-size + --max-line ({})",
                self.buffer_memory,
                self.max_item_size + self.max_line
            ));
        }
        if self.memory < self.max_item_size {
            return Err(format!(
                "--memory ({}) must be at least --max-item-size ({})",
                self.memory, self.max_item_size
            ));
        }
        Ok(())
    }

    /// Where the metadata group's state is kept: `--meta-dir`, else `DATA_DIR/meta`, else nowhere.
    pub fn meta_dir_or_default(&self) -> Option<std::path::PathBuf> {
        self.meta_dir
            .clone()
            .or_else(|| self.data_dir.as_ref().map(|d| d.join("meta")))
    }

    /// The largest native frame body this server accepts and announces in HELLO: `--max-frame`,
    /// but no more than a quarter of `--buffer-memory`, so several such frames fit at once.
    pub fn max_body(&self) -> usize {
        let quarter = self.buffer_memory / 4;
        usize::try_from(self.max_frame.min(quarter)).unwrap_or(usize::MAX)
    }

    /// How long a connection may stay unauthenticated (only with a token).
    pub fn auth_timeout(&self) -> Duration {
        Duration::from_secs(self.auth_timeout_secs.max(1))
    }

    /// The write timeout as a duration.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_secs(self.write_timeout_secs.max(1))
    }
}

/// Parses a size such as `1048576`, `64m`, `64MB`, `64MiB`, `1g`, `1GiB`, `512k`. Units are binary (memcached's `-m 64` means 64 MiB).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number with an optional unit like 64MiB")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?}: use B, KiB, MiB, GiB or TiB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }

    #[test]
    fn stable_flag_names() {
        let c = Config::parse_from([
            "x",
            "--listen",
            "127.0.0.1:7000",
            "--threads",
            "3",
            "--memory",
            "1GiB",
        ]);
        assert_eq!(c.threads, 3);
        assert_eq!(c.memory, 1 << 30);
        assert_eq!(c.listen.port(), 7000);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn non_loopback_needs_a_token() {
        let c = Config::parse_from(["x", "--listen", "0.0.0.0:7000"]);
        assert!(c.validate().unwrap_err().contains("--token"));
        let c = Config::parse_from(["x", "--listen", "0.0.0.0:7000", "--token", "s3cret"]);
        assert!(c.validate().is_ok());
        let c = Config::parse_from(["x", "--listen", "0.0.0.0:7000", "--insecure-no-auth"]);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn an_empty_token_is_refused() {
        for token in ["", "   "] {
            for listen in ["0.0.0.0:7000", "127.0.0.1:7000"] {
                let c = Config::parse_from(["x", "--listen", listen, "--token", token]);
                assert!(
                    c.validate().unwrap_err().contains("empty"),
                    "{listen} {token:?}"
                );
            }
        }
    }
}
