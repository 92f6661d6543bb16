//! Groups of real nodes over TCP on 127.0.0.1 (ephemeral ports), in one process.
//!
//! The tests take a process-wide lock and run one at a time: each runs a Raft group with 100 ms
//! heartbeats, and several at once on a small shared machine would test the scheduler rather
//! than the code. Every test is bounded by `LIMIT`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ramgrid_meta::{
    ErrorKind, MetaCommand, MetaConfig, MetaError, MetaNode, MetaRefusal, MetaReply, MetaState,
    NodeId, ProposeError, LOG_FILE,
};

const LIMIT: Duration = Duration::from_secs(20);
/// The re-election bound the crate doc states for the default timings (about 2.6 s), plus one
/// split vote (1.2 s) and scheduling noise on a loaded machine.
const REELECTION_BOUND: Duration = Duration::from_secs(4);

static SERIAL: Mutex<()> = Mutex::new(());

/// Run `body` alone and within `LIMIT`.
fn run<F: Future<Output = ()>>(name: &str, body: F) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, body)
            .await
            .unwrap_or_else(|_| panic!("{name} ran over {LIMIT:?}"))
    });
    eprintln!("{name}: {:?}", start.elapsed());
}

fn config(id: NodeId, addr: &str, dir: Option<&Path>) -> MetaConfig {
    let mut c = MetaConfig::new(id, addr);
    c.dir = dir.map(Path::to_owned);
    c
}

/// Start nodes 1..=n (with `dirs[i]` if given) and form a group of them.
async fn group(n: u64, dirs: &[PathBuf], tune: impl Fn(&mut MetaConfig)) -> Vec<MetaNode> {
    let mut nodes = Vec::new();
    for id in 1..=n {
        let mut c = config(
            id,
            "127.0.0.1:0",
            dirs.get(id as usize - 1).map(|d| d.as_path()),
        );
        tune(&mut c);
        nodes.push(MetaNode::start(c).await.unwrap());
    }
    let members: BTreeMap<NodeId, String> = nodes
        .iter()
        .map(|n| (n.id(), n.addr().to_owned()))
        .collect();
    nodes[0].initialize(members).await.unwrap();
    leader(&nodes).await;
    nodes
}

