//! The shared-memory handover protocol (docs/shared-memory.md): a client on the same host asks a
//! server, over a Unix socket, for the partition images of one pinned version; the reply lists
//! the partitions and comes with one memfd per partition (SCM_RIGHTS, outside these bytes).
//!
//! Every message is a u32 LE body length, then the body. Pure codecs; the sockets are the
//! server's and the client's. Also the one rule both sides use to name a server's socket.

use std::path::PathBuf;

/// First 8 bytes of every request and reply body; the last byte is the protocol version.
pub const MAGIC: [u8; 8] = *b"RGSHM\0\0\x01";

/// Largest body either side accepts (a reply lists at most 65,536 partitions).
pub const MAX_BODY: usize = 1 << 20;

/// Most file descriptors sent in one `sendmsg` (the kernel's limit, SCM_MAX_FD, is 253).
pub const FDS_PER_MESSAGE: usize = 200;

/// What a client asks for: every image of `table` at `version` that the server holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The server's token (empty if it has none).
    pub token: Vec<u8>,
    /// The table.
    pub table: String,
    /// The incarnation the client pinned (0: whichever exists).
    pub incarnation: u64,
    /// The pinned version (not 0: only a sealed version has images).
    pub version: u32,
}

/// One image the reply's descriptors hold, in descriptor order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The partition.
    pub partition: u32,
    /// Bytes of its image (the memfd's size).
    pub len: u64,
}

/// A server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The segments follow as descriptors, one per entry of `segments`, in order.
    Granted {
        /// The server's identity (its address as clients name it), so a client knows which
        /// server's partitions it maps.
        server_id: String,
        /// The table's incarnation.
        incarnation: u64,
        /// The version.
        version: u32,
        /// The table's partition count.
        partitions: u32,
        /// The images, one per descriptor.
        segments: Vec<Segment>,
    },
    /// Refused, with the reason (no token, another user, no such version, not sealed...).
    Refused(String),
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shared-memory message: {0}")]
pub struct DecodeError(pub String);

fn err(s: &str) -> DecodeError {
    DecodeError(s.to_string())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(err("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn short(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.short()?.to_vec()).map_err(|_| err("a name is not UTF-8"))
    }
    fn magic(&mut self) -> Result<(), DecodeError> {
        if self.take(8)? != MAGIC {
            return Err(err("bad magic or protocol version"));
        }
        Ok(())
    }
    fn end(&self) -> Result<(), DecodeError> {
        if !self.0.is_empty() {
            return Err(err("trailing bytes"));
        }
        Ok(())
    }
}

fn short(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&b[..n]);
}

/// Frame `body`: its u32 LE length, then the body.
fn framed(body: Vec<u8>) -> Vec<u8> {
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The body length a frame announces, once 4 bytes are in; `Err` past [`MAX_BODY`].
pub fn body_len(prefix: [u8; 4]) -> Result<usize, DecodeError> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n > MAX_BODY {
        return Err(err("message too long"));
    }
    Ok(n)
}

impl Request {
    /// The framed request.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        short(&mut b, &self.token);
        short(&mut b, self.table.as_bytes());
        b.extend_from_slice(&self.incarnation.to_le_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        framed(b)
    }

    /// A request from its body (without the length prefix).
    pub fn decode(body: &[u8]) -> Result<Request, DecodeError> {
        let mut r = Reader(body);
        r.magic()?;
        let token = r.short()?.to_vec();
        let table = r.string()?;
        let incarnation = r.u64()?;
        let version = r.u32()?;
        r.end()?;
        Ok(Request {
            token,
            table,
            incarnation,
            version,
        })
    }
}

impl Reply {
    /// The framed reply.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        match self {
            Reply::Granted {
                server_id,
                incarnation,
                version,
                partitions,
                segments,
            } => {
                b.push(0);
                short(&mut b, server_id.as_bytes());
                b.extend_from_slice(&incarnation.to_le_bytes());
                b.extend_from_slice(&version.to_le_bytes());
                b.extend_from_slice(&partitions.to_le_bytes());
                b.extend_from_slice(&(segments.len() as u32).to_le_bytes());
                for s in segments {
                    b.extend_from_slice(&s.partition.to_le_bytes());
                    b.extend_from_slice(&s.len.to_le_bytes());
                }
            }
            Reply::Refused(why) => {
                b.push(1);
                short(&mut b, why.as_bytes());
            }
        }
        framed(b)
    }

    /// A reply from its body (without the length prefix).
    pub fn decode(body: &[u8]) -> Result<Reply, DecodeError> {
        let mut r = Reader(body);
        r.magic()?;
        let reply = match r.take(1)?[0] {
            0 => {
                let server_id = r.string()?;
                let incarnation = r.u64()?;
                let version = r.u32()?;
                let partitions = r.u32()?;
                let n = r.u32()? as usize;
                if n > partitions as usize || n * 12 > r.0.len() {
                    return Err(err("segment count out of range"));
                }
                let mut segments = Vec::with_capacity(n);
                for _ in 0..n {
                    let partition = r.u32()?;
                    let len = r.u64()?;
                    if partition >= partitions {
                        return Err(err("partition out of range"));
                    }
                    segments.push(Segment { partition, len });
                }
                Reply::Granted {
                    server_id,
                    incarnation,
                    version,
                    partitions,
                    segments,
                }
            }
            1 => Reply::Refused(r.string()?),
            _ => return Err(err("unknown reply kind")),
        };
        r.end()?;
        Ok(reply)
    }
}

