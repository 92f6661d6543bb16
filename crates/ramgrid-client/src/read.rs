//! Reads: a batch's keys grouped by partition, each partition sent to its first live replica, reply
//! values scattered into the caller's output, failover replica by replica, and the version check that
//! keeps a batch from mixing two versions.

use ramgrid_proto::cluster::PartitionMap;
use ramgrid_proto::native::{
    GetReply, KeyBatchWriter, KeyStatus, Opcode, Response, ValueType, MAX_KEY_LEN,
};

use crate::client::{
    encode_err, unexpected, Client, GetResult, Handled, OpError, TableMeta, Topology,
};
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::plan::Groups;
use crate::round::{Pick, RoundIo};
use crate::values::{Values, ValuesMut};

impl Client {
    /// Reads `keys` from `table` at `version` (0 = current) into a new output.
    pub fn get(&self, table: &str, keys: Keys<'_>, version: u32) -> Result<GetResult> {
        let _call = self.call();
        let mut meta = self.table_meta(table)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let n = keys.len();
            let mut values = Values::zeroed(meta.value_type, n);
            let mut found = vec![false; n];
            match self.get_into(
                table,
                keys,
                version,
                &mut values.slice_mut(0..n),
                &mut found,
            ) {
                Ok(version) => {
                    return Ok(GetResult {
                        values,
                        found,
                        version,
                    })
                }
                // The table was created again with another value type while we read: the
                // output is allocated anew for it, once.
                Err(e @ Error::Protocol { .. }) if version == 0 && tries < 3 => {
                    let fresh = self.table_meta(table)?;
                    if fresh.incarnation == meta.incarnation {
                        return Err(e);
                    }
                    meta = fresh;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads `keys` from `table` at `version` (0 = current) into `out` and `found` (one entry per key;
    /// `out` should be zeroed: entries of missing keys are left as they are). Returns the version read.
    ///
    /// With version 0 every server resolves "current" itself. If the servers of one batch resolved
    /// different versions (a switch in flight), the partitions that resolved an older one are read
    /// again with the newest explicitly, so the batch never mixes two versions.
    pub fn get_into(
        &self,
        table: &str,
        keys: Keys<'_>,
        version: u32,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Result<u32> {
        self.get_into_of(table, 0, keys, version, out, found)
    }

    /// [`Client::get_into`] of one incarnation of the table (0: whichever exists): a version
    /// pinned on a table that was dropped since and created again under its name is refused with
    /// `TableNotFound`, never read from the new table (whose version numbers start again).
    pub fn get_into_of(
        &self,
        table: &str,
        incarnation: u64,
        keys: Keys<'_>,
        version: u32,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Result<u32> {
        // A pinned version mapped from this host that holds every key's partition: answered
        // there and then (shm.rs), with none of the bookkeeping a network read needs.
        if let Some(v) = self.shm_whole(table, incarnation, keys, version, out, found) {
            return Ok(v);
        }
        let _call = self.call();
        keys.validate()?;
        let n = keys.len();
        if out.len() != n || found.len() != n {
            return Err(Error::InvalidArgument(format!(
                "{n} keys but room for {} values and {} flags",
                out.len(),
                found.len()
            )));
        }
        let meta = self.table_meta(table)?;
        if incarnation != 0 && meta.incarnation != incarnation {
            return Err(Error::TableNotFound(format!(
                "{table} (the version asked for belonged to a table of that name dropped since)"
            )));
        }
        if !out.fits(meta.value_type) {
            return Err(Error::InvalidArgument(format!(
                "the output does not fit table {table}'s value type"
            )));
        }
        found.fill(false);
        let near = self
            .inner
            .near
            .as_ref()
            .filter(|_| version != 0 && n > 0 && self.version_sealed(table, version));
        // Near-cache entries belong to one incarnation of the table: a table created again
        // under the name numbers its versions from 1 again.
        let near_key = near_version(meta.incarnation, version);
        let pending: Vec<u32> = match near {
            Some(near) => (0..n as u32)
                .filter(|&i| keys.key(i as usize).len() <= MAX_KEY_LEN)
                .filter(|&i| {
                    let hit = near.with(table, near_key, &keys.key(i as usize), |v| {
                        out.set(i as usize, v)
                    });
                    found[i as usize] = hit.is_some();
                    hit.is_none()
                })
                .collect(),
            // A key too long for the wire cannot have been stored: it stays a miss, unsent.
            None => (0..n as u32)
                .filter(|&i| keys.key(i as usize).len() <= MAX_KEY_LEN)
                .collect(),
        };
        // Partitions of a pinned version mapped from a server on this host are answered here,
        // in place (shm.rs); the rest go over TCP below.
        let pending = if version != 0 && !pending.is_empty() {
            self.shm_serve(table, meta.incarnation, version, keys, pending, out, found)
        } else {
            pending
        };
        let mut version_read = version;
        let width = meta.value_type.width().unwrap_or(16);
        for chunk in self.chunks(&pending, |i| 2 + keys.key(i).len() + width) {
            // Later chunks pin the version the first one resolved, so they agree with it.
            version_read =
                self.get_chunk(table, incarnation, keys, chunk, version_read, out, found)?;
        }
        // Values read under another incarnation (the table was created again meanwhile and
        // another call refreshed what we know of it) are not kept.
        let same_table = self
            .table_meta(table)
            .is_ok_and(|m| m.incarnation == meta.incarnation);
        if let Some(near) = near.filter(|_| same_table) {
            for &i in &pending {
                if found[i as usize] {
                    let i = i as usize;
                    with_wire(out, i, |v| near.insert(table, near_key, &keys.key(i), v));
                }
            }
        }
        Ok(version_read)
    }

    #[expect(clippy::too_many_arguments)]
    fn get_chunk(
        &self,
        table: &str,
        incarnation: u64,
        keys: Keys<'_>,
        idx: &[u32],
        version: u32,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> Result<u32> {
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            let topo = self.topology();
            let meta = self.table_meta(table)?;
            if incarnation != 0 && meta.incarnation != incarnation {
                return Err(Error::TableNotFound(format!(
                    "{table} (the version asked for belonged to a table of that name dropped since)"
                )));
            }
            if !out.fits(meta.value_type) {
                return Err(Error::Protocol {
                    server: String::new(),
                    message: format!("table {table} changed its value type"),
                });
            }
            let map = topo.map(&meta);
            let mut read = ReadCtx::new(self, &topo, table, &meta, &map, keys, idx);
            let result = read.run(version, out, found);
            match result {
                Ok(v) => return Ok(v),
                Err(OpError::Stale(s, why)) => {
                    for &i in idx {
                        found[i as usize] = false;
                        out.clear(i as usize);
                    }
                    if attempt >= self.inner.spec_retries {
                        return Err(Error::StaleSpec(why));
                    }
                    attempt += 1;
                    crate::client::stale_backoff(attempt);
                    self.on_stale(&topo, s, table)?;
                }
                // A reply the server would not compose (values past its body limit): read the
                // halves, each at the version the first resolved.
                Err(OpError::Fatal(Error::TooLarge { .. })) if idx.len() > 1 => {
                    for &i in idx {
                        found[i as usize] = false;
                        out.clear(i as usize);
                    }
                    let (a, b) = idx.split_at(idx.len() / 2);
                    let version =
                        self.get_chunk(table, incarnation, keys, a, version, out, found)?;
                    return self.get_chunk(table, incarnation, keys, b, version, out, found);
                }
                Err(OpError::Fatal(e)) => {
                    if matches!(e, Error::TableNotFound(_)) {
                        // Dropped, or dropped and created again (a server refuses a batch that
                        // names another incarnation). Forget what we knew of it; a read of the
                        // current version may go on with the new table, once: a pinned version
                        // belonged to the table that is gone.
                        self.inner.tables.write().remove(table);
                        if version == 0 && !refreshed {
                            refreshed = true;
                            for &i in idx {
                                found[i as usize] = false;
                                out.clear(i as usize);
                            }
                            continue;
                        }
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// The near cache's version key: the version number within one incarnation of the table.
fn near_version(incarnation: u64, version: u32) -> u64 {
    incarnation.rotate_left(32) ^ u64::from(version)
}

/// Value `i` of `out` in wire form, for the near cache.
fn with_wire(out: &ValuesMut<'_>, i: usize, f: impl FnOnce(&[u8])) {
    match out {
        ValuesMut::Bytes { data, spans } => {
            let (s, l) = spans[i];
            f(&data[s..s + l])
        }
        ValuesMut::I64(v) => f(&v[i].to_le_bytes()),
        ValuesMut::F64(v) => f(&v[i].to_le_bytes()),
        ValuesMut::F32 { dim, data } => {
            let mut buf = Vec::with_capacity(*dim * 4);
            for x in &data[i * *dim..(i + 1) * *dim] {
                buf.extend_from_slice(&x.to_le_bytes());
            }
            f(&buf)
        }
    }
}

/// The state of one chunk of a read: keys grouped by partition, what each partition resolved.
struct ReadCtx<'a, 'k> {
    client: &'a Client,
    topo: &'a Topology,
    table: &'a str,
    vt: ValueType,
    /// The table incarnation every frame names, so a server whose table of that name was
    /// created again refuses instead of answering with another table's values.
    incarnation: u64,
    map: &'a PartitionMap,
    keys: Keys<'k>,
    idx: &'a [u32],
    /// Positions into `idx`, grouped by partition.
    by_part: Groups,
    /// Version each partition was read at (0 = not yet).
    resolved: Vec<u32>,
}

impl<'a, 'k> ReadCtx<'a, 'k> {
    fn new(
        client: &'a Client,
        topo: &'a Topology,
        table: &'a str,
        meta: &TableMeta,
        map: &'a PartitionMap,
        keys: Keys<'k>,
        idx: &'a [u32],
    ) -> Self {
        let parts: Vec<u32> = idx
            .iter()
            .map(|&i| map.partition_of(&keys.key(i as usize)))
            .collect();
        let by_part = Groups::by_target(map.partitions() as usize, 0..idx.len() as u32, |j| {
            Some(parts[j as usize] as usize)
        });
        ReadCtx {
            client,
            topo,
            table,
            vt: meta.value_type,
            incarnation: meta.incarnation,
            map,
            keys,
            idx,
            by_part,
            resolved: vec![0; map.partitions() as usize],
        }
    }

    /// Reads every partition with keys; then, for version 0, re-reads those that resolved an older
    /// version than the newest seen. Returns the version of every value.
    fn run(
        &mut self,
        version: u32,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> std::result::Result<u32, OpError> {
        let parts: Vec<u32> = self.by_part.busy().map(|p| p as u32).collect();
        if parts.is_empty() {
            return Ok(version);
        }
        self.read(version, parts.clone(), out, found)?;
        if version != 0 {
            return Ok(version);
        }
        let newest = parts
            .iter()
            .map(|&p| self.resolved[p as usize])
            .max()
            .unwrap_or(0);
        let older: Vec<u32> = parts
            .into_iter()
            .filter(|&p| self.resolved[p as usize] != newest)
            .collect();
        if !older.is_empty() {
            for &p in &older {
                for &j in self.by_part.row(p as usize) {
                    let i = self.idx[j as usize] as usize;
                    found[i] = false;
                    out.clear(i);
                }
            }
            self.read(newest, older, out, found)?;
        }
        Ok(newest)
    }

    /// Reads partitions `todo` at `version` in one partition round (`round.rs`): each partition
    /// first to its first replica that is up; partitions that no server answered go to the
    /// replicas left, down ones last.
    fn read(
        &mut self,
        version: u32,
        todo: Vec<u32>,
        out: &mut ValuesMut<'_>,
        found: &mut [bool],
    ) -> std::result::Result<(), OpError> {
        let (client, topo, table, vt) = (self.client, self.topo, self.table, self.vt);
        let (by_part, idx, keys, map) = (&self.by_part, self.idx, self.keys, self.map);
        let incarnation = self.incarnation;
        let resolved = &mut self.resolved;
        let mut encode = |_s: usize, parts: &[u32], buf: &mut Vec<u8>, id: u64| {
            let mut w = KeyBatchWriter::begin(buf, Opcode::Get, id, table, version, map.epoch())
                .map_err(encode_err)?;
            w.set_incarnation(incarnation);
            for &p in parts {
                let ks = by_part
                    .row(p as usize)
                    .iter()
                    .map(|&j| keys.key(idx[j as usize] as usize));
                w.group(p, ks).map_err(encode_err)?;
            }
            w.finish().map_err(encode_err)
        };
        let mut take = |s: usize, parts: &[u32], done: &[bool], resp: Response<'_>| {
            let addr = &topo.pools[s].addr;
            match resp {
                Response::Get(g) => {
                    let h = scatter_reply(&g, vt, addr, parts, done, by_part, idx, out, found)?;
                    if matches!(h, Handled::Ok) {
                        for &p in parts {
                            if !done[p as usize] {
                                resolved[p as usize] = g.version;
                            }
                        }
                    }
                    Ok(h)
                }
                other => Ok(Handled::Failed(unexpected(addr, &other))),
            }
        };
        let pick = client.read_pick(table, version);
        let io = RoundIo {
            opcode: Opcode::Get,
            // A linearizable read waits for its primary: a backup may show a write in flight.
            hedge: pick != Pick::Primary,
            pick,
            keys_in: &|p| by_part.row(p as usize).len(),
            encode: &mut encode,
            take: &mut take,
        };
        client.partition_round(topo, map, table, version, todo, io)
    }
}

/// Scatters one server's GET reply into the caller's output. The reply answers the keys of the
/// server's partitions `row` in order, each partition's keys in `by_part` order. Partitions marked
/// in `skip` (answered by another reply already) are left alone: a partition's values all come from
/// one reply.
#[expect(
    clippy::too_many_arguments,
    reason = "the reply, its layout and the outputs, kept apart for unit tests"
)]
pub(crate) fn scatter_reply(
    g: &GetReply<'_>,
    vt: ValueType,
    addr: &str,
    row: &[u32],
    skip: &[bool],
    by_part: &Groups,
    idx: &[u32],
    out: &mut ValuesMut<'_>,
    found: &mut [bool],
) -> std::result::Result<Handled, OpError> {
    let expected: usize = row.iter().map(|&p| by_part.row(p as usize).len()).sum();
    if g.len() != expected || g.value_type != vt {
        return Ok(Handled::Failed(Error::Protocol {
            server: addr.to_string(),
            message: format!(
                "GET reply has {} values of {:?} for {expected} keys of {vt:?}",
                g.len(),
                g.value_type
            ),
        }));
    }
    let mut it = g.iter();
    for &p in row {
        if skip[p as usize] {
            for _ in by_part.row(p as usize) {
                it.next();
            }
            continue;
        }
        for &j in by_part.row(p as usize) {
            let i = idx[j as usize] as usize;
            // A key over the server's limit cannot have been stored: a miss like any other.
            if let Some((KeyStatus::Ok, Some(v))) = it.next() {
                out.set(i, v);
                found[i] = true;
            }
        }
    }
    Ok(Handled::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ramgrid_proto::native::{parse_frame, GetReplyWriter};

    fn reply(vt: ValueType, answers: &[Option<&[u8]>], buf: &mut Vec<u8>) {
        let mut w = GetReplyWriter::begin(buf, 1, 7, vt, answers.len()).unwrap();
        for a in answers {
            match a {
                Some(v) => w.push_hit(v).unwrap(),
                None => w.push_miss().unwrap(),
            }
        }
        w.finish().unwrap();
    }

    fn decode(buf: &[u8]) -> GetReply<'_> {
        let (frame, _) = parse_frame(buf, 1 << 20).unwrap();
        match Response::decode_body(Opcode::Get, frame.body).unwrap() {
            Response::Get(g) => g,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reply_values_land_at_caller_indices() {
        // Batch of 6 keys; this server holds partitions 2 and 0 (in that order in its frame); key
        // positions by partition: p0 -> [1, 4], p2 -> [0, 5]; idx maps positions to batch indices.
        let idx = [5u32, 3, 0, 1, 2, 4];
        let parts = [2u32, 0, 1, 1, 0, 2];
        let by_part = Groups::by_target(3, 0..6u32, |j| Some(parts[j as usize] as usize));
        let row = [2u32, 0];
        let vals: Vec<[u8; 8]> = [10.0f64, 20.0, 30.0, 40.0]
            .iter()
            .map(|v| v.to_le_bytes())
            .collect();
        let mut buf = Vec::new();
        // Frame order: p2 keys (positions 0, 5) then p0 keys (positions 1, 4); position 5 misses.
        reply(
            ValueType::F64,
            &[Some(&vals[0]), None, Some(&vals[2]), Some(&vals[3])],
            &mut buf,
        );
        let g = decode(&buf);
        let mut out = vec![0.0f64; 6];
        let mut found = vec![false; 6];
        let h = scatter_reply(
            &g,
            ValueType::F64,
            "s",
            &row,
            &[false; 3],
            &by_part,
            &idx,
            &mut ValuesMut::F64(&mut out),
            &mut found,
        );
        assert!(matches!(h, Ok(Handled::Ok)));
        // position 0 -> batch 5, position 5 -> batch 4 (miss), position 1 -> batch 3, position 4 -> batch 2.
        assert_eq!(out, [0.0, 0.0, 40.0, 30.0, 0.0, 10.0]);
        assert_eq!(found, [false, false, true, true, false, true]);
    }

    #[test]
    fn short_or_mistyped_replies_fail_the_server_not_the_batch() {
        let by_part = Groups::by_target(1, 0..2u32, |_| Some(0));
        let mut buf = Vec::new();
        reply(ValueType::Bytes, &[Some(b"x")], &mut buf);
        let g = decode(&buf);
        let mut spans = vec![(0, 0); 2];
        let mut data = Vec::new();
        let mut found = vec![false; 2];
        let mut out = ValuesMut::Bytes {
            data: &mut data,
            spans: &mut spans,
        };
        let h = scatter_reply(
            &g,
            ValueType::Bytes,
            "s",
            &[0],
            &[false],
            &by_part,
            &[0, 1],
            &mut out,
            &mut found,
        );
        assert!(matches!(h, Ok(Handled::Failed(Error::Protocol { .. }))));
        let h = scatter_reply(
            &g,
            ValueType::I64,
            "s",
            &[0],
            &[false],
            &by_part,
            &[0],
            &mut out,
            &mut found,
        );
        assert!(matches!(h, Ok(Handled::Failed(Error::Protocol { .. }))));
    }
}
