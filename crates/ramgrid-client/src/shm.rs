//! Pinned versions read from shared memory: the partitions that servers on this host hold are
//! mapped read-only from the sealed segments they hand over (docs/shared-memory.md), checked
//! once, and answered in place by [`Client::get_into`] with the server's own prefetching lookup
//! (`ramgrid_store::image_view`). Keys of partitions no local server holds go over TCP in the
//! same call.
//!
//! Anything that goes wrong while attaching (no socket, another host, a refusal, a segment that
//! is not sealed or whose checksums do not match, a version of another incarnation) leaves that
//! server's partitions to TCP and is reported in [`ShmInfo::skipped`]. Once mapped, a segment
//! stays readable until it is detached, whatever the server does: the mapping holds the pages.
//!
//! [`Client::get_into`] finds the mapped version by name on every call; a [`crate::ShmReader`]
//! (shm_reader.rs) resolves it once and reads with no lock and no lookup by name.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use ramgrid_proto::cluster::partition_of;
use ramgrid_proto::native::{ValueType, MAX_KEY_LEN};
use ramgrid_proto::shm::{body_len, Reply, Request, FDS_PER_MESSAGE};
use ramgrid_store::image_view::{self, ImageView};

use crate::client::Client;
use crate::error::Result;
use crate::keys::Keys;
use crate::values::ValuesMut;

