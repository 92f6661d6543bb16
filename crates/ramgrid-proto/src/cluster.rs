//! The cluster spec (which servers, in which order, with which token) and the partition map every
//! client and server derives from it, deterministically, so they agree on who owns what without
//! talking. Normative description: `docs/protocol-native.md`, "Cluster spec and partition map".

use std::fmt;
use std::str::FromStr;

use xxhash_rust::xxh3::xxh3_64;

/// Why a cluster spec could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The spec is not UTF-8.
    #[error("cluster spec is not UTF-8")]
    NotUtf8,
    /// The spec lists no server.
    #[error("cluster spec lists no server")]
    NoServers,
    /// A line starts with a word other than `server`, `next` or `token`.
    #[error("line {line}: unknown directive {word:?} (expected `server`, `next` or `token`)")]
    UnknownDirective {
        /// 1-based line number.
        line: usize,
        /// The word found.
        word: String,
    },
    /// A directive has no value, or more than one word.
    #[error("line {line}: `{directive}` takes exactly one value")]
    BadValue {
        /// 1-based line number (0 when built from values, not text).
        line: usize,
        /// The directive.
        directive: &'static str,
    },
    /// A server address is not `host:port`.
    #[error("line {line}: bad server address {addr:?} (expected host:port)")]
    BadAddress {
        /// 1-based line number (0 when built from values, not text).
        line: usize,
        /// The address found.
        addr: String,
    },
    /// A server appears twice.
    #[error("server {0} is listed twice")]
    DuplicateServer(String),
    /// More than one `token` line.
    #[error("line {line}: a second `token`")]
    DuplicateToken {
        /// 1-based line number.
        line: usize,
    },
}

/// The servers of a cluster, in order, and its auth token.
///
/// Text form, one directive per line (blank lines and `#` comments ignored):
///
/// ```text
/// server 127.0.0.1:7001
/// server 127.0.0.1:7002
/// token s3cret
/// ```
///
/// Addresses are compared as strings: `localhost:7001` and `127.0.0.1:7001` are different servers.
///
/// A spec may also describe a move in progress: `next HOST:PORT` lines list the servers the
/// cluster is moving to (docs/membership.md). Until the move is
/// complete, reads follow the `server` list and writes go to the replicas under both lists.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    servers: Vec<String>,
    next: Option<Vec<String>>,
    token: Option<String>,
}

impl ClusterSpec {
    /// A spec from its parts, validated as the text form would be.
    pub fn new(servers: Vec<String>, token: Option<String>) -> Result<ClusterSpec, SpecError> {
        for (i, s) in servers.iter().enumerate() {
            check_address(s, 0)?;
            if servers[..i].contains(s) {
                return Err(SpecError::DuplicateServer(s.clone()));
            }
        }
        if servers.is_empty() {
            return Err(SpecError::NoServers);
        }
        if let Some(t) = &token {
            if t.is_empty() || t.contains(char::is_whitespace) || t.starts_with('#') {
                return Err(SpecError::BadValue {
                    line: 0,
                    directive: "token",
                });
            }
        }
        Ok(ClusterSpec {
            servers,
            next: None,
            token,
        })
    }

    /// This spec moving to `next` (a move in progress): validated like the server list.
    pub fn with_next(mut self, next: Vec<String>) -> Result<ClusterSpec, SpecError> {
        for (i, s) in next.iter().enumerate() {
            check_address(s, 0)?;
            if next[..i].contains(s) {
                return Err(SpecError::DuplicateServer(s.clone()));
            }
        }
        if next.is_empty() {
            return Err(SpecError::NoServers);
        }
        self.next = Some(next);
        Ok(self)
    }

    /// The spec the move in progress leads to (the `next` servers, same token), if any.
    pub fn target(&self) -> Option<ClusterSpec> {
        self.next.as_ref().map(|next| ClusterSpec {
            servers: next.clone(),
            next: None,
            token: self.token.clone(),
        })
    }

    /// The servers being moved to, if a move is in progress.
    pub fn next(&self) -> Option<&[String]> {
        self.next.as_deref()
    }

