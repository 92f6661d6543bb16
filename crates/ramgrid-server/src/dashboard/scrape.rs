//! What the dashboard reads from one member: its METRICS text (the Prometheus exposition,
//! docs/metrics.md) boiled down to the figures the page shows, and its CLUSTER_STATUS lines. The
//! same parser reads this server's own text and its peers', so every member is seen one way.

use std::collections::BTreeMap;

use crate::metrics::LATENCY_BUCKETS;

/// Latency buckets: the histogram's, then `+Inf`.
pub const BUCKETS: usize = LATENCY_BUCKETS.len() + 1;

/// One table's figures on one member.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TableFigures {
    /// The version readers get (0: none).
    pub current: u64,
    /// Live keys per version, over the partitions held here.
    pub items: BTreeMap<u64, u64>,
    /// Bytes per version held here.
    pub bytes: BTreeMap<u64, u64>,
    /// Keys asked by GET, PUT and DELETE frames (counter).
    pub keys: u64,
    /// Keys GET frames found (counter).
    pub hits: u64,
    /// Keys GET frames did not find (counter).
    pub misses: u64,
}

/// One member's figures at one moment. Counters are totals since its start.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Figures {
    /// Seconds since the member started.
    pub uptime_s: u64,
    /// Open client connections.
    pub connections: u64,
    /// Keys asked by data requests, native and memcached (counter).
    pub keys: u64,
    /// Keys found by gets, native and memcached (counter).
    pub hits: u64,
    /// Keys not found by gets (counter).
    pub misses: u64,
    /// Native GET, PUT and DELETE frames, answered or refused (counter).
    pub frames: u64,
    /// Frames refused whole, by status name (counter).
    pub refused: BTreeMap<String, u64>,
    /// Native frames per latency bucket, all operations (counter, not cumulative).
    pub buckets: [u64; BUCKETS],
    /// Bytes of the memcached keyspace.
    pub cache_bytes: u64,
    /// The control plane's gauges and counters (`ramgrid_meta_*`, `ramgrid_cluster_*`), by name.
    pub meta: BTreeMap<String, u64>,
    /// Per table, by name.
    pub tables: BTreeMap<String, TableFigures>,
}

impl Figures {
    /// Bytes the tables use on this member (every version).
    pub fn table_bytes(&self) -> u64 {
        self.tables.values().flat_map(|t| t.bytes.values()).sum()
    }
}

/// A sample's labels: (name, value) pairs, unescaped.
pub type Labels = Vec<(String, String)>;

