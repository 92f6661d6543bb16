//! Property and unit tests for the native codec: round trips through the writers and the
//! message enums, decode-is-canonical, and no panics on arbitrary bytes.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

const BIG: usize = 1 << 24;

/// (partition, keys, values) groups of a PUT, values in wire form.
type PutGroupsOwned = Vec<(u32, Vec<Vec<u8>>, Vec<Vec<u8>>)>;

fn frame_of(out: &[u8]) -> Frame<'_> {
    let (f, used) = parse_frame(out, BIG).expect("own frame parses");
    assert_eq!(used, out.len(), "exactly one frame");
    f
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..24)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_.é]{0,20}"
}

fn value_type() -> impl Strategy<Value = ValueType> {
    prop_oneof![
        Just(ValueType::Bytes),
        Just(ValueType::I64),
        Just(ValueType::F64),
        (1u32..5).prop_map(ValueType::F32Vec),
    ]
}

fn groups() -> impl Strategy<Value = Vec<(u32, Vec<Vec<u8>>)>> {
    vec((any::<u32>(), vec(key(), 0..6)), 0..5)
}

fn table_info() -> impl Strategy<Value = TableInfo> {
    let version = (1u32.., any::<bool>(), any::<u64>(), any::<u64>()).prop_map(
        |(number, sealed, items, bytes)| VersionInfo {
            number,
            sealed,
            items,
            bytes,
        },
    );
    (
        name(),
        any::<u32>(),
        any::<u32>(),
        value_type(),
        (0u8..3, any::<u64>()),
        (any::<u32>(), any::<u32>()),
        vec(version, 0..4),
    )
        .prop_map(
            |(
                name,
                partitions,
                replication,
                value_type,
                (durability, incarnation),
                (current_version, high_water),
                versions,
            )| TableInfo {
                name,
                partitions,
                replication,
                value_type,
                durability: Durability::from_u8(durability).expect("0..3"),
                incarnation,
                current_version,
                high_water,
                versions,
            },
        )
}

fn error_reply() -> impl Strategy<Value = ErrorReply> {
    (
        1..Status::ALL.len(),
        any::<u64>(),
        vec(any::<u32>(), 0..5),
        ".{0,30}",
    )
        .prop_map(|(i, epoch, parts, msg)| {
            let status = Status::ALL[i];
            ErrorReply {
                status,
                server_epoch: if status == Status::WrongEpoch {
                    epoch
                } else {
                    0
                },
                partitions: if status == Status::NotOwner {
                    parts
                } else {
                    Vec::new()
                },
                message: msg,
            }
        })
}

/// Values for `n` keys of type `vt`: each value in wire form.
fn values_for(vt: ValueType, n: usize) -> BoxedStrategy<Vec<Vec<u8>>> {
    match vt.width() {
        Some(w) => vec(vec(any::<u8>(), w), n).boxed(),
        None => vec(vec(any::<u8>(), 0..40), n).boxed(),
    }
}

fn put_batch() -> impl Strategy<Value = (ValueType, PutGroupsOwned)> {
    value_type().prop_flat_map(|vt| {
        let group = (any::<u32>(), vec(key(), 0..6)).prop_flat_map(move |(p, keys)| {
            let n = keys.len();
            (Just(p), Just(keys), values_for(vt, n))
        });
        (Just(vt), vec(group, 0..4))
    })
}

fn roundtrip_request(req: &Request<'_>, id: u64) {
    let mut out = vec![0xEE]; // encoders append; prior content must survive
    req.encode(&mut out, id).unwrap();
    let f = frame_of(&out[1..]);
    assert_eq!(
        (f.opcode, f.request_id, f.is_response()),
        (req.opcode(), id, false)
    );
    assert_eq!(&Request::decode(&f).unwrap(), req);
}

