//! Process structure: one acceptor thread, N worker threads (each a single-threaded tokio runtime that
//! owns its connections, like memcached's worker threads; the first also runs the expiry crawler),
//! and graceful shutdown.
//!
//! Why per-thread runtimes rather than one work-stealing runtime: a connection stays on one thread for
//! its whole life, so its buffers and the thread's counters stay in that core's cache, and no task is
//! ever migrated mid-batch.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ramgrid_proto::memcache::Limits;
use ramgrid_store::{Cache, CacheConfig, SystemClock};
use tokio::sync::{mpsc, watch};

use crate::buffers::BufferMemory;
use crate::config::Config;
use crate::conn;
use crate::node::Node;
use crate::stats::{Settings, Shared, WorkerStats};
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_store::tables::{Tables, TablesConfig};

/// How long connections get to finish their current request after SIGTERM before the process exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How often the expiry crawler wakes, and how many expired items it reclaims per wake.
const CRAWL_INTERVAL: Duration = Duration::from_millis(100);
const CRAWL_BUDGET: usize = 10_000;

/// A running server. Dropping it does not stop it; call [`ServerHandle::shutdown`].
pub struct ServerHandle {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    node: Arc<Node>,
    stop: watch::Sender<bool>,
    stopping: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    shm: Arc<crate::shm::Segments>,
}

impl ServerHandle {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of the metrics endpoint (`--metrics`), if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Shared state (the cache and counters), for tests and embedding.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Native-protocol state (tables, cluster spec), for tests and embedding.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The shared-memory segments this server keeps for local readers (shm.rs).
    pub fn shm(&self) -> &Arc<crate::shm::Segments> {
        &self.shm
    }

