//! Checks the shared test vectors in `tests/vectors/` against the Rust codec: for every frame
//! vector, encoding its fields gives exactly its bytes and decoding its bytes gives exactly its
//! fields; bad frames fail with the named error; cluster vectors (partition_of, epochs, rendezvous
//! scores, partition maps) match. python/tests/unit/test_vectors.py checks the same files.
//!
//! `RAMGRID_BLESS_VECTORS=1 cargo test -p ramgrid-proto --test vectors` rewrites the expected
//! outputs from the Rust implementation instead (for new vectors; review the diff).

use std::path::PathBuf;

use ramgrid_proto::cluster::{epoch_of, partition_of, rendezvous_score, ClusterSpec, PartitionMap};
use ramgrid_proto::native::*;
use serde_json::{json, Map, Value};

fn vectors_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/vectors")
        .join(file)
}

fn load(file: &str) -> Value {
    let text = std::fs::read_to_string(vectors_path(file)).expect("vector file");
    serde_json::from_str(&text).expect("vector JSON")
}

fn bless() -> bool {
    std::env::var_os("RAMGRID_BLESS_VECTORS").is_some_and(|v| v == "1")
}

/// Writes each section's vectors one per line so diffs stay readable.
fn save(file: &str, doc: &Value) {
    let mut s = String::from("{\n");
    let sections = doc.as_object().unwrap();
    for (i, (name, items)) in sections.iter().enumerate() {
        s.push_str(&format!("  {}: [\n", json!(name)));
        let items = items.as_array().unwrap();
        for (j, item) in items.iter().enumerate() {
            let comma = if j + 1 < items.len() { "," } else { "" };
            s.push_str(&format!(
                "    {}{comma}\n",
                serde_json::to_string(item).unwrap()
            ));
        }
        let comma = if i + 1 < sections.len() { "," } else { "" };
        s.push_str(&format!("  ]{comma}\n"));
    }
    s.push_str("}\n");
    std::fs::write(vectors_path(file), s).unwrap();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    s.as_bytes()
        .chunks(2)
        .map(|c| {
            assert_eq!(c.len(), 2, "odd hex {s:?}");
            u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).expect("hex")
        })
        .collect()
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected an unsigned integer, got {v}"))
}

fn u32_(v: &Value) -> u32 {
    u32::try_from(u(v)).expect("u32")
}

fn arr(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
}

fn vt_to_json(vt: ValueType) -> Value {
    match vt {
        ValueType::Bytes => json!({"kind": "bytes", "dim": 0}),
        ValueType::I64 => json!({"kind": "i64", "dim": 0}),
        ValueType::F64 => json!({"kind": "f64", "dim": 0}),
        ValueType::F32Vec(d) => json!({"kind": "f32vec", "dim": d}),
    }
}

fn vt_from_json(v: &Value) -> ValueType {
    match (s(&v["kind"]), u32_(&v["dim"])) {
        ("bytes", 0) => ValueType::Bytes,
        ("i64", 0) => ValueType::I64,
        ("f64", 0) => ValueType::F64,
        ("f32vec", d) => ValueType::F32Vec(d),
        other => panic!("bad value type {other:?}"),
    }
}

/// A value in JSON form -> its wire bytes for `vt`.
fn value_bytes(vt: ValueType, v: &Value) -> Vec<u8> {
    match vt {
        ValueType::Bytes => unhex(s(v)),
        ValueType::I64 => v.as_i64().expect("i64").to_le_bytes().to_vec(),
        ValueType::F64 => v.as_f64().expect("f64").to_le_bytes().to_vec(),
        ValueType::F32Vec(_) => arr(v)
            .iter()
            .flat_map(|x| (x.as_f64().expect("f32") as f32).to_le_bytes())
            .collect(),
    }
}

