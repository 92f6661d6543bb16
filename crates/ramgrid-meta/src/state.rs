//! The cluster metadata and its commands: a deterministic state machine, no I/O.
//!
//! Every node applies the same committed commands in the same order, so [`MetaState::apply`] must
//! depend on nothing but the state and the command (no clock, no randomness, no hash-map order:
//! every collection here is ordered). A command either changes the state as a whole or is refused
//! with a [`MetaRefusal`] and changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A Raft node id. Stable for the life of a node's data directory.
pub type NodeId = u64;

/// A member of the Raft group, as its committed membership names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The address the group reaches it at (its RPC port).
    pub addr: String,
    /// Whether it votes; a learner only receives the log.
    pub voter: bool,
}

/// A rebalance from the current serving spec to `target`, recorded while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The servers the cluster moves to.
    pub target: Vec<String>,
    /// Who began it (a server address or an operator's name), for operators and logs.
    pub started_by: String,
}

/// What the group knows of one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableMeta {
    /// Chosen by the creating client; a table dropped and created again has another.
    pub incarnation: u64,
    /// The table's encoded spec (partitions, replication, value type), opaque here.
    pub spec: Vec<u8>,
    /// The highest version number ever created (dropped versions included); 0 before the first.
    pub high_water: u32,
    /// The current version; 0 when none is current yet.
    pub current: u32,
    /// The creator token of the call that raised `high_water` last (0: none given). The same call
    /// asks every server to create its version, and each proposes the raise: the first commits,
    /// the others are the same call's and succeed without raising again.
    #[serde(default)]
    pub high_water_creator: u64,
}

/// The replicated cluster metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// The Raft group's members, from its last applied membership.
    pub members: BTreeMap<NodeId, Member>,
    /// The serving spec: the ordered server addresses (protocol-native section 8).
    pub servers: Vec<String>,
    /// A rebalance in progress.
    pub transition: Option<Transition>,
    /// Servers marked down by the failure detector.
    pub down: BTreeSet<String>,
    /// The table catalog by name.
    pub tables: BTreeMap<String, TableMeta>,
    /// Servers the failure detector took out of the spec ([`MetaCommand::FailOver`]) that have
    /// not come back yet; the leader moves them back in once they answer again.
    #[serde(default)]
    pub failed: BTreeSet<String>,
    /// How many times each server was failed over, ever. A server that sees its count rise
    /// knows it was out of the spec, even if it sees only the state after its rejoin, and
    /// copies in everything it holds again (what it had may have missed writes).
    #[serde(default)]
    pub failures: BTreeMap<String, u64>,
    /// How many times the group was rebuilt from survivors after losing its majority
    /// ([`MetaCommand::Restore`]); 0 for the group formed first. A server that reports a lower
    /// generation while in a group belongs to a group that was given up, and is reset.
    #[serde(default)]
    pub generation: u64,
}