/// How long asking a local server for its segments may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// A read-only shared mapping of a whole segment; unmapped when dropped.
pub struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and of a sealed memfd (no one can write it), so sharing the
// pointer between threads shares immutable bytes.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `fd` (a memfd of `len` bytes that must be sealed against writes and resizing).
    fn of_sealed(fd: &OwnedFd, len: u64) -> std::result::Result<Mapping, String> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        let need = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & need != need {
            return Err("segment is not sealed against writes and resizing".into());
        }
        // SAFETY: `st` is valid for writes.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor we own, into a valid stat.
        if unsafe { libc::fstat(raw, &mut st) } != 0 || st.st_size as u64 != len || len == 0 {
            return Err(format!(
                "segment is {} bytes, the reply says {len}",
                st.st_size
            ));
        }
        let len = usize::try_from(len).map_err(|_| "segment too large")?;
        // SAFETY: a fresh read-only shared mapping of a descriptor we own; the kernel picks the
        // address. The memfd is sealed, so its size cannot shrink under the mapping (no SIGBUS).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Ok(Mapping {
            ptr: ptr.cast_const().cast(),
            len,
        })
    }
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` readable bytes are mapped at `ptr` for as long as `self` lives, and no
        // one can change them (sealed).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `of_sealed` mapped, once.
        unsafe { libc::munmap(self.ptr.cast_mut().cast(), self.len) };
    }
}

/// The mapped partitions of one (table, incarnation, version).
pub(crate) struct Attached {
    partitions: u32,
    views: Vec<Option<ImageView<Mapping>>>,
    /// Every partition is mapped: a batch needs no pass to find out whether it can be answered.
    all_mapped: bool,
    pub(crate) value_type: ValueType,
    /// Cleared when the last attach is undone. A reader handle still holding the set (and so the
    /// mappings) reads over TCP from then on, as `Client::get_into` does.
    pub(crate) live: AtomicBool,
    info: ShmInfo,
}

impl Attached {
    /// Partition `p`'s mapped image, if it is mapped.
    #[inline]
    pub(crate) fn view(&self, p: u32) -> Option<&ImageView<Mapping>> {
        self.views.get(p as usize)?.as_ref()
    }

    /// One key's value in wire form from its mapping: `Some(None)` if missing (or longer than
    /// the wire allows), `None` if its partition is not mapped.
    #[inline]
    pub(crate) fn get_one(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        if key.len() > MAX_KEY_LEN {
            return Some(None);
        }
        let view = self.views[partition_of(key, self.partitions) as usize].as_ref()?;
        Some(view.get(key))
    }

    /// Answer every key of `keys` from the mappings if every key's partition is mapped: writes
    /// `out` and `found` and returns the keys found; `None`, with nothing written, if some key's
    /// partition is not mapped. The caller has validated the keys and checked `out` and `found`
    /// (one entry per key, `out` of this set's value type). A key longer than the wire allows is
    /// missing, as the general path makes it.
    pub(crate) fn read_whole(
        &self,
        keys: Keys<'_>,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Option<u64> {
        let n = keys.len();
        let view = |k: &[u8]| self.views[partition_of(k, self.partitions) as usize].as_ref();
        if n == 1 {
            // One key: no pipeline to set up, nothing to overlap.
            let got = self.get_one(&keys.key(0))?;
            found[0] = got.is_some();
            if let Some(w) = got {
                out.set(0, w);
            }
            return Some(u64::from(found[0]));
        }
        let (mut hits, mut at) = (0u64, 0usize);
        let mut emit = |wire: Option<&[u8]>| {
            found[at] = wire.is_some();
            if let Some(w) = wire {
                out.set(at, w);
                hits += 1;
            }
            at += 1;
        };
        if self.all_mapped {
            // Every partition is here: each key's view is found as the pipeline reaches it.
            image_view::lookup(
                (0..n).map(|i| {
                    let k = keys.key(i);
                    (view(&k).expect("every partition is mapped"), k)
                }),
                MAX_KEY_LEN,
                &mut emit,
            );
            return Some(hits);
        }
        // Some partitions are not mapped: find every key's view first, so that a key of an
        // unmapped partition leaves the whole batch to the general path before anything is
        // written. Small batches use a stack array, larger ones a vector.
        let mut small: [Option<&ImageView<Mapping>>; 8] = [None; 8];
        let mut large = Vec::new();
        let views: &[Option<&ImageView<Mapping>>] = if n <= small.len() {
            for (i, s) in small.iter_mut().enumerate().take(n) {
                *s = Some(view(&keys.key(i))?);
            }
            &small[..n]
        } else {
            large.reserve(n);
            for i in 0..n {
                large.push(Some(view(&keys.key(i))?));
            }
            &large
        };
        image_view::lookup(
            (0..n).map(|i| (views[i].expect("every key has its view"), keys.key(i))),
            MAX_KEY_LEN,
            &mut emit,
        );
        Some(hits)
    }
}

/// Keys answered from shared memory: the client's own, and one set per reader handle (summed by
/// [`Client::shm_stats`]), so that readers on different threads do not share a cache line.
#[derive(Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Counters {
    /// Count `looked` keys answered locally, `hits` of them found.
    #[inline]
    pub(crate) fn add(&self, hits: u64, looked: u64) {
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
        if looked > hits {
            self.misses.fetch_add(looked - hits, Ordering::Relaxed);
        }
    }

    fn take_from(&self, other: &Counters) {
        self.add(
            other.hits.load(Ordering::Relaxed),
            other.hits.load(Ordering::Relaxed) + other.misses.load(Ordering::Relaxed),
        );
    }
}

/// What attaching a version mapped, for `PinnedTable.describe()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShmInfo {
    /// Partitions answered from shared memory, ascending.
    pub mapped: Vec<u32>,
    /// Bytes mapped.
    pub bytes: u64,
    /// The local servers the segments came from.
    pub servers: Vec<String>,
    /// (server, why) for each server whose partitions stay on TCP.
    pub skipped: Vec<(String, String)>,
}

/// Counters of reads served from shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Keys found in a mapped partition.
    pub hits: u64,
    /// Keys looked up in a mapped partition and absent, or too long to be stored (answered
    /// locally too).
    pub misses: u64,
    /// Keys of pinned, attached versions that went over TCP (their partition is not mapped).
    pub remote: u64,
    /// Versions attached now.
    pub attached: u64,
    /// Bytes mapped now.
    pub mapped_bytes: u64,
}

type VersionKey = (String, u64, u32);