/// The directory of the servers' sockets on this host: `$RAMGRID_SHM_DIR` if set, else
/// `$XDG_RUNTIME_DIR/ramgrid` (per user, mode 0700 by systemd), else `/tmp/ramgrid-<uid>`.
pub fn socket_dir(uid: u32) -> PathBuf {
    if let Some(d) = std::env::var_os("RAMGRID_SHM_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ramgrid");
    }
    PathBuf::from(format!("/tmp/ramgrid-{uid}"))
}

/// Where the server listening on `addr` (as clients name it, `ip:port`) puts its socket by
/// default: `socket_dir(uid)/shm-<ip>-<port>.sock`. A client finds a colocated server by
/// this name alone; the reply's `server_id` confirms it.
pub fn socket_path(uid: u32, addr: &str) -> PathBuf {
    let name: String = addr
        .chars()
        .map(|c| match c {
            '0'..='9' | 'a'..='z' | 'A'..='Z' | '.' | '-' => c,
            _ => '-',
        })
        .collect();
    socket_dir(uid).join(format!("shm-{name}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(framed: &[u8]) -> &[u8] {
        let n = body_len(framed[..4].try_into().unwrap()).unwrap();
        assert_eq!(n, framed.len() - 4);
        &framed[4..]
    }

    #[test]
    fn round_trips_and_refusals() {
        let req = Request {
            token: b"tok".to_vec(),
            table: "emb".into(),
            incarnation: 7,
            version: 3,
        };
        assert_eq!(Request::decode(body(&req.encode())).unwrap(), req);
        let rep = Reply::Granted {
            server_id: "127.0.0.1:7000".into(),
            incarnation: 7,
            version: 3,
            partitions: 8,
            segments: vec![
                Segment {
                    partition: 1,
                    len: 4096,
                },
                Segment {
                    partition: 5,
                    len: 192,
                },
            ],
        };
        assert_eq!(Reply::decode(body(&rep.encode())).unwrap(), rep);
        let no = Reply::Refused("no".into());
        assert_eq!(Reply::decode(body(&no.encode())).unwrap(), no);
        // Every truncation and any trailing byte is refused.
        let b = body(&rep.encode()).to_vec();
        for n in 0..b.len() {
            assert!(Reply::decode(&b[..n]).is_err(), "cut at {n}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(Reply::decode(&longer).is_err());
        assert!(body_len((MAX_BODY as u32 + 1).to_le_bytes()).is_err());
        let mut bad = body(&req.encode()).to_vec();
        bad[7] = 2;
        assert!(Request::decode(&bad).is_err(), "another protocol version");
    }

    /// Writes the fuzz target's seeds: `cargo test -p ramgrid-proto --lib write_fuzz_seeds --
    /// --ignored` (to fuzz/seeds/shm_handshake/). Request and reply bodies (without the length
    /// prefix, as `decode` takes them), and damaged ones.
    #[test]
    #[ignore = "writes files; run by hand to refresh the fuzz seeds"]
    fn write_fuzz_seeds() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/shm_handshake"
        );
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, framed: &[u8]| {
            std::fs::write(format!("{dir}/{name}"), body(framed)).unwrap();
        };
        let req = Request {
            token: b"secret-token".to_vec(),
            table: "embed\u{e9}".into(),
            incarnation: 0xdead_beef,
            version: 3,
        };
        write("request", &req.encode());
        let anon = Request {
            token: vec![],
            table: String::new(),
            incarnation: 0,
            version: 1,
        };
        write("request-empty", &anon.encode());
        let granted = Reply::Granted {
            server_id: "127.0.0.1:7000".into(),
            incarnation: 7,
            version: 3,
            partitions: 8,
            segments: (0..8)
                .step_by(3)
                .map(|p| Segment {
                    partition: p,
                    len: 4096 << p,
                })
                .collect(),
        };
        write("granted", &granted.encode());
        let none = Reply::Granted {
            server_id: "[::1]:7001".into(),
            incarnation: u64::MAX,
            version: u32::MAX,
            partitions: 0,
            segments: vec![],
        };
        write("granted-none", &none.encode());
        write(
            "refused",
            &Reply::Refused("no such version".into()).encode(),
        );
        let mut cut = body(&granted.encode()).to_vec();
        cut.truncate(cut.len() - 5);
        std::fs::write(format!("{dir}/granted-cut"), cut).unwrap();
        let mut kind = body(&granted.encode()).to_vec();
        kind[8] = 2;
        std::fs::write(format!("{dir}/unknown-kind"), kind).unwrap();
    }

    #[test]
    fn socket_names_are_one_path_component() {
        let p = socket_path(1000, "[::1]:7000");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "shm----1--7000.sock");
        assert!(socket_path(1000, "127.0.0.1:7000").ends_with("shm-127.0.0.1-7000.sock"));
    }
}
