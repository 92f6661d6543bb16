//! Writes: every key of a PUT or DELETE goes to the primary of its partition, which orders it,
//! forwards it to the other replicas and answers once every one of them applied it
//! (docs/replication.md); keys it did not store are reported by index with a reason.

use ramgrid_proto::native::{
    KeyBatchWriter, KeyStatus, Merge, Opcode, PutWriter, Response, Status, ValueType, MAX_KEY_LEN,
};

use std::time::{Duration, Instant};

use crate::client::{encode_err, refusal, unexpected, Client, Handled, OpError, Topology};
use crate::deadline;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::plan::{Ack, AckTally, Groups};
use crate::values::ValuesRef;

/// How long a write waits for a down primary to be failed over (or to come back) before its keys
/// fail: past a server's default failure timeout (5 s) and the spec change after it, even when the
/// dead server was the group's leader (an election first). Capped by the call's deadline.
const PRIMARY_WAIT: Duration = Duration::from_secs(20);

impl Client {
    /// Writes `values` for `keys` into `table` at `version` (0 = current; a sealed version refuses).
    /// Every key goes to the primary of its partition, which stores it on every replica of the
    /// committed assignment before it answers. Keys that were not stored are reported together in
    /// [`Error::Batch`] (the others are stored); if the primary of some partitions could not be
    /// reached at all, the error is [`Error::PartitionsUnavailable`] naming them instead. A key
    /// whose primary answered INDETERMINATE may have been stored at some replicas.
    pub fn put(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: ValuesRef<'_>,
        version: u32,
    ) -> Result<()> {
        self.put_merge(table, keys, values, version, Merge::Store)
    }

    /// [`Client::put`] with each value merged into the stored one by the server (`Merge::Add`,
    /// `Min`, `Max`; i64 and f64 tables only, refused whole otherwise). The primary orders the
    /// merges of a partition and every replica applies them in that order, so concurrent writers
    /// lose no update and replicas agree. Each chunk of the call carries a write key, the same in
    /// every try, and every replica applies each partition group of it once (protocol 7.3), so a
    /// merge answered INDETERMINATE is sent again within the call and still counted once. A call
    /// that fails may have been applied at some replicas; calling again is a new write.
    pub fn put_merge(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: ValuesRef<'_>,
        version: u32,
        merge: Merge,
    ) -> Result<()> {
        let _call = self.call();
        keys.validate()?;
        let meta = self.table_meta(table)?;
        values.check(meta.value_type, keys.len())?;
        if merge != Merge::Store && !matches!(meta.value_type, ValueType::I64 | ValueType::F64) {
            return Err(Error::InvalidArgument(format!(
                "merge \"{}\" needs an i64 or f64 table; {table} holds {:?} values",
                merge.name(),
                meta.value_type
            )));
        }
        let cost = |i: usize| 2 + keys.key(i).len() + values.wire_len(i, meta.value_type);
        self.write(table, keys, Some((values, merge)), version, cost)?
            .into_result()
            .map(|_| ())
    }

    /// Deletes `keys` from `table` at `version` on every replica. Returns how many were found and
    /// deleted. Failures are reported as for [`Client::put`].
    pub fn delete(&self, table: &str, keys: Keys<'_>, version: u32) -> Result<usize> {
        let _call = self.call();
        keys.validate()?;
        self.write(table, keys, None, version, |i| 2 + keys.key(i).len())?
            .into_result()
    }