fn roundtrip_response(resp: &Response<'_>, op: Opcode, id: u64) {
    let mut out = Vec::new();
    resp.encode(&mut out, op, id).unwrap();
    let f = frame_of(&out);
    assert_eq!((f.opcode, f.request_id, f.is_response()), (op, id, true));
    assert_eq!(&Response::decode(&f).unwrap(), resp);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(buf in vec(any::<u8>(), 0..96), max in 0usize..64) {
        if let Ok((f, used)) = parse_frame(&buf, max) {
            prop_assert!(used <= buf.len() && f.body.len() <= max);
        }
        for op in Opcode::ALL {
            // Decoding is canonical: whatever decodes re-encodes to the same bytes.
            if let Ok(req) = Request::decode_body(op, &buf) {
                let mut out = Vec::new();
                req.encode(&mut out, 1).unwrap();
                prop_assert_eq!(&out[HEADER_LEN..], &buf[..]);
            }
            if let Ok(resp) = Response::decode_body(op, &buf) {
                let mut out = Vec::new();
                resp.encode(&mut out, op, 1).unwrap();
                prop_assert_eq!(&out[HEADER_LEN..], &buf[..]);
            }
        }
    }

    #[test]
    fn mutated_frames_never_panic(g in groups(), flips in vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut out = Vec::new();
        encode_get(&mut out, 9, "t", 0, 5, g.iter().map(|(p, ks)| (*p, ks))).unwrap();
        for (at, b) in flips {
            let n = out.len();
            out[at % n] = b;
        }
        if let Ok((f, _)) = parse_frame(&out, BIG) {
            let _ = Request::decode(&f);
            let _ = Response::decode_body(f.opcode, f.body);
        }
    }

    #[test]
    fn incomplete_until_whole(g in groups(), cut in any::<prop::sample::Index>()) {
        let mut out = Vec::new();
        encode_get(&mut out, 3, "tab", 2, 7, g.iter().map(|(p, ks)| (*p, ks))).unwrap();
        let at = cut.index(out.len());
        match parse_frame(&out[..at], BIG) {
            Err(FrameError::Incomplete { needed }) => {
                prop_assert!(needed > at);
                prop_assert!(needed == HEADER_LEN || needed == out.len());
            }
            other => prop_assert!(false, "prefix of {at}/{} gave {other:?}", out.len()),
        }
    }

    #[test]
    fn get_and_delete_round_trip(g in groups(), table in name(), version: u32, epoch: u64, id: u64, del: bool) {
        let mut out = Vec::new();
        let groups = g.iter().map(|(p, ks)| (*p, ks));
        if del {
            encode_delete(&mut out, id, &table, version, epoch, groups).unwrap();
        } else {
            encode_get(&mut out, id, &table, version, epoch, groups).unwrap();
        }
        let f = frame_of(&out);
        let batch = match Request::decode(&f).unwrap() {
            Request::Get(b) if !del => b,
            Request::Delete(b) if del => b,
            other => panic!("wrong request {other:?}"),
        };
        prop_assert_eq!((batch.table, batch.version, batch.epoch), (table.as_str(), version, epoch));
        let got: Vec<(u32, Vec<Vec<u8>>)> =
            batch.groups.iter().map(|gr| (gr.partition, gr.keys.map(<[u8]>::to_vec).collect())).collect();
        prop_assert_eq!(&got, &g);
        prop_assert_eq!(batch.key_count(), g.iter().map(|(_, k)| k.len()).sum::<usize>());
        prop_assert_eq!(batch.keys().count(), batch.key_count());
        roundtrip_request(&Request::Get(batch), id);
    }

    #[test]
    fn put_round_trips((vt, g) in put_batch(), table in name(), version: u32, epoch: u64, id: u64) {
        let mut out = Vec::new();
        let mut w = PutWriter::begin(&mut out, id, &table, version, epoch, vt).unwrap();
        for (p, keys, values) in &g {
            let n = match vt {
                ValueType::Bytes => w.group_bytes(*p, keys, values).unwrap(),
                _ => w.group_packed(*p, keys, &values.concat()).unwrap(),
            };
            prop_assert_eq!(n, keys.len());
        }
        w.finish().unwrap();
        let f = frame_of(&out);
        let Request::Put(put) = Request::decode(&f).unwrap() else { panic!("not a put") };
        prop_assert_eq!((put.table, put.version, put.epoch, put.value_type), (table.as_str(), version, epoch, vt));
        let got: PutGroupsOwned = put
            .groups
            .iter()
            .map(|gr| (gr.partition, gr.keys.map(<[u8]>::to_vec).collect(), gr.values.map(<[u8]>::to_vec).collect()))
            .collect();
        prop_assert_eq!(&got, &g);
        prop_assert_eq!(put.pairs().count(), put.key_count());
        roundtrip_request(&Request::Put(put), id);
    }

    #[test]
    fn get_reply_round_trips(vt in value_type(), answers in vec(prop::option::of(vec(any::<u8>(), 0..20)), 0..20), version: u32, id: u64) {
        let mut out = Vec::new();
        let mut w = GetReplyWriter::begin(&mut out, id, version, vt, answers.len()).unwrap();
        let fit = |v: &Vec<u8>| match vt.width() { Some(n) => { let mut v = v.clone(); v.resize(n, 7); v } None => v.clone() };
        for a in &answers {
            match a {
                Some(v) => w.push_hit(&fit(v)).unwrap(),
                None => w.push_miss().unwrap(),
            }
        }
        w.finish().unwrap();
        let f = frame_of(&out);
        let Response::Get(reply) = Response::decode(&f).unwrap() else { panic!("not a get reply") };
        prop_assert_eq!((reply.version, reply.value_type, reply.len()), (version, vt, answers.len()));
        let got: Vec<Option<Vec<u8>>> = reply.iter().map(|(s, v)| {
            assert_eq!(s == KeyStatus::Ok, v.is_some());
            v.map(<[u8]>::to_vec)
        }).collect();
        let want: Vec<Option<Vec<u8>>> = answers.iter().map(|a| a.as_ref().map(fit)).collect();
        prop_assert_eq!(got, want);
        if let Some(w) = vt.width() {
            prop_assert_eq!(reply.packed_values().unwrap().len(), w * answers.len());
        }
        roundtrip_response(&Response::Get(reply), Opcode::Get, id);
    }

    #[test]
    fn key_status_replies_round_trip(st in vec(0..KeyStatus::ALL.len(), 0..30), id: u64, del: bool) {
        let op = if del { Opcode::Delete } else { Opcode::Put };
        let mut out = Vec::new();
        let mut w = KeyStatusWriter::begin(&mut out, op, id, st.len()).unwrap();
        for &i in &st {
            w.push(KeyStatus::ALL[i]).unwrap();
        }
        w.finish().unwrap();
        let Response::KeyStatuses(ks) = Response::decode(&frame_of(&out)).unwrap() else { panic!() };
        prop_assert_eq!(ks.iter().collect::<Vec<_>>(), st.iter().map(|&i| KeyStatus::ALL[i]).collect::<Vec<_>>());
    }

    #[test]
    fn admin_requests_round_trip(
        n in name(), token in vec(any::<u8>(), 0..40), client in ".{0,20}", parts: u32, repl: u32,
        vt in value_type(), version: u32, spec in vec(any::<u8>(), 0..60), id: u64, pv: u8, creator: u64,
    ) {
        let vr = VersionRef { table: &n, version, creator };
        for req in [
            Request::Hello(Hello { protocol_version: pv, token: &token, client_name: &client }),
            Request::Ping,
            Request::CreateTable(CreateTable { name: &n, partitions: parts, replication: repl, value_type: vt, durability: Durability::Snapshot, incarnation: id }),
            Request::DropTable { name: &n },
            Request::ListTables,
            Request::DescribeTable { name: &n },
            Request::CreateVersion(vr),
            Request::SealVersion(vr),
            Request::SetCurrent(vr),
            Request::DropVersion(vr),
            Request::SetSpec { spec: &spec },
            Request::GetSpec,
        ] {
            roundtrip_request(&req, id);
        }
    }

    #[test]
    fn admin_responses_round_trip(
        tables in vec(table_info(), 0..4), err in error_reply(), sid in ".{0,20}", epoch: u64,
        max_body: u32, spec in vec(any::<u8>(), 0..60), id: u64,
    ) {
        for op in Opcode::ALL {
            roundtrip_response(&Response::Error(err.clone()), op, id);
        }
        roundtrip_response(&Response::Hello(HelloOk { protocol_version: 1, server_id: &sid, epoch, max_body }), Opcode::Hello, id);
        for op in [Opcode::Ping, Opcode::CreateTable, Opcode::DropTable, Opcode::CreateVersion, Opcode::SealVersion, Opcode::SetCurrent, Opcode::DropVersion] {
            roundtrip_response(&Response::Done, op, id);
        }
        roundtrip_response(&Response::Tables(tables.clone()), Opcode::ListTables, id);
        if let Some(t) = tables.first() {
            roundtrip_response(&Response::Table(t.clone()), Opcode::DescribeTable, id);
        }
        roundtrip_response(&Response::SpecSet { epoch }, Opcode::SetSpec, id);
        roundtrip_response(&Response::Spec(SpecReply { epoch, spec: &spec }), Opcode::GetSpec, id);
    }
}