/// One sample line of the exposition: name, labels, value. `None` for comments, blank lines and
/// lines that do not parse.
pub fn parse_line(line: &str) -> Option<(&str, Labels, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, Vec::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_owned(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels, value))
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The figures in a METRICS text. Series the dashboard does not use are skipped; so are lines
/// that do not parse (a newer server may add series).
pub fn figures(text: &str) -> Figures {
    let mut f = Figures::default();
    let mut cumulative = [0u64; BUCKETS];
    for (name, labels, value) in text.lines().filter_map(parse_line) {
        // Counters and gauges are integers; the histogram's sum is the only fraction, not used.
        let v = value as u64;
        let table = || label(&labels, "table").unwrap_or_default().to_owned();
        let version = || {
            label(&labels, "version")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        match name {
            "ramgrid_uptime_seconds" => f.uptime_s = v,
            "ramgrid_connections" => f.connections = v,
            "ramgrid_memcached_bytes" => f.cache_bytes = v,
            "ramgrid_native_gets_total"
            | "ramgrid_native_puts_total"
            | "ramgrid_native_deletes_total"
            | "ramgrid_memcached_gets_total"
            | "ramgrid_memcached_sets_total" => f.keys += v,
            "ramgrid_native_hits_total" | "ramgrid_memcached_hits_total" => f.hits += v,
            "ramgrid_native_misses_total" | "ramgrid_memcached_misses_total" => f.misses += v,
            "ramgrid_native_batches_total" => f.frames += v,
            "ramgrid_native_refused_total" => {
                let reason = label(&labels, "reason").unwrap_or("UNKNOWN");
                *f.refused.entry(reason.to_owned()).or_default() += v;
            }
            "ramgrid_native_batch_seconds_bucket" => {
                let le = label(&labels, "le").unwrap_or("+Inf");
                let i = if le == "+Inf" {
                    Some(BUCKETS - 1)
                } else {
                    le.parse::<f64>().ok().and_then(|le| {
                        LATENCY_BUCKETS
                            .iter()
                            .position(|&b| (b - le).abs() <= b * 1e-9)
                    })
                };
                if let Some(i) = i {
                    cumulative[i] += v;
                }
            }
            "ramgrid_table_current_version" => {
                f.tables.entry(table()).or_default().current = v;
            }
            "ramgrid_table_items" => {
                f.tables
                    .entry(table())
                    .or_default()
                    .items
                    .insert(version(), v);
            }
            "ramgrid_table_bytes" => {
                f.tables
                    .entry(table())
                    .or_default()
                    .bytes
                    .insert(version(), v);
            }
            "ramgrid_table_gets_total"
            | "ramgrid_table_puts_total"
            | "ramgrid_table_deletes_total" => {
                f.tables.entry(table()).or_default().keys += v;
            }
            "ramgrid_table_hits_total" => f.tables.entry(table()).or_default().hits += v,
            "ramgrid_table_misses_total" => f.tables.entry(table()).or_default().misses += v,
            n if n.starts_with("ramgrid_meta_")
                || n.starts_with("ramgrid_cluster_")
                || n == "ramgrid_failovers_total"
                || n == "ramgrid_rejoins_total" =>
            {
                f.meta.insert(n.to_owned(), v);
            }
            _ => {}
        }
    }
    // The exposition's buckets are cumulative (summed over the operations above): undo that.
    let mut below = 0;
    for (b, c) in f.buckets.iter_mut().zip(cumulative) {
        *b = c.saturating_sub(below);
        below = c.max(below);
    }
    f
}

/// A member's CLUSTER_STATUS, as its `key value` lines (a key may repeat: `meta_member`, `failed`,
/// `repairing`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Status(pub Vec<(String, String)>);

impl Status {
    /// Splits CLUSTER_STATUS text into its lines.
    pub fn parse(text: &str) -> Status {
        Status(
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The first value of `key`.
    pub fn get<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        self.all(key).next()
    }

    /// Every value of `key`, in order.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A numeric value (0 when absent).
    pub fn num(&self, key: &str) -> u64 {
        self.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// A comma-separated list (`servers`, `next`).
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .map(|v| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The metadata group's leader's address, when one is known.
    pub fn leader(&self) -> Option<&str> {
        self.get("meta_leader")
            .and_then(|v| v.split(' ').next())
            .filter(|a| *a != "none")
    }

    /// Each group member's address and role (`voter` or `learner`).
    pub fn meta_members(&self) -> Vec<(String, String)> {
        self.all("meta_member")
            .filter_map(|v| {
                let mut w = v.split(' ');
                let addr = w.next()?;
                let role = w.nth(1)?;
                Some((addr.to_owned(), role.to_owned()))
            })
            .collect()
    }

    /// The partitions being copied in: (table, version, partitions).
    pub fn repairing(&self) -> Vec<(String, u64, Vec<u32>)> {
        self.all("repairing")
            .filter_map(|v| {
                // "<table> v<N> partitions <p,p,...>"
                let mut w = v.split(' ');
                let table = w.next()?;
                let version = w.next()?.strip_prefix('v')?.parse().ok()?;
                let parts = w
                    .nth(1)
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|p| p.parse().ok())
                    .collect();
                Some((table.to_owned(), version, parts))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_escaped_labels() {
        assert_eq!(parse_line("# HELP x y"), None);
        assert_eq!(
            parse_line("ramgrid_connections 3"),
            Some(("ramgrid_connections", vec![], 3.0))
        );
        let (name, labels, v) =
            parse_line(r#"ramgrid_table_items{table="a\"b,c",version="2"} 10"#).unwrap();
        assert_eq!(name, "ramgrid_table_items");
        assert_eq!(
            labels,
            vec![
                ("table".to_owned(), "a\"b,c".to_owned()),
                ("version".to_owned(), "2".to_owned())
            ]
        );
        assert_eq!(v, 10.0);
        assert_eq!(parse_line("x{a=1} 2"), None);
    }

    #[test]
    fn figures_sum_ops_and_undo_cumulative_buckets() {
        let text = "\
ramgrid_uptime_seconds 12
ramgrid_native_gets_total 10
ramgrid_native_hits_total 7
ramgrid_native_misses_total 3
ramgrid_native_puts_total 5
ramgrid_memcached_gets_total 2
ramgrid_memcached_hits_total 1
ramgrid_memcached_misses_total 1
ramgrid_native_batches_total{op=\"get\"} 4
ramgrid_native_batches_total{op=\"put\"} 1
ramgrid_native_refused_total{reason=\"NOT_OWNER\"} 2
ramgrid_native_batch_seconds_bucket{op=\"get\",le=\"0.00005\"} 1
ramgrid_native_batch_seconds_bucket{op=\"get\",le=\"0.0001\"} 3
ramgrid_native_batch_seconds_bucket{op=\"get\",le=\"+Inf\"} 4
ramgrid_native_batch_seconds_bucket{op=\"put\",le=\"0.0001\"} 1
ramgrid_native_batch_seconds_bucket{op=\"put\",le=\"+Inf\"} 1
ramgrid_table_current_version{table=\"t\"} 2
ramgrid_table_items{table=\"t\",version=\"1\"} 5
ramgrid_table_items{table=\"t\",version=\"2\"} 8
ramgrid_table_bytes{table=\"t\",version=\"2\"} 800
ramgrid_table_gets_total{table=\"t\"} 6
ramgrid_table_hits_total{table=\"t\"} 4
ramgrid_meta_leader 1
";
        let f = figures(text);
        assert_eq!(f.uptime_s, 12);
        assert_eq!((f.keys, f.hits, f.misses, f.frames), (17, 8, 4, 5));
        assert_eq!(f.refused.get("NOT_OWNER"), Some(&2));
        assert_eq!(f.buckets[0], 1);
        assert_eq!(f.buckets[1], 3, "2 gets and 1 put in (50 us, 100 us]");
        assert_eq!(f.buckets[BUCKETS - 1], 1);
        assert_eq!(f.buckets.iter().sum::<u64>(), 5);
        let t = &f.tables["t"];
        assert_eq!((t.current, t.keys, t.hits), (2, 6, 4));
        assert_eq!(t.items.get(&2), Some(&8));
        assert_eq!(f.table_bytes(), 800);
        assert_eq!(f.meta.get("ramgrid_meta_leader"), Some(&1));
    }

    #[test]
    fn status_lines() {
        let s = Status::parse(
            "server a:1\nepoch 00000000000000ab\nservers a:1,b:2\nmeta_leader b:2 7\n\
             meta_member a:1 3 voter\nmeta_member b:2 7 learner\nfailed c:3\n\
             repairing t v2 partitions 1,5\npending_partitions 2\n",
        );
        assert_eq!(s.get("server"), Some("a:1"));
        assert_eq!(s.list("servers"), vec!["a:1", "b:2"]);
        assert_eq!(s.leader(), Some("b:2"));
        assert_eq!(
            s.meta_members(),
            vec![
                ("a:1".to_owned(), "voter".to_owned()),
                ("b:2".to_owned(), "learner".to_owned())
            ]
        );
        assert_eq!(s.all("failed").collect::<Vec<_>>(), vec!["c:3"]);
        assert_eq!(s.repairing(), vec![("t".to_owned(), 2, vec![1, 5])]);
        assert_eq!(s.num("pending_partitions"), 2);
        assert_eq!(Status::parse("meta_leader none\n").leader(), None);
    }
}