/// Wire bytes of one value -> JSON.
fn value_json(vt: ValueType, b: &[u8]) -> Value {
    match vt {
        ValueType::Bytes => json!(hex(b)),
        ValueType::I64 => json!(i64::from_le_bytes(b.try_into().unwrap())),
        ValueType::F64 => json!(f64::from_le_bytes(b.try_into().unwrap())),
        ValueType::F32Vec(_) => {
            let xs: Vec<f64> = b
                .chunks(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .collect();
            json!(xs)
        }
    }
}

fn durability_from_json(d: &Value) -> Durability {
    match s(d) {
        "memory" => Durability::Memory,
        "snapshot" => Durability::Snapshot,
        "log" => Durability::Log,
        other => panic!("unknown durability {other:?}"),
    }
}

fn durability_to_json(d: Durability) -> Value {
    json!(match d {
        Durability::Memory => "memory",
        Durability::Snapshot => "snapshot",
        Durability::Log => "log",
    })
}

fn table_from_json(t: &Value) -> TableInfo {
    TableInfo {
        name: s(&t["name"]).to_owned(),
        partitions: u32_(&t["partitions"]),
        replication: u32_(&t["replication"]),
        value_type: vt_from_json(&t["value_type"]),
        durability: durability_from_json(&t["durability"]),
        incarnation: u(&t["incarnation"]),
        current_version: u32_(&t["current_version"]),
        high_water: u32_(&t["high_water"]),
        versions: arr(&t["versions"])
            .iter()
            .map(|v| VersionInfo {
                number: u32_(&v["number"]),
                sealed: v["sealed"].as_bool().unwrap(),
                items: u(&v["items"]),
                bytes: u(&v["bytes"]),
            })
            .collect(),
    }
}

fn table_json(t: &TableInfo) -> Value {
    let versions: Vec<Value> = t
        .versions
        .iter()
        .map(
            |v| json!({"number": v.number, "sealed": v.sealed, "items": v.items, "bytes": v.bytes}),
        )
        .collect();
    json!({
        "name": t.name, "partitions": t.partitions, "replication": t.replication,
        "value_type": vt_to_json(t.value_type), "durability": durability_to_json(t.durability),
        "incarnation": t.incarnation, "current_version": t.current_version, "high_water": t.high_water,
        "versions": versions,
    })
}

fn keys_of(g: &Value) -> Vec<Vec<u8>> {
    arr(&g["keys_hex"]).iter().map(|k| unhex(s(k))).collect()
}

fn encode_request(op: Opcode, id: u64, f: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match op {
        Opcode::Operator => {
            let parts: Vec<u32> = arr(&f["partitions"]).iter().map(u32_).collect();
            let nums = |k: &str| f64_bytes(&f64s_json(&f[k]));
            let (edges, weights, centroids) = (nums("edges"), nums("weights"), nums("centroids"));
            let pred = predicate_from_json(&f["predicate"]);
            let operator = match OpKind::from_name(s(&f["operator"])).expect("operator name") {
                OpKind::Count => Operator::Count { predicate: pred },
                OpKind::Stats => Operator::Stats {
                    column: u32_(&f["column"]),
                    predicate: pred,
                },
                OpKind::Histogram => Operator::Histogram {
                    column: u32_(&f["column"]),
                    predicate: pred,
                    edges: F64s::new(&edges),
                },
                OpKind::LrGradient => Operator::LrGradient {
                    weights: F64s::new(&weights),
                },
                OpKind::KmeansStep => Operator::KmeansStep {
                    components: u32_(&f["components"]),
                    centroids: F64s::new(&centroids),
                },
                OpKind::TopK => Operator::TopK {
                    column: u32_(&f["column"]),
                    k: u32_(&f["k"]),
                    largest: f["largest"].as_bool().expect("largest"),
                    predicate: pred,
                },
            };
            let (t, v, e) = batch_head(f);
            encode_op(
                &mut out,
                id,
                t,
                v,
                e,
                u(&f["incarnation"]),
                &parts,
                &operator,
            )
            .unwrap();
        }
        Opcode::Scan => {
            let (t, v, e) = batch_head(f);
            let req = ScanRequest {
                table: t,
                version: v,
                epoch: e,
                incarnation: u(&f["incarnation"]),
                partition: u32_(&f["partition"]),
                cursor: Cursor {
                    position: u(&f["position"]),
                    generation: u(&f["generation"]),
                },
                max_items: u32_(&f["max_items"]),
                max_bytes: u32_(&f["max_bytes"]),
                predicate: predicate_from_json(&f["predicate"]),
            };
            encode_scan(&mut out, id, &req).unwrap();
        }
        Opcode::Get | Opcode::Delete => {
            let (t, v, e) = batch_head(f);
            let mut w = KeyBatchWriter::begin(&mut out, op, id, t, v, e).unwrap();
            w.set_incarnation(u(&f["incarnation"]));
            for g in arr(&f["groups"]) {
                w.group(u32_(&g["partition"]), keys_of(g)).unwrap();
            }
            w.finish().unwrap();
        }
        Opcode::Put => {
            let (t, v, e) = batch_head(f);
            let vt = vt_from_json(&f["value_type"]);
            let mut w = PutWriter::begin(&mut out, id, t, v, e, vt).unwrap();
            w.set_incarnation(u(&f["incarnation"]));
            for g in arr(&f["groups"]) {
                let (p, keys, values) = (u32_(&g["partition"]), keys_of(g), arr(&g["values"]));
                // Each value type goes through its own typed helper, as a client would call it.
                match vt {
                    ValueType::Bytes => {
                        w.group_bytes(p, &keys, values.iter().map(|v| unhex(s(v))))
                            .unwrap();
                    }
                    ValueType::I64 => {
                        let v: Vec<i64> = values.iter().map(|v| v.as_i64().unwrap()).collect();
                        w.group_i64(p, &keys, &v).unwrap();
                    }
                    ValueType::F64 => {
                        let v: Vec<f64> = values.iter().map(|v| v.as_f64().unwrap()).collect();
                        w.group_f64(p, &keys, &v).unwrap();
                    }
                    ValueType::F32Vec(_) => {
                        let v: Vec<f32> = values
                            .iter()
                            .flat_map(arr)
                            .map(|x| x.as_f64().unwrap() as f32)
                            .collect();
                        w.group_f32(p, &keys, &v).unwrap();
                    }
                }
            }
            w.finish().unwrap();
        }
        _ => {
            let token = f.get("token_hex").map(|t| unhex(s(t))).unwrap_or_default();
            let spec = f.get("spec_hex").map(|t| unhex(s(t))).unwrap_or_default();
            let name = || s(&f["name"]);
            let digest_parts = match op {
                Opcode::Digest | Opcode::Repair => {
                    partition_bytes(&arr(&f["partitions"]).iter().map(u32_).collect::<Vec<_>>())
                }
                _ => Vec::new(),
            };
            let vr = || VersionRef {
                table: s(&f["table"]),
                version: u32_(&f["version"]),
                creator: f.get("creator").map(u).unwrap_or(0),
            };
            let req = match op {
                Opcode::Hello => Request::Hello(Hello {
                    protocol_version: u8::try_from(u(&f["protocol_version"])).unwrap(),
                    token: &token,
                    client_name: s(&f["client_name"]),
                }),
                Opcode::Ping => Request::Ping,
                Opcode::CreateTable => Request::CreateTable(CreateTable {
                    name: name(),
                    partitions: u32_(&f["partitions"]),
                    replication: u32_(&f["replication"]),
                    value_type: vt_from_json(&f["value_type"]),
                    durability: durability_from_json(&f["durability"]),
                    incarnation: u(&f["incarnation"]),
                }),
                Opcode::DropTable => Request::DropTable { name: name() },
                Opcode::ListTables => Request::ListTables,
                Opcode::DescribeTable => Request::DescribeTable { name: name() },
                Opcode::CreateVersion => Request::CreateVersion(vr()),
                Opcode::SealVersion => Request::SealVersion(vr()),
                Opcode::SetCurrent => Request::SetCurrent(vr()),
                Opcode::DropVersion => Request::DropVersion(vr()),
                Opcode::SetSpec => Request::SetSpec { spec: &spec },
                Opcode::GetSpec => Request::GetSpec,
                Opcode::ClusterStatus => Request::ClusterStatus,
                Opcode::Recover => Request::Recover {
                    mode: match s(&f["mode"]) {
                        "lead" => RecoverMode::Lead,
                        _ => RecoverMode::Join,
                    },
                    generation: u(&f["generation"]),
                },
                Opcode::Digest => Request::Digest(DigestRequest::new(
                    s(&f["table"]),
                    u32_(&f["version"]),
                    &digest_parts,
                )),
                Opcode::Repair => Request::Repair(DigestRequest::new(
                    s(&f["table"]),
                    u32_(&f["version"]),
                    &digest_parts,
                )),
                Opcode::Raft => Request::Raft {
                    message: s(&f["message"]).as_bytes(),
                },
                Opcode::Metrics => Request::Metrics,
                Opcode::ExportPartition => Request::ExportPartition(ExportRequest {
                    table: s(&f["table"]),
                    incarnation: u(&f["incarnation"]),
                    version: u32_(&f["version"]),
                    partition: u32_(&f["partition"]),
                    epoch: u(&f["epoch"]),
                    export_id: u(&f["export_id"]),
                    offset: u(&f["offset"]),
                    max_len: u32_(&f["max_len"]),
                }),
                Opcode::Get | Opcode::Put | Opcode::Delete | Opcode::Operator | Opcode::Scan => {
                    unreachable!()
                }
            };
            req.encode(&mut out, id).unwrap();
        }
    }
    out
}

fn batch_head(f: &Value) -> (&str, u32, u64) {
    (s(&f["table"]), u32_(&f["version"]), u(&f["epoch"]))
}

fn encode_response(op: Opcode, id: u64, f: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let status = Status::from_name(s(&f["status"])).expect("status name");
    if status != Status::Ok {
        let e = ErrorReply {
            status,
            server_epoch: f.get("server_epoch").map(u).unwrap_or(0),
            partitions: f
                .get("partitions")
                .map(|p| arr(p).iter().map(u32_).collect())
                .unwrap_or_default(),
            message: s(&f["message"]).to_owned(),
        };
        encode_error(&mut out, op, id, &e).unwrap();
        return out;
    }
    let key_statuses = || -> Vec<KeyStatus> {
        arr(&f["statuses"])
            .iter()
            .map(|k| KeyStatus::from_name(s(k)).expect("key status"))
            .collect()
    };
    let spec = f.get("spec_hex").map(|t| unhex(s(t))).unwrap_or_default();
    let chunk = f.get("chunk_hex").map(|t| unhex(s(t))).unwrap_or_default();
    let resp = match op {
        Opcode::Get => {
            let vt = vt_from_json(&f["value_type"]);
            let st = key_statuses();
            let mut w =
                GetReplyWriter::begin(&mut out, id, u32_(&f["version"]), vt, st.len()).unwrap();
            for (k, v) in st.iter().zip(arr(&f["values"])) {
                match k {
                    KeyStatus::Ok => w.push_hit(&value_bytes(vt, v)).unwrap(),
                    other => w.push_status(*other).unwrap(),
                }
            }
            w.finish().unwrap();
            return out;
        }
        Opcode::Scan => {
            let vt = vt_from_json(&f["value_type"]);
            let head = PageHead {
                version: u32_(&f["version"]),
                incarnation: u(&f["incarnation"]),
                partition: u32_(&f["partition"]),
                generation: u(&f["generation"]),
                state: PageState::from_name(s(&f["state"])).expect("page state"),
                next: u(&f["next"]),
                value_type: vt,
            };
            let keys: Vec<Vec<u8>> = arr(&f["keys_hex"]).iter().map(|k| unhex(s(k))).collect();
            let values: Vec<Vec<u8>> = arr(&f["values"])
                .iter()
                .map(|v| value_bytes(vt, v))
                .collect();
            encode_scan_page(
                &mut out,
                id,
                &head,
                keys.len(),
                |o| {
                    for k in &keys {
                        o.extend_from_slice(&(k.len() as u16).to_le_bytes());
                        o.extend_from_slice(k);
                    }
                },
                |o| {
                    for v in &values {
                        if vt == ValueType::Bytes {
                            o.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        }
                        o.extend_from_slice(v);
                    }
                },
            )
            .unwrap();
            return out;
        }
        Opcode::Put | Opcode::Delete => {
            let st = key_statuses();
            let mut w = KeyStatusWriter::begin(&mut out, op, id, st.len()).unwrap();
            for k in st {
                w.push(k).unwrap();
            }
            w.finish().unwrap();
            return out;
        }
        Opcode::Hello => Response::Hello(HelloOk {
            protocol_version: u8::try_from(u(&f["protocol_version"])).unwrap(),
            server_id: s(&f["server_id"]),
            epoch: u(&f["epoch"]),
            max_body: u32_(&f["max_body"]),
        }),
        Opcode::ListTables => {
            Response::Tables(arr(&f["tables"]).iter().map(table_from_json).collect())
        }
        Opcode::DescribeTable => Response::Table(table_from_json(&f["table"])),
        Opcode::SetSpec => Response::SpecSet {
            epoch: u(&f["epoch"]),
        },
        Opcode::GetSpec => Response::Spec(SpecReply {
            epoch: u(&f["epoch"]),
            spec: &spec,
        }),
        Opcode::ExportPartition => Response::Export(ExportChunk {
            export_id: u(&f["export_id"]),
            total: u(&f["total"]),
            sealed: f["sealed"].as_bool().expect("bool"),
            chunk: &chunk,
        }),
        Opcode::ClusterStatus | Opcode::Recover => Response::Status(s(&f["text"])),
        Opcode::Raft => Response::Raft(s(&f["message"]).as_bytes()),
        Opcode::Digest => {
            let entries: Vec<PartitionDigest> = arr(&f["digests"])
                .iter()
                .map(|d| PartitionDigest {
                    partition: u32_(&d["partition"]),
                    state: match s(&d["state"]) {
                        "held" => DigestState::Held,
                        "not_held" => DigestState::NotHeld,
                        _ => DigestState::Copying,
                    },
                    items: u(&d["items"]),
                    digest: u(&d["digest"]),
                })
                .collect();
            let mut raw = Vec::new();
            DigestReply::encode_entries(&entries, &mut raw);
            Response::Digest(DigestReply::view(&raw))
                .encode(&mut out, op, id)
                .unwrap();
            return out;
        }
        Opcode::Metrics => Response::Metrics(s(&f["text"])),
        Opcode::Operator => Response::Operator(op_reply_from_json(f)),
        _ => Response::Done,
    };
    resp.encode(&mut out, op, id).unwrap();
    out
}

fn request_json(req: &Request<'_>) -> Value {
    let batch = |b: &KeyBatch<'_>| {
        let groups: Vec<Value> = b
            .groups
            .iter()
            .map(|g| json!({"partition": g.partition, "keys_hex": g.keys.map(hex).collect::<Vec<_>>()}))
            .collect();
        json!({
            "table": b.table, "version": b.version, "epoch": b.epoch, "incarnation": b.incarnation,
            "groups": groups,
        })
    };
    let vr = |v: &VersionRef<'_>| match v.creator {
        0 => json!({"table": v.table, "version": v.version}),
        c => json!({"table": v.table, "version": v.version, "creator": c}),
    };
    match req {
        Request::Hello(h) => json!({
            "protocol_version": h.protocol_version, "token_hex": hex(h.token), "client_name": h.client_name,
        }),
        Request::Ping
        | Request::ListTables
        | Request::GetSpec
        | Request::ClusterStatus
        | Request::Metrics => json!({}),
        Request::Raft { message } => json!({
            "message": std::str::from_utf8(message).expect("RAFT vectors carry text"),
        }),
        Request::Recover { mode, generation } => json!({
            "mode": match mode { RecoverMode::Lead => "lead", RecoverMode::Join => "join" },
            "generation": generation,
        }),
        Request::Digest(d) | Request::Repair(d) => json!({
            "table": d.table, "version": d.version,
            "partitions": d.partitions().collect::<Vec<_>>(),
        }),
        Request::ExportPartition(x) => json!({
            "table": x.table, "incarnation": x.incarnation, "version": x.version,
            "partition": x.partition, "epoch": x.epoch, "export_id": x.export_id,
            "offset": x.offset, "max_len": x.max_len,
        }),
        Request::CreateTable(c) => json!({
            "name": c.name, "partitions": c.partitions, "replication": c.replication,
            "value_type": vt_to_json(c.value_type), "durability": durability_to_json(c.durability),
            "incarnation": c.incarnation,
        }),
        Request::DropTable { name } | Request::DescribeTable { name } => json!({ "name": name }),
        Request::CreateVersion(v)
        | Request::SealVersion(v)
        | Request::SetCurrent(v)
        | Request::DropVersion(v) => vr(v),
        Request::SetSpec { spec } => json!({"spec_hex": hex(spec)}),
        Request::Get(b) | Request::Delete(b) => batch(b),
        Request::Operator(o) => op_request_json(o),
        Request::Scan(q) => json!({
            "table": q.table, "version": q.version, "epoch": q.epoch, "incarnation": q.incarnation,
            "partition": q.partition, "position": q.cursor.position,
            "generation": q.cursor.generation, "max_items": q.max_items,
            "max_bytes": q.max_bytes,
            "predicate": q.predicate.map_or(Value::Null, |p| json!({"component": p.component, "lo": p.lo, "hi": p.hi})),
        }),
        Request::Put(p) => {
            let groups: Vec<Value> = p
                .groups
                .iter()
                .map(|g| {
                    json!({
                        "partition": g.partition,
                        "keys_hex": g.keys.map(hex).collect::<Vec<_>>(),
                        "values": g.values.map(|v| value_json(p.value_type, v)).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "table": p.table, "version": p.version, "epoch": p.epoch,
                "incarnation": p.incarnation, "value_type": vt_to_json(p.value_type), "groups": groups,
            })
        }
    }
}

fn response_json(resp: &Response<'_>) -> Value {
    let mut m = Map::new();
    let status = match resp {
        Response::Error(e) => e.status.name(),
        _ => "OK",
    };
    m.insert("status".into(), json!(status));
    let mut put = |k: &str, v: Value| m.insert(k.into(), v);
    match resp {
        Response::Error(e) => {
            if e.status == Status::WrongEpoch {
                put("server_epoch", json!(e.server_epoch));
            }
            if matches!(e.status, Status::NotOwner | Status::Repairing) {
                put("partitions", json!(e.partitions));
            }
            put("message", json!(e.message));
        }
        Response::Hello(h) => {
            put("protocol_version", json!(h.protocol_version));
            put("server_id", json!(h.server_id));
            put("epoch", json!(h.epoch));
            put("max_body", json!(h.max_body));
        }
        Response::Done => {}
        Response::Tables(ts) => {
            put("tables", Value::Array(ts.iter().map(table_json).collect()));
        }
        Response::Table(t) => {
            put("table", table_json(t));
        }
        Response::Export(x) => {
            put("export_id", json!(x.export_id));
            put("total", json!(x.total));
            put("sealed", json!(x.sealed));
            put("chunk_hex", json!(hex(x.chunk)));
        }
        Response::Status(text) | Response::Metrics(text) => {
            put("text", json!(text));
        }
        Response::Digest(d) => {
            let state = |s: DigestState| match s {
                DigestState::Held => "held",
                DigestState::NotHeld => "not_held",
                DigestState::Copying => "copying",
            };
            put(
                "digests",
                Value::Array(
                    d.iter()
                        .map(|e| {
                            json!({
                                "partition": e.partition, "state": state(e.state),
                                "items": e.items, "digest": e.digest,
                            })
                        })
                        .collect(),
                ),
            );
        }
        Response::Raft(m) => {
            put(
                "message",
                json!(std::str::from_utf8(m).expect("RAFT vectors carry text")),
            );
        }
        Response::SpecSet { epoch } => {
            put("epoch", json!(epoch));
        }
        Response::Spec(sp) => {
            put("epoch", json!(sp.epoch));
            put("spec_hex", json!(hex(sp.spec)));
        }
        Response::Get(g) => {
            put("version", json!(g.version));
            put("value_type", vt_to_json(g.value_type));
            let (st, vals): (Vec<Value>, Vec<Value>) = g
                .iter()
                .map(|(k, v)| {
                    (
                        json!(k.name()),
                        v.map_or(Value::Null, |b| value_json(g.value_type, b)),
                    )
                })
                .unzip();
            put("statuses", Value::Array(st));
            put("values", Value::Array(vals));
        }
        Response::KeyStatuses(ks) => {
            put("statuses", ks.iter().map(|k| json!(k.name())).collect());
        }
        Response::Scan(r) => {
            let h = &r.head;
            put("version", json!(h.version));
            put("incarnation", json!(h.incarnation));
            put("partition", json!(h.partition));
            put("generation", json!(h.generation));
            put("state", json!(h.state.name()));
            put("next", json!(h.next));
            put("value_type", vt_to_json(h.value_type));
            put("keys_hex", r.keys.map(hex).collect());
            put(
                "values",
                r.values.map(|v| value_json(h.value_type, v)).collect(),
            );
        }
        Response::Operator(r) => {
            put("version", json!(r.version));
            put("operator", json!(r.kind.name()));
            put("results", r.results.iter().map(outcome_json).collect());
        }
    }
    Value::Object(m)
}

fn f64s_json(v: &Value) -> Vec<f64> {
    match v {
        Value::Null => Vec::new(),
        v => arr(v).iter().map(|x| x.as_f64().expect("number")).collect(),
    }
}

fn predicate_from_json(v: &Value) -> Option<Predicate> {
    (!v.is_null()).then(|| Predicate {
        component: u32_(&v["component"]),
        lo: v["lo"].as_f64().expect("lo"),
        hi: v["hi"].as_f64().expect("hi"),
    })
}

fn op_request_json(o: &OpRequest<'_>) -> Value {
    let pred = |p: &Option<Predicate>| {
        p.map_or(
            Value::Null,
            |p| json!({"component": p.component, "lo": p.lo, "hi": p.hi}),
        )
    };
    let mut v = json!({
        "table": o.table, "version": o.version, "epoch": o.epoch, "incarnation": o.incarnation,
        "partitions": o.partitions.iter().collect::<Vec<_>>(), "operator": o.op.kind().name(),
    });
    let m = v.as_object_mut().unwrap();
    match &o.op {
        Operator::Count { predicate } => {
            m.insert("predicate".into(), pred(predicate));
        }
        Operator::Stats { column, predicate } => {
            m.insert("column".into(), json!(column));
            m.insert("predicate".into(), pred(predicate));
        }
        Operator::Histogram {
            column,
            predicate,
            edges,
        } => {
            m.insert("column".into(), json!(column));
            m.insert("predicate".into(), pred(predicate));
            m.insert("edges".into(), json!(edges.to_vec()));
        }
        Operator::LrGradient { weights } => {
            m.insert("weights".into(), json!(weights.to_vec()));
        }
        Operator::KmeansStep {
            components,
            centroids,
        } => {
            m.insert("components".into(), json!(components));
            m.insert("centroids".into(), json!(centroids.to_vec()));
        }
        Operator::TopK {
            column,
            k,
            largest,
            predicate,
        } => {
            m.insert("column".into(), json!(column));
            m.insert("k".into(), json!(k));
            m.insert("largest".into(), json!(largest));
            m.insert("predicate".into(), pred(predicate));
        }
    }
    v
}

fn outcome_json((p, o): &(u32, Outcome)) -> Value {
    match o {
        Outcome::Refused { status, message } => {
            json!({"partition": p, "status": status.name(), "message": message})
        }
        Outcome::Done(partial) => {
            let pj = match partial {
                Partial::Count { matched, scanned } => {
                    json!({"matched": matched, "scanned": scanned})
                }
                Partial::Stats(st) => json!({
                    "count": st.count, "sum": st.sum, "min": st.min, "max": st.max,
                    "mean": st.mean, "m2": st.m2,
                }),
                Partial::Histogram(b) => json!({ "bins": b }),
                Partial::LrGradient {
                    rows,
                    loss,
                    gradient,
                } => json!({"rows": rows, "loss": loss, "gradient": gradient}),
                Partial::KmeansStep {
                    components,
                    counts,
                    sums,
                    inertia,
                } => json!({
                    "components": components, "counts": counts, "sums": sums, "inertia": inertia,
                }),
                Partial::TopK(items) => json!({
                    "keys_hex": items.iter().map(|(k, _)| hex(k)).collect::<Vec<_>>(),
                    "values": items.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
                }),
            };
            json!({"partition": p, "status": "OK", "partial": pj})
        }
    }
}

fn op_reply_from_json(f: &Value) -> OpReply {
    let kind = OpKind::from_name(s(&f["operator"])).expect("operator name");
    let num = |v: &Value| v.as_f64().expect("number");
    let results = arr(&f["results"])
        .iter()
        .map(|r| {
            let p = u32_(&r["partition"]);
            let status = Status::from_name(s(&r["status"])).expect("status");
            if status != Status::Ok {
                return (
                    p,
                    Outcome::Refused {
                        status,
                        message: s(&r["message"]).to_owned(),
                    },
                );
            }
            let q = &r["partial"];
            let partial = match kind {
                OpKind::Count => Partial::Count {
                    matched: u(&q["matched"]),
                    scanned: u(&q["scanned"]),
                },
                OpKind::Stats => Partial::Stats(Stats {
                    count: u(&q["count"]),
                    sum: num(&q["sum"]),
                    min: num(&q["min"]),
                    max: num(&q["max"]),
                    mean: num(&q["mean"]),
                    m2: num(&q["m2"]),
                }),
                OpKind::Histogram => Partial::Histogram(arr(&q["bins"]).iter().map(u).collect()),
                OpKind::LrGradient => Partial::LrGradient {
                    rows: u(&q["rows"]),
                    loss: num(&q["loss"]),
                    gradient: f64s_json(&q["gradient"]),
                },
                OpKind::KmeansStep => Partial::KmeansStep {
                    components: u32_(&q["components"]),
                    counts: arr(&q["counts"]).iter().map(u).collect(),
                    sums: f64s_json(&q["sums"]),
                    inertia: num(&q["inertia"]),
                },
                OpKind::TopK => Partial::TopK(
                    arr(&q["keys_hex"])
                        .iter()
                        .zip(arr(&q["values"]))
                        .map(|(k, v)| (unhex(s(k)), num(v)))
                        .collect(),
                ),
            };
            (p, Outcome::Done(partial))
        })
        .collect();
    OpReply {
        version: u32_(&f["version"]),
        kind,
        results,
    }
}

/// JSON equality where numbers compare by value (a float 3.0 equals an integer 3).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn decode_frame_json(bytes: &[u8]) -> (Opcode, bool, u64, Value) {
    let (frame, used) = parse_frame(bytes, 1 << 24).expect("vector frame parses");
    assert_eq!(used, bytes.len(), "vector holds exactly one frame");
    let fields = if frame.is_response() {
        response_json(&Response::decode(&frame).expect("response decodes"))
    } else {
        request_json(&Request::decode(&frame).expect("request decodes"))
    };
    (frame.opcode, frame.is_response(), frame.request_id, fields)
}