/// A change to the metadata, proposed through Raft and applied on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// Replace the serving spec. With `expect_epoch`, only if the current epoch is that one
    /// (compare-and-set; `Some(0)` means "only if there is no spec yet").
    SetServers {
        /// The new ordered server list (non-empty, no duplicates).
        servers: Vec<String>,
        /// The epoch the proposer saw, if it wants compare-and-set.
        expect_epoch: Option<u64>,
    },
    /// Record that a rebalance to `target` has begun.
    BeginTransition {
        /// The servers to move to.
        target: Vec<String>,
        /// Who begins it.
        by: String,
    },
    /// The rebalance to `target` is done: `target` becomes the serving spec.
    CompleteTransition {
        /// The target of the transition in progress.
        target: Vec<String>,
    },
    /// Forget the rebalance in progress, if any; the spec stays as it was.
    AbortTransition,
    /// The failure detector found `addr` down.
    MarkDown {
        /// A server of the spec or of the transition's target.
        addr: String,
    },
    /// `addr` is serving again.
    MarkUp {
        /// The server.
        addr: String,
    },
    /// The failure detector found `addr` unreachable: take it out of the serving spec (its
    /// partitions' replica lists move to live servers, which copy them in from the survivors)
    /// and remember it in `failed`. Refused during a transition and for the last server.
    FailOver {
        /// A server of the spec.
        addr: String,
    },
    /// Create a table.
    CreateTable {
        /// Its name.
        name: String,
        /// Its incarnation id, chosen by the creating client.
        incarnation: u64,
        /// Its encoded spec.
        spec: Vec<u8>,
    },
    /// Drop a table, if it is still that incarnation.
    DropTable {
        /// Its name.
        name: String,
        /// The incarnation the proposer means.
        incarnation: u64,
    },
    /// Reserve version numbers up to `version` (a version is being created).
    RaiseHighWater {
        /// The table.
        name: String,
        /// The incarnation the proposer means.
        incarnation: u64,
        /// Above the table's high-water mark (or equal to it, from the call that raised it).
        version: u32,
        /// The creating call's token (0: none; such a raise is never a repeat).
        #[serde(default)]
        creator: u64,
    },
    /// Make `version` the table's current version.
    SetCurrent {
        /// The table.
        name: String,
        /// The incarnation the proposer means.
        incarnation: u64,
        /// A version already created (1..=high_water).
        version: u32,
    },
    /// The first command of a group rebuilt from a survivor after the old group lost its
    /// majority for good (`ramgrid cluster recover`): everything but the members (the new
    /// group's own) becomes `state`'s, and the generation becomes `generation`. Refused unless
    /// `generation` is above the current one, so a repeat changes nothing.
    Restore {
        /// The survivor's applied state.
        state: Box<MetaState>,
        /// The new group's generation (above the old group's).
        generation: u64,
    },
}

/// What an applied command reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    /// Applied; nothing more to say.
    Done,
    /// The serving spec's epoch after the command.
    Epoch(u64),
    /// The table as the command left it.
    Table(TableMeta),
}

/// Why a command was refused. The state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum MetaRefusal {
    /// `SetServers` with an `expect_epoch` that is not the current one.
    #[error("epoch is {actual:#x}, not the expected {expected:#x}")]
    EpochMismatch {
        /// What the proposer expected.
        expected: u64,
        /// The current epoch.
        actual: u64,
    },
    /// A server list that cannot be a spec.
    #[error("invalid server list: {reason}")]
    InvalidServers {
        /// What is wrong with it.
        reason: String,
    },
    /// A rebalance to another target is in progress.
    #[error("a transition to {target:?} (begun by {started_by}) is in progress")]
    TransitionInProgress {
        /// Its target.
        target: Vec<String>,
        /// Who began it.
        started_by: String,
    },
    /// `CompleteTransition` with no transition, or with another target, in progress.
    #[error("no transition to {target:?} is in progress")]
    NoSuchTransition {
        /// The target named.
        target: Vec<String>,
    },
    /// `MarkDown` of an address that is neither in the spec nor in the transition's target.
    #[error("{addr} is not a server of the cluster")]
    UnknownServer {
        /// The address.
        addr: String,
    },
    /// `CreateTable` of a name that already names another incarnation.
    #[error("table {name:?} already exists with incarnation {incarnation:#x}")]
    TableExists {
        /// The table.
        name: String,
        /// The incarnation that holds the name.
        incarnation: u64,
    },
    /// No table by that name.
    #[error("no table {name:?}")]
    NoSuchTable {
        /// The table.
        name: String,
    },
    /// The table is another incarnation than the one the proposer means.
    #[error("table {name:?} is incarnation {actual:#x}, not {expected:#x}")]
    WrongIncarnation {
        /// The table.
        name: String,
        /// The incarnation named.
        expected: u64,
        /// The table's incarnation.
        actual: u64,
    },
    /// `RaiseHighWater` to a version at or below the mark: that number was already used.
    #[error("table {name:?}: version {version} is not above the high-water mark {high_water}")]
    VersionUsed {
        /// The table.
        name: String,
        /// The version named.
        version: u32,
        /// The table's high-water mark.
        high_water: u32,
    },
    /// `Restore` to a generation not above the current one.
    #[error("the group is at generation {current}, not below {generation}")]
    StaleGeneration {
        /// The generation named.
        generation: u64,
        /// The group's.
        current: u64,
    },
    /// `SetCurrent` to a version never created (0 or above the high-water mark).
    #[error("table {name:?}: version {version} was never created (high-water mark {high_water})")]
    VersionNotCreated {
        /// The table.
        name: String,
        /// The version named.
        version: u32,
        /// The table's high-water mark.
        high_water: u32,
    },
}