#[test]
fn header_errors_are_distinct_and_early() {
    let mut out = Vec::new();
    Request::Ping.encode(&mut out, 1).unwrap();
    assert_eq!(out.len(), HEADER_LEN);
    assert_eq!(
        parse_frame(&[], 10),
        Err(FrameError::Incomplete { needed: HEADER_LEN })
    );
    assert_eq!(
        parse_frame(b"get foo\r\n", 10),
        Err(FrameError::BadMagic(b'g'))
    );
    assert_eq!(parse_frame(&[0x80], 10), Err(FrameError::BadMagic(0x80)));
    assert_eq!(
        parse_frame(&out[..1], 10),
        Err(FrameError::Incomplete { needed: HEADER_LEN })
    );
    let with = |at: usize, b: u8| {
        let mut o = out.clone();
        o[at] = b;
        parse_frame(&o, 10).map(|(f, n)| (f.opcode, n))
    };
    assert_eq!(with(1, 2), Err(FrameError::UnsupportedVersion(2)));
    assert_eq!(with(2, 0x42), Err(FrameError::UnknownOpcode(0x42)));
    assert_eq!(with(3, 0x08), Err(FrameError::BadFlags(0x08)));
    // A huge announced body is refused from the header alone, before any of it arrives.
    assert_eq!(
        with(7, 0x80),
        Err(FrameError::BodyTooLarge {
            len: 0x8000_0000,
            max: 10
        })
    );
    assert_eq!(
        with(4, 3),
        Err(FrameError::Incomplete {
            needed: HEADER_LEN + 3
        })
    );
    assert_eq!(FrameError::BadMagic(0).kind(), FrameErrorKind::Protocol);
    assert_eq!(
        FrameError::Incomplete { needed: 1 }.kind(),
        FrameErrorKind::Incomplete
    );
    assert!(
        is_native_first_byte(MAGIC) && !is_native_first_byte(b'g') && !is_native_first_byte(0x80)
    );
}