    /// Runs a write chunk by chunk, each retried after a spec refresh when refused as stale.
    fn write(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: Option<(ValuesRef<'_>, Merge)>,
        version: u32,
        cost: impl Fn(usize) -> usize,
    ) -> Result<WriteOutcome> {
        let value_type = self.table_meta(table)?.value_type;
        let mut outcome = WriteOutcome::default();
        // A key too long for the wire fails alone, unsent; the rest of the batch goes ahead.
        let all: Vec<u32> = (0..keys.len() as u32)
            .filter(|&i| {
                let len = keys.key(i as usize).len();
                if len > MAX_KEY_LEN {
                    outcome.failures.push((
                        i as usize,
                        format!("KEY_TOO_LARGE: {len} bytes, the limit is {MAX_KEY_LEN}"),
                    ));
                }
                len <= MAX_KEY_LEN
            })
            .collect();
        for chunk in self.chunks(&all, cost) {
            // A merge's key, the same in every try of this chunk: each replica applies each of
            // its partition groups once, so a merge answered INDETERMINATE may go again.
            let write_key = match values {
                Some((_, m)) if m != Merge::Store => new_write_key(),
                _ => 0,
            };
            let mut attempt = 0;
            let mut todo = chunk.to_vec();
            // Keys whose primary is down wait (unsent) for its fail-over or its return.
            let wait_until = deadline::after(PRIMARY_WAIT);
            let mut pause = Duration::from_millis(50);
            // Since when every live server has said the metadata group lost its majority.
            let mut lost_since: Option<Instant> = None;
            loop {
                let patient = Instant::now() + pause < wait_until;
                let r = self.write_chunk(
                    table,
                    keys,
                    values,
                    (&todo, write_key),
                    version,
                    &mut outcome,
                    patient,
                );
                match r {
                    Ok(again) if again.keys.is_empty() => break,
                    Ok(again) => {
                        todo = again.keys;
                        match again.stale {
                            // Refused whole by some primaries (nothing done there): the spec
                            // moved on, or a merge waits for a copy in progress.
                            Some((topo, s, why)) => {
                                // A primary catching up with the group after its restart: a
                                // moment's wait, within the wait for a down primary.
                                if why.contains(ramgrid_proto::native::CATCHING_UP)
                                    && Instant::now() + pause < wait_until
                                {
                                    std::thread::sleep(pause);
                                    pause = (pause * 2).min(Duration::from_millis(500));
                                    continue;
                                }
                                if attempt >= self.inner.spec_retries {
                                    if !why.contains(Status::Indeterminate.name()) {
                                        return Err(Error::StaleSpec(why));
                                    }
                                    // Never completed: these keys fail, the others stand; those
                                    // waiting for a down primary go on waiting.
                                    let keys =
                                        again.resend.iter().map(|&i| (i as usize, why.clone()));
                                    outcome.failures.extend(keys);
                                    todo.retain(|i| again.resend.binary_search(i).is_err());
                                    if todo.is_empty() {
                                        break;
                                    }
                                    std::thread::sleep(pause);
                                    continue;
                                }
                                attempt += 1;
                                crate::client::stale_backoff(attempt);
                                // `s` indexes the round's topology, not a newer one.
                                self.on_stale(&topo, s, table)?;
                                if self.table_meta(table)?.value_type != value_type {
                                    return Err(Error::Protocol {
                                        server: String::new(),
                                        message: format!("table {table} changed its value type"),
                                    });
                                }
                            }
                            None => {
                                std::thread::sleep(pause);
                                pause = (pause * 2).min(Duration::from_millis(500));
                                // A fail-over names another primary in a new spec.
                                let _ = self.refresh_spec();
                                // Without a majority no fail-over comes: once every live server
                                // has said so for twice the failure timeout (an election and a
                                // fail-over would have happened by then), the write is refused.
                                match self.quorum_lost() {
                                    Some((server, message, timeout)) => {
                                        let since = *lost_since.get_or_insert_with(Instant::now);
                                        if since.elapsed() >= 2 * timeout {
                                            return Err(Error::Server {
                                                server,
                                                status: "NO_QUORUM",
                                                message,
                                            });
                                        }
                                    }
                                    None => lost_since = None,
                                }
                            }
                        }
                    }
                    Err(OpError::Stale(s, why)) => {
                        return Err(Error::StaleSpec(format!("{why} (server {s})")));
                    }
                    Err(OpError::Fatal(e)) => {
                        if matches!(e, Error::TableNotFound(_)) {
                            // Dropped, or created again: what we knew of it is stale. A write is
                            // not retried into a table that may be another one.
                            self.inner.tables.write().remove(table);
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// One round of a PUT (values given) or DELETE to the primaries of the keys `idx`; adds to
    /// `outcome` what the primaries that took their frames answered. Returned to be sent again:
    /// the keys of frames refused whole as stale (WRONG_EPOCH, NOT_OWNER; REPAIRING for a merge),
    /// which did nothing, and with `patient` the keys whose primary is down (not sent; without
    /// `patient` they fail). Never sent again: keys of a frame that was written and then failed.
    #[expect(clippy::too_many_arguments)]
    fn write_chunk(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: Option<(ValuesRef<'_>, Merge)>,
        (idx, write_key): (&[u32], u64),
        version: u32,
        outcome: &mut WriteOutcome,
        patient: bool,
    ) -> std::result::Result<Again, OpError> {
        let topo = self.topology();
        let meta = self.table_meta(table)?;
        let map = topo.map(&meta);
        let parts: Vec<u32> = idx
            .iter()
            .map(|&i| map.partition_of(&keys.key(i as usize)))
            .collect();
        let by_part = Groups::by_target(map.partitions() as usize, 0..idx.len() as u32, |j| {
            Some(parts[j as usize] as usize)
        });
        let busy: Vec<u32> = by_part.busy().map(|p| p as u32).collect();
        // A primary that failed recently is not waited for: its partitions' keys are not written
        // until the control plane fails it over and names another. At ack = one the first replica
        // up takes them instead (protocol 7.5).
        let live = |s: u32| !topo.pools[s as usize].is_down();
        let one = self.inner.ack == Ack::One;
        let taker = |p: u32| -> Option<u32> {
            if one {
                map.replicas(p).iter().copied().find(|&s| live(s))
            } else {
                map.primary(p).filter(|&s| live(s))
            }
        };
        let per_server = Groups::by_target(topo.pools.len(), busy.iter().copied(), |p| {
            taker(p).map(|s| s as usize)
        });
        let mut tally = AckTally::new(idx.len());
        let (mut answered, mut lost_table) = (0usize, 0usize);
        let mut skipped = Vec::new();
        let mut waiting = Vec::new();
        let mut wait_parts = std::collections::BTreeSet::new();
        for &p in busy.iter().filter(|&&p| taker(p).is_none()) {
            if let Some(s) = map.primary(p) {
                if patient {
                    waiting.extend(by_part.row(p as usize).iter().map(|&j| idx[j as usize]));
                    wait_parts.insert(p);
                    continue;
                }
                let why = format!("{} is down (failed recently)", topo.pools[s as usize].addr);
                for &j in by_part.row(p as usize) {
                    tally.unanswered(j, || why.clone());
                }
                skipped.push(why);
            }
        }
        let mut deleted = vec![false; if values.is_none() { idx.len() } else { 0 }];
        // Servers whose frame was refused whole as stale, and the first such refusal.
        let mut stale_rows: Vec<usize> = Vec::new();
        let mut stale: Option<(std::sync::Arc<Topology>, usize, String)> = None;
        // A store or delete tried again does what the first did; a merge does under its key.
        let idempotent = write_key != 0 || !matches!(values, Some((_, m)) if m != Merge::Store);
        let vt = meta.value_type;
        let dim = match vt {
            ValueType::F32Vec(d) => d as usize,
            _ => 0,
        };
        let mut scratch = Vec::new();
        let op = if values.is_some() {
            Opcode::Put
        } else {
            Opcode::Delete
        };
        let failed = self.exchange(
            &topo,
            (0..topo.pools.len()).filter(|&s| !per_server.row(s).is_empty()),
            op,
            |s, buf, id| {
                let row = per_server.row(s);
                match values {
                    Some((vals, merge)) => {
                        let mut w = PutWriter::begin(buf, id, table, version, topo.epoch, vt)
                            .map_err(encode_err)?;
                        w.set_incarnation(meta.incarnation);
                        if one {
                            w.set_ack_one();
                        }
                        w.set_merge(merge);
                        w.set_write_key(write_key);
                        for &p in row {
                            let js = by_part.row(p as usize);
                            let ks = js.iter().map(|&j| keys.key(idx[j as usize] as usize));
                            if vt == ValueType::Bytes {
                                let vs = js.iter().map(|&j| vals.bytes(idx[j as usize] as usize));
                                w.group_bytes(p, ks, vs).map_err(encode_err)?;
                            } else {
                                scratch.clear();
                                for &j in js {
                                    vals.put_fixed(idx[j as usize] as usize, dim, &mut scratch);
                                }
                                w.group_packed(p, ks, &scratch).map_err(encode_err)?;
                            }
                        }
                        w.finish().map_err(encode_err)
                    }
                    None => {
                        let mut w = KeyBatchWriter::begin(
                            buf,
                            Opcode::Delete,
                            id,
                            table,
                            version,
                            topo.epoch,
                        )
                        .map_err(encode_err)?;
                        w.set_incarnation(meta.incarnation);
                        if one {
                            w.set_ack_one();
                        }
                        for &p in row {
                            let ks = by_part
                                .row(p as usize)
                                .iter()
                                .map(|&j| keys.key(idx[j as usize] as usize));
                            w.group(p, ks).map_err(encode_err)?;
                        }
                        w.finish().map_err(encode_err)
                    }
                }
            },
            |s, resp| {
                let addr = &topo.pools[s].addr;
                let row = per_server.row(s);
                match resp {
                    Response::KeyStatuses(st) => {
                        answered += 1;
                        let expected: usize =
                            row.iter().map(|&p| by_part.row(p as usize).len()).sum();
                        if st.len() != expected {
                            return Ok(Handled::Failed(Error::Protocol {
                                server: addr.clone(),
                                message: format!("{} statuses for {expected} keys", st.len()),
                            }));
                        }
                        let mut it = st.iter();
                        for &p in row {
                            for &j in by_part.row(p as usize) {
                                match it.next().unwrap_or(KeyStatus::NotFound) {
                                    KeyStatus::Ok => {
                                        tally.ack(j);
                                        if let Some(d) = deleted.get_mut(j as usize) {
                                            *d = true;
                                        }
                                    }
                                    KeyStatus::NotFound if values.is_none() => tally.ack(j),
                                    other => {
                                        tally.refuse(j, || format!("{} from {addr}", other.name()))
                                    }
                                }
                            }
                        }
                        Ok(Handled::Ok)
                    }
                    Response::Error(e)
                        if matches!(
                            e.status,
                            Status::OutOfMemory | Status::Internal | Status::TooLarge
                        ) || (e.status == Status::Indeterminate && !idempotent) =>
                    {
                        // The whole frame failed: every key in it failed (a merge answered
                        // INDETERMINATE may have been applied at some replicas).
                        let why = format!("{} from {addr}: {}", e.status.name(), e.message);
                        for &p in row {
                            for &j in by_part.row(p as usize) {
                                tally.refuse(j, || why.clone());
                            }
                        }
                        Ok(Handled::Ok)
                    }
                    // This replica lost the table (restarted empty) or holds another incarnation
                    // of its name: its keys are refused there (so not acknowledged), the other
                    // replicas' writes stand. If no server has the table, the call fails whole.
                    Response::Error(e) if e.status == Status::NoSuchTable => {
                        lost_table += 1;
                        let why = format!("NO_SUCH_TABLE from {addr}: {}", e.message);
                        for &p in row {
                            for &j in by_part.row(p as usize) {
                                tally.refuse(j, || why.clone());
                            }
                        }
                        Ok(Handled::Ok)
                    }
                    // Refused whole, nothing done: the spec moved on (WRONG_EPOCH, NOT_OWNER), or
                    // the primary is still copying some of these partitions in and takes no merge
                    // into them yet (REPAIRING), or it is catching up with the metadata group a
                    // moment after a restart (NO_QUORUM, CATCHING_UP). Its keys go again after a
                    // refresh; the frames other primaries took stand.
                    // INDETERMINATE (the primary could not complete the write on every replica,
                    // mostly because a fail-over moved the partition on meanwhile): a store or a
                    // delete may be sent again within this call, which has not returned (it then
                    // takes effect at the second try); a merge may not (it would count twice).
                    Response::Error(e)
                        if matches!(
                            e.status,
                            Status::WrongEpoch | Status::NotOwner | Status::Repairing
                        ) || (e.status == Status::Indeterminate && idempotent)
                            || (e.status == Status::NoQuorum
                                && e.message.starts_with(ramgrid_proto::native::CATCHING_UP)) =>
                    {
                        answered += 1;
                        stale_rows.push(s);
                        if stale.is_none() {
                            let why = format!("{addr}: {} {}", e.status.name(), e.message);
                            stale = Some((topo.clone(), s, why));
                        }
                        Ok(Handled::Ok)
                    }
                    Response::Error(e) => Err(refusal(s, addr, table, version, e)),
                    other => Ok(Handled::Failed(unexpected(addr, &other))),
                }
            },
        )?;
        if lost_table > 0 && answered == 0 {
            return Err(OpError::Fatal(Error::TableNotFound(table.to_string())));
        }
        // A partition none of whose replicas took part (down, or failed in this round) is unreachable.
        let mut reached = vec![false; map.partitions() as usize];
        for s in 0..topo.pools.len() {
            if !failed.iter().any(|(f, _)| *f == s) {
                for &p in per_server.row(s) {
                    reached[p as usize] = true;
                }
            }
        }
        outcome.detail.extend(skipped);
        for (s, e) in &failed {
            if patient && matches!(e, Error::Connect { .. }) {
                // Not connected, so nothing was sent: a primary that just died waits, as one
                // already marked down does.
                for &p in per_server.row(*s) {
                    wait_parts.insert(p);
                    waiting.extend(by_part.row(p as usize).iter().map(|&j| idx[j as usize]));
                }
                continue;
            }
            outcome.detail.push(format!("{}: {e}", topo.pools[*s].addr));
            for &p in per_server.row(*s) {
                for &j in by_part.row(p as usize) {
                    tally.unanswered(j, || format!("{}: {e}", topo.pools[*s].addr));
                }
            }
        }
        // The primary's answer stands for every replica (it answers once all applied the write).
        let mut resend = Vec::new();
        for &s in &stale_rows {
            for &p in per_server.row(s) {
                wait_parts.insert(p);
                resend.extend(by_part.row(p as usize).iter().map(|&j| idx[j as usize]));
            }
        }
        let failures = tally.failures(|_| 1);
        outcome.failures.extend(
            failures
                .into_iter()
                .filter(|&(j, _)| !wait_parts.contains(&parts[j]))
                .map(|(j, why)| (idx[j] as usize, why)),
        );
        outcome.unreachable.extend(
            busy.iter()
                .copied()
                .filter(|&p| !reached[p as usize] && !wait_parts.contains(&p)),
        );
        outcome.deleted += deleted.iter().filter(|&&d| d).count();
        let mut keys: Vec<u32> = waiting.iter().chain(&resend).copied().collect();
        keys.sort_unstable();
        resend.sort_unstable();
        Ok(Again {
            keys,
            resend,
            stale,
        })
    }
}

/// What a round of a write leaves to send again (see `Client::write_chunk`).
struct Again {
    /// Batch indices of the keys to send again.
    keys: Vec<u32>,
    /// Those of them that a primary refused whole (the others wait for a down primary).
    resend: Vec<u32>,
    /// A stale refusal among them: (the round's topology, server, why); the spec is refreshed first.
    stale: Option<(std::sync::Arc<Topology>, usize, String)>,
}

/// What a write did, summed over its chunks.
#[derive(Debug, Default)]
struct WriteOutcome {
    /// Keys short of the acknowledgement level: (batch index, first reason).
    failures: Vec<(usize, String)>,
    /// Partitions with keys that no replica could be reached for.
    unreachable: std::collections::BTreeSet<u32>,
    /// Server failures seen.
    detail: Vec<String>,
    /// Keys some replica deleted (DELETE only).
    deleted: usize,
}

impl WriteOutcome {
    fn into_result(self) -> Result<usize> {
        if !self.unreachable.is_empty() {
            let mut detail = self.detail;
            detail.sort_unstable();
            detail.dedup();
            return Err(Error::PartitionsUnavailable {
                partitions: self.unreachable.into_iter().collect(),
                detail: format!(
                    "{} keys not written; {}",
                    self.failures.len(),
                    detail.join("; ")
                ),
            });
        }
        if !self.failures.is_empty() {
            let mut failures = self.failures;
            failures.sort_by_key(|f| f.0);
            return Err(Error::Batch { failures });
        }
        Ok(self.deleted)
    }
}

/// A fresh write key: random, never 0 (protocol 7.5).
fn new_write_key() -> u64 {
    use std::hash::BuildHasher;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::hash::RandomState::new()
        .hash_one((n, std::process::id()))
        .max(1)
}