    /// Every server of the spec: the `server` list, then the `next` servers not in it. A server's
    /// index here is its id in the [`PartitionMap`] (so the `server` list keeps its indices).
    pub fn members(&self) -> Vec<String> {
        let mut all = self.servers.clone();
        for s in self.next.iter().flatten() {
            if !all.contains(s) {
                all.push(s.clone());
            }
        }
        all
    }

    /// The same spec without its token (what the epoch and the wire's canonical text cover).
    pub fn without_token(&self) -> ClusterSpec {
        ClusterSpec {
            token: None,
            ..self.clone()
        }
    }

    /// Parses the text form.
    pub fn parse(text: &str) -> Result<ClusterSpec, SpecError> {
        let mut servers: Vec<String> = Vec::new();
        let mut next: Vec<String> = Vec::new();
        let mut token = None;
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let word = words.next().unwrap_or_default();
            let (directive, value) = match word {
                "server" => ("server", words.next()),
                "next" => ("next", words.next()),
                "token" => ("token", words.next()),
                _ => {
                    return Err(SpecError::UnknownDirective {
                        line: line_no,
                        word: word.to_owned(),
                    })
                }
            };
            let (Some(value), None) = (value, words.next()) else {
                return Err(SpecError::BadValue {
                    line: line_no,
                    directive,
                });
            };
            if directive == "server" {
                check_address(value, line_no)?;
                if servers.iter().any(|s| s == value) {
                    return Err(SpecError::DuplicateServer(value.to_owned()));
                }
                servers.push(value.to_owned());
            } else if directive == "next" {
                check_address(value, line_no)?;
                if next.iter().any(|s| s == value) {
                    return Err(SpecError::DuplicateServer(value.to_owned()));
                }
                next.push(value.to_owned());
            } else if token.replace(value.to_owned()).is_some() {
                return Err(SpecError::DuplicateToken { line: line_no });
            }
        }
        let spec = ClusterSpec::new(servers, token)?;
        if next.is_empty() {
            Ok(spec)
        } else {
            spec.with_next(next)
        }
    }

    /// Parses a spec file (`--cluster-spec`): the text form, where a line may also be a bare
    /// `host:port` (read as `server host:port`, the form clients' spec files use, so one file
    /// serves both) and may end in a `# comment`.
    pub fn parse_file(text: &str) -> Result<ClusterSpec, SpecError> {
        let mut canonical = String::with_capacity(text.len() + 64);
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default().trim();
            let mut words = line.split_whitespace();
            if let (Some(word), None) = (words.next(), words.next()) {
                if word.contains(':') {
                    canonical.push_str("server ");
                }
            }
            canonical.push_str(line);
            canonical.push('\n');
        }
        ClusterSpec::parse(&canonical)
    }

    /// Parses the text form from bytes (as carried by SET_SPEC / GET_SPEC).
    pub fn parse_bytes(bytes: &[u8]) -> Result<ClusterSpec, SpecError> {
        ClusterSpec::parse(std::str::from_utf8(bytes).map_err(|_| SpecError::NotUtf8)?)
    }

    /// The servers, in spec order; a server's index here is its id in the [`PartitionMap`].
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The auth token, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The index of the server with address `addr` among the [`members`](Self::members).
    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.members().iter().position(|s| s == addr)
    }

    /// The canonical text form: `server` lines in order, then `next` lines, then the `token`
    /// line if any.
    pub fn to_text(&self) -> String {
        let mut s = canonical_servers(&self.servers);
        for n in self.next.iter().flatten() {
            s.push_str("next ");
            s.push_str(n);
            s.push('\n');
        }
        if let Some(t) = &self.token {
            s.push_str("token ");
            s.push_str(t);
            s.push('\n');
        }
        s
    }

    /// The partition-map epoch of this spec: see [`epoch_of`]. The token does not count, so
    /// rotating it does not invalidate maps. A spec with a move in progress has its own epoch
    /// (the hash of its `server` and `next` lines), so requests routed under it are told apart
    /// from those routed under either end of the move.
    pub fn epoch(&self) -> u64 {
        match &self.next {
            None => epoch_of(&self.servers),
            Some(_) => match xxh3_64(self.without_token().to_text().as_bytes()) {
                0 => 1,
                h => h,
            },
        }
    }
}

impl FromStr for ClusterSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<ClusterSpec, SpecError> {
        ClusterSpec::parse(s)
    }
}