#[test]
fn direction_is_checked() {
    let mut out = Vec::new();
    Request::Ping.encode(&mut out, 1).unwrap();
    assert!(Response::decode(&frame_of(&out)).is_err());
    out.clear();
    Response::Done.encode(&mut out, Opcode::Ping, 1).unwrap();
    assert!(Request::decode(&frame_of(&out)).is_err());
    assert!(Response::Done
        .encode(&mut Vec::new(), Opcode::Get, 1)
        .is_err());
}

#[test]
fn failed_encodes_leave_the_buffer_as_it_was() {
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    let mut out = b"prior".to_vec();
    assert!(encode_get(&mut out, 1, "t", 0, 0, [(0, [&b"ok"[..], &long])]).is_err());
    assert!(encode_get(&mut out, 1, "", 0, 0, [(0, [b"k"])]).is_err());
    assert!(Request::CreateTable(CreateTable {
        name: "t",
        partitions: 1,
        replication: 1,
        value_type: ValueType::F32Vec(0),
        durability: Durability::Memory,
        incarnation: 1,
    })
    .encode(&mut out, 1)
    .is_err());
    {
        let mut w = PutWriter::begin(&mut out, 1, "t", 1, 1, ValueType::I64).unwrap();
        assert!(w.group_i64(0, [b"a", b"b"], &[1]).is_err()); // too few values
        assert!(w.group_bytes(0, [b"a"], [b"x"]).is_err()); // wrong kind
        w.group_i64(0, [b"a"], &[1]).unwrap();
        // dropped without finish
    }
    {
        let mut w = GetReplyWriter::begin(&mut out, 1, 1, ValueType::F64, 2).unwrap();
        assert!(w.push_hit(b"short").is_err());
        w.push_miss().unwrap();
        assert!(w.push_status(KeyStatus::Ok).is_err());
    }
    assert_eq!(out, b"prior");

    // A key group left out on error does not spoil the rest of the frame.
    let mut w = KeyBatchWriter::begin(&mut out, Opcode::Get, 1, "t", 0, 0).unwrap();
    assert!(w.group(1, [&long[..]]).is_err());
    w.group(2, [b"x"]).unwrap();
    w.finish().unwrap();
    let Request::Get(g) = Request::decode(&frame_of(&out[5..])).unwrap() else {
        panic!()
    };
    assert_eq!(g.keys().collect::<Vec<_>>(), [b"x"]);
}