/// Checks (or, blessing, rewrites) every frame vector of `file`; returns the (opcode, response)
/// pairs it covers.
fn check_frame_file(file: &str) -> std::collections::HashSet<(Opcode, bool)> {
    let mut doc = load(file);
    let mut seen = std::collections::HashSet::new();
    for v in doc["frames"].as_array_mut().unwrap() {
        let name = s(&v["name"]).to_owned();
        let op = Opcode::from_name(s(&v["opcode"])).unwrap_or_else(|| panic!("{name}: opcode"));
        let response = v["response"].as_bool().unwrap();
        let id = u(&v["request_id"]);
        seen.insert((op, response));
        let encoded = if response {
            encode_response(op, id, &v["fields"])
        } else {
            encode_request(op, id, &v["fields"])
        };
        if bless() {
            v["hex"] = json!(hex(&encoded));
            continue;
        }
        assert_eq!(hex(&encoded), s(&v["hex"]), "{name}: encode(fields) != hex");
        let (dop, dresp, did, fields) = decode_frame_json(&unhex(s(&v["hex"])));
        assert_eq!((dop, dresp, did), (op, response, id), "{name}: header");
        assert!(
            json_eq(&fields, &v["fields"]),
            "{name}: decode(hex) != fields\n got  {fields}\n want {}",
            v["fields"]
        );
    }
    if bless() {
        save(file, &doc);
    }
    seen
}