/// Attached versions by table name: (incarnation, version, what is mapped).
type ByTable = HashMap<String, Vec<(u64, u32, Arc<Attached>)>>;

thread_local! {
    /// Set by [`tcp_only`]: reads on this thread skip shared memory.
    static TCP_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside [`tcp_only`].
#[inline]
pub(crate) fn tcp_only_here() -> bool {
    TCP_ONLY.with(|c| c.get())
}

/// Run `f` with reads on this thread going over TCP even for attached versions: a handle that
/// asked for no shared memory (`PinnedTable(shared_memory=False)`) while another handle of the
/// same client maps the version.
pub fn tcp_only<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            TCP_ONLY.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(TCP_ONLY.with(|c| c.replace(true)));
    f()
}

/// The client's attached versions and counters.
#[derive(Default)]
pub(crate) struct Registry {
    /// Each attached version and how many attaches it counts.
    sets: RwLock<HashMap<VersionKey, (Arc<Attached>, usize)>>,
    /// The same sets by table name, then (incarnation, version): what reads look up, by `&str`
    /// without allocating. Changed with `sets`, under its write lock.
    by_table: RwLock<ByTable>,
    counters: Counters,
    remote: AtomicU64,
    /// The counters of reader handles. A set no handle holds any more is folded into
    /// `counters` and let go.
    handles: Mutex<Vec<Arc<Counters>>>,
}

impl Registry {
    pub(crate) fn get(&self, table: &str, incarnation: u64, version: u32) -> Option<Arc<Attached>> {
        let by = self.by_table.read();
        by.get(table)?
            .iter()
            .find(|(i, v, _)| *i == incarnation && *v == version)
            .map(|(_, _, a)| a.clone())
    }

    /// Rebuild `by_table` from `sets` (attach and detach only, under `sets`' write lock).
    fn index(&self, sets: &HashMap<VersionKey, (Arc<Attached>, usize)>) {
        let mut by = ByTable::new();
        for ((t, i, v), (a, _)) in sets {
            by.entry(t.clone()).or_default().push((*i, *v, a.clone()));
        }
        *self.by_table.write() = by;
    }

    /// Counters for a new reader handle, summed with the others by `shm_stats`.
    pub(crate) fn new_counters(&self) -> Arc<Counters> {
        let c = Arc::new(Counters::default());
        let mut handles = self.handles.lock();
        self.fold(&mut handles);
        handles.push(c.clone());
        c
    }

    /// Fold the counters of handles that are gone into the client's own.
    fn fold(&self, handles: &mut Vec<Arc<Counters>>) {
        handles.retain(|c| {
            // Only this list holds it: no handle can count into it any more.
            let gone = Arc::strong_count(c) == 1;
            if gone {
                self.counters.take_from(c);
            }
            !gone
        });
    }
}