#[test]
fn typed_put_helpers_pack_little_endian() {
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 1, "v", 1, 1, ValueType::F32Vec(2)).unwrap();
    w.group_f32(3, [b"a", b"b"], &[1.0, 2.0, 3.0, -0.5])
        .unwrap();
    assert!(w.group_f32(3, [b"a"], &[1.0]).is_err());
    w.finish().unwrap();
    let Request::Put(p) = Request::decode(&frame_of(&out)).unwrap() else {
        panic!()
    };
    let g = p.groups.iter().next().unwrap();
    let packed: Vec<f32> = g
        .values
        .packed()
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(packed, [1.0, 2.0, 3.0, -0.5]);

    out.clear();
    let mut w = PutWriter::begin(&mut out, 1, "n", 1, 1, ValueType::I64).unwrap();
    w.group_i64(0, [b"a"], &[-2]).unwrap();
    assert!(w.group_f64(0, [b"a"], &[1.0]).is_err());
    w.finish().unwrap();
    let Request::Put(p) = Request::decode(&frame_of(&out)).unwrap() else {
        panic!()
    };
    assert_eq!(p.pairs().next().unwrap().1, (-2i64).to_le_bytes());
}

#[test]
fn the_merge_byte_is_optional_and_round_trips() {
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 1, "n", 1, 1, ValueType::I64).unwrap();
    w.group_i64(0, [b"a"], &[5]).unwrap();
    w.finish().unwrap();
    let plain = out.clone();
    let Request::Put(p) = Request::decode(&frame_of(&plain)).unwrap() else {
        panic!()
    };
    assert_eq!(p.merge, Merge::Store);
    for m in [Merge::Add, Merge::Min, Merge::Max] {
        out.clear();
        let mut w = PutWriter::begin(&mut out, 1, "n", 1, 1, ValueType::I64).unwrap();
        w.set_merge(m);
        w.group_i64(0, [b"a"], &[5]).unwrap();
        w.finish().unwrap();
        // The frame is the plain one plus one byte.
        assert_eq!(out.len(), plain.len() + 1);
        let Request::Put(p) = Request::decode(&frame_of(&out)).unwrap() else {
            panic!()
        };
        assert_eq!(p.merge, m);
        roundtrip_request(&Request::Put(p), 1);
    }
    // A merge byte 0 or above 3, two bytes, a write key 0 or a short one is malformed.
    let body = &plain[HEADER_LEN..];
    let zero_key = [1u8, 0, 0, 0, 0, 0, 0, 0, 0];
    for tail in [
        &[0u8][..],
        &[4],
        &[1, 1],
        &zero_key,
        &[1, 7, 0, 0, 0, 0, 0, 0],
    ] {
        let mut b = body.to_vec();
        b.extend_from_slice(tail);
        assert!(Put::decode(&b).is_err(), "tail {tail:?}");
    }
}

