//! EXPORT_PARTITION: serving a partition's image to a peer that copies it (a move or a repair),
//! in chunks no larger than the peer asks for, so no frame is ever larger than the body limit.
//!
//! The first chunk (export id 0) takes the image: a sealed partition's bytes, or a point-in-time
//! copy of an open one. Later chunks name the export and read on in that same image, so a copy
//! is one consistent image however many frames it takes. An export is forgotten when its last
//! chunk is read, or after [`IDLE`] without a request (a copier that died). At most [`MAX_LIVE`]
//! exports are held at once; more are refused (TOO_LARGE), and the copier retries later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ramgrid_proto::native::{ErrorReply, ExportChunk, ExportRequest, Status};

use crate::convert::refusal;
use crate::node::Node;

/// An export nobody asked about for this long is dropped.
const IDLE: Duration = Duration::from_secs(60);
/// Most exports held at once (each holds one partition's image).
const MAX_LIVE: usize = 8;

struct Export {
    image: Arc<Vec<u8>>,
    sealed: bool,
    used: Instant,
}

/// One chunk to send: the export id, its whole image, whether it is of a sealed version, and the
/// range of the image this chunk is.
pub type Chunk = (u64, Arc<Vec<u8>>, bool, std::ops::Range<usize>);

/// The exports this server is serving.
#[derive(Default)]
pub struct Exports {
    live: Mutex<HashMap<u64, Export>>,
}

impl Exports {
    /// Answers one EXPORT_PARTITION request: the chunk to send, as (export id, total, sealed,
    /// image, range).
    pub fn chunk(
        &self,
        state: &Node,
        req: &ExportRequest<'_>,
        max_body: usize,
    ) -> Result<Chunk, ErrorReply> {
        let now = Instant::now();
        let mut live = self.live.lock();
        live.retain(|_, e| now.duration_since(e.used) < IDLE);
        let (id, image, sealed) = if req.export_id == 0 {
            // Only under the copier's spec: every write from now on reaches the copier too.
            crate::cluster::check_epoch(&state.cluster.read(), req.epoch, false)?;
            if live.len() >= MAX_LIVE {
                return Err(ErrorReply::new(
                    Status::TooLarge,
                    format!("{MAX_LIVE} partition copies in progress here: try again later"),
                ));
            }
            if req.version == 0 || req.incarnation == 0 {
                return Err(ErrorReply::new(
                    Status::BadRequest,
                    "an export names its version and incarnation",
                ));
            }
            let tv = state
                .tables
                .at(req.table, req.version)
                .map_err(|e| refusal(&e))?;
            if tv.spec().incarnation != req.incarnation {
                return Err(ErrorReply::new(
                    Status::NoSuchTable,
                    "another incarnation of the table",
                ));
            }
            // Not under the map lock: building the image copies the partition.
            drop(live);
            let (image, sealed) = tv.export_image(req.partition).map_err(|e| refusal(&e))?;
            let image = Arc::new(image);
            let id = loop {
                let id = rand_id();
                if id != 0 {
                    break id;
                }
            };
            live = self.live.lock();
            live.insert(
                id,
                Export {
                    image: image.clone(),
                    sealed,
                    used: now,
                },
            );
            (id, image, sealed)
        } else {
            let e = live.get_mut(&req.export_id).ok_or_else(|| {
                ErrorReply::new(
                    Status::BadRequest,
                    "no such export (finished, or idle too long): start again",
                )
            })?;
            e.used = now;
            (req.export_id, e.image.clone(), e.sealed)
        };
        let total = image.len();
        let start = usize::try_from(req.offset).unwrap_or(usize::MAX).min(total);
        let room = max_body.saturating_sub(64).max(1);
        let end = start + (req.max_len as usize).min(room).min(total - start);
        if end == total {
            live.remove(&id);
        }
        Ok((id, image, sealed, start..end))
    }
}

/// Encodes the reply to an EXPORT_PARTITION.
pub fn reply<'a>(
    id: u64,
    image: &'a [u8],
    sealed: bool,
    range: std::ops::Range<usize>,
) -> ExportChunk<'a> {
    ExportChunk {
        export_id: id,
        total: image.len() as u64,
        sealed,
        chunk: &image[range],
    }
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}
