//! Shared harness for the multi-server tests: real `ramgrid-server` processes on loopback, killed
//! (or stopped) where a test needs a fault, and always reaped when the test ends, even on panic.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

use ramgrid_client::{Client, ClientConfig};

pub fn server_binary() -> PathBuf {
    static BUILD: Once = Once::new();
    // target/debug/deps/cluster-HASH -> target/debug/ramgrid-server
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("ramgrid-server");
    BUILD.call_once(|| {
        // Make sure the server is built and current (a no-op when it is).
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "ramgrid-server"]);
        // As a build from the shell: cargo sets CARGO_MANIFEST_DIR, CARGO_PKG_NAME and the like
        // for this test, and a dependency's build script that watches them (ring's) would
        // otherwise make this build and the next plain one rebuild half the tree each.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            let per_package = [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
            ]
            .iter()
            .any(|p| k.starts_with(p));
            if per_package || k == "CARGO_PRIMARY_PACKAGE" || k == "CARGO_TARGET_TMPDIR" {
                cmd.env_remove(k.as_ref());
            }
        }
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build -p ramgrid-server");
        assert!(status.success(), "cargo build -p ramgrid-server failed");
    });
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p ramgrid-server`",
        bin.display()
    );
    bin
}

/// A server process; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: String,
    extra: Vec<String>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_at("127.0.0.1:0", extra)
    }

    /// A server listening on `listen` (`127.0.0.1:0` picks a free port).
    pub fn start_at(listen: &str, extra: &[&str]) -> Server {
        // A test's own --table-memory replaces the default (clap takes each flag once).
        let table_memory = if extra.contains(&"--table-memory") {
            &[][..]
        } else {
            &["--table-memory", "256MiB"][..]
        };
        let mut child = Command::new(server_binary())
            .args(["--listen", listen, "--threads", "1", "--memory", "16MiB"])
            .args(table_memory)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ramgrid-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read listening line");
        let addr = line
            .trim()
            .strip_prefix("ramgrid-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server {
            child,
            addr,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL (also ends a stopped process)
        let _ = self.child.wait();
    }

    /// Kills the process and starts a new one on the same address with the same flags (empty: no
    /// spec, no tables).
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let fresh = Server::start_at(&self.addr, &extra);
        assert_eq!(fresh.addr, self.addr);
        *self = fresh;
    }

    /// SIGSTOP: the process keeps its sockets open (the kernel still accepts connections) but never
    /// answers, like a hung machine. Resumed (SIGCONT) when the guard drops, even on panic.
    pub fn pause(&self) -> Paused {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: a plain syscall on a child process this test owns and has not reaped.
        let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(rc, 0, "SIGSTOP {pid}");
        let paused = Paused { pid };
        // kill() returns before every thread has stopped; a thread already running could still
        // answer a request. Wait (bounded) until /proc shows each thread stopped.
        let start = std::time::Instant::now();
        while !all_threads_stopped(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{pid} did not stop"
            );
            std::thread::yield_now();
        }
        paused
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether every thread of `pid` is in state T (stopped), from /proc.
fn all_threads_stopped(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // "tid (comm) S ...": the state follows the last ')'.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

/// A stopped server; SIGCONT on drop.
pub struct Paused {
    pid: libc::pid_t,
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: as in `Server::pause`; the process is ours (killing it also ends the stop).
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

pub struct Cluster {
    pub servers: Vec<Server>,
}

impl Cluster {
    /// `n` servers with the spec pushed by a first client.
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with(n, &[])
    }

    pub fn start_with(n: usize, extra: &[&str]) -> Cluster {
        let servers: Vec<Server> = (0..n).map(|_| Server::start(extra)).collect();
        Cluster { servers }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    pub fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addrs());
        c.timeout = Duration::from_secs(5);
        c.connect_timeout = Duration::from_millis(500);
        c
    }

    pub fn client(&self) -> Client {
        let c = Client::new(self.config()).expect("client");
        c.push_spec().expect("push spec");
        c
    }
}
