//! The dashboard's JSON API: pure functions from the gathered [`State`] to the documents that
//! `/api/cluster`, `/api/tables`, `/api/series` and `/api/events` answer (docs/dashboard.md).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::scrape::BUCKETS;
use super::series::quantile_ms;
use super::State;

fn own_status<'a>(st: &'a State, me: &str) -> Option<&'a super::scrape::Status> {
    st.members.get(me)?.last.as_ref().map(|(s, _, _)| s)
}

/// `/api/cluster`: the agreed spec, the metadata group, and each member as this server sees it.
pub fn cluster(st: &State, me: &str, now_ms: u64) -> Value {
    let empty = super::scrape::Status::default();
    let own = own_status(st, me).unwrap_or(&empty);
    let servers = own.list("servers");
    let next = own.list("next");
    let failed: BTreeSet<String> = own.all("failed").map(str::to_owned).collect();
    let roles: BTreeMap<String, String> = own.meta_members().into_iter().collect();
    let leader = own.leader().map(str::to_owned);
    // The leader alone knows how many voters answer it: take its figure when it is in reach.
    let tolerated = leader
        .as_ref()
        .and_then(|l| st.members.get(l))
        .filter(|m| m.up == Some(true))
        .and_then(|m| m.last.as_ref())
        .and_then(|(_, f, _)| f.meta.get("ramgrid_meta_failures_tolerated").copied());
    let voters = roles.values().filter(|r| *r == "voter").count();
    let mut totals = [0.0f64; 3];
    let members: Vec<Value> = super::member_addrs(me, own)
        .iter()
        .map(|addr| {
            let m = st.members.get(addr);
            let last = m.and_then(|m| m.last.as_ref());
            let up = m.and_then(|m| m.up);
            let state = if failed.contains(addr) {
                "failed"
            } else if !servers.contains(addr) && next.contains(addr) {
                "joining"
            } else {
                match up {
                    Some(true) => "up",
                    Some(false) => "down",
                    None => "unknown",
                }
            };
            let role = if leader.as_deref() == Some(addr.as_str()) {
                "leader"
            } else {
                roles.get(addr).map_or("none", String::as_str)
            };
            let rates = m.and_then(|m| m.ring.last()).filter(|_| up == Some(true));
            if let Some(s) = rates {
                totals[0] += s.ops;
                totals[1] += s.hits;
                totals[2] += s.misses;
            }
            let (status, figures) = match last {
                Some((s, f, _)) => (Some(s), Some(f)),
                None => (None, None),
            };
            let pending = status.map_or(0, |s| s.num("pending_partitions"));
            let peak = m.map_or(0, |m| m.peak_pending).max(pending);
            json!({
                "addr": addr,
                "self": addr == me,
                "state": state,
                "in_spec": servers.contains(addr),
                "role": role,
                "epoch": status.and_then(|s| s.get("epoch")),
                "quorum": status.and_then(|s| s.get("quorum")),
                "uptime_s": figures.map(|f| f.uptime_s),
                "connections": figures.map(|f| f.connections),
                "table_bytes": figures.map(|f| f.table_bytes()),
                "cache_bytes": figures.map(|f| f.cache_bytes),
                "keys_total": figures.map(|f| f.keys),
                "ops_per_s": rates.map(|s| s.ops),
                "repair": {
                    "pending_partitions": pending,
                    "peak_partitions": peak,
                    "done_partitions": peak - pending,
                    "copied_partitions": status.map_or(0, |s| s.num("copied_partitions")),
                    "copied_bytes": status.map_or(0, |s| s.num("copied_bytes")),
                    "copy_failures": status.map_or(0, |s| s.num("copy_failures")),
                    "stranded_partitions": status.map_or(0, |s| s.num("stranded_partitions")),
                    "tables": status.map_or_else(Vec::new, |s| s.repairing().into_iter().map(|(t, v, p)| {
                        json!({"table": t, "version": v, "partitions": p})
                    }).collect()),
                },
                "error": m.and_then(|m| m.error.clone()),
                "seen_ago_ms": m.filter(|m| m.seen_ms > 0).map(|m| now_ms.saturating_sub(m.seen_ms)),
            })
        })
        .collect();
    json!({
        "server": me,
        "time_ms": now_ms,
        "epoch": own.get("epoch"),
        "servers": servers,
        "next": if next.is_empty() { Value::Null } else { json!(next) },
        "failed": failed,
        "leader": leader,
        "term": own.get("meta_term").and_then(|t| t.parse::<u64>().ok()),
        "quorum": own.get("quorum"),
        "voters": voters,
        "failures_tolerated": tolerated,
        "failure_timeout_ms": own.get("failure_timeout_ms").and_then(|t| t.parse::<u64>().ok()),
        "members": members,
        "totals": {"ops_per_s": totals[0], "hits_per_s": totals[1], "misses_per_s": totals[2]},
    })
}

