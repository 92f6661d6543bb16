//! The state machine's rules, command by command (state.rs): each command applied whole or refused whole.

use super::*;

fn list(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

/// Apply `cmd`, and check that a refusal left the state exactly as it was.
fn run(st: &mut MetaState, cmd: MetaCommand) -> Result<MetaReply, MetaRefusal> {
    let before = st.clone();
    let r = st.apply(&cmd);
    if r.is_err() {
        assert_eq!(*st, before, "a refused {cmd:?} changed the state");
    }
    r
}

fn set(servers: &[&str], expect_epoch: Option<u64>) -> MetaCommand {
    MetaCommand::SetServers {
        servers: list(servers),
        expect_epoch,
    }
}

#[test]
fn set_servers_computes_the_protocol_epoch_and_compares_and_sets() {
    let mut st = MetaState::default();
    assert_eq!(st.epoch(), 0);
    let e1 = ramgrid_proto::cluster::epoch_of(&["a:1", "b:2"]);
    assert_eq!(
        run(&mut st, set(&["a:1", "b:2"], Some(0))),
        Ok(MetaReply::Epoch(e1))
    );
    assert_eq!(st.epoch(), e1);
    // CAS against a stale epoch is refused.
    assert_eq!(
        run(&mut st, set(&["a:1"], Some(0))),
        Err(MetaRefusal::EpochMismatch {
            expected: 0,
            actual: e1
        })
    );
    let e2 = ramgrid_proto::cluster::epoch_of(&["b:2", "a:1"]);
    assert_eq!(
        run(&mut st, set(&["b:2", "a:1"], Some(e1))),
        Ok(MetaReply::Epoch(e2))
    );
    // Without expect_epoch it always applies.
    assert!(run(&mut st, set(&["c:3"], None)).is_ok());
    assert_eq!(st.servers, list(&["c:3"]));
}

#[test]
fn set_servers_refuses_bad_lists() {
    let mut st = MetaState::default();
    assert!(matches!(
        run(&mut st, set(&[], None)),
        Err(MetaRefusal::InvalidServers { .. })
    ));
    assert!(matches!(
        run(&mut st, set(&["a:1", "a:1"], None)),
        Err(MetaRefusal::InvalidServers { .. })
    ));
    assert!(matches!(
        run(&mut st, set(&["a 1"], None)),
        Err(MetaRefusal::InvalidServers { .. })
    ));
}

#[test]
fn transitions_begin_idempotently_complete_and_abort() {
    let mut st = MetaState::default();
    run(&mut st, set(&["a:1", "b:2"], None)).unwrap();
    let target = list(&["a:1", "b:2", "c:3"]);
    let begin = |t: &[String], by: &str| MetaCommand::BeginTransition {
        target: t.to_vec(),
        by: by.into(),
    };
    assert_eq!(run(&mut st, begin(&target, "a:1")), Ok(MetaReply::Done));
    // The same target again: accepted, and the first starter is kept.
    assert_eq!(run(&mut st, begin(&target, "b:2")), Ok(MetaReply::Done));
    assert_eq!(st.transition.as_ref().unwrap().started_by, "a:1");
    // Another target while one runs: refused, as is replacing the spec under it.
    assert!(matches!(
        run(&mut st, begin(&list(&["a:1"]), "b:2")),
        Err(MetaRefusal::TransitionInProgress { .. })
    ));
    assert!(matches!(
        run(&mut st, set(&["a:1"], None)),
        Err(MetaRefusal::TransitionInProgress { .. })
    ));
    // Completing another target is refused.
    assert!(matches!(
        run(
            &mut st,
            MetaCommand::CompleteTransition {
                target: list(&["a:1"])
            }
        ),
        Err(MetaRefusal::NoSuchTransition { .. })
    ));
    let e = ramgrid_proto::cluster::epoch_of(&target);
    assert_eq!(
        run(
            &mut st,
            MetaCommand::CompleteTransition {
                target: target.clone()
            }
        ),
        Ok(MetaReply::Epoch(e))
    );
    assert_eq!(st.servers, target);
    assert_eq!(st.transition, None);
    // Completing twice is refused: it is no longer in progress.
    assert!(matches!(
        run(
            &mut st,
            MetaCommand::CompleteTransition {
                target: target.clone()
            }
        ),
        Err(MetaRefusal::NoSuchTransition { .. })
    ));
    // Abort forgets a transition and keeps the spec; with none it is a no-op.
    run(&mut st, begin(&list(&["a:1"]), "ops")).unwrap();
    assert_eq!(
        run(&mut st, MetaCommand::AbortTransition),
        Ok(MetaReply::Done)
    );
    assert_eq!(st.transition, None);
    assert_eq!(st.servers, target);
    assert_eq!(
        run(&mut st, MetaCommand::AbortTransition),
        Ok(MetaReply::Done)
    );
    // A bad target is refused.
    assert!(matches!(
        run(&mut st, begin(&[], "ops")),
        Err(MetaRefusal::InvalidServers { .. })
    ));
}

#[test]
fn fail_over_takes_a_server_out_and_a_move_puts_it_back_counted() {
    let mut st = MetaState::default();
    run(&mut st, set(&["a:1", "b:2", "c:3"], None)).unwrap();
    let fail = |a: &str| MetaCommand::FailOver { addr: a.into() };
    let e = ramgrid_proto::cluster::epoch_of(&["a:1", "c:3"]);
    assert_eq!(run(&mut st, fail("b:2")), Ok(MetaReply::Epoch(e)));
    assert_eq!(st.servers, list(&["a:1", "c:3"]));
    assert!(st.failed.contains("b:2"));
    assert_eq!(st.failures.get("b:2"), Some(&1));
    // Not a server any more, and unknown servers are refused.
    assert!(run(&mut st, fail("b:2")).is_err());
    assert!(run(&mut st, fail("z:9")).is_err());
    // It rejoins as the leader does it: a move to the spec with it at the end. No fail-over
    // under a move.
    let back = list(&["a:1", "c:3", "b:2"]);
    run(
        &mut st,
        MetaCommand::BeginTransition {
            target: back.clone(),
            by: "rejoin of b:2".into(),
        },
    )
    .unwrap();
    assert!(run(&mut st, fail("a:1")).is_err());
    assert!(st.failed.contains("b:2"));
    run(&mut st, MetaCommand::CompleteTransition { target: back }).unwrap();
    assert!(st.failed.is_empty());
    // The count stays: a server seeing it rise knows it was out.
    assert_eq!(st.failures.get("b:2"), Some(&1));
    // Never the last server.
    run(&mut st, set(&["a:1"], None)).unwrap();
    assert!(run(&mut st, fail("a:1")).is_err());
    // A failed server put back by hand is no longer waiting to rejoin.
    run(&mut st, set(&["a:1", "b:2"], None)).unwrap();
    run(&mut st, fail("b:2")).unwrap();
    run(&mut st, set(&["a:1", "b:2"], None)).unwrap();
    assert!(st.failed.is_empty());
}

#[test]
fn down_marks_name_known_servers_and_are_pruned_with_them() {
    let mut st = MetaState::default();
    run(&mut st, set(&["a:1", "b:2"], None)).unwrap();
    let down = |a: &str| MetaCommand::MarkDown { addr: a.into() };
    assert_eq!(run(&mut st, down("b:2")), Ok(MetaReply::Done));
    assert_eq!(run(&mut st, down("b:2")), Ok(MetaReply::Done));
    assert!(st.down.contains("b:2"));
    assert_eq!(
        run(&mut st, down("z:9")),
        Err(MetaRefusal::UnknownServer { addr: "z:9".into() })
    );
    assert_eq!(
        run(&mut st, MetaCommand::MarkUp { addr: "b:2".into() }),
        Ok(MetaReply::Done)
    );
    assert!(st.down.is_empty());
    // A server of the transition's target may be marked down; leaving the spec clears it.
    run(
        &mut st,
        MetaCommand::BeginTransition {
            target: list(&["a:1", "c:3"]),
            by: "ops".into(),
        },
    )
    .unwrap();
    run(&mut st, down("c:3")).unwrap();
    run(&mut st, down("b:2")).unwrap();
    run(
        &mut st,
        MetaCommand::CompleteTransition {
            target: list(&["a:1", "c:3"]),
        },
    )
    .unwrap();
    assert_eq!(st.down, BTreeSet::from(["c:3".to_string()]));
    run(
        &mut st,
        MetaCommand::MarkUp {
            addr: "nobody:1".into(),
        },
    )
    .unwrap();
}

#[test]
fn create_table_one_incarnation_wins() {
    let mut st = MetaState::default();
    let create = |inc: u64, spec: &[u8]| MetaCommand::CreateTable {
        name: "t".into(),
        incarnation: inc,
        spec: spec.to_vec(),
    };
    let made = TableMeta {
        incarnation: 7,
        spec: b"s1".to_vec(),
        high_water: 0,
        current: 0,
        high_water_creator: 0,
    };
    assert_eq!(
        run(&mut st, create(7, b"s1")),
        Ok(MetaReply::Table(made.clone()))
    );
    // The same incarnation again: the table as it is.
    assert_eq!(
        run(&mut st, create(7, b"other")),
        Ok(MetaReply::Table(made))
    );
    assert_eq!(
        run(&mut st, create(8, b"s2")),
        Err(MetaRefusal::TableExists {
            name: "t".into(),
            incarnation: 7
        })
    );
}

#[test]
fn drop_table_needs_the_incarnation() {
    let mut st = MetaState::default();
    let drop = |inc: u64| MetaCommand::DropTable {
        name: "t".into(),
        incarnation: inc,
    };
    assert_eq!(
        run(&mut st, drop(1)),
        Err(MetaRefusal::NoSuchTable { name: "t".into() })
    );
    run(
        &mut st,
        MetaCommand::CreateTable {
            name: "t".into(),
            incarnation: 1,
            spec: vec![],
        },
    )
    .unwrap();
    assert!(matches!(
        run(&mut st, drop(2)),
        Err(MetaRefusal::WrongIncarnation {
            expected: 2,
            actual: 1,
            ..
        })
    ));
    assert_eq!(run(&mut st, drop(1)), Ok(MetaReply::Done));
    assert!(st.tables.is_empty());
    // Created again under the name, it is another incarnation.
    run(
        &mut st,
        MetaCommand::CreateTable {
            name: "t".into(),
            incarnation: 2,
            spec: vec![],
        },
    )
    .unwrap();
    assert_eq!(st.tables["t"].incarnation, 2);
}

#[test]
fn high_water_only_rises_and_current_names_a_created_version() {
    let mut st = MetaState::default();
    run(
        &mut st,
        MetaCommand::CreateTable {
            name: "t".into(),
            incarnation: 1,
            spec: vec![],
        },
    )
    .unwrap();
    let raise = |inc: u64, v: u32| MetaCommand::RaiseHighWater {
        name: "t".into(),
        incarnation: inc,
        version: v,
        creator: 0,
    };
    let current = |inc: u64, v: u32| MetaCommand::SetCurrent {
        name: "t".into(),
        incarnation: inc,
        version: v,
    };
    assert!(matches!(
        run(&mut st, current(1, 1)),
        Err(MetaRefusal::VersionNotCreated {
            version: 1,
            high_water: 0,
            ..
        })
    ));
    run(&mut st, raise(1, 3)).unwrap();
    assert!(matches!(
        run(&mut st, raise(1, 3)),
        Err(MetaRefusal::VersionUsed {
            version: 3,
            high_water: 3,
            ..
        })
    ));
    assert!(matches!(
        run(&mut st, raise(1, 2)),
        Err(MetaRefusal::VersionUsed { .. })
    ));
    assert!(matches!(
        run(&mut st, raise(9, 4)),
        Err(MetaRefusal::WrongIncarnation { .. })
    ));
    assert!(matches!(
        run(
            &mut st,
            MetaCommand::RaiseHighWater {
                name: "nope".into(),
                incarnation: 1,
                version: 4,
                creator: 0,
            }
        ),
        Err(MetaRefusal::NoSuchTable { .. })
    ));
    let r = run(&mut st, current(1, 2)).unwrap();
    assert_eq!(
        r,
        MetaReply::Table(TableMeta {
            incarnation: 1,
            spec: vec![],
            high_water: 3,
            current: 2,
            high_water_creator: 0,
        })
    );
    // Setting it again is harmless; 0 and unreleased numbers are refused.
    run(&mut st, current(1, 2)).unwrap();
    assert!(run(&mut st, current(1, 0)).is_err());
    assert!(run(&mut st, current(1, 4)).is_err());
    assert!(matches!(
        run(&mut st, current(2, 3)),
        Err(MetaRefusal::WrongIncarnation { .. })
    ));
    assert_eq!(st.tables["t"].current, 2);
}

#[test]
fn a_raise_repeated_by_its_own_call_succeeds_and_another_calls_is_refused() {
    let mut st = MetaState::default();
    run(
        &mut st,
        MetaCommand::CreateTable {
            name: "t".into(),
            incarnation: 1,
            spec: vec![],
        },
    )
    .unwrap();
    let raise = |v: u32, creator: u64| MetaCommand::RaiseHighWater {
        name: "t".into(),
        incarnation: 1,
        version: v,
        creator,
    };
    run(&mut st, raise(1, 0xA)).unwrap();
    // The same call, proposed again by the next server it asked: no change, no refusal.
    assert!(run(&mut st, raise(1, 0xA)).is_ok());
    assert_eq!(st.tables["t"].high_water, 1);
    // Another call that chose the same number loses everywhere.
    assert!(matches!(
        run(&mut st, raise(1, 0xB)),
        Err(MetaRefusal::VersionUsed { .. })
    ));
    // No token is never a repeat.
    assert!(run(&mut st, raise(1, 0)).is_err());
    // Once a later number is raised, the first call's repeat is refused (it is stale).
    run(&mut st, raise(2, 0xB)).unwrap();
    assert!(run(&mut st, raise(1, 0xA)).is_err());
}

#[test]
fn state_round_trips_through_json() {
    let mut st = MetaState::default();
    run(&mut st, set(&["a:1"], None)).unwrap();
    run(&mut st, MetaCommand::MarkDown { addr: "a:1".into() }).unwrap();
    run(
        &mut st,
        MetaCommand::CreateTable {
            name: "t".into(),
            incarnation: u64::MAX,
            spec: vec![0, 255],
        },
    )
    .unwrap();
    st.members.insert(
        3,
        Member {
            addr: "a:9".into(),
            voter: true,
        },
    );
    let back: MetaState = serde_json::from_slice(&serde_json::to_vec(&st).unwrap()).unwrap();
    assert_eq!(back, st);
}

#[test]
fn restore_keeps_the_new_groups_members_takes_the_rest_and_only_raises_the_generation() {
    let mut old = MetaState::default();
    run(&mut old, set(&["a:1", "b:2", "c:3"], Some(0))).unwrap();
    let create = MetaCommand::CreateTable {
        name: "t".into(),
        incarnation: 7,
        spec: vec![1, 2],
    };
    run(&mut old, create).unwrap();
    old.members.insert(
        1,
        Member {
            addr: "a:1".into(),
            voter: true,
        },
    );
    let mut fresh = MetaState::default();
    fresh.members.insert(
        9,
        Member {
            addr: "a:1".into(),
            voter: true,
        },
    );
    let restore = |generation| MetaCommand::Restore {
        state: Box::new(old.clone()),
        generation,
    };
    assert_eq!(
        run(&mut fresh, restore(1)),
        Ok(MetaReply::Epoch(old.epoch()))
    );
    assert_eq!(fresh.servers, old.servers);
    assert_eq!(fresh.tables, old.tables);
    assert_eq!(fresh.generation, 1);
    assert_eq!(fresh.members.keys().copied().collect::<Vec<_>>(), vec![9]);
    // A repeat (or an older survivor's) changes nothing.
    assert_eq!(
        run(&mut fresh, restore(1)),
        Err(MetaRefusal::StaleGeneration {
            generation: 1,
            current: 1
        })
    );
}