    /// Stops accepting, lets connections finish the request in hand, and waits for every thread
    /// (bounded by the shutdown grace period).
    pub fn shutdown(self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.node.repair.wake();
        if let Some(m) = self.node.meta.get() {
            m.shutdown();
        }
        let _ = self.stop.send(true);
        // Wake the blocking accept() so the acceptor sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        let deadline = Instant::now() + SHUTDOWN_GRACE + Duration::from_secs(1);
        for t in self.threads {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Binds, starts every thread, and returns once the server accepts connections.
pub fn start(config: &Config) -> anyhow::Result<ServerHandle> {
    config.validate().map_err(anyhow::Error::msg)?;
    if let Some(addr) = config.metrics {
        let token = config.token.is_some();
        crate::metrics::check_addr(addr, token, config.insecure_no_auth)
            .map_err(anyhow::Error::msg)?;
    }
    if !config.listen.ip().is_loopback() && config.token.is_none() {
        tracing::warn!(
            "listening on {} with NO authentication (--insecure-no-auth)",
            config.listen
        );
    }
    let tls = crate::tls::load(config)?;
    if !config.listen.ip().is_loopback() && tls.is_none() {
        tracing::warn!(
            "listening on {} WITHOUT TLS: the token and all data cross the network in clear \
             text (see docs/tls.md: --tls-cert, --tls-key)",
            config.listen
        );
    }
    raise_fd_limit(config.max_conns as u64 + 64);
    fix_malloc_thresholds();
    let listener = TcpListener::bind(config.listen)
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let threads = config.threads.max(1);
    crate::compute::init(threads);

    let max_item = usize::try_from(config.max_item_size).unwrap_or(usize::MAX);
    let cache = Cache::new(
        CacheConfig {
            memory_limit: usize::try_from(config.memory).unwrap_or(usize::MAX),
            evict: !config.no_evict,
            max_item_size: max_item,
            shards: config.shards.max(1),
        },
        Arc::new(SystemClock::new()),
    );
    let limits = Limits {
        max_value_len: max_item,
        max_line_len: usize::try_from(config.max_line).unwrap_or(usize::MAX),
        ..Limits::default()
    };
    let workers: Vec<Arc<WorkerStats>> = (0..threads)
        .map(|_| Arc::new(WorkerStats::default()))
        .collect();
    let shared = Arc::new(Shared {
        cache,
        buffers: BufferMemory::new(usize::try_from(config.buffer_memory).unwrap_or(usize::MAX)),
        settings: Settings {
            threads,
            max_conns: config.max_conns,
            limits,
            flush_enabled: !config.disable_flush_all,
            token: config.token.clone(),
            auth_timeout: config.auth_timeout(),
        },
        started: Instant::now(),
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        curr_connections: Default::default(),
        total_connections: Default::default(),
        rejected_connections: Default::default(),
        verbosity: Default::default(),
        workers: workers.clone(),
    });

    let node = Arc::new(Node {
        tables: Tables::new(TablesConfig {
            memory_limit: usize::try_from(config.table_memory).unwrap_or(usize::MAX),
            max_value_size: max_item,
        })
        .with_seal_threads(threads),
        cluster: Default::default(),
        token: config.token.clone(),
        tls: tls.clone(),
        server_id: addr.to_string(),
        max_body: config.max_body(),
        persist: match &config.data_dir {
            Some(dir) => Some(crate::persist::Persist::open(dir).map_err(anyhow::Error::msg)?),
            None => None,
        },
        repair: crate::repair::RepairState::new(config.join.clone()),
        exports: Default::default(),
        meta: Default::default(),
        metrics: Default::default(),
        replication: crate::replicate::Replication::new(
            Duration::from_millis(config.failure_timeout_ms.max(1000)),
            config.token.clone(),
            tls.clone(),
        ),
        replica_checks: Default::default(),
    });
    node.metrics.set(shared.clone());
    let meta = crate::meta::start(
        &node,
        config.meta_dir_or_default(),
        Duration::from_millis(config.failure_timeout_ms.max(1000)),
    )?;
    let _ = node.meta.set(meta);
    crate::replica_check::spawn(&node, Duration::from_millis(config.replica_check_ms))?;
    if let Some(path) = &config.cluster_spec {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read cluster spec {}", path.display()))?;
        let spec = ClusterSpec::parse_file(&text)
            .map_err(|e| anyhow::anyhow!("cluster spec {}: {e}", path.display()))?;
        let committed = node.meta.get().and_then(|m| m.committed_spec());
        if crate::repair::use_spec_file(&node, &spec, committed.as_ref()) {
            node.install_spec(spec)
                .map_err(|e| anyhow::anyhow!("cluster spec {}: {e}", path.display()))?;
        }
    }

    if let Some(p) = &node.persist {
        // Before any connection is served: a client never sees a table half loaded.
        let cluster = node.cluster.read().clone();
        let loaded = p.load(
            &node.tables,
            |spec| crate::cluster::held_partitions(cluster.as_ref(), spec),
            |msg| tracing::info!("data dir: {msg}"),
        );
        let mut marked = Vec::new();
        for l in loaded {
            // Replayed open versions are reconciled with a live replica before they are read.
            for (v, parts) in
                crate::repair::reconcile_replayed(&node, &l.name, &l.replayed, &l.copying)
            {
                marked.push((l.name.clone(), v, parts));
            }
            let replayed = if l.replayed.is_empty() {
                String::new()
            } else {
                format!(
                    ", open versions {:?} replayed from their logs ({} records, {} bytes)",
                    l.replayed, l.log_records, l.log_bytes
                )
            };
            tracing::info!(
                "loaded table {:?}: versions {:?}, {} items, {} bytes{replayed}, \
                 {:.0} ms{}",
                l.name,
                l.versions,
                l.items,
                l.bytes,
                l.seconds * 1e3,
                if l.missing.is_empty() {
                    String::new()
                } else {
                    format!(", partitions refused (version, partition): {:?}", l.missing)
                }
            );
        }
        // Whatever no other replica serves now is served as replayed from the first request on.
        crate::repair::serve_unserved(&node, &marked);
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopping = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    handles.push(crate::repair::spawn(node.clone(), stopping.clone())?);
    if node.cluster.read().is_some() {
        // A spec from --cluster-spec: learn the tables from the peers too.
        node.repair.needs_catalog.store(true, Ordering::Release);
    }
    node.repair.wake();
    let shm = Arc::new(crate::shm::Segments::default());
    if let Some(path) = crate::shm::socket_for(Some(&config.shm_dir), &addr.to_string()) {
        if let Some(h) = crate::shm::start(path, node.clone(), shm.clone(), stopping.clone()) {
            handles.push(h);
        }
    }
    let mut metrics_addr = None;
    if let Some(at) = config.metrics {
        let l = TcpListener::bind(at).with_context(|| format!("cannot serve metrics on {at}"))?;
        metrics_addr = Some(l.local_addr()?);
        let (shared, node) = (shared.clone(), node.clone());
        handles.push(crate::http::spawn(l, shared, node, stop_rx.clone())?);
    }
    let mut senders = Vec::new();
    for (i, stats) in workers.into_iter().enumerate() {
        let crawler = i == 0;
        let (tx, rx) = mpsc::unbounded_channel::<TcpStream>();
        senders.push(tx);
        let shared = shared.clone();
        let node = node.clone();
        let stop = stop_rx.clone();
        let write_timeout = config.write_timeout();
        handles.push(
            std::thread::Builder::new()
                .name(format!("ramgrid-worker-{i}"))
                .spawn(move || {
                    worker_main(rx, shared, node, stats, stop, write_timeout, crawler)
                })?,
        );
    }
    {
        let shared = shared.clone();
        let stopping = stopping.clone();
        handles.push(
            std::thread::Builder::new()
                .name("ramgrid-accept".into())
                .spawn(move || accept_loop(listener, senders, shared, stopping))?,
        );
    }
    tracing::info!(
        listen = %addr,
        threads,
        table_memory = config.table_memory,
        memory = config.memory,
        data_dir = config.data_dir.as_ref().map(|d| d.display().to_string()),
        auth = config.token.is_some(),
        metrics = metrics_addr.map(|a| a.to_string()),
        version = env!("CARGO_PKG_VERSION"),
        "server started"
    );
    Ok(ServerHandle {
        addr,
        metrics_addr,
        shared,
        node,
        stop: stop_tx,
        stopping,
        threads: handles,
        shm,
    })
}

fn accept_loop(
    listener: TcpListener,
    workers: Vec<mpsc::UnboundedSender<TcpStream>>,
    shared: Arc<Shared>,
    stopping: Arc<AtomicBool>,
) {
    let mut next = 0usize;
    loop {
        let (stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) => {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                // EMFILE and friends: back off instead of spinning; the server stays up.
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let curr = shared.curr_connections.load(Ordering::Relaxed);
        if curr >= shared.settings.max_conns as u64 {
            // memcached's answer when it is out of connections; then close.
            reject(stream);
            shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
            if let Some(n) = REFUSED_AT_LIMIT.note() {
                tracing::warn!(
                    max_conns = shared.settings.max_conns,
                    refused = n,
                    "connections refused: --max-conns reached"
                );
            }
            continue;
        }
        shared.curr_connections.fetch_add(1, Ordering::Relaxed);
        shared.total_connections.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        if workers[next % workers.len()].send(stream).is_err() {
            shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
        }
        next = next.wrapping_add(1);
    }
}

/// Connections refused at `--max-conns`: one log line a second at most, with the count.
static REFUSED_AT_LIMIT: crate::log::Throttle = crate::log::Throttle::new();

fn reject(stream: TcpStream) {
    use std::io::Write;
    let mut stream = stream;
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(b"SERVER_ERROR too many open connections\r\n");
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// A runtime for the calling thread alone (a worker, the metrics endpoint, the replica checks);
/// `None`, logged, if the system refuses one (out of file descriptors, say).
pub(crate) fn thread_runtime(what: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            tracing::error!("cannot start the {what} runtime: {e}");
            None
        }
    }
}

fn worker_main(
    mut rx: mpsc::UnboundedReceiver<TcpStream>,
    shared: Arc<Shared>,
    node: Arc<Node>,
    stats: Arc<WorkerStats>,
    mut stop: watch::Receiver<bool>,
    write_timeout: Duration,
    crawler: bool,
) {
    let Some(rt) = thread_runtime("worker") else {
        return;
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        // Connections watch a channel of this worker's own: every read registers a waker with it,
        // and a channel shared by all workers would bounce its lock between cores on every request.
        let (local_stop, local_rx) = watch::channel(false);
        if crawler {
            // Active expiry runs on the first worker's own runtime rather than on a thread of its
            // own: one thread fewer competing for a small machine's cores, and no crawler thread
            // that the OS could deschedule while it holds a shard lock a request needs.
            let shared = shared.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(CRAWL_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    shared.cache.crawl_expired(CRAWL_BUDGET);
                }
            });
        }
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                s = rx.recv() => {
                    let Some(s) = s else { break };
                    let shared = shared.clone();
                    let node = node.clone();
                    let stats = stats.clone();
                    let stop = local_rx.clone();
                    tasks.spawn_local(async move {
                        if let Ok(s) = s.set_nonblocking(true).and_then(|_| tokio::net::TcpStream::from_std(s)) {
                            match node.tls.clone() {
                                None => conn::serve(s, &shared, &node, &stats, stop, write_timeout).await,
                                Some(tls) => {
                                    if let Some(s) = handshake(&tls, s, &shared, &stats, stop.clone()).await {
                                        conn::serve(s, &shared, &node, &stats, stop, write_timeout).await;
                                    }
                                }
                            }
                        }
                        shared.curr_connections.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = stop.changed() => break,
            }
        }
        let _ = local_stop.send(true);
        // Let connections finish the request in hand, bounded.
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    });
}

/// Runs a connection's TLS handshake, bounded by the auth timeout (with or without a token: a
/// client that never finishes it must not hold a connection slot) and by shutdown. A failure (a
/// plain-text client, a refused certificate) closes the connection and is counted.
async fn handshake(
    tls: &crate::tls::Tls,
    sock: tokio::net::TcpStream,
    shared: &Shared,
    stats: &WorkerStats,
    mut stop: watch::Receiver<bool>,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let peer = sock.peer_addr().ok();
    let failed = |why: &dyn std::fmt::Display| {
        WorkerStats::add(&stats.tls_handshake_failures, 1);
        // At debug: a scanner or a misconfigured client would otherwise fill the log.
        tracing::debug!(peer = ?peer, "TLS handshake failed: {why}");
        None
    };
    tokio::select! {
        r = tokio::time::timeout(shared.settings.auth_timeout, tls.acceptor.accept(sock)) => match r {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => failed(&e),
            Err(_) => failed(&"timed out"),
        },
        _ = stop.changed() => None,
    }
}

/// Makes glibc serve every allocation of 128 KiB and more with its own `mmap`, returned to the
/// system on free. By default glibc raises that threshold (up to 32 MiB) each time such a block is
/// freed, after which large values and reply buffers come from the heap and their memory stays in
/// the process after a burst (measured: 87 MiB of RSS after a burst of 100 KB-1 MB sets under
/// `--memory 64MiB`, 67 MiB with the threshold fixed). The cache's charge for an item
/// (`cache/shard.rs`, `alloc_size`) assumes this threshold. Setting it also stops glibc from
/// moving the trim threshold, so freed heap at the top is returned past 256 KiB.
fn fix_malloc_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before the workers start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 10);
    }
}

/// Raises the soft open-files limit towards `want` (up to the hard limit) so thousands of
/// connections do not hit EMFILE.
fn raise_fd_limit(want: u64) {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