#[test]
fn native_frame_vectors() {
    let mut seen = check_frame_file("native.json");
    // OPERATOR's vectors are in operators.json (section 10 of the spec).
    seen.extend(check_frame_file("operators.json"));
    // SCAN's are in scan.json (section 11).
    seen.extend(check_frame_file("scan.json"));
    for op in Opcode::ALL {
        for response in [false, true] {
            assert!(
                seen.contains(&(op, response)),
                "no vector for {} response={response}",
                op.name()
            );
        }
    }
}

#[test]
fn operator_bad_frame_vectors() {
    check_bad_frames("operators.json");
}

#[test]
fn scan_bad_frame_vectors() {
    check_bad_frames("scan.json");
}

#[test]
fn native_bad_frame_vectors() {
    check_bad_frames("native.json");
}

fn check_bad_frames(file: &str) {
    let doc = load(file);
    for v in arr(&doc["bad_frames"]) {
        let name = s(&v["name"]);
        let bytes = unhex(s(&v["hex"]));
        let max = u(&v["max_body"]) as usize;
        let err = match (s(&v["stage"]), parse_frame(&bytes, max)) {
            ("frame", Err(e)) => e,
            ("request", Ok((f, _))) => Request::decode(&f).expect_err(name),
            ("response", Ok((f, _))) => Response::decode(&f).expect_err(name),
            (stage, other) => panic!("{name}: stage {stage} got {other:?}"),
        };
        assert_eq!(err.code(), s(&v["error"]), "{name}: {err}");
        if let (FrameError::Incomplete { needed }, Some(want)) = (&err, v.get("needed")) {
            assert_eq!(*needed as u64, u(want), "{name}: needed");
        }
    }
}

