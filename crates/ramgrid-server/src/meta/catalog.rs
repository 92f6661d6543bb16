//! The table catalog in the metadata group: which requests are proposals, and how each server
//! installs the current version the group committed (docs/control-plane.md).
//!
//! - CREATE_TABLE and DROP_TABLE are proposed first; the server then applies the request locally.
//! - CREATE_VERSION raises the table's high-water mark first (`RaiseHighWater` with the creating
//!   call's token): of two calls that chose one number, the first committed creates it on every
//!   server and the other gets VERSION_EXISTS from every server, having created nothing. The
//!   same call's request on the next server is a repeat the group accepts.
//! - SET_CURRENT is proposed (`SetCurrent`) and then installed here by the [`Installer`], the
//!   only writer of a member's current versions: each server installs the committed switches in
//!   commit order, so two clients switching one table at once leave every server on the one
//!   committed last, and a server that missed a switch (restarted from its data directory,
//!   or holding the version only once a copy finishes) installs it when it can.
//! - SEAL_VERSION and DROP_VERSION stay local: sealing freezes what this server holds, and the
//!   number of a dropped version stays used (the high-water mark never goes down).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ramgrid_meta::{MetaCommand, MetaError, MetaRefusal, MetaState};
use ramgrid_proto::native::{ErrorReply, Request, Status, VersionRef};
use tokio::time::Instant;

use super::{no_quorum, Meta};
use crate::node::Node;

/// How long a SET_CURRENT waits for the committed switch to be installed here.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

impl Meta {
    /// The group's half of a catalog request on a member (module docs). `Ok(false)`: the
    /// connection then handles the request locally; `Ok(true)`: done here (a SET_CURRENT the
    /// installer carried out), answer it.
    pub(super) async fn catalog(
        self: &Arc<Self>,
        state: &Node,
        req: &Request<'_>,
    ) -> Result<bool, ErrorReply> {
        // Asked of the node, not the keeper's flag, which may lag a just-added member by a tick.
        if !self.is_member() {
            return Ok(false);
        }
        self.check_quorum()?;
        match req {
            Request::CreateTable(_) | Request::DropTable { .. } => {
                self.tables(state, req).await.map(|()| false)
            }
            Request::CreateVersion(v) if v.version > 0 => {
                self.create_version(state, v).await.map(|()| false)
            }
            Request::SetCurrent(v) if v.version > 0 => self.set_current(state, v).await,
            _ => Ok(false),
        }
    }

