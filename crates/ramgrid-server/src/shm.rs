//! Sealed partitions handed to processes on the same host as shared memory (docs/shared-memory.md).
//!
//! A Unix socket (`--shm-dir`, named by [`ramgrid_proto::shm::socket_path`]) answers one request
//! per connection: (token, table, incarnation, pinned version). The peer must be this server's
//! user (SO_PEERCRED) and present the token if the server has one. For each partition of that
//! sealed version this server holds, the server writes the partition's image into a memfd once,
//! seals it (no write, grow, shrink, or further seals), keeps it per (table, incarnation,
//! version, partition), and passes the descriptors with SCM_RIGHTS. The client maps them
//! read-only and reads them in place (`ramgrid-client`'s `shm.rs`).
//!
//! Release rule: the server drops its descriptor of a segment once the version is dropped, the
//! table is dropped, or the partition leaves this server (checked every [`SWEEP`] and on every
//! request). A reader's mapping keeps the pages alive (the kernel counts mappings and
//! descriptors), so a dropped version is never pulled from under a reader; the memory is freed
//! when the last reader unmaps or exits.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ramgrid_proto::shm::{body_len, Reply, Request, Segment, FDS_PER_MESSAGE};

use crate::node::Node;

/// How often segments of dropped versions are let go.
const SWEEP: Duration = Duration::from_millis(500);

/// How long one connection may take to send its request and take the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// (table, incarnation, version, partition).
type SegKey = (String, u64, u32, u32);

/// The sealed segments this server keeps, and counters.
#[derive(Debug, Default)]
pub struct Segments {
    fds: Mutex<HashMap<SegKey, (Arc<OwnedFd>, u64)>>,
    /// Requests answered with segments.
    pub granted: AtomicU64,
    /// Requests refused (bad token, another user, no such version...).
    pub refused: AtomicU64,
}

impl Segments {
    /// Segments kept now.
    pub fn len(&self) -> usize {
        self.fds.lock().len()
    }

    /// Whether no segment is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Let go of every segment whose version, table or partition is no longer here.
    fn sweep(&self, node: &Node) {
        self.fds
            .lock()
            .retain(|(table, inc, version, p), (_, len)| {
                let keep = node
                    .tables
                    .at(table, *version)
                    .is_ok_and(|tv| tv.spec().incarnation == *inc && tv.is_held(*p));
                if !keep {
                    node.tables.release_outside(*len as usize);
                }
                keep
            });
    }
}

/// Where this server's socket goes, or `None` if `--shm-dir off`.
pub fn socket_for(dir: Option<&str>, addr: &str) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    match dir {
        Some("off") => None,
        Some(d) if !d.is_empty() && d != "auto" => Some(
            PathBuf::from(d).join(
                ramgrid_proto::shm::socket_path(uid, addr)
                    .file_name()
                    .expect("a file name"),
            ),
        ),
        _ => Some(ramgrid_proto::shm::socket_path(uid, addr)),
    }
}

/// The socket's directory, made (mode 0700) if missing; refused if another user owns it or
/// others may write to it (they could then replace the socket).
fn private_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let md = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: as above.
    let uid = unsafe { libc::geteuid() };
    if !md.is_dir() || md.uid() != uid || md.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of this user that only this user can write to",
            dir.display()
        ));
    }
    Ok(())
}

/// Bind the socket and start serving it on a thread of its own, until `stopping`. Failing to bind
/// is logged and leaves the server without shared memory (clients then read over TCP).
pub fn start(
    path: PathBuf,
    node: Arc<Node>,
    segments: Arc<Segments>,
    stopping: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("shared memory off: {e}");
            return None;
        }
    };
    tracing::info!(socket = %path.display(), "shared-memory socket listening");
    std::thread::Builder::new()
        .name("ramgrid-shm".into())
        .spawn(move || {
            serve(&listener, &node, &segments, &stopping);
            let _ = std::fs::remove_file(&path);
        })
        .ok()
}

