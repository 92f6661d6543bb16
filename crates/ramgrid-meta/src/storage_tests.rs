//! Storage tests: openraft's own conformance suite over both stores, and reopening a durable
//! directory.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;

use crate::log::LogStore;
use crate::sm::StateMachineStore;
use crate::state::NodeId;
use crate::TypeConfig;

struct InMemory;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, ()> for InMemory {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError<NodeId>> {
        Ok((
            (),
            LogStore::in_memory(),
            StateMachineStore::open(None).unwrap(),
        ))
    }
}

struct Durable;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Durable {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path()).unwrap();
        let sm = StateMachineStore::open(Some(dir.path())).unwrap();
        Ok((dir, log, sm))
    }
}

#[test]
fn in_memory_store_passes_the_openraft_suite() {
    Suite::test_all(InMemory).unwrap();
}

#[test]
fn durable_store_passes_the_openraft_suite() {
    Suite::test_all(Durable).unwrap();
}

mod reopen {
    use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    use crate::log::{LogStore, LOG_FILE};
    use crate::state::MetaCommand;
    use crate::TypeConfig;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(MetaCommand::MarkUp {
                addr: format!("s{index}:1"),
            }),
        }
    }

    async fn indexes(log: &mut LogStore) -> Vec<u64> {
        let entries = log.try_get_log_entries(0..).await.unwrap();
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn log_vote_purge_and_truncate_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            log.blocking_append((1..=6).map(entry)).await.unwrap();
            log.save_vote(&Vote::new(3, 2)).await.unwrap();
            log.purge(LogId::new(CommittedLeaderId::new(1, 0), 2))
                .await
                .unwrap();
            log.truncate(LogId::new(CommittedLeaderId::new(1, 0), 6))
                .await
                .unwrap();
            log.blocking_append([entry(6), entry(7)]).await.unwrap();
        }
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, vec![3, 4, 5, 6, 7]);
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(2));
        assert_eq!(st.last_log_id.map(|l| l.index), Some(7));
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_a_damaged_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            log.blocking_append((1..=4).map(entry)).await.unwrap();
        }
        let path = dir.path().join(LOG_FILE);
        let len = std::fs::metadata(&path).unwrap().len();
        // Cut the last record short, as a crash during its append would.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, vec![1, 2, 3]);
        // The tail was cut on disk, so appending goes on after the last whole record.
        log.blocking_append([entry(4)]).await.unwrap();
        drop(log);
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4]);
        drop(log);
        // A flipped byte in the second record is corruption, named, not skipped.
        let mut bytes = std::fs::read(&path).unwrap();
        let first = 16 + u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
        bytes[first + 16 + 3] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let err = LogStore::open(dir.path())
            .err()
            .expect("a damaged log must not open");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(&format!("offset {first}")), "{err}");
    }
}