impl MetaState {
    /// The serving spec's epoch: `ramgrid_proto::cluster::epoch_of(servers)`, or 0 ("no spec",
    /// as a server without a spec reports) while the list is empty.
    pub fn epoch(&self) -> u64 {
        epoch_of_list(&self.servers)
    }

    /// Apply one command: all of it, or nothing and a refusal.
    pub fn apply(&mut self, cmd: &MetaCommand) -> Result<MetaReply, MetaRefusal> {
        match cmd {
            MetaCommand::Restore { state, generation } => {
                if *generation <= self.generation {
                    return Err(MetaRefusal::StaleGeneration {
                        generation: *generation,
                        current: self.generation,
                    });
                }
                let members = std::mem::take(&mut self.members);
                *self = MetaState {
                    members,
                    generation: *generation,
                    ..(**state).clone()
                };
                Ok(MetaReply::Epoch(self.epoch()))
            }
            MetaCommand::SetServers {
                servers,
                expect_epoch,
            } => {
                let actual = self.epoch();
                if let Some(expected) = *expect_epoch {
                    if expected != actual {
                        return Err(MetaRefusal::EpochMismatch { expected, actual });
                    }
                }
                check_servers(servers)?;
                // A rebalance runs from the spec it began under; replacing the spec under it
                // would leave its moves meaningless.
                if let Some(t) = &self.transition {
                    return Err(in_progress(t));
                }
                self.servers.clone_from(servers);
                self.prune_down();
                Ok(MetaReply::Epoch(self.epoch()))
            }
            MetaCommand::BeginTransition { target, by } => {
                check_servers(target)?;
                match &self.transition {
                    // Idempotent: a proposer that lost the reply can send it again.
                    Some(t) if &t.target == target => Ok(MetaReply::Done),
                    Some(t) => Err(in_progress(t)),
                    None => {
                        self.transition = Some(Transition {
                            target: target.clone(),
                            started_by: by.clone(),
                        });
                        Ok(MetaReply::Done)
                    }
                }
            }
            MetaCommand::CompleteTransition { target } => match &self.transition {
                Some(t) if &t.target == target => {
                    self.servers.clone_from(target);
                    self.transition = None;
                    self.prune_down();
                    Ok(MetaReply::Epoch(self.epoch()))
                }
                _ => Err(MetaRefusal::NoSuchTransition {
                    target: target.clone(),
                }),
            },
            // Idempotent: "no transition" is the state asked for, whether or not one ran.
            MetaCommand::AbortTransition => {
                self.transition = None;
                self.prune_down();
                Ok(MetaReply::Done)
            }
            MetaCommand::MarkDown { addr } => {
                if !self.is_server(addr) {
                    return Err(MetaRefusal::UnknownServer { addr: addr.clone() });
                }
                self.down.insert(addr.clone());
                Ok(MetaReply::Done)
            }
            MetaCommand::MarkUp { addr } => {
                self.down.remove(addr);
                Ok(MetaReply::Done)
            }
            MetaCommand::FailOver { addr } => {
                if let Some(t) = &self.transition {
                    return Err(in_progress(t));
                }
                if !self.servers.iter().any(|s| s == addr) {
                    return Err(MetaRefusal::UnknownServer { addr: addr.clone() });
                }
                if self.servers.len() < 2 {
                    return Err(MetaRefusal::InvalidServers {
                        reason: format!("{addr} is the last server"),
                    });
                }
                self.servers.retain(|s| s != addr);
                self.failed.insert(addr.clone());
                *self.failures.entry(addr.clone()).or_default() += 1;
                self.prune_down();
                Ok(MetaReply::Epoch(self.epoch()))
            }
            MetaCommand::CreateTable {
                name,
                incarnation,
                spec,
            } => match self.tables.get(name) {
                // Idempotent for the same incarnation: the creator may retry after a lost reply.
                // The spec stays the first one: an incarnation names one table.
                Some(t) if t.incarnation == *incarnation => Ok(MetaReply::Table(t.clone())),
                Some(t) => Err(MetaRefusal::TableExists {
                    name: name.clone(),
                    incarnation: t.incarnation,
                }),
                None => {
                    let t = TableMeta {
                        incarnation: *incarnation,
                        spec: spec.clone(),
                        high_water: 0,
                        current: 0,
                        high_water_creator: 0,
                    };
                    self.tables.insert(name.clone(), t.clone());
                    Ok(MetaReply::Table(t))
                }
            },
            MetaCommand::DropTable { name, incarnation } => {
                self.table_mut(name, *incarnation)?;
                self.tables.remove(name);
                Ok(MetaReply::Done)
            }
            MetaCommand::RaiseHighWater {
                name,
                incarnation,
                version,
                creator,
            } => {
                let t = self.table_mut(name, *incarnation)?;
                if *creator != 0 && *version == t.high_water && *creator == t.high_water_creator {
                    return Ok(MetaReply::Table(t.clone())); // The same call, from another server.
                }
                if *version <= t.high_water {
                    return Err(MetaRefusal::VersionUsed {
                        name: name.clone(),
                        version: *version,
                        high_water: t.high_water,
                    });
                }
                t.high_water = *version;
                t.high_water_creator = *creator;
                Ok(MetaReply::Table(t.clone()))
            }
            MetaCommand::SetCurrent {
                name,
                incarnation,
                version,
            } => {
                let t = self.table_mut(name, *incarnation)?;
                if *version == 0 || *version > t.high_water {
                    return Err(MetaRefusal::VersionNotCreated {
                        name: name.clone(),
                        version: *version,
                        high_water: t.high_water,
                    });
                }
                t.current = *version;
                Ok(MetaReply::Table(t.clone()))
            }
        }
    }