#[test]
fn a_merge_carries_its_write_key_and_a_forward_keeps_it() {
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 1, "n", 1, 1, ValueType::I64).unwrap();
    w.set_merge(Merge::Add);
    w.set_write_key(0xfeed);
    w.group_i64(0, [b"a"], &[5]).unwrap();
    w.group_i64(3, [b"b"], &[6]).unwrap();
    w.finish().unwrap();
    let Request::Put(p) = Request::decode(&frame_of(&out)).unwrap() else {
        panic!()
    };
    assert_eq!((p.merge, p.write_key), (Merge::Add, 0xfeed));
    roundtrip_request(&Request::Put(p), 1);
    let groups: Vec<_> = p.groups.iter().collect();
    let mut fwd = Vec::new();
    p.encode_replica(&mut fwd, 9, 2, &groups[1..]).unwrap();
    let Request::Put(f) = Request::decode(&frame_of(&fwd)).unwrap() else {
        panic!()
    };
    assert_eq!(
        (f.merge, f.write_key, f.groups.iter().count()),
        (Merge::Add, 0xfeed, 1)
    );
    // A store carries none (set_write_key is ignored without a merge).
    out.clear();
    let mut w = PutWriter::begin(&mut out, 1, "n", 1, 1, ValueType::I64).unwrap();
    w.set_write_key(0xfeed);
    w.group_i64(0, [b"a"], &[5]).unwrap();
    w.finish().unwrap();
    let Request::Put(p) = Request::decode(&frame_of(&out)).unwrap() else {
        panic!()
    };
    assert_eq!(p.write_key, 0);
}

#[test]
fn hostile_counts_do_not_allocate_or_panic() {
    // LIST_TABLES reply claiming 4 billion tables in a 10-byte body.
    let body = [0u8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0];
    assert!(Response::decode_body(Opcode::ListTables, &body).is_err());
    // NOT_OWNER claiming 4 billion partitions.
    let body = [2u8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0];
    assert!(Response::decode_body(Opcode::Get, &body).is_err());
    // GET with a huge group count and nothing behind it.
    let mut body = Vec::new();
    body.extend_from_slice(&[1, 0, b't', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    body.extend_from_slice(&[0; 8]); // incarnation
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        KeyBatch::decode(&body),
        Err(FrameError::Truncated("partition"))
    );
}

#[test]
fn a_version_reference_with_an_explicit_zero_creator_is_malformed() {
    // Found by the native_frame fuzz target: a trailing creator 0 decoded, then re-encoded without
    // it, so the frame was not canonical. The spec (6.3) makes the creator non-zero when present.
    let mut body = Vec::new();
    VersionRef::new("t", 3).write(&mut body).unwrap();
    for op in [
        Opcode::CreateVersion,
        Opcode::SealVersion,
        Opcode::SetCurrent,
        Opcode::DropVersion,
    ] {
        assert!(Request::decode_body(op, &body).is_ok());
        let mut zero = body.clone();
        zero.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            Request::decode_body(op, &zero),
            Err(FrameError::Malformed(_))
        ));
        let mut seven = body.clone();
        seven.extend_from_slice(&7u64.to_le_bytes());
        let Ok(
            Request::SealVersion(v)
            | Request::CreateVersion(v)
            | Request::SetCurrent(v)
            | Request::DropVersion(v),
        ) = Request::decode_body(op, &seven)
        else {
            panic!("{op:?} with creator 7 does not decode")
        };
        assert_eq!(v.creator, 7);
    }
}