#[test]
fn cluster_vectors() {
    let mut doc = load("cluster.json");
    let b = bless();
    for v in doc["partition_of"].as_array_mut().unwrap() {
        let got = partition_of(&unhex(s(&v["key_hex"])), u32_(&v["partitions"]));
        if b {
            v["partition"] = json!(got);
        } else {
            assert_eq!(u64::from(got), u(&v["partition"]), "partition_of {v}");
        }
    }
    for v in doc["epochs"].as_array_mut().unwrap() {
        let spec = ClusterSpec::parse(s(&v["spec"])).unwrap();
        let canonical: String = spec
            .servers()
            .iter()
            .map(|x| format!("server {x}\n"))
            .collect();
        assert_eq!(spec.epoch(), epoch_of(spec.servers()));
        if b {
            v["canonical"] = json!(canonical);
            v["epoch"] = json!(spec.epoch());
        } else {
            assert_eq!(canonical, s(&v["canonical"]));
            assert_eq!(spec.epoch(), u(&v["epoch"]), "epoch of {v}");
        }
    }
    for v in doc["rendezvous_scores"].as_array_mut().unwrap() {
        let got = rendezvous_score(s(&v["server"]), u32_(&v["partition"]));
        if b {
            v["score"] = json!(got);
        } else {
            assert_eq!(got, u(&v["score"]), "score {v}");
        }
    }
    for v in doc["partition_maps"].as_array_mut().unwrap() {
        let servers: Vec<&str> = arr(&v["servers"]).iter().map(s).collect();
        let map =
            PartitionMap::from_servers(&servers, u32_(&v["partitions"]), u32_(&v["replication"]));
        let got: Vec<Vec<u32>> = (0..map.partitions())
            .map(|p| map.replicas(p).to_vec())
            .collect();
        if b {
            v["replicas"] = json!(got);
        } else {
            assert_eq!(json!(got), v["replicas"], "map {}", v["servers"]);
        }
    }
    if b {
        save("cluster.json", &doc);
    }
}