fn bind(path: &Path) -> Result<UnixListener, String> {
    let dir = path.parent().ok_or("socket path has no directory")?;
    private_dir(dir)?;
    // A socket left by a server that died: the TCP port is ours now, so the name is too.
    match std::fs::symlink_metadata(path) {
        Ok(md) if std::os::unix::fs::FileTypeExt::is_socket(&md.file_type()) => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => return Err(format!("{} exists and is not a socket", path.display())),
        Err(_) => {}
    }
    let l = UnixListener::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    l.set_nonblocking(true)
        .map_err(|e| format!("socket: {e}"))?;
    Ok(l)
}

fn serve(l: &UnixListener, node: &Node, segments: &Segments, stopping: &AtomicBool) {
    let mut swept = Instant::now();
    while !stopping.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 200) };
        if swept.elapsed() >= SWEEP {
            segments.sweep(node);
            swept = Instant::now();
        }
        match l.accept() {
            Ok((s, _)) => {
                if let Err(e) = answer(s, node, segments) {
                    tracing::debug!("shared-memory request: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!("shared-memory accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The peer's user id (SO_PEERCRED).
fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn answer(mut s: UnixStream, node: &Node, segments: &Segments) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let (reply, fds) = match decide(&mut s, node, segments) {
        Ok(granted) => {
            segments.granted.fetch_add(1, Ordering::Relaxed);
            granted
        }
        Err(why) => {
            segments.refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!("shared-memory request refused: {why}");
            (Reply::Refused(why), Vec::new())
        }
    };
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    send_with_fds(&s, &reply.encode(), &raw)
}

fn decide(
    s: &mut UnixStream,
    node: &Node,
    segments: &Segments,
) -> Result<(Reply, Vec<Arc<OwnedFd>>), String> {
    // The request is read whole before any check, so that a refusal reaches a peer that is still
    // sending (closing on unread bytes would break its write instead).
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).map_err(|e| e.to_string())?;
    let n = body_len(prefix).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; n];
    s.read_exact(&mut body).map_err(|e| e.to_string())?;
    // SAFETY: as above.
    let me = unsafe { libc::geteuid() };
    let uid = peer_uid(s).map_err(|e| format!("no peer credentials: {e}"))?;
    if uid != me {
        return Err(format!(
            "user {uid} may not map this server's memory (only user {me})"
        ));
    }
    let req = Request::decode(&body).map_err(|e| e.to_string())?;
    if let Some(token) = &node.token {
        if !crate::auth::token_matches(&req.token, token) {
            return Err("bad or missing token".into());
        }
    }
    if req.version == 0 {
        return Err("only a pinned (sealed) version is shared: name its number".into());
    }
    let tv = node
        .tables
        .at(&req.table, req.version)
        .map_err(|e| e.to_string())?;
    let inc = tv.spec().incarnation;
    if req.incarnation != 0 && req.incarnation != inc {
        return Err(format!(
            "table {} was dropped and created again since that version was pinned",
            req.table
        ));
    }
    if !tv.is_sealed() {
        return Err(format!(
            "version {} is open: only sealed versions are shared",
            req.version
        ));
    }
    segments.sweep(node);
    let mut no_room = Vec::new();
    let mut list = Vec::new();
    let mut fds = Vec::new();
    for p in 0..tv.spec().partitions {
        if !tv.is_held(p) || tv.is_missing(p) {
            continue;
        }
        let key = (req.table.clone(), inc, req.version, p);
        let cached = segments.fds.lock().get(&key).cloned();
        let (fd, len) = match cached {
            Some(x) => x,
            None => {
                let mut img = tv.partition_image(p).map_err(|e| e.to_string())?;
                // A segment is a second copy of the partition on this host (until the version is
                // dropped): charged to --table-memory like the tables, so sharing never takes
                // memory the operator did not give. Without room, the partition is read over TCP.
                if !node.tables.try_charge_outside(img.len()) {
                    no_room.push(p);
                    continue;
                }
                if corrupt_for_tests() {
                    let mid = img.len() / 2;
                    img[mid] ^= 0x5a;
                }
                let fd = match sealed_memfd(
                    &format!("ramgrid:{}:v{}:p{p}", req.table, req.version),
                    &img,
                ) {
                    Ok(fd) => Arc::new(fd),
                    Err(e) => {
                        node.tables.release_outside(img.len());
                        return Err(format!("memfd: {e}"));
                    }
                };
                let len = img.len() as u64;
                segments.fds.lock().insert(key, (fd.clone(), len));
                (fd, len)
            }
        };
        list.push(Segment { partition: p, len });
        fds.push(fd);
    }
    if !no_room.is_empty() {
        tracing::warn!(
            table = %req.table,
            version = req.version,
            partitions = no_room.len(),
            "no room in --table-memory for shared copies of some partitions; they are read over TCP"
        );
        if list.is_empty() {
            return Err(format!(
                "no room in --table-memory for a shared copy of {} partition(s) of {} version {}",
                no_room.len(),
                req.table,
                req.version
            ));
        }
    }
    Ok((
        Reply::Granted {
            server_id: node.server_id.clone(),
            incarnation: inc,
            version: req.version,
            partitions: tv.spec().partitions,
            segments: list,
        },
        fds,
    ))
}

/// `RAMGRID_SHM_CORRUPT_FOR_TESTS=1`: every segment is written with one byte flipped, so the
/// tests can show that readers refuse a segment whose checksum does not match (a sealed segment
/// cannot be damaged after it is made). Never set outside tests.
fn corrupt_for_tests() -> bool {
    std::env::var_os("RAMGRID_SHM_CORRUPT_FOR_TESTS").is_some_and(|v| v == "1")
}

/// A memfd holding `bytes`, sealed against any change (F_SEAL_WRITE, F_SEAL_GROW,
/// F_SEAL_SHRINK) and against removing the seals (F_SEAL_SEAL): readers may trust that the
/// checked bytes stay as they were.
fn sealed_memfd(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "?")).expect("no NUL");
    // SAFETY: a valid C string; the flags are constants.
    let raw =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just created and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f.into())
}