    /// CREATE_TABLE and DROP_TABLE: the group decides first, then the server applies the request.
    async fn tables(self: &Arc<Self>, state: &Node, req: &Request<'_>) -> Result<(), ErrorReply> {
        let cmd = match req {
            Request::CreateTable(c) => {
                let mut spec = Vec::new();
                Request::CreateTable(*c)
                    .encode(&mut spec, 0)
                    .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
                MetaCommand::CreateTable {
                    name: c.name.to_owned(),
                    incarnation: c.incarnation,
                    spec,
                }
            }
            Request::DropTable { name } => match self.incarnation(state, name) {
                Some(incarnation) => MetaCommand::DropTable {
                    name: (*name).to_owned(),
                    incarnation,
                },
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        match self.propose(cmd).await? {
            Ok(_) => Ok(()),
            Err(MetaError::Refused(r @ MetaRefusal::TableExists { .. })) => Err(ErrorReply::new(
                Status::TableExists,
                format!("{r} (another client created it first)"),
            )),
            // Dropped already, or the group knows it under another incarnation: the local drop
            // still removes what this server holds under the name.
            Err(MetaError::Refused(
                MetaRefusal::NoSuchTable { .. } | MetaRefusal::WrongIncarnation { .. },
            )) => Ok(()),
            Err(e) => Err(proposal_error(e)),
        }
    }

    /// CREATE_VERSION: the number is the group's before any server creates it.
    async fn create_version(
        self: &Arc<Self>,
        state: &Node,
        v: &VersionRef<'_>,
    ) -> Result<(), ErrorReply> {
        let Some(incarnation) = self.incarnation(state, v.table) else {
            return Ok(()); // Unknown here and to the group: the local handler says so.
        };
        let cmd = MetaCommand::RaiseHighWater {
            name: v.table.to_owned(),
            incarnation,
            version: v.version,
            creator: v.creator,
        };
        match self.propose(cmd).await? {
            Ok(_) => Ok(()),
            Err(MetaError::Refused(MetaRefusal::VersionUsed {
                version,
                high_water,
                ..
            })) => Err(ErrorReply::new(
                Status::VersionExists,
                format!(
                    "version {version} of {} was taken: the cluster has numbered versions up to \
                     {high_water} (another client created one at the same time)",
                    v.table
                ),
            )),
            // A table created before the group existed: numbered by its servers, as before.
            Err(MetaError::Refused(MetaRefusal::NoSuchTable { .. })) => Ok(()),
            Err(e) => Err(proposal_error(e)),
        }
    }

    /// SET_CURRENT: proposed, then installed here by the installer; answered once it is (or once
    /// a later committed switch superseded it). `Ok(false)`: not for the group (the local
    /// handler refuses it with the reason).
    async fn set_current(
        self: &Arc<Self>,
        state: &Node,
        v: &VersionRef<'_>,
    ) -> Result<bool, ErrorReply> {
        // Only a version this server holds sealed can be made current (the local handler then
        // refuses with the reason): check before asking the group.
        let sealed_here = state
            .tables
            .describe(v.table)
            .is_ok_and(|t| t.versions.iter().any(|x| x.number == v.version && x.sealed));
        let Some(incarnation) = self.incarnation(state, v.table).filter(|_| sealed_here) else {
            return Ok(false);
        };
        let cmd = |version| MetaCommand::SetCurrent {
            name: v.table.to_owned(),
            incarnation,
            version,
        };
        let mut r = self.propose(cmd(v.version)).await?;
        if let Err(MetaError::Refused(MetaRefusal::VersionNotCreated { .. })) = r {
            // Created while this server was outside any group: give the group its number.
            let raise = MetaCommand::RaiseHighWater {
                name: v.table.to_owned(),
                incarnation,
                version: v.version,
                creator: 0,
            };
            let _ = self.propose(raise).await?;
            r = self.propose(cmd(v.version)).await?;
        }
        match r {
            Ok(_) => {}
            // A table created before the group existed: switched by its servers, as before.
            Err(MetaError::Refused(MetaRefusal::NoSuchTable { .. })) => return Ok(false),
            Err(e) => return Err(proposal_error(e)),
        }
        // Committed is not yet applied here: until this node has applied the switch, its state
        // still names the old current version, which the loop below would take for a later
        // switch that superseded this one, and answer before installing (a drop of the old
        // version right after the call was then refused as current). A read through the leader
        // returns once this node has applied everything committed so far, this switch included.
        self.read_committed().await?;
        let deadline = Instant::now() + INSTALL_WAIT;
        loop {
            self.observe_catalog(state, false);
            let here = state.tables.describe(v.table).map_or(0, |t| t.current);
            let agreed = self.node().state().tables.get(v.table).map(|t| t.current);
            if here == v.version || agreed.is_some_and(|c| c != v.version) {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Err(ErrorReply::new(
                    Status::Internal,
                    "the switch was committed but is not installed here yet",
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The incarnation of `table` here, else the one the group knows.
    fn incarnation(&self, state: &Node, table: &str) -> Option<u64> {
        match state.tables.describe(table) {
            Ok(info) => Some(info.spec.incarnation),
            Err(_) => self.node().state().tables.get(table).map(|t| t.incarnation),
        }
    }

    /// Hands the installer the newest applied state (`sync`: as the truth, after a read through
    /// the leader), then installs what it can. The state is read under the installer's lock, so
    /// the states it sees never go back in the log, whichever task calls.
    pub(super) fn observe_catalog(&self, state: &Node, sync: bool) {
        let mut installer = self.installer.lock().unwrap_or_else(|p| p.into_inner());
        let ms = self.node().state();
        if sync {
            installer.sync(&ms);
        } else {
            installer.observe(&ms);
        }
        installer.install(state);
        self.settled
            .store(installer.wanted.is_empty(), Ordering::Release);
    }
}

fn proposal_error(e: MetaError) -> ErrorReply {
    match e {
        MetaError::Refused(r) => ErrorReply::new(Status::BadRequest, r.to_string()),
        e @ MetaError::NoQuorum { .. } => no_quorum(&e.to_string()),
        e => ErrorReply::new(Status::Internal, e.to_string()),
    }
}

/// The current versions the group committed that this server has yet to install.
///
/// Until it has read the group's state through the leader (`sync`, at the first keeper tick as
/// a member and after every catch-up), it installs nothing: the state a restarted server's Raft
/// directory holds is older than its data directory, and replaying the log from there would
/// switch readers back for a moment. From the synced state on, each committed state is observed
/// in commit order and a table whose (incarnation, current) changed is wanted at that version,
/// replacing what was wanted before.
#[derive(Default)]
pub(crate) struct Installer {
    synced: bool,
    seen: BTreeMap<String, (u64, u32)>,
    wanted: BTreeMap<String, (u64, u32)>,
}

impl Installer {
    /// Whether no switch of `table` the group committed waits here for its version (before the
    /// first sync nothing is known to wait).
    pub(crate) fn installed(&self, table: &str) -> bool {
        !self.wanted.contains_key(table)
    }

    /// Whether the installer has read the group's state since this server started.
    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    /// Takes `ms`, read through the leader, as the truth: every table's current version is wanted.
    pub(crate) fn sync(&mut self, ms: &MetaState) {
        self.synced = true;
        self.seen.clear();
        self.wanted.clear();
        for (name, t) in &ms.tables {
            self.seen.insert(name.clone(), (t.incarnation, t.current));
            if t.current != 0 {
                self.wanted.insert(name.clone(), (t.incarnation, t.current));
            }
        }
    }

    /// Records a committed state (ignored before the first `sync`).
    pub(crate) fn observe(&mut self, ms: &MetaState) {
        if !self.synced {
            return;
        }
        for (name, t) in &ms.tables {
            let now = (t.incarnation, t.current);
            if self.seen.get(name) == Some(&now) {
                continue;
            }
            self.seen.insert(name.clone(), now);
            if t.current != 0 {
                self.wanted.insert(name.clone(), now);
            } else {
                self.wanted.remove(name);
            }
        }
        self.seen.retain(|n, _| ms.tables.contains_key(n));
        self.wanted.retain(|n, _| ms.tables.contains_key(n));
    }

    /// Installs each wanted version this server holds sealed; keeps the others for later (a
    /// table or version still being copied in).
    pub(crate) fn install(&mut self, state: &Node) {
        self.wanted.retain(|name, &mut (incarnation, version)| {
            let Ok(info) = state.tables.describe(name) else {
                return true;
            };
            if info.spec.incarnation != incarnation {
                return true; // The old incarnation is still here; the new one arrives by copy.
            }
            if info.current == version {
                return false;
            }
            if !info
                .versions
                .iter()
                .any(|v| v.number == version && v.sealed)
            {
                return true;
            }
            match state.tables.set_current(name, version) {
                Ok(()) => {
                    tracing::info!(table = name, version, "current version switched");
                    if let Err(e) = state.sync_catalog(name) {
                        tracing::info!(
                            "version {version} of {name} is current, but the \
                             catalog could not be written: {}",
                            e.message
                        );
                    }
                    false
                }
                Err(e) => {
                    tracing::error!("cannot make version {version} of {name} current: {e}");
                    true
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ramgrid_meta::TableMeta;

    fn state(tables: &[(&str, u64, u32)]) -> MetaState {
        let mut ms = MetaState::default();
        for &(n, inc, cur) in tables {
            ms.tables.insert(
                n.into(),
                TableMeta {
                    incarnation: inc,
                    spec: vec![],
                    high_water: cur,
                    current: cur,
                    high_water_creator: 0,
                },
            );
        }
        ms
    }

    #[test]
    fn nothing_is_wanted_before_sync_and_later_switches_are_wanted_in_order() {
        let mut i = Installer::default();
        i.observe(&state(&[("a", 1, 4)]));
        assert!(
            i.wanted.is_empty(),
            "a replayed state may be older than the disk"
        );
        i.sync(&state(&[("a", 1, 4), ("z", 3, 0)]));
        assert_eq!(i.wanted["a"], (1, 4), "the synced state is the truth");
        assert!(!i.wanted.contains_key("z"));
        i.wanted.clear(); // as if installed
        i.observe(&state(&[("a", 1, 4)]));
        assert!(i.wanted.is_empty(), "no change, nothing to do");
        i.observe(&state(&[("a", 1, 5)]));
        assert_eq!(i.wanted["a"], (1, 5));
        i.observe(&state(&[("a", 1, 3)]));
        assert_eq!(
            i.wanted["a"],
            (1, 3),
            "a later switch (back) replaces the wanted one"
        );
        i.observe(&state(&[("a", 1, 3), ("b", 2, 0)]));
        assert!(
            !i.wanted.contains_key("b"),
            "no current version: nothing to install"
        );
        i.observe(&state(&[("b", 2, 0)]));
        assert!(i.wanted.is_empty(), "a dropped table is no longer wanted");
    }
}
