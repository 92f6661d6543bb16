//! Copying partitions in (moves and repairs): a pending partition refuses reads, takes writes, and
//! its copy never overwrites or brings back what was written or deleted here since it began.

use ramgrid_store::{Durability, Error, TableSpec, Tables, TablesConfig, ValueRef, ValueType};

fn spec() -> TableSpec {
    TableSpec {
        name: "t".into(),
        partitions: 2,
        replication: 2,
        value_type: ValueType::I64,
        durability: Durability::Memory,
        incarnation: 7,
    }
}

fn put(t: &Tables, version: u32, kv: &[(&str, i64)]) {
    let mut st = Vec::new();
    t.put_batch(
        "t",
        version,
        0,
        kv.iter().map(|(k, v)| (k.as_bytes(), ValueRef::I64(*v))),
        &mut st,
    )
    .unwrap();
    assert!(st.iter().all(|&s| s == 0), "{st:?}");
}

fn get(t: &Tables, version: u32, key: &str) -> Result<Option<i64>, Error> {
    let (mut st, mut vals) = (Vec::new(), Vec::new());
    t.get_batch("t", version, 0, [key.as_bytes()], &mut st, &mut vals)?;
    Ok((st[0] == 0).then(|| i64::from_le_bytes(vals[..8].try_into().unwrap())))
}

#[test]
fn an_open_copy_keeps_the_writes_and_deletes_made_during_it() {
    // The source: keys a, b, c in partition 0 of the open head.
    let src = Tables::new(TablesConfig::default());
    src.create_table(spec(), &[0, 1]).unwrap();
    put(&src, 1, &[("a", 1), ("b", 2), ("c", 3)]);
    let (image, sealed) = src.at("t", 1).unwrap().export_image(0).unwrap();
    assert!(!sealed);

    // The copier learned the table: its partition is pending.
    let dst = Tables::new(TablesConfig::default());
    dst.adopt_table(spec(), &[0, 1], 1).unwrap();
    dst.adopt_version("t", 1, false).unwrap();
    dst.adopt_current("t", 1).unwrap();
    assert_eq!(get(&dst, 0, "a"), Err(Error::Repairing(0)));
    // Writes meanwhile: b overwritten, c deleted, d new.
    put(&dst, 1, &[("b", 20), ("d", 4)]);
    let mut st = Vec::new();
    dst.delete_batch("t", 1, 0, [&b"c"[..]], &mut st).unwrap();
    assert_eq!(dst.pending("t").unwrap()[0].partitions, [0, 1]);

    dst.import_image("t", 1, 0, &image).unwrap();
    assert_eq!(get(&dst, 0, "a"), Ok(Some(1)), "copied");
    assert_eq!(get(&dst, 0, "b"), Ok(Some(20)), "the later write stands");
    assert_eq!(get(&dst, 0, "c"), Ok(None), "the delete stands");
    assert_eq!(get(&dst, 0, "d"), Ok(Some(4)));
    assert_eq!(
        dst.pending("t").unwrap()[0].partitions,
        [1],
        "partition 1 still pending"
    );
}

#[test]
fn a_sealed_copy_replaces_its_partition_and_a_corrupt_one_changes_nothing() {
    let src = Tables::new(TablesConfig::default());
    src.create_table(spec(), &[0, 1]).unwrap();
    src.create_version("t", 2).unwrap();
    put(&src, 2, &[("x", 9)]);
    src.seal_version("t", 2).unwrap();
    let (image, sealed) = src.at("t", 2).unwrap().export_image(0).unwrap();
    assert!(sealed);

    let dst = Tables::new(TablesConfig::default());
    dst.adopt_table(spec(), &[0, 1], 2).unwrap();
    dst.adopt_version("t", 2, true).unwrap();
    let mut bad = image.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        dst.import_image("t", 2, 0, &bad),
        Err(Error::CorruptImage(_))
    ));
    assert_eq!(
        get(&dst, 2, "x"),
        Err(Error::Repairing(0)),
        "still refused, never empty"
    );
    let reader = dst.at("t", 2).unwrap();
    assert_eq!(dst.import_image("t", 2, 0, &image), Ok(1));
    assert_eq!(get(&dst, 2, "x"), Ok(Some(9)));
    // A handle taken before the copy keeps reading what it saw (the version was rebuilt).
    assert!(reader.is_missing(0));
    drop(reader);
    // Moving away empties the partition and gives its memory back.
    let before = dst.memory_used();
    dst.release_partitions("t", &[0]).unwrap();
    assert!(dst.memory_used() < before);
    assert_eq!(get(&dst, 2, "x"), Ok(None));
}