impl Client {
    /// Map the partitions of `table` at sealed `version` (of `incarnation`; 0: the table as it
    /// is now) that servers on this host hold, so reads of that version answer them locally.
    /// Attaching twice counts twice ([`Client::shm_detach`] once per attach). Never fails for
    /// want of shared memory: what could not be mapped is listed in [`ShmInfo::skipped`] and read
    /// over TCP.
    pub fn shm_attach(&self, table: &str, incarnation: u64, version: u32) -> Result<ShmInfo> {
        let meta = self.table_meta(table)?;
        let incarnation = if incarnation == 0 {
            meta.incarnation
        } else {
            incarnation
        };
        let key = (table.to_string(), incarnation, version);
        if let Some((a, refs)) = self.inner.shm.sets.write().get_mut(&key) {
            *refs += 1;
            return Ok(a.info.clone());
        }
        let mut info = ShmInfo::default();
        let partitions = meta.partitions;
        let mut views: Vec<Option<ImageView<Mapping>>> = (0..partitions).map(|_| None).collect();
        let req = Request {
            token: self
                .inner
                .settings
                .token
                .clone()
                .unwrap_or_default()
                .into_bytes(),
            table: table.to_string(),
            incarnation,
            version,
        };
        for addr in self.servers() {
            match ask(&addr, &req) {
                Ok((server_id, granted, segs, fds)) => {
                    if let Err(why) = check_grant(&addr, &server_id, &granted, &req, partitions) {
                        info.skipped.push((addr, why));
                        continue;
                    }
                    let mut mine = Vec::new();
                    let mut failed = None;
                    for (seg, fd) in segs.iter().zip(&fds) {
                        if views[seg.partition as usize].is_some() {
                            continue; // another local replica's copy is mapped already
                        }
                        match map_view(fd, seg.len, meta.value_type) {
                            Ok(v) => mine.push((seg.partition, v)),
                            Err(why) => {
                                failed = Some(format!("partition {}: {why}", seg.partition));
                                break;
                            }
                        }
                    }
                    // One bad segment and nothing of that server is trusted.
                    if let Some(why) = failed {
                        info.skipped.push((addr, why));
                        continue;
                    }
                    for (p, v) in mine {
                        info.bytes += v.bytes().len() as u64;
                        info.mapped.push(p);
                        views[p as usize] = Some(v);
                    }
                    info.servers.push(addr);
                }
                Err(why) => info.skipped.push((addr, why)),
            }
        }
        info.mapped.sort_unstable();
        if !info.mapped.is_empty() {
            let attached = Arc::new(Attached {
                partitions,
                all_mapped: views.iter().all(Option::is_some),
                views,
                value_type: meta.value_type,
                live: AtomicBool::new(true),
                info: info.clone(),
            });
            // Two threads attaching at once both mapped: one set is kept, counted twice.
            let mut sets = self.inner.shm.sets.write();
            sets.entry(key).or_insert((attached, 0)).1 += 1;
            self.inner.shm.index(&sets);
        }
        Ok(info)
    }

    /// Undo one [`Client::shm_attach`]; the last one unmaps (reads of the version then go over
    /// TCP). Returns whether the version was attached.
    pub fn shm_detach(&self, table: &str, incarnation: u64, version: u32) -> bool {
        let incarnation = if incarnation == 0 {
            match self.table_meta(table) {
                Ok(m) => m.incarnation,
                Err(_) => return false,
            }
        } else {
            incarnation
        };
        let key = (table.to_string(), incarnation, version);
        let mut sets = self.inner.shm.sets.write();
        let Some((_, refs)) = sets.get_mut(&key) else {
            return false;
        };
        *refs -= 1;
        if *refs == 0 {
            // A read in flight keeps its Arc, and so the mappings, until it returns; so does a
            // reader handle, which reads over TCP from now on.
            if let Some((a, _)) = sets.remove(&key) {
                a.live.store(false, Ordering::Release);
            }
            self.inner.shm.index(&sets);
        }
        true
    }

    /// What is mapped of a version, if it is attached.
    pub fn shm_info(&self, table: &str, incarnation: u64, version: u32) -> Option<ShmInfo> {
        let sets = self.inner.shm.sets.read();
        sets.get(&(table.to_string(), incarnation, version))
            .map(|(a, _)| a.info.clone())
    }

    /// Counters of reads answered from shared memory.
    pub fn shm_stats(&self) -> ShmStats {
        let r = &self.inner.shm;
        let (mut hits, mut misses) = (0, 0);
        {
            let mut handles = r.handles.lock();
            r.fold(&mut handles);
            for c in handles.iter() {
                hits += c.hits.load(Ordering::Relaxed);
                misses += c.misses.load(Ordering::Relaxed);
            }
        }
        hits += r.counters.hits.load(Ordering::Relaxed);
        misses += r.counters.misses.load(Ordering::Relaxed);
        let sets = r.sets.read();
        ShmStats {
            hits,
            misses,
            remote: r.remote.load(Ordering::Relaxed),
            attached: sets.len() as u64,
            mapped_bytes: sets.values().map(|(a, _)| a.info.bytes).sum(),
        }
    }

