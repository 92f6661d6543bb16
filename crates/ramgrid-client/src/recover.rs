//! `ramgrid cluster recover`: the operator's way back after the metadata group lost a majority
//! of its voters for good (docs/control-plane.md, "Recovering a lost majority"; the servers' side
//! is `ramgrid-server/src/meta/recover.rs`).
//!
//! The client asks every server of the spec for its status. It refuses if any is in reach of a
//! leader with a majority (nothing to recover) or none answers. Otherwise it sends RECOVER
//! `lead` to the live server that applied the most of the old group's log (the spec's first on a
//! tie) and RECOVER `join` to every other live server, under a generation above all they report,
//! then waits (bounded) until each is in the new group with a leader. The report names the
//! servers that did not answer and, per table, the partitions all of whose replicas are among
//! them: data no survivor holds, which no recovery brings back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ramgrid_proto::native::{RecoverMode, Request, Response};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::membership::ServerStatus;

/// How long `recover` waits for every live server to be in the new group with a leader.
const SETTLE: Duration = Duration::from_secs(30);

/// What [`Client::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverReport {
    /// The new group's generation.
    pub generation: u64,
    /// The server the group was rebuilt from; it leads the new group.
    pub leader: String,
    /// The other live servers, which joined it.
    pub joined: Vec<String>,
    /// Servers of the spec that did not answer: the control plane fails them over.
    pub dead: Vec<String>,
    /// Per table, the partitions every replica of which is dead: their data is gone.
    pub lost: BTreeMap<String, Vec<u32>>,
    /// Live servers not yet in the new group when the wait ended (empty when all settled).
    pub unsettled: Vec<String>,
}

impl Client {
    /// Rebuilds the metadata group from the live servers after it lost its majority for good
    /// (module docs). Refused ([`Error::InvalidArgument`]) while a majority answers.
    pub fn recover(&self) -> Result<RecoverReport> {
        let _ = self.refresh_spec();
        let spec = self.spec();
        let statuses: Vec<(String, Result<ServerStatus>)> = spec
            .members()
            .into_iter()
            .map(|a| {
                let s = self.server_status(&a);
                (a, s)
            })
            .collect();
        let mut live: Vec<(String, ServerStatus)> = Vec::new();
        let mut dead = Vec::new();
        for (addr, s) in statuses {
            match s {
                Ok(s) => live.push((addr, s)),
                Err(_) => dead.push(addr),
            }
        }
        if live.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "no server of the cluster answers ({}): nothing to rebuild the group from",
                dead.join(", ")
            )));
        }
        let field = |s: &ServerStatus, k: &str| s.get(k).cloned().unwrap_or_default();
        if let Some((addr, _)) = live.iter().find(|(_, s)| field(s, "quorum") == "ok") {
            return Err(Error::InvalidArgument(format!(
                "{addr} is in reach of a leader with a majority: the metadata group decides, \
                 nothing to recover"
            )));
        }
        let number = |s: &ServerStatus, k: &str| field(s, k).parse::<u64>().unwrap_or(0);
        let generation = 1 + live
            .iter()
            .map(|(_, s)| number(s, "meta_generation"))
            .max()
            .unwrap_or(0);
        // The survivor that applied the most of the old log; the spec's order breaks ties.
        let lead = live
            .iter()
            .enumerate()
            .max_by_key(|(i, (_, s))| (number(s, "meta_applied"), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let lost = self.lost_partitions(&dead);
        let leader = live[lead].0.clone();
        self.send_recover(&leader, RecoverMode::Lead, generation)?;
        let mut joined = Vec::new();
        for (addr, _) in live.iter().filter(|(a, _)| *a != leader) {
            // One that does not take it now is reset by the new leader when it sees it.
            if self
                .send_recover(addr, RecoverMode::Join, generation)
                .is_ok()
            {
                joined.push(addr.clone());
            }
        }
        let deadline = Instant::now() + SETTLE;
        let mut unsettled: Vec<String> = live.iter().map(|(a, _)| a.clone()).collect();
        while !unsettled.is_empty() && Instant::now() < deadline {
            unsettled.retain(|a| {
                !self.server_status(a).is_ok_and(|s| {
                    field(&s, "quorum") == "ok" && number(&s, "meta_generation") == generation
                })
            });
            if !unsettled.is_empty() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(RecoverReport {
            generation,
            leader,
            joined,
            dead,
            lost,
            unsettled,
        })
    }

    fn send_recover(&self, addr: &str, mode: RecoverMode, generation: u64) -> Result<()> {
        let pool = self.pool_for(addr);
        self.request(&pool, &Request::Recover { mode, generation }, |r| match r {
            Response::Status(_) => Ok(()),
            other => Err(Error::Protocol {
                server: addr.to_owned(),
                message: format!("unexpected reply to RECOVER: {other:?}"),
            }),
        })
    }

    /// Per table, the partitions whose every replica is in `dead` (under the spec as it is).
    fn lost_partitions(&self, dead: &[String]) -> BTreeMap<String, Vec<u32>> {
        let mut lost = BTreeMap::new();
        let Ok(tables) = self.list_tables() else {
            return lost;
        };
        for t in tables {
            let Ok(owners) = self.partition_owners(&t.name) else {
                continue;
            };
            let gone: Vec<u32> = owners
                .iter()
                .enumerate()
                .filter(|(_, o)| !o.is_empty() && o.iter().all(|a| dead.contains(a)))
                .map(|(p, _)| p as u32)
                .collect();
            if !gone.is_empty() {
                lost.insert(t.name, gone);
            }
        }
        lost
    }
}
