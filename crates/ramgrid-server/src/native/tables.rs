//! Catalog and version requests: CREATE_TABLE, DROP_TABLE, LIST_TABLES, DESCRIBE_TABLE and the
//! version life cycle (CREATE, SEAL, SET_CURRENT, DROP).

use ramgrid_proto::native::{self as wire, ErrorReply, Opcode, Request, Response, Status};
use ramgrid_store::tables::{self, TableSpec};
use ramgrid_store::Error as StoreError;

use crate::cluster::held_partitions;
use crate::convert::{disk_refusal, refusal, store_value_type, wire_value_type};
use crate::node::Node;

pub(super) fn answer(
    state: &Node,
    op: Opcode,
    id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    let done = |out: &mut Vec<u8>, resp: Response<'_>| {
        resp.encode(out, op, id)
            .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
    };
    match req {
        Request::CreateTable(c) => {
            state.check_quorum()?;
            if c.partitions == 0 || c.partitions > tables::MAX_PARTITIONS {
                return Err(ErrorReply::new(
                    Status::BadRequest,
                    format!("partitions must be 1..={}", tables::MAX_PARTITIONS),
                ));
            }
            let spec = TableSpec {
                name: c.name.to_owned(),
                partitions: c.partitions,
                replication: c.replication.max(1),
                value_type: store_value_type(c.value_type),
                durability: match c.durability {
                    wire::Durability::Memory => tables::Durability::Memory,
                    wire::Durability::Snapshot => tables::Durability::Snapshot,
                    wire::Durability::Log => tables::Durability::Log,
                },
                incarnation: c.incarnation,
            };
            if let Ok(have) = state.tables.describe(&spec.name) {
                // The same table (its incarnation is the creator's, random): this server
                // learned it from a peer first (repair.rs). Creating it is then done.
                // Its creation is happening now, so no write predates it: nothing to copy.
                if have.spec == spec {
                    let _ = state.tables.clear_pending(&spec.name);
                    return done(out, Response::Done);
                }
            }
            let held = held_partitions(state.cluster.read().as_ref(), &spec);
            let name = spec.name.clone();
            let theirs = spec.clone();
            match state.tables.create_table(spec, &held) {
                // Learned from a peer between the check above and here: the same table.
                Err(StoreError::TableExists(_))
                    if state.tables.describe(&name).is_ok_and(|h| h.spec == theirs) =>
                {
                    let _ = state.tables.clear_pending(&name);
                    return done(out, Response::Done);
                }
                r => r.map_err(|e| refusal(&e))?,
            }
            if let Err(e) = state.sync_catalog(&name) {
                // Not durable, so not created: a table that says "snapshot" must be on disk.
                let _ = state.tables.drop_table(&name);
                return Err(e);
            }
            done(out, Response::Done)
        }
        Request::DropTable { name } => {
            state.check_quorum()?;
            if let (Some(p), Ok(info)) = (&state.persist, state.tables.describe(name)) {
                p.drop_table(&info.spec).map_err(disk_refusal)?;
            }
            state.tables.drop_table(name).map_err(|e| refusal(&e))?;
            done(out, Response::Done)
        }
        Request::ListTables => {
            let infos = state
                .tables
                .list()
                .iter()
                .filter_map(|n| state.tables.describe(n).ok())
                .map(table_info)
                .collect();
            done(out, Response::Tables(infos))
        }
        Request::DescribeTable { name } => {
            let info = state.tables.describe(name).map_err(|e| refusal(&e))?;
            done(out, Response::Table(table_info(info)))
        }
        Request::CreateVersion(v)
        | Request::SealVersion(v)
        | Request::SetCurrent(v)
        | Request::DropVersion(v) => {
            state.check_quorum()?;
            if v.version == 0 {
                return Err(ErrorReply::new(
                    Status::BadRequest,
                    "version numbers start at 1",
                ));
            }
            let n = v.version;
            if let Request::SealVersion(_) = req {
                // A seal would freeze a partition half copied in.
                if let Some(pv) = state
                    .tables
                    .pending(v.table)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|pv| pv.version == n)
                {
                    let mut e = ErrorReply::repairing(pv.partitions);
                    e.message = format!(
                        "version {n} still has partitions being copied in here: seal again once the repair is done"
                    );
                    return Err(e);
                }
            }
            if let (Request::SealVersion(_), Some(p)) = (req, &state.persist) {
                p.seal(&state.tables, v.table, n).map_err(|e| match e {
                    crate::persist::SealError::Store(e) => refusal(&e),
                    crate::persist::SealError::Disk(e) => disk_refusal(e),
                })?;
                return done(out, Response::Done);
            }
            if let Request::CreateVersion(_) = req {
                // Learned from a peer an instant before its creator got here (repair.rs).
                if state
                    .tables
                    .claim_learned_version(v.table, n)
                    .unwrap_or(false)
                {
                    return done(out, Response::Done);
                }
            }
            let r = match req {
                Request::CreateVersion(_) => state.tables.create_version(v.table, n),
                Request::SealVersion(_) => state.tables.seal_version(v.table, n),
                Request::SetCurrent(_) => state.tables.set_current(v.table, n),
                _ => state.tables.drop_version(v.table, n, false),
            };
            if let (Err(StoreError::VersionExists(_)), Request::CreateVersion(_)) = (&r, req) {
                // Learned from a peer between the claim above and here.
                if state
                    .tables
                    .claim_learned_version(v.table, n)
                    .unwrap_or(false)
                {
                    return done(out, Response::Done);
                }
            }
            r.map_err(|e| refusal(&e))?;
            match req {
                Request::SetCurrent(_) => {
                    tracing::info!(table = v.table, version = n, "current version switched")
                }
                Request::SealVersion(_) => {
                    tracing::debug!(table = v.table, version = n, "version sealed")
                }
                Request::DropVersion(_) => {
                    tracing::info!(table = v.table, version = n, "version dropped")
                }
                _ => tracing::debug!(table = v.table, version = n, "version created"),
            }
            if let (Request::DropVersion(_), Some(p)) = (req, &state.persist) {
                p.drop_version(&state.tables, v.table, n)
                    .map_err(disk_refusal)?;
            } else if let Err(e) = state.sync_catalog(v.table) {
                if let Request::CreateVersion(_) = req {
                    // Not durable, so not created (its number stays used).
                    let _ = state.tables.drop_version(v.table, n, true);
                }
                return Err(e);
            }
            done(out, Response::Done)
        }
        _ => unreachable!("the handler sends only this family here"),
    }
}

fn table_info(info: tables::TableInfo) -> wire::TableInfo {
    wire::TableInfo {
        name: info.spec.name,
        partitions: info.spec.partitions,
        replication: info.spec.replication,
        value_type: wire_value_type(info.spec.value_type),
        durability: match info.spec.durability {
            tables::Durability::Memory => wire::Durability::Memory,
            tables::Durability::Snapshot => wire::Durability::Snapshot,
            tables::Durability::Log => wire::Durability::Log,
        },
        incarnation: info.spec.incarnation,
        current_version: info.current,
        high_water: info.high_water,
        versions: info
            .versions
            .iter()
            .map(|v| wire::VersionInfo {
                number: v.number,
                sealed: v.sealed,
                items: v.items,
                bytes: v.bytes,
            })
            .collect(),
    }
}