#[test]
fn kmeans_step_without_components_or_centroids_is_malformed() {
    let data: [u8; 83] = [
        167, 1, 64, 0, 67, 0, 0, 0, 44, 0, 0, 0, 86, 0, 0, 0, 4, 0, 114, 27, 119, 115, 3, 0, 0, 0,
        0, 0, 0, 0, 0, 2, 1, 1, 2, 77, 195, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 254, 255, 1, 5, 0,
        0, 200, 242, 128, 17, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 240, 63, 5, 0, 0, 0, 0, 0, 0,
        0, 249,
    ];
    // A KMEANS_STEP of 0 components and k = 0xF9000005 decoded, then re-encoded with k = 0 (the
    // native_frame fuzz target): a step with no component or no centroid is malformed.
    let (frame, _) = parse_frame(&data, 1 << 16).unwrap();
    assert!(matches!(
        Request::decode(&frame),
        Err(FrameError::Malformed("centroids"))
    ));
}

#[test]
fn a_forward_carries_the_groups_asked_for_under_the_primarys_epoch() {
    let mut out = Vec::new();
    let mut w = PutWriter::begin(&mut out, 7, "t", 3, 11, ValueType::I64).unwrap();
    w.set_incarnation(99);
    w.set_merge(Merge::Add);
    w.set_ack_one();
    for p in 0..3u32 {
        let keys = [format!("k{p}a"), format!("k{p}b")];
        w.group_i64(
            p,
            keys.iter().map(|k| k.as_bytes()),
            &[p as i64, 10 + p as i64],
        )
        .unwrap();
    }
    w.finish().unwrap();
    let (frame, _) = parse_frame(&out, 1 << 20).unwrap();
    assert_eq!(frame.flags, FLAG_ACK_ONE);
    let Request::Put(put) = Request::decode(&frame).unwrap() else {
        panic!("not a PUT")
    };
    let groups: Vec<PutGroup<'_>> = put.groups.iter().collect();
    let mut fwd = Vec::new();
    put.encode_replica(&mut fwd, 42, 12, [&groups[0], &groups[2]])
        .unwrap();
    let (f2, used) = parse_frame(&fwd, 1 << 20).unwrap();
    assert_eq!(
        (f2.flags, f2.request_id, used),
        (FLAG_REPLICA, 42, fwd.len())
    );
    let Request::Put(p2) = Request::decode(&f2).unwrap() else {
        panic!("not a PUT")
    };
    assert_eq!(
        (p2.table, p2.version, p2.epoch, p2.incarnation),
        ("t", 3, 12, 99)
    );
    assert_eq!(p2.merge, Merge::Add);
    let parts: Vec<u32> = p2.groups.iter().map(|g| g.partition).collect();
    assert_eq!(parts, [0, 2]);
    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
        p2.pairs().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
    assert_eq!(pairs[2], (b"k2a".to_vec(), 2i64.to_le_bytes().to_vec()));

    // A DELETE's forward the same way.
    let mut out = Vec::new();
    let mut d = KeyBatchWriter::begin(&mut out, Opcode::Delete, 1, "t", 3, 11).unwrap();
    d.group(4, [b"x".as_slice(), b"y".as_slice()]).unwrap();
    d.group(5, [b"z".as_slice()]).unwrap();
    d.finish().unwrap();
    let (frame, _) = parse_frame(&out, 1 << 20).unwrap();
    let Request::Delete(b) = Request::decode(&frame).unwrap() else {
        panic!("not a DELETE")
    };
    let groups: Vec<KeyGroup<'_>> = b.groups.iter().collect();
    let mut fwd = Vec::new();
    b.encode_replica(&mut fwd, 2, 12, [&groups[1]]).unwrap();
    let (f2, _) = parse_frame(&fwd, 1 << 20).unwrap();
    let Request::Delete(b2) = Request::decode(&f2).unwrap() else {
        panic!("not a DELETE")
    };
    assert_eq!(f2.flags, FLAG_REPLICA);
    assert_eq!(b2.keys().collect::<Vec<_>>(), [b"z".as_slice()]);
}