/// The leader all of `nodes` agree on (it being one of them), waiting for one.
async fn leader(nodes: &[MetaNode]) -> NodeId {
    loop {
        let seen: Vec<_> = nodes
            .iter()
            .map(|n| n.status().leader.map(|l| l.0))
            .collect();
        if let Some(Some(id)) = seen.first() {
            if seen.iter().all(|s| s == &Some(*id)) && nodes.iter().any(|n| n.id() == *id) {
                return *id;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait until `node` has applied a state for which `pred` holds.
async fn until(node: &MetaNode, pred: impl Fn(&MetaState) -> bool) -> Arc<MetaState> {
    let mut rx = node.watch();
    let st = rx.wait_for(|s| pred(s)).await.expect("the node stopped");
    st.clone()
}

fn servers(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

fn create(name: &str, incarnation: u64) -> MetaCommand {
    MetaCommand::CreateTable {
        name: name.into(),
        incarnation,
        spec: format!("spec of {name}").into_bytes(),
    }
}

fn raise(name: &str, incarnation: u64, version: u32) -> MetaCommand {
    MetaCommand::RaiseHighWater {
        name: name.into(),
        incarnation,
        version,
        creator: 0,
    }
}

fn current(name: &str, incarnation: u64, version: u32) -> MetaCommand {
    MetaCommand::SetCurrent {
        name: name.into(),
        incarnation,
        version,
    }
}

#[test]
fn three_nodes_commit_proposals_from_any_node_and_agree() {
    run("three_nodes", async {
        let nodes = group(3, &[], |_| {}).await;
        let spec = servers(&["127.0.0.1:7001", "127.0.0.1:7002"]);
        let epoch = ramgrid_proto::cluster::epoch_of(&spec);
        // One command through each node: the leader appends, followers forward.
        let r = nodes[0]
            .propose(MetaCommand::SetServers {
                servers: spec.clone(),
                expect_epoch: Some(0),
            })
            .await;
        assert_eq!(r, Ok(MetaReply::Epoch(epoch)));
        assert!(matches!(
            nodes[1].propose(create("t", 11)).await,
            Ok(MetaReply::Table(_))
        ));
        assert!(nodes[2].propose(raise("t", 11, 1)).await.is_ok());
        assert!(nodes[0].propose(current("t", 11, 1)).await.is_ok());
        // A refusal travels back from the leader too, whichever node proposed.
        for n in &nodes {
            let r = n
                .propose(MetaCommand::SetServers {
                    servers: servers(&["x:1"]),
                    expect_epoch: Some(0),
                })
                .await;
            assert_eq!(
                r,
                Err(ProposeError::Refused(MetaRefusal::EpochMismatch {
                    expected: 0,
                    actual: epoch
                }))
            );
        }
        // Every node's watch reaches the same state.
        let mut states = Vec::new();
        for n in &nodes {
            states.push(until(n, |s| s.tables.get("t").is_some_and(|t| t.current == 1)).await);
        }
        assert!(states.iter().all(|s| **s == *states[0]), "{states:#?}");
        let st = &states[0];
        assert_eq!(st.servers, spec);
        assert_eq!(st.epoch(), epoch);
        assert_eq!(st.members.len(), 3);
        assert!(st.members.values().all(|m| m.voter));
        // A follower's linearizable read sees everything committed.
        let leader_id = leader(&nodes).await;
        let follower = nodes.iter().find(|n| n.id() != leader_id).unwrap();
        assert_eq!(*follower.linearizable_state().await.unwrap(), **st);
        let status = follower.status();
        assert_eq!(status.voters.len(), 3);
        assert_eq!(status.leader.as_ref().map(|l| l.0), Some(leader_id));
        assert!(status.last_applied >= 5);
        for n in &nodes {
            n.shutdown().await;
        }
    });
}

#[test]
fn leader_loss_elects_a_new_leader_within_the_bound_and_work_continues() {
    run("leader_loss", async {
        let nodes = group(3, &[], |_| {}).await;
        nodes[1].propose(create("t", 1)).await.unwrap();
        let old = leader(&nodes).await;
        let (dead, live): (Vec<_>, Vec<_>) = nodes.into_iter().partition(|n| n.id() == old);
        let t0 = Instant::now();
        dead[0].shutdown().await;
        let new = loop {
            let seen: Vec<_> = live
                .iter()
                .map(|n| n.status().leader.map(|l| l.0))
                .collect();
            if let Some(id) = seen[0] {
                if id != old && seen.iter().all(|s| *s == Some(id)) {
                    break id;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let took = t0.elapsed();
        eprintln!("re-election after leader loss: {took:?} (node {old} -> node {new})");
        assert!(took < REELECTION_BOUND, "re-election took {took:?}");
        // Table creation and version switches go on, proposed from either survivor.
        assert!(live[0].propose(raise("t", 1, 1)).await.is_ok());
        assert!(live[1].propose(current("t", 1, 1)).await.is_ok());
        assert!(live[1].propose(create("u", 2)).await.is_ok());
        let st = live[0].linearizable_state().await.unwrap();
        assert_eq!(st.tables["t"].current, 1);
        assert!(st.tables.contains_key("u"));
        for n in &live {
            n.shutdown().await;
        }
    });
}

#[test]
fn two_concurrent_creates_of_one_name_one_wins_the_other_is_refused() {
    run("concurrent_create", async {
        let nodes = group(3, &[], |_| {}).await;
        for round in 0..5u64 {
            let name = format!("t{round}");
            let (a, b) = tokio::join!(
                nodes[(round % 3) as usize].propose(create(&name, 100 + round)),
                nodes[((round + 1) % 3) as usize].propose(create(&name, 200 + round)),
            );
            let st = nodes[2].linearizable_state().await.unwrap();
            let winner = st.tables[&name].incarnation;
            let (won, lost) = if winner == 100 + round {
                (a, b)
            } else {
                (b, a)
            };
            assert!(matches!(won, Ok(MetaReply::Table(t)) if t.incarnation == winner));
            assert_eq!(
                lost,
                Err(MetaError::Refused(MetaRefusal::TableExists {
                    name: name.clone(),
                    incarnation: winner
                }))
            );
        }
        for n in &nodes {
            n.shutdown().await;
        }
    });
}

#[test]
fn a_follower_left_alone_never_commits_and_the_group_goes_on_after_a_restart() {
    run("minority_follower", minority(false));
}

#[test]
fn a_leader_left_alone_never_commits_and_the_group_goes_on_after_a_restart() {
    run("minority_leader", minority(true));
}

/// Two of three nodes shut down, leaving the leader (`keep_leader`) or a follower alone.
async fn minority(keep_leader: bool) {
    {
        let dirs = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (1..=3).map(|i| dirs.path().join(format!("n{i}"))).collect();
        let timeout_ms = 2000;
        let mut nodes = group(3, &paths, |c| c.propose_timeout_ms = timeout_ms).await;
        nodes[0].propose(create("before", 1)).await.unwrap();
        for n in &nodes {
            until(n, |s| s.tables.contains_key("before")).await;
        }
        let leader_id = leader(&nodes).await;
        let keep = nodes
            .iter()
            .position(|n| (n.id() == leader_id) == keep_leader)
            .unwrap();
        let last = nodes.remove(keep);
        let gone = nodes;
        for n in &gone {
            n.shutdown().await;
        }
        let t0 = Instant::now();
        let r = last.propose(create("lost", 2)).await;
        let took = t0.elapsed();
        assert_eq!(
            r.as_ref().map_err(MetaError::kind),
            Err(ErrorKind::NoQuorum),
            "{r:?}"
        );
        assert!(
            took < Duration::from_millis(timeout_ms + 1000),
            "NoQuorum took {took:?}"
        );
        assert!(
            took >= Duration::from_millis(timeout_ms / 2),
            "gave up after {took:?}"
        );
        assert!(matches!(
            last.linearizable_state().await,
            Err(MetaError::NoQuorum { .. })
        ));
        assert!(!last.state().tables.contains_key("lost"));
        // A node that was shut down comes back from its directory on its address: a majority.
        let id = gone[0].id();
        let dir = &paths[id as usize - 1];
        let back = MetaNode::start(config(id, gone[0].addr(), Some(dir)))
            .await
            .unwrap();
        let now = [back.clone(), last.clone()];
        leader(&now).await;
        last.propose(create("after", 3)).await.unwrap();
        for n in &now {
            let st = n.linearizable_state().await.unwrap();
            assert!(st.tables.contains_key("before") && st.tables.contains_key("after"));
            assert!(
                !st.tables.contains_key("lost"),
                "a command refused with NoQuorum was applied"
            );
        }
        back.shutdown().await;
        last.shutdown().await;
    }
}

#[test]
fn a_whole_group_restarted_from_its_directories_keeps_its_state() {
    run("whole_group_restart", async {
        let dirs = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (1..=3).map(|i| dirs.path().join(format!("n{i}"))).collect();
        let nodes = group(3, &paths, |_| {}).await;
        let spec = servers(&["a:1", "b:2", "c:3"]);
        nodes[0]
            .propose(MetaCommand::SetServers {
                servers: spec.clone(),
                expect_epoch: None,
            })
            .await
            .unwrap();
        nodes[1].propose(create("t", 5)).await.unwrap();
        nodes[2].propose(raise("t", 5, 2)).await.unwrap();
        nodes[0].propose(current("t", 5, 2)).await.unwrap();
        nodes[1]
            .propose(MetaCommand::MarkDown { addr: "b:2".into() })
            .await
            .unwrap();
        let before = nodes[0].linearizable_state().await.unwrap();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_owned()).collect();
        for n in &nodes {
            n.shutdown().await;
        }
        let mut again = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let c = config(i as u64 + 1, addr, Some(&paths[i]));
            again.push(MetaNode::start(c).await.unwrap());
        }
        // Initialising a restarted node is harmless.
        let members = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        again[0].initialize(members).await.unwrap();
        leader(&again).await;
        for n in &again {
            assert_eq!(*n.linearizable_state().await.unwrap(), *before);
        }
        again[2].propose(raise("t", 5, 3)).await.unwrap();
        let st = again[1].linearizable_state().await.unwrap();
        assert_eq!(st.tables["t"].high_water, 3);
        assert_eq!(st.servers, spec);
        for n in &again {
            n.shutdown().await;
        }
    });
}

#[test]
fn a_node_restarted_alone_knows_what_it_had_committed_before_any_leader_reaches_it() {
    run("restart_alone_reapplies", async {
        let dirs = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (1..=3).map(|i| dirs.path().join(format!("n{i}"))).collect();
        let nodes = group(3, &paths, |_| {}).await;
        assert!(!nodes[1].restored(), "a node started on an empty directory");
        nodes[0].propose(create("t", 5)).await.unwrap();
        nodes[0].propose(raise("t", 5, 2)).await.unwrap();
        nodes[0].propose(current("t", 5, 2)).await.unwrap();
        until(&nodes[1], |st| {
            st.tables.get("t").is_some_and(|t| t.current == 2)
        })
        .await;
        let addr = nodes[1].addr().to_owned();
        for n in &nodes {
            n.shutdown().await;
        }
        // Alone: no leader will ever reach it, yet its state is what it had applied.
        let alone = MetaNode::start(config(2, &addr, Some(&paths[1])))
            .await
            .unwrap();
        assert!(alone.restored());
        let st = until(&alone, |st| st.tables.contains_key("t")).await;
        assert_eq!(st.tables["t"].current, 2);
        alone.shutdown().await;
    });
}

#[test]
fn a_torn_log_tail_is_cut_on_start_and_a_damaged_log_is_refused() {
    run("torn_tail", async {
        let dir = tempfile::tempdir().unwrap();
        let start = |addr: String| MetaNode::start(config(1, &addr, Some(dir.path())));
        let node = start("127.0.0.1:0".into()).await.unwrap();
        let addr = node.addr().to_owned();
        node.initialize([(1, addr.clone())].into()).await.unwrap();
        for i in 1..=5u64 {
            node.propose(create(&format!("t{i}"), i)).await.unwrap();
        }
        node.shutdown().await;
        let log = dir.path().join(LOG_FILE);
        let len = std::fs::metadata(&log).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)
            .unwrap()
            .set_len(len - 7)
            .unwrap();
        // The torn record (t5's) is cut and the node serves what remains. (With one node the
        // cut record had been acknowledged: this shows detection, not a crash's real effect,
        // where the torn record is one whose append never returned.)
        let node = start(addr.clone()).await.unwrap();
        let st = node.linearizable_state().await.unwrap();
        assert!(
            (1..=4).all(|i| st.tables.contains_key(&format!("t{i}"))),
            "{st:?}"
        );
        assert!(!st.tables.contains_key("t5"));
        node.propose(create("t6", 6)).await.unwrap();
        node.shutdown().await;
        // A flipped byte inside the log is an error naming the file.
        let mut bytes = std::fs::read(&log).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x04;
        std::fs::write(&log, &bytes).unwrap();
        let err = start(addr)
            .await
            .err()
            .expect("a damaged log must not start");
        assert_eq!(err.kind(), ErrorKind::Storage);
        assert!(
            err.to_string().contains(&log.display().to_string()),
            "{err}"
        );
    });
}

#[test]
fn a_learner_added_later_catches_up_from_a_snapshot() {
    run("learner", async {
        let tune = |c: &mut MetaConfig| {
            c.snapshot_every = 5;
            c.keep_logs = 0;
        };
        let nodes = group(3, &[], tune).await;
        for i in 0..20u64 {
            nodes[(i % 3) as usize]
                .propose(create(&format!("t{i}"), i))
                .await
                .unwrap();
        }
        let leader_id = leader(&nodes).await;
        let lead = nodes.iter().find(|n| n.id() == leader_id).unwrap();
        lead.snapshot_now().await.unwrap();
        // The leader purged its log behind the snapshot: the learner cannot get it from the log.
        let t0 = Instant::now();
        while lead.log_len() > 5 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "log not purged: {}",
                lead.log_len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut c = config(4, "127.0.0.1:0", None);
        tune(&mut c);
        let learner = MetaNode::start(c).await.unwrap();
        // Added through a follower, which forwards the change to the leader.
        let follower = nodes.iter().find(|n| n.id() != leader_id).unwrap();
        follower.add_learner(4, learner.addr()).await.unwrap();
        let want = lead.linearizable_state().await.unwrap();
        let st = until(&learner, |s| s.tables.len() == 20).await;
        assert_eq!(st.tables, want.tables);
        assert!(
            learner.log_len() < 20,
            "caught up from the log: {} entries",
            learner.log_len()
        );
        // The membership entry that added it follows the snapshot; it applies it in turn.
        let st = until(&learner, |s| s.members.len() == 4).await;
        assert!(!st.members[&4].voter && st.members[&1].voter);
        // A learner proposes like any node, and sees its own write.
        learner.propose(create("from_learner", 99)).await.unwrap();
        until(&learner, |s| s.tables.contains_key("from_learner")).await;
        // Promoted, it votes.
        lead.change_membership([1, 2, 3, 4]).await.unwrap();
        let st = until(&learner, |s| s.members.get(&4).is_some_and(|m| m.voter)).await;
        assert_eq!(st.members.values().filter(|m| m.voter).count(), 4);
        for n in nodes.iter().chain([&learner]) {
            n.shutdown().await;
        }
    });
}
