//! The state machine openraft applies committed entries to, and its snapshots.
//!
//! The applied [`MetaState`] lives in memory as an `Arc`, replaced (copy on write) once per
//! batch of applied entries and published on a watch channel. A snapshot is the state encoded
//! as JSON; with a directory it is written atomically to `raft.snapshot` before openraft is told
//! it exists, because openraft purges the log up to it right after.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::disk;
use crate::state::{Member, MetaRefusal, MetaReply, MetaState, NodeId};
use crate::TypeConfig;

/// The snapshot file's name in the directory.
pub const SNAPSHOT_FILE: &str = "raft.snapshot";

/// A snapshot as stored and as sent: its meta and the encoded state.
#[derive(Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// The state machine handed to openraft; clones share one state.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Inner>,
    dir: Option<PathBuf>,
    watch: watch::Sender<Arc<MetaState>>,
}

struct Inner {
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    state: Arc<MetaState>,
    snapshot: Option<StoredSnapshot>,
    /// Makes snapshot ids unique within this process.
    built: u64,
}

type StorageResult<T> = Result<T, StorageError<NodeId>>;

impl StateMachineStore {
    /// A state machine starting from the snapshot under `dir`, if any, or empty.
    pub fn open(dir: Option<&Path>) -> Result<StateMachineStore, String> {
        let mut inner = Inner {
            applied: None,
            membership: StoredMembership::default(),
            state: Arc::new(MetaState::default()),
            snapshot: None,
            built: 0,
        };
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if let Some(snap) = disk::read_value::<StoredSnapshot>(dir, SNAPSHOT_FILE)? {
                let state: MetaState = serde_json::from_slice(&snap.data).map_err(|e| {
                    format!(
                        "{}: undecodable state: {e}",
                        dir.join(SNAPSHOT_FILE).display()
                    )
                })?;
                inner.applied = snap.meta.last_log_id;
                inner.membership = snap.meta.last_membership.clone();
                inner.state = Arc::new(state);
                inner.snapshot = Some(snap);
            }
        }
        let (watch, _) = watch::channel(inner.state.clone());
        Ok(StateMachineStore {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                dir: dir.map(Path::to_owned),
                watch,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The applied state.
    pub fn state(&self) -> Arc<MetaState> {
        self.shared.watch.borrow().clone()
    }

    /// A receiver of every newly applied state.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaState>> {
        self.shared.watch.subscribe()
    }

    /// Replace the state (install or start from a snapshot) and publish it.
    fn publish(&self, state: Arc<MetaState>) {
        self.shared.watch.send_replace(state);
    }
}

/// The members as a membership names them.
fn members_of(
    m: &StoredMembership<NodeId, BasicNode>,
) -> std::collections::BTreeMap<NodeId, Member> {
    let voters: std::collections::BTreeSet<NodeId> = m.membership().voter_ids().collect();
    m.membership()
        .nodes()
        .map(|(id, node)| {
            let member = Member {
                addr: node.addr.clone(),
                voter: voters.contains(id),
            };
            (*id, member)
        })
        .collect()
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let (meta, state) = {
            let mut g = self.lock();
            g.built += 1;
            let snapshot_id = match g.applied {
                Some(id) => format!("{}-{}-{}", id.leader_id.term, id.index, g.built),
                None => format!("0-0-{}", g.built),
            };
            let meta = SnapshotMeta {
                last_log_id: g.applied,
                last_membership: g.membership.clone(),
                snapshot_id,
            };
            (meta, g.state.clone())
        };
        let data = serde_json::to_vec(&*state)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let snap = StoredSnapshot { meta, data };
        if let Some(dir) = &self.shared.dir {
            disk::blocking(|| disk::write_value(dir, SNAPSHOT_FILE, &snap)).map_err(|e| {
                StorageIOError::write_snapshot(Some(snap.meta.signature()), &disk::io(e))
            })?;
        }
        self.lock().snapshot = Some(snap.clone());
        Ok(Snapshot {
            meta: snap.meta,
            snapshot: Box::new(Cursor::new(snap.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let g = self.lock();
        Ok((g.applied, g.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Result<MetaReply, MetaRefusal>>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.lock();
        let mut state = (*g.state).clone();
        let mut replies = Vec::new();
        for entry in entries {
            g.applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Blank => Ok(MetaReply::Done),
                EntryPayload::Normal(cmd) => state.apply(&cmd),
                EntryPayload::Membership(m) => {
                    g.membership = StoredMembership::new(Some(entry.log_id), m);
                    state.members = members_of(&g.membership);
                    Ok(MetaReply::Done)
                }
            };
            replies.push(reply);
        }
        let state = Arc::new(state);
        g.state = state.clone();
        drop(g);
        self.publish(state);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let mut state: MetaState = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        // The members follow the membership the snapshot carries, as `apply` keeps them.
        state.members = members_of(&meta.last_membership);
        let snap = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        if let Some(dir) = &self.shared.dir {
            disk::blocking(|| disk::write_value(dir, SNAPSHOT_FILE, &snap)).map_err(|e| {
                StorageIOError::write_snapshot(Some(meta.signature()), &disk::io(e))
            })?;
        }
        let state = Arc::new(state);
        {
            let mut g = self.lock();
            g.applied = meta.last_log_id;
            g.membership = meta.last_membership.clone();
            g.state = state.clone();
            g.snapshot = Some(snap);
        }
        self.publish(state);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        Ok(self.lock().snapshot.clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