    /// Whether reads of `version` (not 0) of `table` may be served from a mapping of this
    /// process (a pinned version attached from a server on this host), as `get_into_of` would.
    pub(crate) fn shm_maps(&self, table: &str, incarnation: u64, version: u32) -> bool {
        if version == 0 || tcp_only_here() {
            return false;
        }
        let Some(meta) = self.inner.tables.read().get(table).copied() else {
            return false;
        };
        (incarnation == 0 || incarnation == meta.incarnation)
            && self
                .inner
                .shm
                .get(table, meta.incarnation, version)
                .is_some()
    }

    /// A read answered wholly from shared memory, before any of the general path's bookkeeping
    /// (call deadline, key lists): `None` unless every key's partition is mapped for this
    /// version, in which case the read is done (`found` and `out` written) and returns the
    /// version. The general path checks the same things and serves what it can (`shm_serve`).
    pub(crate) fn shm_whole(
        &self,
        table: &str,
        incarnation: u64,
        keys: Keys<'_>,
        version: u32,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Option<u32> {
        if version == 0 || tcp_only_here() || keys.validate().is_err() {
            return None;
        }
        let meta = *self.inner.tables.read().get(table)?;
        if incarnation != 0 && incarnation != meta.incarnation {
            return None;
        }
        let a = self.inner.shm.get(table, meta.incarnation, version)?;
        let n = keys.len();
        if out.len() != n || found.len() != n || !out.fits(meta.value_type) {
            return None;
        }
        let hits = a.read_whole(keys, out, found)?;
        self.inner.shm.counters.add(hits, n as u64);
        Some(version)
    }

    /// Answer the keys of `pending` whose partitions are mapped for (table, incarnation,
    /// version), writing `out` and `found`; returns the keys left for TCP (all of them if the
    /// version is not attached).
    #[expect(clippy::too_many_arguments)]
    pub(crate) fn shm_serve(
        &self,
        table: &str,
        incarnation: u64,
        version: u32,
        keys: Keys<'_>,
        pending: Vec<u32>,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Vec<u32> {
        if tcp_only_here() {
            return pending;
        }
        let Some(a) = self.inner.shm.get(table, incarnation, version) else {
            return pending;
        };
        let mut local: Vec<(u32, &ImageView<Mapping>)> = Vec::with_capacity(pending.len());
        let mut remote = Vec::new();
        for i in pending {
            let p = partition_of(&keys.key(i as usize), a.partitions);
            match &a.views[p as usize] {
                Some(v) => local.push((i, v)),
                None => remote.push(i),
            }
        }
        let (mut hits, mut at) = (0u64, 0usize);
        image_view::lookup(
            local.iter().map(|&(i, v)| (v, keys.key(i as usize))),
            MAX_KEY_LEN,
            |wire| {
                let i = local[at].0 as usize;
                at += 1;
                if let Some(w) = wire {
                    out.set(i, w);
                    found[i] = true;
                    hits += 1;
                }
            },
        );
        let r = &self.inner.shm;
        r.counters.add(hits, local.len() as u64);
        if !remote.is_empty() {
            r.remote.fetch_add(remote.len() as u64, Ordering::Relaxed);
        }
        remote
    }
}

fn check_grant(
    addr: &str,
    server_id: &str,
    granted: &(u64, u32, u32),
    req: &Request,
    partitions: u32,
) -> std::result::Result<(), String> {
    let port = |a: &str| a.rsplit(':').next().map(str::to_string);
    let same_server = server_id == addr
        || (server_id.starts_with("0.0.0.0:") || server_id.starts_with("[::]:"))
            && port(server_id) == port(addr);
    if !same_server {
        return Err(format!("the socket belongs to {server_id}, not {addr}"));
    }
    let (incarnation, version, parts) = *granted;
    if incarnation != req.incarnation || version != req.version || parts != partitions {
        return Err("the server answered for another table, version or partition count".into());
    }
    Ok(())
}

fn map_view(
    fd: &OwnedFd,
    len: u64,
    want: ValueType,
) -> std::result::Result<ImageView<Mapping>, String> {
    let m = Mapping::of_sealed(fd, len)?;
    let v = ImageView::open(m).map_err(|e| e.to_string())?;
    let got = match v.value_type() {
        ramgrid_store::ValueType::Bytes => ValueType::Bytes,
        ramgrid_store::ValueType::I64 => ValueType::I64,
        ramgrid_store::ValueType::F64 => ValueType::F64,
        ramgrid_store::ValueType::F32Vec { dim } => ValueType::F32Vec(dim),
    };
    if got != want {
        return Err(format!("segment holds {got:?} values, the table {want:?}"));
    }
    Ok(v)
}

type Granted = (
    String,
    (u64, u32, u32),
    Vec<ramgrid_proto::shm::Segment>,
    Vec<OwnedFd>,
);

/// Ask the server at `addr` on this host for its segments of `req`'s version.
fn ask(addr: &str, req: &Request) -> std::result::Result<Granted, String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut paths = vec![ramgrid_proto::shm::socket_path(uid, addr)];
    if let Some((_, port)) = addr.rsplit_once(':') {
        paths.push(ramgrid_proto::shm::socket_path(
            uid,
            &format!("0.0.0.0:{port}"),
        ));
    }
    let Some(path) = paths.iter().find(|p| p.exists()) else {
        return Err("no shared-memory socket on this host (another host, or --shm-dir off)".into());
    };
    let mut s = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(Some(ASK_TIMEOUT))
        .and_then(|_| s.set_write_timeout(Some(ASK_TIMEOUT)))
        .and_then(|_| s.write_all(&req.encode()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let (reply, fds) = recv_reply(&s).map_err(|e| format!("{}: {e}", path.display()))?;
    match reply {
        Reply::Granted {
            server_id,
            incarnation,
            version,
            partitions,
            segments,
        } => {
            if fds.len() != segments.len() {
                return Err("descriptor count does not match the reply".into());
            }
            Ok((server_id, (incarnation, version, partitions), segments, fds))
        }
        Reply::Refused(why) => Err(format!("refused: {why}")),
    }
}

/// Read one reply and the descriptors that come with it (in messages of at most
/// [`FDS_PER_MESSAGE`], each after the first carrying one byte).
fn recv_reply(s: &UnixStream) -> std::io::Result<(Reply, Vec<OwnedFd>)> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut data: Vec<u8> = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((FDS_PER_MESSAGE * std::mem::size_of::<i32>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    loop {
        // Complete? The body, then one byte per further message of descriptors.
        if data.len() >= 4 {
            let n = body_len(data[..4].try_into().expect("4 bytes")).map_err(|e| bad(e.0))?;
            if data.len() >= 4 + n {
                let reply = Reply::decode(&data[4..4 + n]).map_err(|e| bad(e.0))?;
                let want = match &reply {
                    Reply::Granted { segments, .. } => segments.len(),
                    Reply::Refused(_) => 0,
                };
                let extra = want.div_ceil(FDS_PER_MESSAGE).saturating_sub(1);
                if data.len() > 4 + n + extra || fds.len() > want {
                    return Err(bad("more than the reply announced".into()));
                }
                if data.len() == 4 + n + extra && fds.len() == want {
                    return Ok((reply, fds));
                }
            }
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: a zeroed msghdr is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Take every descriptor first, so that none leaks whatever follows.
        // SAFETY: walking the control messages the kernel wrote into `cbuf`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let p = libc::CMSG_DATA(c).cast::<i32>();
                    for k in 0..bytes / std::mem::size_of::<i32>() {
                        fds.push(OwnedFd::from_raw_fd(p.add(k).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(bad("descriptors were cut off".into()));
        }
        if n == 0 {
            return Err(bad("the server closed before the reply was complete".into()));
        }
        data.extend_from_slice(&buf[..n as usize]);
    }
}