impl fmt::Display for ClusterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

fn check_address(addr: &str, line: usize) -> Result<(), SpecError> {
    let bad = || SpecError::BadAddress {
        line,
        addr: addr.to_owned(),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host_ok = !host.is_empty() && !host.contains(char::is_whitespace) && !host.starts_with('#');
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(())
}

fn canonical_servers<S: AsRef<str>>(servers: &[S]) -> String {
    let mut s = String::new();
    for server in servers {
        s.push_str("server ");
        s.push_str(server.as_ref());
        s.push('\n');
    }
    s
}

/// The epoch of an ordered server list: xxh3_64 (seed 0) of its canonical text
/// (`"server ADDR\n"` per server, in order), with 0 replaced by 1 so that 0 can mean "no spec".
pub fn epoch_of<S: AsRef<str>>(servers: &[S]) -> u64 {
    match xxh3_64(canonical_servers(servers).as_bytes()) {
        0 => 1,
        h => h,
    }
}

/// The partition of `key` in a table of `partitions` partitions: the high 32 bits of
/// `xxh3_64(key) * partitions` (a multiply-shift range reduction, which uses the hash's high bits
/// and has no modulo bias worth naming). `partitions == 0` is treated as 1.
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    ((u128::from(xxh3_64(key)) * u128::from(partitions.max(1))) >> 64) as u32
}

/// The rendezvous weight of `server` for `partition`: xxh3_64 of the address bytes, a 0xFF
/// separator (never part of UTF-8, so the concatenation is unambiguous) and the partition as u32 LE.
pub fn rendezvous_score(server: &str, partition: u32) -> u64 {
    let mut buf = Vec::with_capacity(server.len() + 5);
    buf.extend_from_slice(server.as_bytes());
    buf.push(0xFF);
    buf.extend_from_slice(&partition.to_le_bytes());
    xxh3_64(&buf)
}

/// For each partition of a table, its replica servers in order (the first is the primary), as
/// indices into the spec's server list.
///
/// Built by capped rendezvous hashing: each partition ranks the servers by [`rendezvous_score`]
/// (highest first, ties by lower index). Replica slots are filled rank by rank (all primaries,
/// then all second replicas...), partitions in ascending order; each takes the best-ranked server
/// not already among its replicas whose count of slots at this rank is below
/// `ceil(partitions / servers)`, or, when every such server is at the cap, the best-ranked one not
/// among its replicas. The cap keeps every server's share of primaries (and of each rank) within
/// one partition of even; the ranking keeps the moves few when a server is added or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMap {
    partitions: u32,
    replication: u32,
    servers: u32,
    epoch: u64,
    /// `partitions * replication` server indices, partition-major.
    replicas: Vec<u32>,
    /// During a move: the replicas under the `next` servers (indices into the spec's members),
    /// `partitions * next replication`, partition-major. Empty otherwise.
    next: Vec<u32>,
    next_replication: u32,
}

impl PartitionMap {
    /// The map of a table with `partitions` partitions (0 is treated as 1) and `replication`
    /// replicas per partition (clamped to 1..=servers) over `spec`'s servers.
    ///
    /// With a move in progress, [`replicas`](Self::replicas) are those under the `server` list
    /// (the ones holding the data, which reads use) and [`write_replicas`](Self::write_replicas)
    /// add those under the `next` list (every copy a write must reach).
    pub fn new(spec: &ClusterSpec, partitions: u32, replication: u32) -> PartitionMap {
        let mut map = PartitionMap::from_servers(spec.servers(), partitions, replication);
        if let Some(next) = spec.next() {
            let members = spec.members();
            let target = PartitionMap::from_servers(next, partitions, replication);
            let id = |i: u32| {
                members
                    .iter()
                    .position(|m| *m == next[i as usize])
                    .unwrap_or(0) as u32
            };
            map.next = target.replicas.iter().map(|&i| id(i)).collect();
            map.next_replication = target.replication;
            map.servers = members.len() as u32;
            map.epoch = spec.epoch();
        }
        map
    }