/// Send `data`, with `fds` attached: the first [`FDS_PER_MESSAGE`] to `data`, the rest in
/// further messages of one byte each (the client reads until it has them all).
fn send_with_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut chunks: Vec<&[RawFd]> = fds.chunks(FDS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for (i, chunk) in chunks.iter().enumerate() {
        let payload: &[u8] = if i == 0 { data } else { b"+" };
        send_one(s, payload, chunk)?;
    }
    Ok(())
}

fn send_one(s: &UnixStream, payload: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < payload.len() {
        let mut iov = libc::iovec {
            iov_base: payload[sent..].as_ptr() as *mut libc::c_void,
            iov_len: payload.len() - sent,
        };
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        // SAFETY: zeroed msghdr is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if sent == 0 && !fds.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: the control buffer is `space` bytes, room for one header and `fds`.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(c).cast::<RawFd>(),
                    fds.len(),
                );
            }
        }
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_memfd_cannot_be_written_or_resized() {
        let fd = sealed_memfd("test", b"hello").unwrap();
        let mut f = std::fs::File::from(fd);
        assert!(f.write_all(b"x").is_err(), "written");
        assert!(f.set_len(1).is_err(), "shrunk");
        assert!(f.set_len(100).is_err(), "grown");
        let mut back = String::new();
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "hello");
    }

    #[test]
    fn socket_paths() {
        assert_eq!(socket_for(Some("off"), "127.0.0.1:1"), None);
        assert_eq!(
            socket_for(Some("/x"), "127.0.0.1:1").unwrap(),
            PathBuf::from("/x/shm-127.0.0.1-1.sock")
        );
    }
}
