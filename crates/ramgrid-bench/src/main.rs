//! ramgrid-bench: a closed-loop load generator speaking the memcached text protocol, so that one binary
//! measures ramgrid and memcached alike.
//!
//! Workloads: `get` (one key per request), `get-pipelined` (`--depth` gets sent back to back),
//! `multiget` (`get k1 .. kK`), `meta-multiget` (`mg <key> v k q` per key, then `mn`), `set`, and
//! `load` (write every key once, in pipelined batches).
//! Every reply is parsed and checked; one that does not parse stops the run with an error.

mod driver;
mod keys;
mod native;
mod procstat;
mod reply;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, ValueEnum};

use driver::{Conn, Op, Plan, Shape, Tally};
use keys::KeySpace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// One single-key get per round trip.
    Get,
    /// `--depth` single-key gets written back to back, then all replies read.
    GetPipelined,
    /// One `get` of `--keys-per-get` keys per round trip.
    Multiget,
    /// A native-protocol get of `--keys-per-get` int64 keys per round trip, through the cluster
    /// client, one per client thread (`--connections` threads); ramgrid only. Loads its own table
    /// of `--key-count` keys first.
    NativeGet,
    /// A meta-protocol multi-get per round trip: `mg <key> v k q` for each of `--keys-per-get`
    /// keys, then `mn` (memcached's pipelined form of a multi-key get).
    MetaMultiget,
    /// One set per round trip.
    Set,
    /// Writes every key of the key space once, `--load-batch` sets per round trip.
    Load,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Get => "get",
            Workload::GetPipelined => "get-pipelined",
            Workload::Multiget => "multiget",
            Workload::MetaMultiget => "meta-multiget",
            Workload::NativeGet => "native-get",
            Workload::Set => "set",
            Workload::Load => "load",
        }
    }
}

/// Closed-loop memcached-protocol load generator.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Server address.
    #[arg(long, default_value = "127.0.0.1:11211")]
    server: String,
    /// Concurrent connections, each with one batch in flight.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Client threads, each running an event loop over its share of the connections.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds to measure (default 5 unless --requests is given).
    #[arg(long)]
    duration: Option<f64>,
    /// Stop after about this many measured requests (a multiget counts as one).
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    #[arg(long, value_enum, default_value_t = Workload::Get)]
    workload: Workload,
    /// Pipeline depth of get-pipelined.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Keys per request of multiget and meta-multiget.
    #[arg(long, default_value_t = 10)]
    keys_per_get: usize,
    /// Keys in the key space; requests draw uniformly from it.
    #[arg(long, default_value_t = 1_000_000)]
    key_count: u64,
    /// Length of every key in bytes (`key:` and a zero-padded id).
    #[arg(long, default_value_t = 14)]
    key_size: usize,
    /// Value length in bytes for set and load.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Sets per round trip of the load workload.
    #[arg(long, default_value_t = 100)]
    load_batch: usize,
    /// Server process whose CPU time (from /proc) is charged to the measured window.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Print one JSON object instead of a human line.
    #[arg(long)]
    json: bool,
    /// Seed of the key choice (each connection derives its own stream).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds any connect, or any batch without progress, may take before the run fails.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
}

/// Converts a seconds flag to a duration, refusing negative and absurd values.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .with_context(|| format!("--{flag} must be a number of seconds >= 0"))
}

/// CPU seconds of the server (if known) and of this process.
#[derive(Clone, Copy)]
struct CpuSample {
    server: Option<f64>,
    client: f64,
}

fn sample_cpu(server_pid: Option<u32>) -> Result<CpuSample> {
    Ok(CpuSample {
        server: server_pid
            .map(|pid| procstat::cpu_seconds(Some(pid)))
            .transpose()?,
        client: procstat::cpu_seconds(None)?,
    })
}

/// Sleeps until `until`, waking early once every worker has finished (quota met, or a failure).
fn wait_for(until: Instant, workers: &[thread::ScopedJoinHandle<'_, Result<Tally>>]) {
    loop {
        let now = Instant::now();
        if now >= until || workers.iter().all(|w| w.is_finished()) {
            return;
        }
        thread::sleep((until - now).min(Duration::from_millis(10)));
    }
}

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connecting to {addr}"))
}

/// What a run measured, ready to print.
struct Report {
    window_s: f64,
    tally: Tally,
    server_cpu_s: Option<f64>,
    client_cpu_s: f64,
}