/// `/api/tables`: every table any member holds, its versions (the current one marked), items and
/// bytes per member, and its traffic over the last interval.
pub fn tables(st: &State) -> Value {
    #[derive(Default)]
    struct Acc {
        current: u64,
        versions: BTreeMap<u64, BTreeMap<String, (u64, u64)>>,
        rates: [f64; 3],
        keys: u64,
    }
    let mut all: BTreeMap<String, Acc> = BTreeMap::new();
    for (addr, m) in &st.members {
        let Some((_, f, _)) = m.last.as_ref().filter(|_| m.up == Some(true)) else {
            continue;
        };
        for (name, t) in &f.tables {
            let a = all.entry(name.clone()).or_default();
            a.current = a.current.max(t.current);
            a.keys += t.keys;
            for (&v, &items) in &t.items {
                let bytes = t.bytes.get(&v).copied().unwrap_or(0);
                a.versions
                    .entry(v)
                    .or_default()
                    .insert(addr.clone(), (items, bytes));
            }
            if let Some(r) = m.table_rates.get(name) {
                for (x, y) in a.rates.iter_mut().zip(r) {
                    *x += y;
                }
            }
        }
    }
    let tables: Vec<Value> = all
        .into_iter()
        .map(|(name, a)| {
            let mut per_server: BTreeMap<&str, u64> = BTreeMap::new();
            let versions: Vec<Value> = a
                .versions
                .iter()
                .map(|(&v, servers)| {
                    let (items, bytes) = servers
                        .values()
                        .fold((0, 0), |(i, b), (x, y)| (i + x, b + y));
                    for (s, (_, b)) in servers {
                        *per_server.entry(s).or_default() += b;
                    }
                    json!({
                        "number": v,
                        "current": v == a.current,
                        "items": items,
                        "bytes": bytes,
                        "servers": servers.iter().map(|(s, (i, b))| (s.clone(), json!({"items": i, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
                    })
                })
                .collect();
            let current_items = a.versions.get(&a.current).map_or(0, |s| s.values().map(|x| x.0).sum::<u64>());
            json!({
                "name": name,
                "current": a.current,
                "items": current_items,
                "bytes": per_server.values().sum::<u64>(),
                "bytes_per_server": per_server,
                "versions": versions,
                "keys_total": a.keys,
                "ops_per_s": a.rates[0],
                "hits_per_s": a.rates[1],
                "misses_per_s": a.rates[2],
            })
        })
        .collect();
    json!({ "tables": tables })
}

/// `/api/series`: per-second rates over the last minutes, per member and for the cluster (the
/// latency percentiles of the cluster come from the members' summed bucket counts). Seconds
/// where a member has no sample are `null` in its series.
pub fn series(st: &State) -> Value {
    let seconds: BTreeSet<u64> = st
        .members
        .values()
        .flat_map(|m| m.ring.iter().map(|s| s.t))
        .collect();
    let t: Vec<u64> = seconds.iter().copied().collect();
    let index: BTreeMap<u64, usize> = t.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let n = t.len();
    let (mut ops, mut hits, mut misses, mut refused) =
        (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut buckets = vec![[0u64; BUCKETS]; n];
    let mut servers = serde_json::Map::new();
    for (addr, m) in &st.members {
        let mut mine = [
            vec![Value::Null; n],
            vec![Value::Null; n],
            vec![Value::Null; n],
        ];
        for s in m.ring.iter() {
            let i = index[&s.t];
            ops[i] += s.ops;
            hits[i] += s.hits;
            misses[i] += s.misses;
            refused[i] += s.refused;
            for (b, c) in buckets[i].iter_mut().zip(&s.buckets) {
                *b += c;
            }
            mine[0][i] = json!(s.ops);
            mine[1][i] = json!(s.hits);
            mine[2][i] = json!(s.misses);
        }
        let [o, h, x] = mine;
        servers.insert(addr.clone(), json!({"ops": o, "hits": h, "misses": x}));
    }
    let q = |p: f64| -> Vec<Option<f64>> { buckets.iter().map(|b| quantile_ms(b, p)).collect() };
    json!({
        "t": t,
        "servers": servers,
        "total": {
            "ops": ops,
            "hits": hits,
            "misses": misses,
            "refused": refused,
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "p999_ms": q(0.999),
        },
    })
}

/// `/api/events`: the recent events, newest first.
pub fn events(st: &State) -> Value {
    let list: Vec<Value> = st
        .events
        .iter()
        .rev()
        .map(|e| json!({"t_ms": e.t_ms, "kind": e.kind, "server": e.server, "text": e.text}))
        .collect();
    json!({ "events": list })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::scrape::{figures, Status};
    use super::super::Member;
    use super::*;

    /// Two members, `a:1` (this server, the leader) and `b:2`, each read twice a second apart;
    /// `c:3` failed over.
    fn state() -> State {
        let status = |me: &str| {
            Status::parse(&format!(
                "server {me}\nepoch 00000000000000ab\nservers a:1,b:2\nfailed c:3\n\
                 meta_leader a:1 1\nmeta_term 4\nmeta_member a:1 1 voter\nmeta_member b:2 2 voter\n\
                 quorum ok\nfailure_timeout_ms 5000\npending_partitions 0\ncopied_bytes 10\n"
            ))
        };
        let text = |keys: u64, items: u64| {
            format!(
                "ramgrid_native_gets_total {keys}\nramgrid_native_hits_total {keys}\n\
                 ramgrid_native_batch_seconds_bucket{{op=\"get\",le=\"0.0001\"}} {keys}\n\
                 ramgrid_native_batch_seconds_bucket{{op=\"get\",le=\"+Inf\"}} {keys}\n\
                 ramgrid_meta_failures_tolerated 1\n\
                 ramgrid_table_current_version{{table=\"words\"}} 2\n\
                 ramgrid_table_items{{table=\"words\",version=\"1\"}} 3\n\
                 ramgrid_table_items{{table=\"words\",version=\"2\"}} {items}\n\
                 ramgrid_table_bytes{{table=\"words\",version=\"2\"}} 100\n\
                 ramgrid_table_gets_total{{table=\"words\"}} {keys}\n"
            )
        };
        let mut st = State::default();
        let t0 = Instant::now();
        for (addr, k) in [("a:1", 100), ("b:2", 40)] {
            let mut m = Member::default();
            let _ = m.update(addr, Ok((status(addr), figures(&text(0, 5)))), t0, 10_000);
            let _ = m.update(
                addr,
                Ok((status(addr), figures(&text(k, 7)))),
                t0 + std::time::Duration::from_secs(1),
                11_000,
            );
            st.members.insert(addr.into(), m);
        }
        let mut c = Member::default();
        let _ = c.update("c:3", Err("connection refused".into()), t0, 11_000);
        st.members.insert("c:3".into(), c);
        st.events.add(
            11_000,
            vec![("failover", "c:3".into(), "c:3 failed over".into())],
        );
        st
    }

    #[test]
    fn cluster_names_every_member_with_its_state_and_role() {
        let v = cluster(&state(), "a:1", 12_000);
        assert_eq!(v["leader"], "a:1");
        assert_eq!(v["term"], 4);
        assert_eq!(v["quorum"], "ok");
        assert_eq!(v["voters"], 2);
        assert_eq!(v["failures_tolerated"], 1);
        assert_eq!(v["servers"], json!(["a:1", "b:2"]));
        assert_eq!(v["failed"], json!(["c:3"]));
        let members = v["members"].as_array().unwrap();
        let by: Vec<(&str, &str, &str)> = members
            .iter()
            .map(|m| {
                (
                    m["addr"].as_str().unwrap(),
                    m["state"].as_str().unwrap(),
                    m["role"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            by,
            vec![
                ("a:1", "up", "leader"),
                ("b:2", "up", "voter"),
                ("c:3", "failed", "none")
            ]
        );
        assert_eq!(members[0]["self"], true);
        assert_eq!(members[0]["ops_per_s"], 100.0);
        assert_eq!(members[0]["repair"]["copied_bytes"], 10);
        assert_eq!(members[2]["error"], "connection refused");
        assert_eq!(members[0]["seen_ago_ms"], 1000);
        assert_eq!(v["totals"]["ops_per_s"], 140.0);
    }

    #[test]
    fn tables_sum_versions_over_members() {
        let v = tables(&state());
        let t = &v["tables"][0];
        assert_eq!(t["name"], "words");
        assert_eq!(t["current"], 2);
        assert_eq!(t["items"], 14, "7 on each of two members");
        assert_eq!(t["bytes_per_server"], json!({"a:1": 100, "b:2": 100}));
        let versions = t["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 2);
        assert_eq!(versions[1]["current"], true);
        assert_eq!(
            versions[1]["servers"]["b:2"],
            json!({"items": 7, "bytes": 100})
        );
        assert_eq!(t["ops_per_s"], 140.0);
    }

    #[test]
    fn series_align_members_by_second() {
        let v = series(&state());
        assert_eq!(v["t"], json!([11]));
        assert_eq!(v["total"]["ops"], json!([140.0]));
        assert_eq!(v["servers"]["b:2"]["ops"], json!([40.0]));
        assert_eq!(v["servers"]["c:3"]["ops"], json!([null]));
        let p50 = v["total"]["p50_ms"][0].as_f64().unwrap();
        assert!(p50 > 0.05 && p50 <= 0.1, "{p50}");
    }

    #[test]
    fn events_newest_first() {
        let mut st = state();
        st.events.add(
            12_000,
            vec![("up", "c:3".into(), "c:3 answers again".into())],
        );
        let v = events(&st);
        assert_eq!(v["events"][0]["kind"], "up");
        assert_eq!(v["events"][1]["kind"], "failover");
        assert_eq!(v["events"][1]["t_ms"], 11_000);
    }
}
