//! The way back from a lost majority (docs/control-plane.md, "Recovering a lost majority"):
//! RECOVER replaces this server's group member with a new one, of a new generation.
//!
//! A group that lost a majority of its voters for good (they died, with their disks) decides
//! nothing again: Raft cannot tell a dead voter from a slow one. The operator, who can, runs
//! `ramgrid cluster recover`; the client picks the live server that applied the most of the old
//! group's log and sends it RECOVER `lead`, then the other live servers RECOVER `join`:
//!
//! - **lead**: the server gives up its member, starts a fresh one (new node id; a durable state
//!   directory's old files are set aside in `given-up-<generation>/`, not deleted), forms a
//!   group of one and proposes [`MetaCommand::Restore`] with the state it had applied: the
//!   spec, the failed servers and the catalog go on as they were, under the new generation.
//!   Its leader duties then fail over the servers that stay silent and add the others.
//! - **join**: the server gives up its member and starts a fresh one in no group; the new
//!   leader adds it as it adds any server of the spec.
//!
//! Both are refused while a leader with a majority reaches this server (nothing to recover),
//! and for a generation not above the one it holds (a repeat, or a stale operator). A server of
//! the old group that comes back later (a restart from its state directory) reports the old
//! generation; the new leader sends it RECOVER `join` (`leader.rs`) instead of adding a member
//! that still believes in the old group.
//!
//! What the operator vouches for: that the missing voters are gone and not merely cut off. A
//! voter cut off by a network partition that still has a majority on its side keeps deciding
//! there; RECOVER on the minority side then makes two groups (as etcd's
//! `--force-new-cluster` would). The refusal above catches the common mistake (a majority in
//! reach of the server asked), not a partition that hides one.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ramgrid_meta::{
    MetaCommand, MetaConfig, MetaError, MetaNode, COMMITTED_FILE, LOG_FILE, SNAPSHOT_FILE,
    VOTE_FILE,
};
use ramgrid_proto::native::{ErrorReply, RecoverMode, Status};

use super::Meta;

impl Meta {
    /// RECOVER (module docs): `key value` lines saying what this server now is.
    pub(super) async fn recover(
        self: &Arc<Self>,
        mode: RecoverMode,
        generation: u64,
    ) -> Result<String, ErrorReply> {
        let me = self.clone();
        self.rt
            .spawn(async move { me.recover_here(mode, generation).await })
            .await
            .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))?
    }

    async fn recover_here(
        self: Arc<Self>,
        mode: RecoverMode,
        generation: u64,
    ) -> Result<String, ErrorReply> {
        let refuse = |why: String| Err(ErrorReply::new(Status::BadRequest, why));
        // One at a time: two operators (or an operator and a leader) must not swap at once.
        let _one = self.recovering.lock().await;
        let old = self.node();
        let applied = old.state();
        if self.member.load(Ordering::Acquire) && self.check_quorum().is_ok() {
            return refuse(format!(
                "{} is in reach of a leader with a majority: the metadata group decides, \
                 nothing to recover",
                self.server_id
            ));
        }
        if generation <= applied.generation {
            return refuse(format!(
                "generation {generation} is not above {}, which {} holds",
                applied.generation, self.server_id
            ));
        }
        if mode == RecoverMode::Lead && applied.servers.is_empty() {
            return refuse(format!(
                "{} holds no cluster metadata to rebuild the group from",
                self.server_id
            ));
        }
        let node = self.replace_node(&old, generation).await?;
        if mode == RecoverMode::Lead {
            let me = BTreeMap::from([(node.id(), self.server_id.clone())]);
            node.initialize(me)
                .await
                .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))?;
            let cmd = MetaCommand::Restore {
                state: Box::new((*applied).clone()),
                generation,
            };
            match node.propose(cmd).await {
                Ok(_) | Err(MetaError::Refused(_)) => {}
                Err(e) => return Err(ErrorReply::new(Status::Internal, e.to_string())),
            }
            self.events.note(
                |e| e.membership_changes += 1,
                format!(
                    "rebuilt the metadata group (generation {generation}) from this server's \
                     state at log index {}",
                    old.status().last_applied
                ),
            );
        } else {
            self.events.note(
                |_| {},
                format!("left the metadata group for generation {generation}: waiting to be added"),
            );
        }
        let role = match mode {
            RecoverMode::Lead => "lead",
            RecoverMode::Join => "join",
        };
        Ok(format!(
            "server {}\nmode {role}\ngeneration {generation}\nmeta_id {}\napplied_before {}\n",
            self.server_id,
            node.id(),
            old.status().last_applied
        ))
    }

    /// Stops `old` and starts a fresh member in its place (a new node id; a state directory's
    /// Raft files set aside first), then lets every task follow the new one.
    async fn replace_node(&self, old: &MetaNode, generation: u64) -> Result<MetaNode, ErrorReply> {
        let internal = |e: &dyn std::fmt::Display| ErrorReply::new(Status::Internal, e.to_string());
        old.shutdown().await;
        if let Some(dir) = &self.dir {
            set_aside(dir, generation).map_err(|e| internal(&e))?;
        }
        let id = super::node_id(self.dir.as_deref(), &self.server_id).map_err(|e| internal(&e))?;
        let mut config = MetaConfig::new(id, self.server_id.clone());
        config.dir = self.dir.clone();
        let node = MetaNode::start_with(config, self.pool.clone())
            .await
            .map_err(|e| internal(&e))?;
        *self.node.write() = node.clone();
        *self.installer.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
        self.settled.store(true, Ordering::Release);
        self.member.store(false, Ordering::Release);
        self.stale.store(false, Ordering::Release);
        self.swaps.send_modify(|n| *n += 1);
        Ok(node)
    }
}

/// Moves the old member's files (`node_id`, log, vote, snapshot) into `given-up-<generation>/`
/// in the state directory: kept for a post-mortem, never read again.
fn set_aside(dir: &std::path::Path, generation: u64) -> std::io::Result<()> {
    let to = dir.join(format!("given-up-{generation}"));
    std::fs::create_dir_all(&to)?;
    for name in [
        "node_id",
        LOG_FILE,
        VOTE_FILE,
        COMMITTED_FILE,
        SNAPSHOT_FILE,
    ] {
        match std::fs::rename(dir.join(name), to.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::File::open(dir)?.sync_all()
}