#[test]
fn a_partition_gained_by_a_move_is_emptied_and_pending() {
    let t = Tables::new(TablesConfig::default());
    t.create_table(spec(), &[0, 1]).unwrap();
    put(&t, 1, &[("stale", 1)]);
    t.mark_pending("t", &[0]).unwrap();
    assert_eq!(get(&t, 1, "stale"), Err(Error::Repairing(0)));
    // Its creator's CREATE_TABLE after all: nothing older to copy.
    t.clear_pending("t").unwrap();
    assert_eq!(
        get(&t, 1, "stale"),
        Ok(None),
        "the stale data went with the mark"
    );
}

#[test]
fn a_replayed_partition_is_reconciled_with_the_copy_or_served_when_none_comes() {
    // The live replica: a replaced, b deleted, c kept, while the restarting server was down.
    let src = Tables::new(TablesConfig::default());
    src.create_table(spec(), &[0, 1]).unwrap();
    put(&src, 1, &[("a", 10), ("c", 3)]);
    let (image, _) = src.at("t", 1).unwrap().export_image(0).unwrap();

    // The restarted server replayed its log (a, b, c as they were) and must reconcile.
    let dst = Tables::new(TablesConfig::default());
    dst.create_table(spec(), &[0, 1]).unwrap();
    put(&dst, 1, &[("a", 1), ("b", 2), ("c", 3), ("e", 5)]);
    dst.mark_replayed_pending("t", 1, &[0], true).unwrap();
    assert_eq!(get(&dst, 1, "a"), Err(Error::Repairing(0)));
    // Written here since the restart: d new, e deleted; both stand whatever the copy says.
    put(&dst, 1, &[("d", 4)]);
    let mut st = Vec::new();
    dst.delete_batch("t", 1, 0, [&b"e"[..]], &mut st).unwrap();

    let (items, dropped) = dst
        .import_image_then("t", 1, 0, &image, |view, dropped| {
            assert_eq!(view.len(), 3, "a, c and d: b dropped, e deleted here");
            dropped.to_vec()
        })
        .unwrap();
    assert_eq!(items, 2);
    assert_eq!(dropped, Some(vec![Box::<[u8]>::from(&b"b"[..])]));
    assert_eq!(
        get(&dst, 1, "a"),
        Err(Error::Repairing(0)),
        "pending until finished"
    );
    // A write between the merge and the finish is kept, even by a retried merge.
    put(&dst, 1, &[("f", 6)]);
    assert_eq!(
        dst.import_image_then("t", 1, 0, &image, |_, d| d.len()),
        Ok((2, Some(0)))
    );
    dst.finish_import("t", 1, 0).unwrap();
    assert_eq!(get(&dst, 1, "f"), Ok(Some(6)));
    assert_eq!(
        get(&dst, 1, "a"),
        Ok(Some(10)),
        "the replica's value replaces the replay"
    );
    assert_eq!(
        get(&dst, 1, "b"),
        Ok(None),
        "deleted on the replica: dropped here"
    );
    assert_eq!(get(&dst, 1, "c"), Ok(Some(3)));
    assert_eq!(get(&dst, 1, "d"), Ok(Some(4)), "written since the restart");
    assert_eq!(get(&dst, 1, "e"), Ok(None), "deleted since the restart");
    assert!(
        !dst.serve_replayed("t", 1, 0).unwrap(),
        "copied: nothing to serve"
    );
    // A second copy arriving late changes nothing: writes since the first are not remembered.
    put(&dst, 1, &[("a", 11), ("z", 26)]);
    assert_eq!(
        dst.import_image_then("t", 1, 0, &image, |_, _| ()),
        Ok((0, None))
    );
    assert_eq!(get(&dst, 1, "a"), Ok(Some(11)));
    assert_eq!(get(&dst, 1, "z"), Ok(Some(26)));

    // No replica gave a copy: the replay is served as it is, but only if marked servable.
    let lone = Tables::new(TablesConfig::default());
    lone.create_table(spec(), &[0, 1]).unwrap();
    put(&lone, 1, &[("a", 1)]);
    lone.mark_replayed_pending("t", 1, &[0], false).unwrap();
    assert!(
        !lone.serve_replayed("t", 1, 0).unwrap(),
        "a damaged log's version waits for a copy"
    );
    assert_eq!(get(&lone, 1, "a"), Err(Error::Repairing(0)));
    let lone = Tables::new(TablesConfig::default());
    lone.create_table(spec(), &[0, 1]).unwrap();
    put(&lone, 1, &[("a", 1)]);
    lone.mark_replayed_pending("t", 1, &[0], true).unwrap();
    assert!(lone.serve_replayed("t", 1, 0).unwrap());
    assert_eq!(get(&lone, 1, "a"), Ok(Some(1)));
    // A partition emptied for a move is never served without its copy.
    lone.mark_pending("t", &[0]).unwrap();
    assert!(!lone.serve_replayed("t", 1, 0).unwrap());
    assert_eq!(get(&lone, 1, "a"), Err(Error::Repairing(0)));
}