    /// As [`PartitionMap::new`], from the ordered server addresses alone. An empty list gives a
    /// map with no replicas at all.
    pub fn from_servers<S: AsRef<str>>(
        servers: &[S],
        partitions: u32,
        replication: u32,
    ) -> PartitionMap {
        let partitions = partitions.max(1);
        let n = servers.len() as u32;
        let replication = replication.clamp(1, n.max(1)).min(n);
        let epoch = epoch_of(servers);
        let mut map = PartitionMap {
            partitions,
            replication,
            servers: n,
            epoch,
            replicas: Vec::new(),
            next: Vec::new(),
            next_replication: 0,
        };
        if n == 0 {
            return map;
        }
        let r = replication as usize;
        // Each partition's preference order, computed once and reused for every rank.
        let prefs: Vec<Vec<u32>> = (0..partitions)
            .map(|p| {
                let mut order: Vec<(u64, u32)> = servers
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (rendezvous_score(s.as_ref(), p), i as u32))
                    .collect();
                order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                order.into_iter().map(|(_, i)| i).collect()
            })
            .collect();
        let cap = partitions.div_ceil(n);
        let mut replicas = vec![u32::MAX; partitions as usize * r];
        for rank in 0..r {
            let mut load = vec![0u32; n as usize];
            for (p, pref) in prefs.iter().enumerate() {
                let taken = &replicas[p * r..p * r + rank];
                let mut free = pref.iter().copied().filter(|s| !taken.contains(s));
                let first = free.clone().next().unwrap_or(0);
                let pick = free.find(|&s| load[s as usize] < cap).unwrap_or(first);
                load[pick as usize] += 1;
                replicas[p * r + rank] = pick;
            }
        }
        map.replicas = replicas;
        map
    }

    /// The epoch of the spec the map was built from.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Replicas per partition after clamping to the server count.
    pub fn replication(&self) -> u32 {
        self.replication
    }

    /// Number of servers.
    pub fn server_count(&self) -> u32 {
        self.servers
    }

    /// The replica servers of partition `p`, primary first (empty if `p` is out of range).
    pub fn replicas(&self, p: u32) -> &[u32] {
        let r = self.replication as usize;
        let start = p as usize * r;
        self.replicas.get(start..start + r).unwrap_or(&[])
    }

    /// During a move, the replicas of partition `p` under the `next` servers; otherwise the same
    /// as [`replicas`](Self::replicas).
    pub fn next_replicas(&self, p: u32) -> &[u32] {
        if self.next.is_empty() {
            return self.replicas(p);
        }
        let r = self.next_replication as usize;
        let start = p as usize * r;
        self.next.get(start..start + r).unwrap_or(&[])
    }

    /// Every server a write to partition `p` must reach: its replicas, then (during a move) its
    /// replicas under the `next` servers that are not among them.
    pub fn write_replicas(&self, p: u32) -> Vec<u32> {
        let mut all = self.replicas(p).to_vec();
        for &s in self.next_replicas(p) {
            if !all.contains(&s) {
                all.push(s);
            }
        }
        all
    }

    /// Whether a move is in progress in the spec this map was built from.
    pub fn is_moving(&self) -> bool {
        !self.next.is_empty()
    }

    /// The primary server of partition `p`.
    pub fn primary(&self, p: u32) -> Option<u32> {
        self.replicas(p).first().copied()
    }

    /// Whether `server` holds a replica of partition `p`.
    pub fn holds(&self, server: u32, p: u32) -> bool {
        self.replicas(p).contains(&server)
    }

    /// The partitions `server` holds a replica of, ascending.
    pub fn partitions_of(&self, server: u32) -> impl Iterator<Item = u32> + '_ {
        (0..self.partitions).filter(move |&p| self.holds(server, p))
    }

    /// The partitions `server` is the primary of, ascending.
    pub fn primaries_of(&self, server: u32) -> impl Iterator<Item = u32> + '_ {
        (0..self.partitions).filter(move |&p| self.primary(p) == Some(server))
    }

    /// The partition of `key` in this map's table ([`partition_of`]).
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        partition_of(key, self.partitions)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spec_file_may_list_bare_addresses_and_comments() {
        let text = "# hosts\n10.0.0.1:11211\nserver 10.0.0.2:11211  # second\n\n[::1]:7000\n";
        let spec = ClusterSpec::parse_file(text).unwrap();
        assert_eq!(
            spec.servers(),
            ["10.0.0.1:11211", "10.0.0.2:11211", "[::1]:7000"]
        );
        // What the wire form refuses stays refused: a word that is not an address, a bad port.
        assert!(ClusterSpec::parse_file("nonsense\n").is_err());
        assert!(ClusterSpec::parse_file("10.0.0.1:0\n").is_err());
        assert!(ClusterSpec::parse_file("10.0.0.1:1\n10.0.0.1:1\n").is_err());
        // The wire form does not take bare addresses.
        assert!(ClusterSpec::parse("10.0.0.1:11211\n").is_err());
    }

    use super::*;

    fn servers(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("127.0.0.1:{}", 7001 + i)).collect()
    }

    #[test]
    fn a_move_has_its_own_epoch_and_writes_reach_both_ends() {
        let from = servers(4);
        let to = servers(5);
        let spec = ClusterSpec::new(from.clone(), None).unwrap();
        let moving = spec.clone().with_next(to.clone()).unwrap();
        let text = moving.to_text();
        assert!(text.contains("next 127.0.0.1:7005"));
        assert_eq!(ClusterSpec::parse(&text).unwrap(), moving);
        assert_eq!(moving.members(), to);
        assert_eq!(moving.target().unwrap().servers(), &to[..]);
        let (e0, e1, e2) = (epoch_of(&from), moving.epoch(), epoch_of(&to));
        assert!(e1 != e0 && e1 != e2);
        let (old, new) = (
            PartitionMap::new(&spec, 64, 2),
            PartitionMap::from_servers(&to, 64, 2),
        );
        let map = PartitionMap::new(&moving, 64, 2);
        assert!(map.is_moving());
        for p in 0..64 {
            assert_eq!(map.replicas(p), old.replicas(p), "reads follow the old end");
            assert_eq!(map.next_replicas(p), new.replicas(p), "indices are shared");
            let w = map.write_replicas(p);
            assert!(old
                .replicas(p)
                .iter()
                .chain(new.replicas(p))
                .all(|s| w.contains(s)));
        }
        assert!(ClusterSpec::parse("server a:1\nnext a:1\nnext a:1\n").is_err());
    }

    #[test]
    fn spec_text_round_trips_and_rejects_bad_lines() {
        let text = "# two servers\nserver 127.0.0.1:7001\n\n  server [::1]:7002  \ntoken abc\n";
        let spec = ClusterSpec::parse(text).unwrap();
        assert_eq!(spec.servers(), ["127.0.0.1:7001", "[::1]:7002"]);
        assert_eq!(spec.token(), Some("abc"));
        assert_eq!(
            spec.to_text(),
            "server 127.0.0.1:7001\nserver [::1]:7002\ntoken abc\n"
        );
        assert_eq!(ClusterSpec::parse(&spec.to_text()).unwrap(), spec);
        assert_eq!(spec.index_of("[::1]:7002"), Some(1));

        let err = |t: &str| ClusterSpec::parse(t).unwrap_err();
        assert_eq!(err(""), SpecError::NoServers);
        assert!(matches!(
            err("serve 1:2"),
            SpecError::UnknownDirective { line: 1, .. }
        ));
        assert!(matches!(err("server"), SpecError::BadValue { line: 1, .. }));
        assert!(matches!(
            err("server a:1 b:2"),
            SpecError::BadValue { line: 1, .. }
        ));
        assert!(matches!(err("server nohost"), SpecError::BadAddress { .. }));
        assert!(matches!(err("server h:0"), SpecError::BadAddress { .. }));
        assert!(matches!(
            err("server h:99999"),
            SpecError::BadAddress { .. }
        ));
        assert!(matches!(
            err("server h:1\nserver h:1"),
            SpecError::DuplicateServer(_)
        ));
        assert!(matches!(
            err("server h:1\ntoken a\ntoken b"),
            SpecError::DuplicateToken { line: 3 }
        ));
        assert_eq!(ClusterSpec::parse_bytes(b"\xff"), Err(SpecError::NotUtf8));
    }

    #[test]
    fn epoch_depends_on_servers_and_order_not_token() {
        let a = ClusterSpec::new(servers(3), None).unwrap();
        let b = ClusterSpec::new(servers(3), Some("t".into())).unwrap();
        let mut rev = servers(3);
        rev.reverse();
        let c = ClusterSpec::new(rev, None).unwrap();
        let d = ClusterSpec::new(servers(4), None).unwrap();
        assert_eq!(a.epoch(), b.epoch());
        assert_ne!(a.epoch(), c.epoch());
        assert_ne!(a.epoch(), d.epoch());
        assert_ne!(a.epoch(), 0);
    }

    #[test]
    fn partition_of_stays_in_range() {
        for parts in [0, 1, 2, 7, 64, 100, u32::MAX] {
            for i in 0..1000u32 {
                let p = partition_of(&i.to_le_bytes(), parts);
                assert!(p < parts.max(1), "{p} >= {parts}");
            }
        }
    }

    #[test]
    fn map_replicas_are_distinct_and_clamped() {
        for n in 1..=6 {
            for r in 0..=7 {
                let map = PartitionMap::from_servers(&servers(n), 50, r);
                assert_eq!(map.replication(), (r.max(1)).min(n as u32));
                for p in 0..50 {
                    let reps = map.replicas(p);
                    assert_eq!(reps.len(), map.replication() as usize);
                    let mut d = reps.to_vec();
                    d.sort_unstable();
                    d.dedup();
                    assert_eq!(
                        d.len(),
                        reps.len(),
                        "replicas of {p} not distinct: {reps:?}"
                    );
                    assert!(reps.iter().all(|&s| s < n as u32));
                }
            }
        }
        assert!(PartitionMap::from_servers::<String>(&[], 8, 2)
            .replicas(0)
            .is_empty());
    }

    #[test]
    fn map_balances_every_rank() {
        for (n, parts, r) in [
            (4, 64, 1),
            (4, 64, 2),
            (3, 100, 3),
            (5, 64, 2),
            (7, 1000, 2),
        ] {
            let map = PartitionMap::from_servers(&servers(n), parts, r);
            let cap = parts.div_ceil(n as u32);
            for rank in 0..r as usize {
                let mut load = vec![0u32; n];
                for p in 0..parts {
                    load[map.replicas(p)[rank] as usize] += 1;
                }
                assert!(
                    load.iter().all(|&l| l <= cap && l + n as u32 >= cap),
                    "n={n} rank={rank} {load:?}"
                );
            }
        }
    }

    #[test]
    fn adding_a_server_moves_few_primaries() {
        let parts = 256;
        for n in [2usize, 4, 8] {
            let before = PartitionMap::from_servers(&servers(n), parts, 1);
            let after = PartitionMap::from_servers(&servers(n + 1), parts, 1);
            let moved = (0..parts)
                .filter(|&p| before.primary(p) != after.primary(p))
                .count();
            let ideal = parts as usize / (n + 1);
            eprintln!(
                "{n} -> {} servers: {moved} of {parts} primaries moved (ideal {ideal})",
                n + 1
            );
            assert!(moved <= 2 * ideal + 8, "{moved} moved, ideal {ideal}");
        }
    }

    /// Reports the spread of 1M keys over 64 partitions and 4 servers (run with --nocapture).
    #[test]
    fn key_spread_over_partitions_and_servers() {
        let (parts, n) = (64u32, 4usize);
        let map = PartitionMap::from_servers(&servers(n), parts, 1);
        let mut per_part = vec![0u64; parts as usize];
        let mut key = Vec::with_capacity(16);
        for i in 0..1_000_000u64 {
            key.clear();
            key.extend_from_slice(b"key:");
            key.extend_from_slice(i.to_string().as_bytes());
            per_part[map.partition_of(&key) as usize] += 1;
        }
        let mut per_server = vec![0u64; n];
        for p in 0..parts {
            per_server[map.primary(p).unwrap() as usize] += per_part[p as usize];
        }
        let ratio = |v: &[u64]| *v.iter().max().unwrap() as f64 / *v.iter().min().unwrap() as f64;
        let (rp, rs) = (ratio(&per_part), ratio(&per_server));
        eprintln!("1M keys: partitions max/min {rp:.4}, servers {per_server:?} max/min {rs:.4}");
        assert!(rp < 1.08, "partition spread {rp}");
        assert!(rs < 1.02, "server spread {rs}");
    }
}
