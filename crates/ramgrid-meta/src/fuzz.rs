//! The decoders a restart runs on the files of a durable directory (`raft.log`, `raft.vote`,
//! `raft.committed`, `raft.snapshot`), with the invariants the cargo-fuzz target `meta_disk` (/fuzz) checks. Not an
//! API: compiled for tests and with the `fuzzing` feature only.

use std::path::Path;

use openraft::storage::SnapshotMeta;
use openraft::{BasicNode, LogId, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::log::{decode_log, encode_log, LogRecord};
use crate::{disk, MetaState, NodeId};

/// What `raft.snapshot` holds: the fields of `sm::StoredSnapshot`, which is private to its
/// module (the test `real_files_decode` checks that both read a real snapshot file alike).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// What the bytes decoded as.
#[derive(Debug, Default)]
pub struct Decoded {
    /// As `raft.log`: the entries a restart keeps (`None`: it refuses the file).
    pub log_entries: Option<usize>,
    /// As `raft.vote`.
    pub vote: bool,
    /// As `raft.committed`.
    pub committed: bool,
    /// As `raft.snapshot`: the state it restores.
    pub snapshot_state: Option<MetaState>,
    /// Unframed, as one log record's payload.
    pub log_record: bool,
    /// Unframed, as the state inside a snapshot (its `data` field).
    pub state: bool,
}

/// Whether the bytes after the whole records are a torn tail as `disk::scan_records`
/// documents one: nothing, zeros, a header cut short, a payload running past the end, or a
/// last payload that does not match its checksum.
fn is_torn_tail(tail: &[u8]) -> bool {
    if tail.len() < disk::HEADER || tail.iter().all(|&b| b == 0) {
        return true;
    }
    let len = u32::from_le_bytes(tail[0..4].try_into().expect("4 bytes"));
    let check = u32::from_le_bytes(tail[4..8].try_into().expect("4 bytes"));
    let sum = u64::from_le_bytes(tail[8..16].try_into().expect("8 bytes"));
    let end = disk::HEADER + len as usize;
    check == !len
        && (tail.len() < end || (tail.len() == end && xxh3_64(&tail[disk::HEADER..]) != sum))
}

/// `value` written as `disk::write_value` writes it (one checksummed record of its JSON).
fn file_of<T: Serialize>(value: &T) -> Vec<u8> {
    let payload = serde_json::to_vec(value).expect("decoded values encode");
    let mut bytes = Vec::new();
    disk::encode_record(&payload, &mut bytes);
    bytes
}

/// A value decoded from JSON encodes to JSON that decodes to the same value.
fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
    let json = serde_json::to_vec(value).expect("decoded values encode");
    let again: T = serde_json::from_slice(&json).expect("an encoded value decodes");
    assert_eq!(&again, value, "a decoded value did not survive encoding");
}