    fn is_server(&self, addr: &str) -> bool {
        self.servers.iter().any(|s| s == addr)
            || self
                .transition
                .as_ref()
                .is_some_and(|t| t.target.iter().any(|s| s == addr))
    }

    /// Down marks are kept only for servers the cluster still names, so a server removed and
    /// later added again starts up.
    fn prune_down(&mut self) {
        let down = std::mem::take(&mut self.down);
        self.down = down.into_iter().filter(|a| self.is_server(a)).collect();
        // A failed server put back by hand is no longer waiting to rejoin.
        let failed = std::mem::take(&mut self.failed);
        self.failed = failed.into_iter().filter(|a| !self.is_server(a)).collect();
    }

    fn table_mut(&mut self, name: &str, incarnation: u64) -> Result<&mut TableMeta, MetaRefusal> {
        match self.tables.get_mut(name) {
            None => Err(MetaRefusal::NoSuchTable {
                name: name.to_owned(),
            }),
            Some(t) if t.incarnation != incarnation => Err(MetaRefusal::WrongIncarnation {
                name: name.to_owned(),
                expected: incarnation,
                actual: t.incarnation,
            }),
            Some(t) => Ok(t),
        }
    }
}

fn epoch_of_list(servers: &[String]) -> u64 {
    if servers.is_empty() {
        0
    } else {
        ramgrid_proto::cluster::epoch_of(servers)
    }
}

fn in_progress(t: &Transition) -> MetaRefusal {
    MetaRefusal::TransitionInProgress {
        target: t.target.clone(),
        started_by: t.started_by.clone(),
    }
}

fn check_servers(servers: &[String]) -> Result<(), MetaRefusal> {
    if servers.is_empty() {
        return Err(MetaRefusal::InvalidServers {
            reason: "no servers".into(),
        });
    }
    let mut seen = BTreeSet::new();
    for s in servers {
        if s.is_empty() || s.contains(char::is_whitespace) {
            return Err(MetaRefusal::InvalidServers {
                reason: format!("bad address {s:?}"),
            });
        }
        if !seen.insert(s.as_str()) {
            return Err(MetaRefusal::InvalidServers {
                reason: format!("{s} is listed twice"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
