//! One write order per partition (docs/replication.md). A client's PUT or DELETE goes to the
//! primary of its partitions (the first replica under the committed spec). The primary takes each
//! partition's order lock, forwards the write to the partition's other replicas (flag REPLICA,
//! its epoch), waits until every one of them applied it, applies it itself, and only then lets
//! the next write of that partition go. So:
//!
//! 1. every replica applies a partition's writes in the order the primary chose (one write of a
//!    partition is in flight at a time, and a backup applies a forward before it answers);
//! 2. what the primary holds, every replica of the assignment holds: a read of the primary sees a
//!    write only once it is everywhere, so reads of the primary are linearizable;
//! 3. a deposed primary orders nothing: a backup refuses a forward under another epoch
//!    (WRONG_EPOCH), and the primary itself stops once the assignment no longer names it first.
//!
//! A forward carries the write's id as its request id, the same in every try; a backup keeps the
//! ids it applied lately and answers a second try of one from memory instead of applying it again
//! (a forward that timed out may still arrive: a paused backup reads it when it resumes).
//!
//! A replica that does not answer is tried again until it answers or the control plane fails it
//! over (the next spec no longer names it; the write then goes to the replicas of that spec).
//! After [`Replication::patience`] the primary gives up: it applies the write itself (so that it
//! holds whatever a backup may hold) and answers INDETERMINATE.
//!
//! This module holds the order locks and the forwarding connections; the request's path is
//! `native/primary.rs`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ramgrid_proto::native::Response;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::peer_pool::{CallError, Pool};

/// How long one forward may take before it is tried again.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two tries of a forward that failed.
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Forwards whose answers a backup remembers, against second tries.
const REMEMBERED: usize = 1 << 16;

/// Order locks kept before the idle ones are dropped (each is a few bytes).
const MAX_IDLE_LOCKS: usize = 1 << 14;

/// A partition of one version of one incarnation of a table: what an order lock guards.
type Slot = (String, u64, u32, u32);

/// The order locks and the primary's patience.
pub struct Replication {
    locks: Mutex<HashMap<Slot, Arc<tokio::sync::Mutex<()>>>>,
    /// The next write id: random high bits per process, a counter below.
    next_id: AtomicU64,
    /// As a backup: the forwards applied lately, by write id.
    applied: Mutex<Applied>,
    /// How long a primary keeps trying to complete a write on a silent replica: past the failure
    /// timeout, so that the silent replica is failed over first when the group can do it.
    pub patience: Duration,
    /// The keyed merges applied here lately (as primary or backup), against second tries.
    pub ledger: crate::ledger::Ledger,
    token: Option<String>,
    tls: Option<Arc<crate::tls::Tls>>,
}

thread_local! {
    /// Each worker thread's connections to its peers: a tokio stream belongs to the runtime it was
    /// opened on, and every worker runs its own.
    static POOL: RefCell<Option<Rc<Pool>>> = const { RefCell::new(None) };
}

impl Replication {
    /// The order locks of a server whose failure timeout is `failure_timeout`, forwarding with
    /// `token` (over TLS when given).
    pub fn new(
        failure_timeout: Duration,
        token: Option<String>,
        tls: Option<Arc<crate::tls::Tls>>,
    ) -> Replication {
        let seed = RandomState::new().hash_one(std::process::id());
        Replication {
            locks: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(seed << 32),
            applied: Mutex::new(Applied::default()),
            patience: failure_timeout * 2 + Duration::from_secs(3),
            ledger: Default::default(),
            token,
            tls,
        }
    }

    /// Takes the order locks of `partitions` (of `table`'s `incarnation`, `version`), in ascending
    /// order so that two writes over several partitions never wait for each other in a circle.
    pub async fn lock(
        &self,
        table: &str,
        incarnation: u64,
        version: u32,
        partitions: &[u32],
    ) -> Vec<OwnedMutexGuard<()>> {
        let mut parts = partitions.to_vec();
        parts.sort_unstable();
        parts.dedup();
        let locks: Vec<_> = {
            let mut all = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            if all.len() > MAX_IDLE_LOCKS {
                // Only locks nobody holds or waits for go (the map's is their only reference).
                all.retain(|_, l| Arc::strong_count(l) > 1);
            }
            parts
                .iter()
                .map(|&p| {
                    all.entry((table.to_owned(), incarnation, version, p))
                        .or_default()
                        .clone()
                })
                .collect()
        };
        let mut guards = Vec::with_capacity(locks.len());
        for l in locks {
            guards.push(l.lock_owned().await);
        }
        guards
    }

    /// An id for a write this server orders, unique among the writes any server orders (with
    /// odds of 2^-32 against two servers' ids meeting within a backup's memory).
    pub fn write_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// As a backup, before applying the forward `id`: `Begin` if it is new (it is now marked in
    /// progress), `Done` with the statuses answered if it was applied, `Busy` while another try of
    /// it is being applied.
    pub fn seen(&self, id: u64) -> Seen {
        let mut a = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        match a.by_id.get(&id) {
            Some(Some(st)) => Seen::Done(st.clone()),
            Some(None) => Seen::Busy,
            None => {
                if a.order.len() >= REMEMBERED {
                    if let Some(old) = a.order.pop_front() {
                        a.by_id.remove(&old);
                    }
                }
                a.order.push_back(id);
                a.by_id.insert(id, None);
                Seen::Begin
            }
        }
    }

    /// Records what forward `id` answered (`None`: it was refused, so a second try applies it).
    pub fn applied(&self, id: u64, statuses: Option<Vec<u8>>) {
        let mut a = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        match statuses {
            Some(st) => {
                a.by_id.insert(id, Some(st));
            }
            None => {
                a.by_id.remove(&id);
            }
        }
    }

    fn pool(&self) -> Rc<Pool> {
        POOL.with(|p| {
            p.borrow_mut()
                .get_or_insert_with(|| Rc::new(Pool::new(self.token.clone(), self.tls.clone())))
                .clone()
        })
    }

    /// Sends the forward of write `id` (its frame appended by `encode`) to `addr` and returns the
    /// per-key statuses it answered.
    pub async fn forward(
        &self,
        addr: &str,
        id: u64,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> Result<(), String>,
    ) -> Result<Vec<u8>, String> {
        let pool = self.pool();
        let deadline = Instant::now() + FORWARD_TIMEOUT;
        let r = pool
            .call_with(addr, Some(id), encode, deadline, |r| match r {
                Response::KeyStatuses(st) => Ok(st.iter().map(|s| s as u8).collect()),
                Response::Error(e) => Err(format!("{} {}", e.status.name(), e.message)),
                other => Err(format!("unexpected reply to a forward: {other:?}")),
            })
            .await;
        r.map_err(|e| match e {
            CallError::Timeout => format!("{addr}: no reply in {FORWARD_TIMEOUT:?}"),
            other => format!("{addr}: {other}"),
        })
    }
}

/// What a backup knows of a forward: see [`Replication::seen`].
pub enum Seen {
    /// New: apply it.
    Begin,
    /// Applied: answer these statuses again.
    Done(Vec<u8>),
    /// Another try of it is being applied now.
    Busy,
}

/// The forwards a backup applied lately (`None`: in progress), oldest first in `order`.
#[derive(Default)]
struct Applied {
    by_id: HashMap<u64, Option<Vec<u8>>>,
    order: VecDeque<u64>,
}
