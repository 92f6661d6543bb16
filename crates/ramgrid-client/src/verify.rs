//! Comparing replicas: every server that holds a partition of a version says how many items it
//! holds and an order-independent hash of them (DIGEST); replicas that disagree are named
//! (`ramgrid table verify`, docs/replication.md, "Convergence checked").

use std::collections::BTreeMap;
use std::time::Duration;

use ramgrid_proto::native::{partition_bytes, DigestRequest, DigestState, Request, Response};

use crate::client::{unexpected, Client};
use crate::error::{Error, Result};

/// How often a partition found different is asked again before it is reported: a write in flight
/// between a backup and its primary makes a difference that the next look no longer sees.
const LOOKS: usize = 3;

/// One replica's figures for a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaDigest {
    /// The server's address.
    pub server: String,
    /// Items it holds.
    pub items: u64,
    /// The wrapping sum of a hash of each (key, value).
    pub digest: u64,
}

/// What [`Client::verify`] found.
#[derive(Debug, Clone, Default)]
pub struct Verify {
    /// The version compared.
    pub version: u32,
    /// Partitions whose every replica answered and agreed.
    pub agreed: u32,
    /// Items in those (counted once per partition).
    pub items: u64,
    /// Partitions whose replicas hold different items: the figures of each replica that answered.
    pub differ: Vec<(u32, Vec<ReplicaDigest>)>,
    /// Partitions some replica could not be compared for: (partition, server, why).
    pub unanswered: Vec<(u32, String, String)>,
}

impl Client {
    /// Compares the replicas of every partition of `table` at `version` (0: the current one).
    /// A partition found different is looked at again (up to three times, 0.2 s apart) before
    /// it is reported, so that writes in flight during the call are not taken for a difference.
    pub fn verify(&self, table: &str, version: u32) -> Result<Verify> {
        let _call = self.call();
        let meta = self.table_meta(table)?;
        let version = match version {
            0 => self.current_version(table)?,
            v => v,
        };
        let mut todo: Vec<u32> = (0..meta.partitions).collect();
        let mut out = Verify {
            version,
            ..Verify::default()
        };
        for look in 0..LOOKS {
            let topo = self.topology();
            let map = topo.map(&meta);
            let mut figures: BTreeMap<u32, Vec<ReplicaDigest>> = BTreeMap::new();
            let mut missing: Vec<(u32, String, String)> = Vec::new();
            for (s, pool) in topo.pools.iter().enumerate() {
                let parts: Vec<u32> = todo
                    .iter()
                    .copied()
                    .filter(|&p| map.holds(s as u32, p))
                    .collect();
                if parts.is_empty() {
                    continue;
                }
                let bytes = partition_bytes(&parts);
                let req = Request::Digest(DigestRequest::new(table, version, &bytes));
                let mut got = Vec::new();
                let r = self.request(pool, &req, |resp| match resp {
                    Response::Digest(d) => {
                        got.extend(d.iter());
                        Ok(())
                    }
                    Response::Error(e) => Err(Error::Server {
                        server: pool.addr.clone(),
                        status: e.status.name(),
                        message: e.message,
                    }),
                    other => Err(unexpected(&pool.addr, &other)),
                });
                if let Err(e) = r {
                    let why = e.to_string();
                    missing.extend(parts.iter().map(|&p| (p, pool.addr.clone(), why.clone())));
                    continue;
                }
                for d in got {
                    match d.state {
                        DigestState::Held => {
                            figures.entry(d.partition).or_default().push(ReplicaDigest {
                                server: pool.addr.clone(),
                                items: d.items,
                                digest: d.digest,
                            })
                        }
                        DigestState::NotHeld => {
                            missing.push((d.partition, pool.addr.clone(), "not held".into()))
                        }
                        DigestState::Copying => {
                            missing.push((d.partition, pool.addr.clone(), "being copied in".into()))
                        }
                    }
                }
            }
            let mut again = Vec::new();
            for &p in &todo {
                let reps = figures.remove(&p).unwrap_or_default();
                let same = reps
                    .windows(2)
                    .all(|w| (w[0].items, w[0].digest) == (w[1].items, w[1].digest));
                if !same {
                    if look + 1 < LOOKS {
                        again.push(p);
                    } else {
                        out.differ.push((p, reps));
                    }
                } else if missing.iter().all(|m| m.0 != p) {
                    out.agreed += 1;
                    out.items += reps.first().map_or(0, |r| r.items);
                }
            }
            let last = again.is_empty() || look + 1 == LOOKS;
            // What could not be compared is reported from the look that settled each partition.
            out.unanswered
                .extend(missing.into_iter().filter(|m| !again.contains(&m.0)));
            if last {
                break;
            }
            todo = again;
            std::thread::sleep(Duration::from_millis(200));
        }
        out.unanswered.sort();
        Ok(out)
    }
}