/// Run every decoder a restart runs on a durable file over `bytes`, as each of the three
/// files, then the record decoders on `bytes` as one unframed payload. Panics if an
/// invariant breaks:
///
/// - the record scan keeps `valid_len <= len` bytes that are exactly its records framed
///   again, which scan again to the same records with nothing left over, and what it cuts is
///   a torn tail as documented;
/// - a log that opens, rewritten as a purge rewrites it, opens to the same entries and
///   purge;
/// - every value that decodes (log record, vote, snapshot and its state) encodes to JSON that
///   decodes to the same value, and its file written again reads back to it.
pub fn fuzz_decode(bytes: &[u8]) -> Decoded {
    let path = Path::new("fuzz");
    let mut out = Decoded::default();

    // The record framing (every file).
    if let Ok(s) = disk::scan_records(bytes, path) {
        assert!(s.valid_len <= bytes.len());
        let mut framed = Vec::new();
        for r in &s.records {
            disk::encode_record(r, &mut framed);
        }
        assert_eq!(
            framed,
            &bytes[..s.valid_len],
            "the records are not the bytes kept"
        );
        let again =
            disk::scan_records(&bytes[..s.valid_len], path).expect("the kept records scan again");
        assert_eq!(again.records, s.records);
        assert_eq!(again.valid_len, s.valid_len);
        assert!(
            is_torn_tail(&bytes[s.valid_len..]),
            "cut {} bytes at {} that are not a torn tail",
            bytes.len() - s.valid_len,
            s.valid_len
        );
        for r in &s.records {
            if let Ok(rec) = serde_json::from_slice::<LogRecord>(r) {
                round_trips(&rec);
            }
        }
    }

    // raft.log, as LogStore::open reads it.
    if let Ok(log) = decode_log(bytes, path) {
        out.log_entries = Some(log.entries.len());
        let rewritten = encode_log(log.last_purged, log.entries.values());
        let again = decode_log(&rewritten, path).expect("a rewritten log opens");
        assert_eq!(again.valid_len, rewritten.len());
        assert_eq!(again.last_purged, log.last_purged);
        assert_eq!(again.entries, log.entries);
    }

    // raft.vote, as LogStore::open reads it.
    if let Ok(vote) = disk::decode_value::<Vote<NodeId>>(bytes, path) {
        out.vote = true;
        round_trips(&vote);
        assert_eq!(
            disk::decode_value::<Vote<NodeId>>(&file_of(&vote), path),
            Ok(vote)
        );
    }

    // raft.committed, as LogStore::open reads it.
    if let Ok(committed) = disk::decode_value::<Option<LogId<NodeId>>>(bytes, path) {
        out.committed = true;
        round_trips(&committed);
        assert_eq!(
            disk::decode_value::<Option<LogId<NodeId>>>(&file_of(&committed), path),
            Ok(committed)
        );
    }

    // raft.snapshot, as StateMachineStore::open reads it: the file, then the state inside.
    if let Ok(snap) = disk::decode_value::<SnapshotFile>(bytes, path) {
        round_trips(&snap);
        assert_eq!(
            disk::decode_value::<SnapshotFile>(&file_of(&snap), path).as_ref(),
            Ok(&snap)
        );
        if let Ok(state) = serde_json::from_slice::<MetaState>(&snap.data) {
            round_trips(&state);
            out.snapshot_state = Some(state);
        }
    }

    // The payloads alone, so that mutations reach the JSON decoders without a checksum.
    if let Ok(rec) = serde_json::from_slice::<LogRecord>(bytes) {
        out.log_record = true;
        round_trips(&rec);
    }
    if let Ok(vote) = serde_json::from_slice::<Vote<NodeId>>(bytes) {
        round_trips(&vote);
    }
    if let Ok(snap) = serde_json::from_slice::<SnapshotFile>(bytes) {
        round_trips(&snap);
    }
    if let Ok(state) = serde_json::from_slice::<MetaState>(bytes) {
        out.state = true;
        round_trips(&state);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
    use openraft::{
        BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftSnapshotBuilder,
        Vote,
    };

    use super::fuzz_decode;
    use crate::{LogStore, MetaCommand, StateMachineStore, TypeConfig, LOG_FILE};
    use crate::{COMMITTED_FILE, SNAPSHOT_FILE, VOTE_FILE};

    fn id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// A short history touching every kind of entry and command.
    fn entries() -> Vec<Entry<TypeConfig>> {
        let members: BTreeMap<u64, BasicNode> = (1..=3)
            .map(|n| (n, BasicNode::new(format!("127.0.0.1:{}", 7000 + n))))
            .collect();
        let voters: BTreeSet<u64> = [1, 2].into();
        let servers =
            |n: u16| -> Vec<String> { (0..n).map(|i| format!("10.0.0.{i}:11211")).collect() };
        let payloads = vec![
            EntryPayload::Blank,
            EntryPayload::Membership(Membership::new(vec![voters], members)),
            EntryPayload::Normal(MetaCommand::SetServers {
                servers: servers(3),
                expect_epoch: Some(0),
            }),
            EntryPayload::Normal(MetaCommand::CreateTable {
                name: "emb\u{e9}d \"x\"".into(),
                incarnation: u64::MAX - 7,
                spec: vec![0, 1, 2, 255],
            }),
            EntryPayload::Normal(MetaCommand::RaiseHighWater {
                name: "emb\u{e9}d \"x\"".into(),
                incarnation: u64::MAX - 7,
                version: 2,
                creator: 99,
            }),
            EntryPayload::Normal(MetaCommand::SetCurrent {
                name: "emb\u{e9}d \"x\"".into(),
                incarnation: u64::MAX - 7,
                version: 1,
            }),
            EntryPayload::Normal(MetaCommand::BeginTransition {
                target: servers(4),
                by: "operator".into(),
            }),
            EntryPayload::Normal(MetaCommand::CompleteTransition { target: servers(4) }),
            EntryPayload::Normal(MetaCommand::MarkDown {
                addr: "10.0.0.2:11211".into(),
            }),
            EntryPayload::Normal(MetaCommand::MarkUp {
                addr: "10.0.0.2:11211".into(),
            }),
            EntryPayload::Normal(MetaCommand::FailOver {
                addr: "10.0.0.3:11211".into(),
            }),
            EntryPayload::Normal(MetaCommand::AbortTransition),
            EntryPayload::Normal(MetaCommand::CreateTable {
                name: "gone".into(),
                incarnation: 1,
                spec: vec![],
            }),
            EntryPayload::Normal(MetaCommand::DropTable {
                name: "gone".into(),
                incarnation: 1,
            }),
        ];
        payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| Entry {
                log_id: id(2, i as u64 + 1),
                payload,
            })
            .collect()
    }

    /// Real files, as the stores write them: `(name, bytes)`.
    async fn real_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let mut files = Vec::new();
        let all = entries();
        let mut log = LogStore::open(dir).unwrap();
        log.blocking_append(all[..3].to_vec()).await.unwrap();
        files.push(("log-3".to_string(), read(LOG_FILE)));
        log.blocking_append(all[3..].to_vec()).await.unwrap();
        files.push(("log-all".to_string(), read(LOG_FILE)));
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        files.push(("vote".to_string(), read(VOTE_FILE)));
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        files.push(("vote-committed".to_string(), read(VOTE_FILE)));
        log.save_committed(Some(id(2, 12))).await.unwrap();
        files.push(("committed".to_string(), read(COMMITTED_FILE)));
        log.purge(id(2, 9)).await.unwrap();
        files.push(("log-purged".to_string(), read(LOG_FILE)));
        log.truncate(id(2, 13)).await.unwrap();
        files.push(("log-purged-truncated".to_string(), read(LOG_FILE)));
        let mut sm = StateMachineStore::open(Some(dir)).unwrap();
        sm.apply(all.clone()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        files.push(("snapshot".to_string(), read(SNAPSHOT_FILE)));
        files
    }

    #[tokio::test]
    async fn real_files_decode() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in real_files(dir.path()).await {
            let d = fuzz_decode(&bytes);
            match name.as_str() {
                "log-3" => assert_eq!(d.log_entries, Some(3)),
                "log-all" => assert_eq!(d.log_entries, Some(entries().len())),
                "log-purged" => assert_eq!(d.log_entries, Some(entries().len() - 9)),
                "log-purged-truncated" => assert_eq!(d.log_entries, Some(3)),
                "vote" | "vote-committed" => assert!(d.vote, "{name}"),
                "committed" => assert!(d.committed),
                "snapshot" => {
                    // The mirror of `StoredSnapshot` reads what the state machine restores.
                    let sm = StateMachineStore::open(Some(dir.path())).unwrap();
                    assert_eq!(d.snapshot_state.as_ref(), Some(&*sm.state()));
                    assert!(!sm.state().tables.is_empty());
                }
                _ => unreachable!("{name}"),
            }
        }
    }

    /// Writes the fuzz target's seeds: `cargo test -p ramgrid-meta --lib write_fuzz_seeds --
    /// --ignored` (to fuzz/seeds/meta_disk/). Real log, vote and snapshot files, their
    /// payloads alone, and a few damaged files.
    #[tokio::test]
    #[ignore = "writes files; run by hand to refresh the fuzz seeds"]
    async fn write_fuzz_seeds() {
        let out = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/meta_disk"
        ));
        std::fs::create_dir_all(out).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut seeds = Vec::new();
        for (name, bytes) in real_files(dir.path()).await {
            let s = crate::disk::scan_records(&bytes, Path::new("seed")).unwrap();
            for (i, payload) in s.records.iter().enumerate() {
                if !seeds.iter().any(|(_, b): &(String, Vec<u8>)| b == payload) {
                    seeds.push((format!("{name}.payload{i}"), payload.to_vec()));
                }
            }
            if name == "log-all" {
                let mut torn = bytes.clone();
                torn.truncate(bytes.len() - 7);
                seeds.push(("log-all.torn".into(), torn));
                let mut zeros = bytes.clone();
                zeros.extend_from_slice(&[0; 48]);
                seeds.push(("log-all.zeros".into(), zeros));
                let mut flipped = bytes.clone();
                flipped[40] ^= 0x08;
                seeds.push(("log-all.corrupt".into(), flipped));
            }
            if name == "snapshot" {
                let snap: serde_json::Value = serde_json::from_slice(s.records[0]).unwrap();
                let data: Vec<u8> = serde_json::from_value(snap["data"].clone()).unwrap();
                seeds.push(("snapshot.state".into(), data));
            }
            seeds.push((name, bytes));
        }
        for (name, bytes) in seeds {
            assert!(bytes.len() <= 4096, "{name}: seeds stay under -max_len");
            std::fs::write(out.join(name), bytes).unwrap();
        }
    }
}
