//! Table and version admin: the shape of a table (agreed by the servers' majority), creating and
//! dropping tables, creating, sealing, switching and dropping versions, and describing them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ramgrid_proto::native::{
    CreateTable, Durability, ErrorReply, Request, Response, Status, TableInfo, ValueType,
    VersionRef,
};

use crate::client::{refusal, unexpected, Client, OpError, Topology};
use crate::error::{Error, Result};

/// How long "version V of T is not sealed" is believed before the near cache asks again.
const UNSEALED_RECHECK: Duration = Duration::from_secs(1);
/// Attempts at CREATE_VERSION when another client takes the same number at the same time.
const CREATE_VERSION_TRIES: u32 = 8;

/// What the client knows of a table (fixed at creation, so cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableMeta {
    /// Number of partitions.
    pub partitions: u32,
    /// Replication factor asked for at creation.
    pub replication: u32,
    /// Value type.
    pub value_type: ValueType,
    /// The table's identity (a table created again under its name has another).
    pub incarnation: u64,
}

/// A table as the whole cluster holds it (DESCRIBE_TABLE aggregated over servers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDescription {
    /// Table name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
    /// Replication factor asked for at creation.
    pub replication: u32,
    /// Value type.
    pub value_type: ValueType,
    /// Durability, fixed at creation.
    pub durability: Durability,
    /// The table's identity, fixed at creation: a table created again under the same name has
    /// another one.
    pub incarnation: u64,
    /// The newest current version over the servers (during a switch, some may still point at the previous one).
    pub current_version: u32,
    /// The highest version number any server ever created in the table: new versions are
    /// numbered above it, so a number never names two contents.
    pub high_water: u32,
    /// Every version any server holds, ascending.
    pub versions: Vec<VersionSummary>,
    /// Servers that did not answer (down, or failed during the call): the description is that of
    /// the others, and items and bytes may then count short.
    pub unreachable: Vec<String>,
}

/// One version of a table over the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionSummary {
    /// Version number.
    pub version: u32,
    /// Sealed on every server that holds it.
    pub sealed: bool,
    /// Items summed over servers, divided by the effective replication (each item counted once when
    /// every replica holds it).
    pub items: u64,
    /// Bytes, counted like `items`.
    pub bytes: u64,
}

impl Client {
    // ------------------------------------------------------------------------------------------
    // Tables and versions

    /// A table's shape (partitions, replication, value type, incarnation), cached after the first
    /// ask. Every server that is up is asked, and the incarnation most of them hold wins: a server
    /// that lost the table (restarted empty) or holds another incarnation of its name (created
    /// there again) is outvoted, and then refuses the frames that name this one, so reads fail over
    /// to replicas that have it. A tie is an error, never a guess.
    pub fn table_meta(&self, table: &str) -> Result<TableMeta> {
        let _call = self.call();
        if let Some(m) = self.inner.tables.read().get(table) {
            return Ok(*m);
        }
        let topo = self.topology();
        let (answers, _unreachable) = self.ask_live(
            &topo,
            &Request::DescribeTable { name: table },
            describe_answer(&topo, table),
        )?;
        let infos: Vec<TableInfo> = answers.into_iter().flatten().flatten().collect();
        let meta = agreed_meta(table, &infos)?;
        self.inner.tables.write().insert(table.to_string(), meta);
        Ok(meta)
    }

    /// Creates a table on every server, with an open version 1 that is current, kept in memory
    /// only (see [`Client::create_table_with`]).
    pub fn create_table(
        &self,
        name: &str,
        partitions: u32,
        replication: u32,
        value_type: ValueType,
    ) -> Result<()> {
        self.create_table_with(
            name,
            partitions,
            replication,
            value_type,
            Durability::Memory,
        )
    }

