//! The client's view of the cluster: the spec it routes by, its epoch, a pool per server and the
//! partition maps built from it; fetching, adopting and pushing a spec, and what a stale-epoch refusal
//! does (`on_stale`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use ramgrid_proto::cluster::{ClusterSpec, PartitionMap};
use ramgrid_proto::native::{Request, Response};

use crate::client::{unexpected, Client, OpError, TableMeta};
use crate::conn::Pool;
use crate::error::{Error, Result};

/// A spec, its epoch and pools, and the partition maps built from it.
pub(crate) struct Topology {
    pub(crate) spec: ClusterSpec,
    pub(crate) epoch: u64,
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) maps: Mutex<HashMap<(u32, u32), Arc<PartitionMap>>>,
}

impl Topology {
    /// Server indices, those that are up first, down ones last: for requests any one server can
    /// answer, so a hung or dead server is not waited for while another can be asked.
    pub(crate) fn healthiest_first(&self) -> Vec<usize> {
        let rank = |s: &usize| {
            let h = &self.pools[*s].health;
            (h.avoid_for_reads(), h.is_down())
        };
        let mut order: Vec<usize> = (0..self.pools.len()).collect();
        order.sort_by_key(rank);
        order
    }

    pub(crate) fn map(&self, meta: &TableMeta) -> Arc<PartitionMap> {
        self.maps
            .lock()
            .entry((meta.partitions, meta.replication))
            .or_insert_with(|| {
                Arc::new(PartitionMap::new(
                    &self.spec,
                    meta.partitions,
                    meta.replication,
                ))
            })
            .clone()
    }
}

/// Before the `attempt`-th retry after a stale-spec refusal: nothing for the first, then 10, 20,
/// 40, 80 ms. Servers install a committed spec each in its own time (a few milliseconds apart),
/// so a client may meet one still on the spec another has left; a short wait lets it catch up
/// instead of the client bouncing between the two.
pub(crate) fn stale_backoff(attempt: u32) {
    if attempt > 1 {
        std::thread::sleep(std::time::Duration::from_millis(10 << (attempt - 2).min(3)));
    }
}

impl Client {
    pub(crate) fn topology(&self) -> Arc<Topology> {
        self.inner.topo.read().clone()
    }

    /// Installs `spec` as this client's view (a move it drives).
    pub(crate) fn adopt_spec(&self, spec: ClusterSpec) {
        self.adopt(spec)
    }

    /// Installs `spec` as this client's view, reusing the pools of servers it already knew.
    pub(crate) fn adopt(&self, spec: ClusterSpec) {
        let spec = spec.without_token();
        let pools = {
            let mut known = self.inner.pools.lock();
            spec.members()
                .iter()
                .map(|a| {
                    known
                        .entry(a.clone())
                        .or_insert_with(|| Arc::new(Pool::new(a.clone())))
                        .clone()
                })
                .collect()
        };
        let topo = Topology {
            epoch: spec.epoch(),
            spec,
            pools,
            maps: Mutex::new(HashMap::new()),
        };
        *self.inner.topo.write() = Arc::new(topo);
    }

    /// The servers of the current spec, in order.
    pub fn servers(&self) -> Vec<String> {
        self.topology().spec.servers().to_vec()
    }

    /// The epoch of the current spec.
    pub fn epoch(&self) -> u64 {
        self.topology().epoch
    }

    /// The current spec.
    pub fn spec(&self) -> ClusterSpec {
        self.topology().spec.clone()
    }

    /// The replicas of each partition of `table` under the spec this client routes by, as server
    /// addresses, primary first (what a job needs to run a partition's work next to its data).
    pub fn partition_owners(&self, table: &str) -> Result<Vec<Vec<String>>> {
        let meta = self.table_meta(table)?;
        let topo = self.topology();
        let map = topo.map(&meta);
        let servers = topo.spec.servers();
        Ok((0..map.partitions())
            .map(|p| {
                map.replicas(p)
                    .iter()
                    .map(|&s| servers[s as usize].clone())
                    .collect()
            })
            .collect())
    }

    /// Fetches the spec from the servers (the first that has one answers) and adopts it if its epoch
    /// differs from this client's.
    pub fn refresh_spec(&self) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let mut last = None;
        for s in topo.healthiest_first() {
            match self.fetch_spec(&topo, s) {
                Ok(Some(spec)) => {
                    if spec.epoch() != topo.epoch {
                        self.adopt(spec);
                    }
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e) => Err(e),
            None => Ok(()), // No server has a spec yet: ours stands (push_spec installs it).
        }
    }

    /// GET_SPEC from one server: `None` when it has none installed.
    fn fetch_spec(&self, topo: &Topology, s: usize) -> Result<Option<ClusterSpec>> {
        let mut spec = None;
        self.request(&topo.pools[s], &Request::GetSpec, |resp| match resp {
            Response::Spec(r) if r.epoch == 0 => Ok(()),
            Response::Spec(r) => {
                let parsed = ClusterSpec::parse_bytes(r.spec).map_err(|e| Error::Protocol {
                    server: topo.pools[s].addr.clone(),
                    message: format!("bad spec from server: {e}"),
                })?;
                spec = Some(parsed);
                Ok(())
            }
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        Ok(spec)
    }

    /// Sends this client's spec to every server (SET_SPEC); how a new cluster learns its layout.
    pub fn push_spec(&self) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let text = topo.spec.to_text();
        self.broadcast(
            &topo,
            &Request::SetSpec {
                spec: text.as_bytes(),
            },
            "",
            0,
            |_, resp| match resp {
                Response::SpecSet { .. } => Ok(()),
                other => Err(OpError::Fatal(Error::Protocol {
                    server: String::new(),
                    message: format!("unexpected reply {other:?}"),
                })),
            },
        )
    }

    /// After a stale-epoch refusal from server `s`: adopt its spec if it differs, forget the table's
    /// cached shape (it may have been recreated), and say whether a retry can help.
    pub(crate) fn on_stale(&self, topo: &Topology, s: usize, table: &str) -> Result<()> {
        self.inner.tables.write().remove(table);
        match self.fetch_spec(topo, s)? {
            Some(spec) if spec.epoch() != topo.epoch => self.adopt(spec),
            Some(_) => {}
            // A server of our spec that has none (it restarted empty): give it ours, as
            // `push_spec` would, so it refuses what it lacks (NO_SUCH_TABLE, and reads go to the
            // replicas) instead of every request failing on its epoch. A server the spec does not
            // list refuses it, and the call fails as before.
            None => {
                let text = topo.spec.to_text();
                self.request(
                    &topo.pools[s],
                    &Request::SetSpec {
                        spec: text.as_bytes(),
                    },
                    |resp| match resp {
                        Response::SpecSet { .. } => Ok(()),
                        // Restarted a moment ago: it installs the agreed spec once caught up.
                        Response::Error(e)
                            if e.message.starts_with(ramgrid_proto::native::CATCHING_UP) =>
                        {
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok(())
                        }
                        Response::Error(e) => Err(Error::StaleSpec(format!(
                            "{} has no cluster spec installed and refused ours: {}",
                            topo.pools[s].addr, e.message
                        ))),
                        other => Err(unexpected(&topo.pools[s].addr, &other)),
                    },
                )?;
            }
        }
        Ok(())
    }
}