fn run(args: &Args) -> Result<Report> {
    ensure!(args.connections >= 1, "--connections must be at least 1");
    ensure!(
        (1..=args.connections).contains(&args.threads),
        "--threads must be between 1 and --connections"
    );
    ensure!(args.depth >= 1, "--depth must be at least 1");
    ensure!(args.keys_per_get >= 1, "--keys-per-get must be at least 1");
    ensure!(args.load_batch >= 1, "--load-batch must be at least 1");
    ensure!(args.requests != Some(0), "--requests must be at least 1");
    let keys = KeySpace::new(args.key_count, args.key_size)?;
    let warmup = seconds("warmup", args.warmup)?;
    let op_timeout = seconds("timeout", args.timeout)?;
    ensure!(!op_timeout.is_zero(), "--timeout must be positive");
    let duration = match (args.duration, args.requests) {
        (Some(d), _) => Some(seconds("duration", d)?),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(5)),
    };
    ensure!(
        duration != Some(Duration::ZERO),
        "--duration must be positive"
    );

    let load = args.workload == Workload::Load;
    let shape = match args.workload {
        Workload::Get => Shape {
            op: Op::Get,
            requests: 1,
            keys_per_request: 1,
        },
        Workload::GetPipelined => Shape {
            op: Op::Get,
            requests: args.depth,
            keys_per_request: 1,
        },
        Workload::Multiget => Shape {
            op: Op::Get,
            requests: 1,
            keys_per_request: args.keys_per_get,
        },
        Workload::NativeGet => return run_native(args, warmup, duration),
        Workload::MetaMultiget => Shape {
            op: Op::MetaGet,
            requests: 1,
            keys_per_request: args.keys_per_get,
        },
        Workload::Set => Shape {
            op: Op::Set,
            requests: 1,
            keys_per_request: 1,
        },
        Workload::Load => Shape {
            op: Op::Set,
            requests: args.load_batch,
            keys_per_request: 1,
        },
    };

    let addr = args
        .server
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", args.server))?
        .next()
        .with_context(|| format!("{} resolves to no address", args.server))?;
    let n_conns = if load {
        args.connections
            .min(usize::try_from(keys.count()).unwrap_or(usize::MAX))
    } else {
        args.connections
    };
    let n_threads = args.threads.min(n_conns);
    let mut per_thread: Vec<Vec<Conn>> = (0..n_threads).map(|_| Vec::new()).collect();
    for index in 0..n_conns {
        // The load workload gives each connection a contiguous share of the ids.
        let share = |i: usize| keys.count() * i as u64 / n_conns as u64;
        let range = (share(index), share(index + 1));
        let stream = connect(addr, op_timeout)?;
        per_thread[index % n_threads].push(Conn::new(index, stream, args.seed, range)?);
    }

    let start = Instant::now();
    let measure_from = if load { start } else { start + warmup };
    let plan = Plan {
        keys,
        value: (0..args.value_size)
            .map(|i| b'a' + (i % 26) as u8)
            .collect(),
        shape,
        load,
        measure_from,
        stop_at: if load {
            None
        } else {
            duration.map(|d| measure_from + d)
        },
        op_timeout,
        abort: AtomicBool::new(false),
    };
    let quotas: Vec<Option<u64>> = (0..n_threads)
        .map(|t| {
            args.requests.map(|n| {
                let base = n / n_threads as u64;
                base + u64::from((t as u64) < n % n_threads as u64)
            })
        })
        .collect();

    let (tallies, cpu_before, cpu_after) = thread::scope(|scope| -> Result<_> {
        let workers: Vec<_> = per_thread
            .into_iter()
            .zip(&quotas)
            .map(|(conns, &quota)| {
                let plan = &plan;
                scope.spawn(move || {
                    let result = driver::drive(plan, conns, quota);
                    if result.is_err() {
                        plan.abort.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        wait_for(measure_from, &workers);
        let cpu_before = sample_cpu(args.server_pid);
        let mut cpu_after = None;
        if let Some(stop) = plan.stop_at {
            wait_for(stop, &workers);
            cpu_after = Some(sample_cpu(args.server_pid));
        }
        let mut tallies = Vec::new();
        for worker in workers {
            tallies.push(worker.join().expect("worker thread panicked"));
        }
        let cpu_after = match cpu_after {
            Some(sample) => sample,
            None => sample_cpu(args.server_pid),
        };
        Ok((tallies, cpu_before, cpu_after))
    })?;
    let mut tally = Tally::new();
    for t in tallies {
        tally.merge(&t?)?;
    }
    let (cpu_before, cpu_after) = (cpu_before?, cpu_after?);
    ensure!(
        tally.requests > 0,
        "no request completed in the measured window"
    );
    // A run bounded by time is measured over the whole window; one that may end on a request
    // count (or the load, which ends when every key is written) ends at its last completion.
    let last_done = tally.last_done.unwrap_or(measure_from);
    let window = match plan.stop_at {
        Some(stop) if args.requests.is_none() => stop,
        Some(stop) => stop.min(last_done),
        None => last_done,
    }
    .duration_since(measure_from);
    let window_s = window.as_secs_f64();
    if window_s <= 0.0 {
        bail!("the measured window is empty");
    }
    Ok(Report {
        window_s,
        tally,
        server_cpu_s: cpu_after.server.zip(cpu_before.server).map(|(a, b)| a - b),
        client_cpu_s: cpu_after.client - cpu_before.client,
    })
}

/// The `native-get` workload (see `native.rs`): loads its table, then measures like the others.
fn run_native(args: &Args, warmup: Duration, duration: Option<Duration>) -> Result<Report> {
    ensure!(
        args.requests.is_none(),
        "--requests is not supported by native-get; give --duration"
    );
    let duration = duration.unwrap_or(Duration::from_secs(5));
    native::load(&args.server, args.key_count)?;
    let measure_from = Instant::now() + warmup;
    let plan = native::Plan {
        server: &args.server,
        key_count: args.key_count,
        keys_per_get: args.keys_per_get,
        threads: args.connections,
        seed: args.seed,
        measure_from,
        stop_at: measure_from + duration,
    };
    let sleep_until = |t: Instant| thread::sleep(t.saturating_duration_since(Instant::now()));
    let (tally, (before, after)) = native::run(&plan, || {
        sleep_until(plan.measure_from);
        let before = sample_cpu(args.server_pid);
        sleep_until(plan.stop_at);
        (before, sample_cpu(args.server_pid))
    })?;
    let (before, after) = (before?, after?);
    ensure!(
        tally.requests > 0,
        "no request completed in the measured window"
    );
    Ok(Report {
        window_s: duration.as_secs_f64(),
        tally,
        server_cpu_s: after.server.zip(before.server).map(|(a, b)| a - b),
        client_cpu_s: after.client - before.client,
    })
}

/// Microseconds at a quantile of the batch latency histogram.
fn quantile_us(tally: &Tally, q: f64) -> f64 {
    tally.latency.value_at_quantile(q) as f64 / 1000.0
}

fn print_report(args: &Args, r: &Report) {
    let t = &r.tally;
    let ops = t.requests as f64 / r.window_s;
    let keys = t.keys as f64 / r.window_s;
    let gets = args.workload != Workload::Set && args.workload != Workload::Load;
    let hit_ratio = if gets {
        Some(t.hits as f64 / t.keys as f64)
    } else {
        None
    };
    let server_ns_per_key = r.server_cpu_s.map(|s| s * 1e9 / t.keys as f64);
    let (p50, p99, p999) = (
        quantile_us(t, 0.5),
        quantile_us(t, 0.99),
        quantile_us(t, 0.999),
    );
    let max = t.latency.max() as f64 / 1000.0;
    if args.json {
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "null".to_owned(), |v| format!("{v:.digits$}"))
        };
        println!(
            concat!(
                "{{\"workload\":\"{}\",\"server\":\"{}\",\"connections\":{},\"threads\":{},",
                "\"depth\":{},\"keys_per_get\":{},\"key_count\":{},\"key_size\":{},\"value_size\":{},",
                "\"window_s\":{:.4},\"requests\":{},\"batches\":{},\"keys\":{},\"hits\":{},",
                "\"ops_per_s\":{:.1},\"keys_per_s\":{:.1},\"hit_ratio\":{},",
                "\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},",
                "\"server_cpu_s\":{},\"server_cpu_ns_per_key\":{},\"client_cpu_s\":{:.3}}}"
            ),
            args.workload.name(),
            args.server.escape_default(),
            args.connections,
            args.threads,
            args.depth,
            args.keys_per_get,
            args.key_count,
            args.key_size,
            args.value_size,
            r.window_s,
            t.requests,
            t.batches,
            t.keys,
            t.hits,
            ops,
            keys,
            opt(hit_ratio, 6),
            p50,
            p99,
            p999,
            max,
            opt(r.server_cpu_s, 3),
            opt(server_ns_per_key, 1),
            r.client_cpu_s,
        );
        return;
    }
    let hits = hit_ratio.map_or_else(|| "     -".to_owned(), |h| format!("{:5.1}%", h * 100.0));
    let server = match (r.server_cpu_s, server_ns_per_key) {
        (Some(s), Some(ns)) => format!("  srv_cpu {s:6.2}s  srv_ns/key {ns:8.0}"),
        _ => String::new(),
    };
    println!(
        "{:<13} conns {:>3}  ops/s {:>10.0}  keys/s {:>10.0}  hits {}  p50 {:>8.1}us  p99 {:>8.1}us  p99.9 {:>8.1}us{}  cli_cpu {:5.2}s",
        args.workload.name(),
        args.connections,
        ops,
        keys,
        hits,
        p50,
        p99,
        p999,
        server,
        r.client_cpu_s,
    );
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => print_report(&args, &report),
        Err(e) => {
            // One line with every cause; a backtrace says nothing useful about a refused connection.
            eprintln!("ramgrid-bench: error: {e:#}");
            std::process::exit(1);
        }
    }
}