    /// Creates a table on every server, with an open version 1 that is current, and a new
    /// incarnation id (random, the same on every server) that tells it from any earlier table of
    /// that name.
    pub fn create_table_with(
        &self,
        name: &str,
        partitions: u32,
        replication: u32,
        value_type: ValueType,
        durability: Durability,
    ) -> Result<()> {
        let _call = self.call();
        if partitions == 0 || replication == 0 {
            return Err(Error::InvalidArgument(
                "partitions and replication must be at least 1".into(),
            ));
        }
        if name.is_empty() || name.len() > ramgrid_proto::native::MAX_NAME_LEN {
            return Err(Error::InvalidArgument(format!(
                "table names are 1 to {} bytes",
                ramgrid_proto::native::MAX_NAME_LEN
            )));
        }
        let topo = self.topology();
        let req = Request::CreateTable(CreateTable {
            name,
            partitions,
            replication,
            value_type,
            durability,
            incarnation: new_incarnation(),
        });
        // A server that already has the table still lets the others create it, so a retry after a
        // partial failure converges; TABLE_EXISTS is reported once all have answered.
        let mut exists = false;
        let answers = self.ask_all(&topo, &req, |s, resp| match resp {
            Response::Done => Ok(()),
            Response::Error(e) if e.status == Status::TableExists => {
                exists = true;
                Ok(())
            }
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        debug_assert!(answers.iter().all(Option::is_some));
        self.forget_table(name);
        if exists {
            return Err(Error::TableExists(name.to_string()));
        }
        Ok(())
    }

    fn forget_table(&self, name: &str) {
        self.inner.tables.write().remove(name);
        self.inner.sealed.lock().retain(|(t, _), _| t != name);
        if let Some(n) = &self.inner.near {
            n.purge_table(name);
        }
    }

    /// Drops a table (every version) on every server. Fails only if no server had it.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let mut dropped = false;
        self.ask_all(&topo, &Request::DropTable { name }, |s, resp| match resp {
            Response::Done => {
                dropped = true;
                Ok(())
            }
            Response::Error(e) if e.status == Status::NoSuchTable => Ok(()),
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        self.forget_table(name);
        if !dropped {
            return Err(Error::TableNotFound(name.to_string()));
        }
        Ok(())
    }

    /// Every table any server holds, aggregated like [`Client::describe_table`], by name. Like it,
    /// answers from the servers that are up.
    pub fn list_tables(&self) -> Result<Vec<TableDescription>> {
        let _call = self.call();
        let topo = self.topology();
        let (answers, unreachable) =
            self.ask_live(&topo, &Request::ListTables, |s, resp| match resp {
                Response::Tables(ts) => Ok(ts),
                Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, "", 0, e)),
                other => Err(unexpected(&topo.pools[s].addr, &other)),
            })?;
        let mut by_name: std::collections::BTreeMap<String, Vec<TableInfo>> = Default::default();
        for t in answers.into_iter().flatten().flatten() {
            by_name.entry(t.name.clone()).or_default().push(t);
        }
        Ok(by_name
            .into_values()
            .map(|infos| aggregate(&topo, &infos, unreachable.clone()))
            .collect())
    }

    /// A table over the whole cluster: versions merged, items and bytes summed over servers and
    /// divided by the effective replication. A metadata read: servers that are down or fail are
    /// left out (named in [`TableDescription::unreachable`]); it fails only if none answers.
    pub fn describe_table(&self, name: &str) -> Result<TableDescription> {
        let _call = self.call();
        let topo = self.topology();
        let (answers, unreachable) = self.ask_live(
            &topo,
            &Request::DescribeTable { name },
            describe_answer(&topo, name),
        )?;
        let mut infos: Vec<TableInfo> = answers.into_iter().flatten().flatten().collect();
        // Servers holding another incarnation of the name (outvoted) describe another table.
        let agreed = agreed_meta(name, &infos)?.incarnation;
        infos.retain(|t| t.incarnation == agreed);
        Ok(aggregate(&topo, &infos, unreachable))
    }

    /// DESCRIBE_TABLE on every server, each of which must answer (for admin calls that need them
    /// all); the servers that do not have the table are left out.
    fn describe_all(&self, topo: &Topology, name: &str) -> Result<Vec<TableInfo>> {
        let answers = self.ask_all(
            topo,
            &Request::DescribeTable { name },
            describe_answer(topo, name),
        )?;
        Ok(answers.into_iter().flatten().flatten().collect())
    }

    /// The newest current version over the servers that answer (see [`Client::describe_table`]: a
    /// version becomes current only on every server at once, so those that answer agree).
    pub fn current_version(&self, table: &str) -> Result<u32> {
        Ok(self.describe_table(table)?.current_version)
    }

    /// Creates the next version (open, not current) on every server and returns its number: one more
    /// than the highest any server holds. If another client takes the number first, the versions this
    /// call created are dropped and the next number is tried.
    pub fn create_version(&self, table: &str) -> Result<u32> {
        let _call = self.call();
        self.on_every_server(|topo| self.create_version_on(topo, table))
    }

    fn create_version_on(&self, topo: &Topology, table: &str) -> Result<u32> {
        for _ in 0..CREATE_VERSION_TRIES {
            let infos = self.describe_all(topo, table)?;
            if infos.is_empty() {
                return Err(Error::TableNotFound(table.to_string()));
            }
            // Above every number any server ever used (dropped versions included), so a number
            // never names two contents.
            let max = infos
                .iter()
                .flat_map(|t| t.versions.iter().map(|v| v.number))
                .chain(infos.iter().map(|t| t.current_version.max(t.high_water)))
                .max();
            let version = max.unwrap_or(0) + 1;
            // The same token on every server: the metadata group tells this call's creation,
            // proposed by whichever server comes first, from another client's (6.3).
            let creator = random_token();
            let req = Request::CreateVersion(VersionRef {
                table,
                version,
                creator,
            });
            let mut conflict = false;
            let created = self.ask_all(topo, &req, |s, resp| match resp {
                Response::Done => Ok(true),
                Response::Error(e) if e.status == Status::VersionExists => {
                    conflict = true;
                    Ok(false)
                }
                Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
                other => Err(unexpected(&topo.pools[s].addr, &other)),
            })?;
            if !conflict {
                return Ok(version);
            }
            for (s, made) in created.iter().enumerate() {
                if *made == Some(true) {
                    let _ = self.request(
                        &topo.pools[s],
                        &Request::DropVersion(VersionRef::new(table, version)),
                        |_| Ok(()),
                    );
                }
            }
            // Two clients racing for the same number back off by different random amounts.
            let jitter = random_token() % 16;
            std::thread::sleep(Duration::from_millis(1 + jitter));
        }
        Err(Error::Server {
            server: String::new(),
            status: "VERSION_EXISTS",
            message: format!(
                "could not create a new version of {table}: other clients kept taking the number"
            ),
        })
    }

    /// Seals a version on every server (idempotent).
    pub fn seal_version(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        let req = Request::SealVersion(VersionRef::new(table, version));
        self.on_every_server(|topo| {
            self.ask_all(topo, &req, |s, resp| match resp {
                Response::Done => Ok(()),
                Response::Error(e) if e.status == Status::VersionSealed => Ok(()),
                Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
                other => Err(unexpected(&topo.pools[s].addr, &other)),
            })
        })?;
        // Every server answered: the version is sealed everywhere, so the near cache may keep it.
        self.inner
            .sealed
            .lock()
            .insert((table.to_string(), version), None);
        Ok(())
    }

    /// Makes a version current on every server. Refused, with nothing switched, unless every server
    /// holds it sealed.
    pub fn set_current(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        self.on_every_server(|topo| self.set_current_on(topo, table, version))
    }

    fn set_current_on(&self, topo: &Topology, table: &str, version: u32) -> Result<()> {
        let infos = self.describe_all(topo, table)?;
        if infos.len() < topo.pools.len() {
            return Err(Error::TableNotFound(table.to_string()));
        }
        for t in &infos {
            match t.versions.iter().find(|v| v.number == version) {
                None => {
                    return Err(Error::VersionNotFound {
                        table: table.to_string(),
                        version,
                    })
                }
                Some(v) if !v.sealed => {
                    return Err(Error::VersionNotSealed {
                        table: table.to_string(),
                        version,
                    })
                }
                Some(_) => {}
            }
        }
        let req = Request::SetCurrent(VersionRef::new(table, version));
        self.broadcast(topo, &req, table, version, |s, resp| match resp {
            Response::Done => Ok(()),
            other => Err(OpError::Fatal(unexpected(&topo.pools[s].addr, &other))),
        })
    }

    /// Runs `f`, an operation on every server of the topology; if a server could not be reached,
    /// refreshes the spec and, if the cluster moved on meanwhile (the server was failed over),
    /// runs `f` once more under the new one.
    fn on_every_server<T>(&self, f: impl Fn(&Topology) -> Result<T>) -> Result<T> {
        let topo = self.topology();
        match f(&topo) {
            Err(e @ (Error::Connect { .. } | Error::Io { .. } | Error::Timeout { .. })) => {
                let _ = self.refresh_spec();
                let now = self.topology();
                if now.epoch == topo.epoch {
                    return Err(e);
                }
                f(&now)
            }
            r => r,
        }
    }

    /// Drops a version on every server. Fails only if no server had it.
    pub fn drop_version(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let req = Request::DropVersion(VersionRef::new(table, version));
        let mut dropped = false;
        self.ask_all(&topo, &req, |s, resp| match resp {
            Response::Done => {
                dropped = true;
                Ok(())
            }
            Response::Error(e)
                if matches!(e.status, Status::NoSuchVersion | Status::NoSuchTable) =>
            {
                Ok(())
            }
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        // A later version may reuse the number: its values must not come from the old one's cache.
        self.inner
            .sealed
            .lock()
            .remove(&(table.to_string(), version));
        if let Some(n) = &self.inner.near {
            n.purge_table(table);
        }
        if !dropped {
            return Err(Error::VersionNotFound {
                table: table.to_string(),
                version,
            });
        }
        Ok(())
    }

    /// Whether `table`'s current version is a sealed one on every server. A fresh table's current
    /// version is open (written in place); once a sealed version is made current, the current
    /// version stays sealed (SET_CURRENT takes only sealed versions) for the table's incarnation,
    /// so a yes is kept and a no looked at again after a second.
    pub(crate) fn current_sealed(&self, table: &str) -> bool {
        let incarnation = self.table_meta(table).map_or(0, |m| m.incarnation);
        let key = (format!("{table}\u{0}{incarnation:016x}"), 0);
        self.sealed_everywhere(table, key, |t| t.current_version)
    }

    /// Whether `version` of `table` is sealed on every server (remembered once true).
    pub(crate) fn version_sealed(&self, table: &str, version: u32) -> bool {
        self.sealed_everywhere(table, (table.to_string(), version), |_| version)
    }

    /// Whether every server holds the version `which` names in its DESCRIBE_TABLE answer, sealed;
    /// remembered under `key` for good once true, for a second when false.
    fn sealed_everywhere(
        &self,
        table: &str,
        key: (String, u32),
        which: impl Fn(&TableInfo) -> u32,
    ) -> bool {
        match self.inner.sealed.lock().get(&key) {
            Some(None) => return true,
            Some(Some(at)) if at.elapsed() < UNSEALED_RECHECK => return false,
            _ => {}
        }
        let topo = self.topology();
        let sealed = match self.describe_all(&topo, table) {
            Ok(infos) => {
                infos.len() == topo.pools.len()
                    && infos.iter().all(|t| {
                        let v = which(t);
                        t.versions.iter().any(|x| x.number == v && x.sealed)
                    })
            }
            Err(_) => false,
        };
        self.inner
            .sealed
            .lock()
            .insert(key, if sealed { None } else { Some(Instant::now()) });
        sealed
    }
}

/// Takes one server's DESCRIBE_TABLE answer: `None` when it does not have the table.
fn describe_answer<'t>(
    topo: &'t Topology,
    name: &'t str,
) -> impl FnMut(usize, Response<'_>) -> Result<Option<TableInfo>> + 't {
    move |s, resp| match resp {
        Response::Table(t) => Ok(Some(t)),
        Response::Error(e) if e.status == Status::NoSuchTable => Ok(None),
        Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
        other => Err(unexpected(&topo.pools[s].addr, &other)),
    }
}

fn refusal_err(addr: &str, table: &str, version: u32, e: ErrorReply) -> Error {
    match refusal(0, addr, table, version, e) {
        OpError::Fatal(e) => e,
        OpError::Stale(_, m) => Error::StaleSpec(m),
    }
}

/// The table as most servers that answered hold it (by incarnation).
fn agreed_meta(table: &str, infos: &[TableInfo]) -> Result<TableMeta> {
    let mut counts: Vec<(u64, usize, &TableInfo)> = Vec::new();
    for t in infos {
        match counts.iter_mut().find(|(inc, _, _)| *inc == t.incarnation) {
            Some(c) => c.1 += 1,
            None => counts.push((t.incarnation, 1, t)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    match counts.as_slice() {
        [] => Err(Error::TableNotFound(table.to_string())),
        [(_, n, _), (_, m, _), ..] if n == m => Err(Error::Protocol {
            server: String::new(),
            message: format!(
                "servers disagree about table {table}: as many hold one incarnation as another ({})",
                counts
                    .iter()
                    .map(|(inc, n, _)| format!("{inc:016x} on {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
        [(_, _, t), ..] => Ok(TableMeta {
            partitions: t.partitions,
            replication: t.replication,
            value_type: t.value_type,
            incarnation: t.incarnation,
        }),
    }
}

/// A new table incarnation id: random and never 0 (64 bits from the process's random hash keys,
/// the time and a counter, so two creations never share one in practice).
fn new_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Merges one table's descriptions from several servers.
fn aggregate(topo: &Topology, infos: &[TableInfo], unreachable: Vec<String>) -> TableDescription {
    let first = &infos[0];
    let r = u64::from(first.replication.clamp(1, (topo.pools.len() as u32).max(1)));
    let mut versions: std::collections::BTreeMap<u32, VersionSummary> = Default::default();
    for t in infos {
        for v in &t.versions {
            let e = versions.entry(v.number).or_insert(VersionSummary {
                version: v.number,
                sealed: true,
                items: 0,
                bytes: 0,
            });
            e.sealed &= v.sealed;
            e.items += v.items;
            e.bytes += v.bytes;
        }
    }
    for v in versions.values_mut() {
        v.items = v.items.div_ceil(r);
        v.bytes = v.bytes.div_ceil(r);
    }
    TableDescription {
        name: first.name.clone(),
        partitions: first.partitions,
        replication: first.replication,
        value_type: first.value_type,
        durability: first.durability,
        incarnation: first.incarnation,
        current_version: infos.iter().map(|t| t.current_version).max().unwrap_or(0),
        high_water: infos.iter().map(|t| t.high_water).max().unwrap_or(0),
        versions: versions.into_values().collect(),
        unreachable,
    }
}

/// A random non-zero u64 (std's per-process random hash keys; no RNG dependency).
fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use parking_lot::Mutex;
    use ramgrid_proto::cluster::ClusterSpec;

    use super::*;
    use crate::conn::Pool;

    #[test]
    fn aggregate_merges_versions_and_divides_by_replication() {
        let topo = Topology {
            spec: ClusterSpec::new(vec!["a:1".into(), "b:1".into(), "c:1".into()], None).unwrap(),
            epoch: 1,
            pools: (0..3)
                .map(|i| Arc::new(Pool::new(format!("s{i}"))))
                .collect(),
            maps: Mutex::new(HashMap::new()),
        };
        let info = |cur, sealed2, items| TableInfo {
            name: "t".into(),
            partitions: 8,
            replication: 2,
            value_type: ValueType::I64,
            durability: Durability::Memory,
            incarnation: 9,
            current_version: cur,
            high_water: 2 + cur,
            versions: vec![
                ramgrid_proto::native::VersionInfo {
                    number: 1,
                    sealed: true,
                    items,
                    bytes: 10 * items,
                },
                ramgrid_proto::native::VersionInfo {
                    number: 2,
                    sealed: sealed2,
                    items: 1,
                    bytes: 1,
                },
            ],
        };
        let d = aggregate(
            &topo,
            &[info(1, true, 4), info(2, false, 6), info(1, true, 10)],
            Vec::new(),
        );
        assert_eq!(d.current_version, 2);
        assert_eq!((d.high_water, d.incarnation), (4, 9));
        assert_eq!(
            d.versions[0],
            VersionSummary {
                version: 1,
                sealed: true,
                items: 10,
                bytes: 100
            }
        );
        assert!(!d.versions[1].sealed);
        assert_eq!(d.versions[1].items, 2);
    }
}
