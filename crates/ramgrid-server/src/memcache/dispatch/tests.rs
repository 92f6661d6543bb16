//! Transcript-style tests: requests go through the real parser, replies are compared byte for
//! byte with what memcached 1.6.18 answers to the same input (CAS values aside).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use ramgrid_proto::memcache::{parse_request, Limits, ParseError};
use ramgrid_store::{CacheConfig, ManualClock};

use super::*;
use crate::stats::Settings;

const EPOCH: u64 = 1_700_000_000;

struct Server {
    shared: Shared,
    clock: Arc<ManualClock>,
}

fn server_with(config: CacheConfig, flush_enabled: bool) -> Server {
    let clock = Arc::new(ManualClock::new(EPOCH));
    let shared = Shared {
        cache: Cache::new(config, clock.clone()),
        buffers: crate::buffers::BufferMemory::new(64 << 20),
        settings: Settings {
            threads: 2,
            max_conns: 100,
            limits: Limits::default(),
            flush_enabled,
            token: None,
            auth_timeout: std::time::Duration::from_secs(10),
        },
        started: Instant::now(),
        started_unix: EPOCH,
        curr_connections: AtomicU64::new(1),
        total_connections: AtomicU64::new(3),
        rejected_connections: AtomicU64::new(0),
        verbosity: AtomicU32::new(0),
        workers: vec![
            Arc::new(WorkerStats::default()),
            Arc::new(WorkerStats::default()),
        ],
    };
    Server { shared, clock }
}

fn server() -> Server {
    server_with(CacheConfig::default(), true)
}

impl Server {
    /// Feeds `input` through parser and dispatcher as a connection would; returns the output
    /// and whether the connection was closed.
    fn run_flow(&self, input: &[u8]) -> (Vec<u8>, Flow) {
        let limits = self.shared.settings.limits;
        let stats = &self.shared.workers[0];
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < input.len() {
            match parse_request(&input[pos..], &limits) {
                Ok((req, n)) => {
                    pos += n;
                    if execute(&req, &self.shared, stats, &mut out) == Flow::Close {
                        return (out, Flow::Close);
                    }
                }
                Err(ParseError::Recoverable { consumed, reply }) => {
                    pos += consumed;
                    out.extend_from_slice(reply.as_bytes());
                }
                Err(e) => panic!("{e:?} at {:?}", String::from_utf8_lossy(&input[pos..])),
            }
        }
        (out, Flow::Continue)
    }

    fn run(&self, input: &str) -> String {
        String::from_utf8(self.run_flow(input.as_bytes()).0).unwrap()
    }

    /// The CAS unique of `key` (via gets).
    fn cas(&self, key: &str) -> u64 {
        let out = self.run(&format!("gets {key}\r\n"));
        out.split("\r\n")
            .next()
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn stat(&self, name: &str) -> u64 {
        let out = self.run("stats\r\n");
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("STAT {name} ")))
            .unwrap_or_else(|| panic!("no {name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

#[test]
fn get_gets_and_misses() {
    let s = server();
    assert_eq!(s.run("get nope\r\n"), "END\r\n");
    assert_eq!(
        s.run("set a 5 0 3\r\nabc\r\nset b 0 0 0\r\n\r\n"),
        "STORED\r\nSTORED\r\n"
    );
    assert_eq!(
        s.run("get a nope b a\r\n"),
        "VALUE a 5 3\r\nabc\r\nVALUE b 0 0\r\n\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"
    );
    let cas = s.cas("a");
    assert_eq!(
        s.run("gets a\r\n"),
        format!("VALUE a 5 3 {cas}\r\nabc\r\nEND\r\n")
    );
    assert_eq!(
        (s.stat("cmd_get"), s.stat("get_hits"), s.stat("get_misses")),
        (7, 5, 2)
    );
}

#[test]
fn gat_touches_and_counts_as_touch() {
    let s = server();
    s.run("set a 1 0 1\r\nx\r\n");
    assert_eq!(s.run("gat 100 a nope\r\n"), "VALUE a 1 1\r\nx\r\nEND\r\n");
    assert_eq!(s.run("mg a t\r\n"), "HD t100\r\n");
    let cas = s.cas("a");
    assert_eq!(
        s.run("gats 0 a\r\n"),
        format!("VALUE a 1 1 {cas}\r\nx\r\nEND\r\n")
    );
    assert_eq!(s.run("mg a t\r\n"), "HD t-1\r\n");
    assert_eq!(
        s.run("gat -1 a\r\nget a\r\n"),
        "VALUE a 1 1\r\nx\r\nEND\r\nEND\r\n"
    );
    assert_eq!(s.run("gat 10\r\n"), "END\r\n");
    assert_eq!(
        (
            s.stat("cmd_touch"),
            s.stat("touch_hits"),
            s.stat("touch_misses")
        ),
        (4, 3, 1)
    );
}

#[test]
fn storage_commands() {
    let s = server();
    assert_eq!(
        s.run("add k 0 0 1\r\na\r\nadd k 0 0 1\r\nb\r\n"),
        "STORED\r\nNOT_STORED\r\n"
    );
    assert_eq!(
        s.run("replace k 3 0 1\r\nc\r\nreplace nope 0 0 1\r\nc\r\n"),
        "STORED\r\nNOT_STORED\r\n"
    );
    assert_eq!(
        s.run("append k 9 9 2\r\nde\r\nprepend k 9 9 2\r\nab\r\n"),
        "STORED\r\nSTORED\r\n"
    );
    assert_eq!(
        s.run("append nope 0 0 1\r\nx\r\nprepend nope 0 0 1\r\nx\r\n"),
        "NOT_STORED\r\nNOT_STORED\r\n"
    );
    // append/prepend keep the item's flags.
    assert_eq!(s.run("get k\r\n"), "VALUE k 3 5\r\nabcde\r\nEND\r\n");
    let cas = s.cas("k");
    assert_eq!(
        s.run(&format!("cas k 0 0 1 {}\r\nx\r\n", cas + 1000)),
        "EXISTS\r\n"
    );
    assert_eq!(s.run(&format!("cas k 7 0 1 {cas}\r\nz\r\n")), "STORED\r\n");
    assert_eq!(s.run("cas nope 0 0 1 1\r\nx\r\n"), "NOT_FOUND\r\n");
    assert_eq!(s.run("get k\r\n"), "VALUE k 7 1\r\nz\r\nEND\r\n");
    assert_eq!(
        s.run("set q 0 0 1 noreply\r\nq\r\nadd q 0 0 1 noreply\r\nq\r\nget q\r\n"),
        "VALUE q 0 1\r\nq\r\nEND\r\n"
    );
    assert_eq!(
        (
            s.stat("cas_hits"),
            s.stat("cas_badval"),
            s.stat("cas_misses")
        ),
        (1, 1, 1)
    );
    assert_eq!(s.stat("cmd_set"), 13);
    // Negative exptime: stored, already gone.
    assert_eq!(
        s.run("set gone 0 -1 1\r\nx\r\nget gone\r\n"),
        "STORED\r\nEND\r\n"
    );
}

#[test]
fn a_value_the_store_refuses_keeps_the_old_one() {
    let config = CacheConfig {
        max_item_size: 200,
        ..CacheConfig::default()
    };
    let s = server_with(config, true);
    let big = "x".repeat(300);
    assert_eq!(s.run("set k 0 0 1\r\na\r\n"), "STORED\r\n");
    let kept = "VALUE k 0 1\r\na\r\nEND\r\n";
    assert_eq!(
        s.run(&format!("set k 0 0 300\r\n{big}\r\nget k\r\n")),
        format!("SERVER_ERROR object too large for cache\r\n{kept}")
    );
    assert_eq!(
        s.run(&format!("append k 0 0 300\r\n{big}\r\nget k\r\n")),
        format!("SERVER_ERROR object too large for cache\r\n{kept}")
    );
    assert_eq!(
        s.run(&format!("set k 0 0 300 noreply\r\n{big}\r\nget k\r\n")),
        kept
    );
    // ms always answers, even with q.
    assert_eq!(
        s.run(&format!("ms k 300 MA q\r\n{big}\r\nmg k v\r\n")),
        "SERVER_ERROR object too large for cache\r\nVA 1\r\na\r\n"
    );
    assert_eq!(s.stat("cmd_set"), 1);
}

#[test]
fn delete_incr_decr_touch() {
    let s = server();
    s.run("set n 0 0 2\r\n10\r\n");
    assert_eq!(
        s.run("incr n 5\r\ndecr n 100\r\nincr n 18446744073709551615\r\nincr n 2\r\n"),
        "15\r\n0\r\n18446744073709551615\r\n1\r\n"
    );
    assert_eq!(
        s.run("incr nope 1\r\ndecr nope 1\r\n"),
        "NOT_FOUND\r\nNOT_FOUND\r\n"
    );
    assert_eq!(
        s.run("set t 0 0 1\r\nx\r\nincr t 1\r\n"),
        "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    );
    assert_eq!(
        s.run("incr n 1 noreply\r\nincr t 1 noreply\r\nget n\r\n"),
        "VALUE n 0 1\r\n2\r\nEND\r\n"
    );
    assert_eq!(
        (
            s.stat("incr_hits"),
            s.stat("incr_misses"),
            s.stat("decr_hits"),
            s.stat("decr_misses")
        ),
        (4, 1, 1, 1)
    );
    assert_eq!(
        s.run("touch n 10\r\ntouch nope 10\r\ntouch n 10 noreply\r\n"),
        "TOUCHED\r\nNOT_FOUND\r\n"
    );
    assert_eq!(
        (
            s.stat("cmd_touch"),
            s.stat("touch_hits"),
            s.stat("touch_misses")
        ),
        (3, 2, 1)
    );
    s.clock.advance(11);
    assert_eq!(s.stat("get_expired"), 0);
    assert_eq!(s.run("get n\r\n"), "END\r\n");
    assert_eq!(s.stat("get_expired"), 1);
    assert_eq!(
        s.run("delete t\r\ndelete t\r\ndelete nope noreply\r\ndelete t 0\r\n"),
        "DELETED\r\nNOT_FOUND\r\nNOT_FOUND\r\n"
    );
    assert_eq!((s.stat("delete_hits"), s.stat("delete_misses")), (1, 3));
}

#[test]
fn flush_all_now_later_and_disabled() {
    let s = server();
    s.run("set a 0 0 1\r\na\r\n");
    assert_eq!(s.run("flush_all\r\nget a\r\n"), "OK\r\nEND\r\n");
    s.run("set a 0 0 1\r\na\r\n");
    assert_eq!(
        s.run("flush_all 10\r\nget a\r\n"),
        "OK\r\nVALUE a 0 1\r\na\r\nEND\r\n"
    );
    s.clock.advance(10);
    assert_eq!(s.run("get a\r\n"), "END\r\n");
    assert_eq!((s.stat("get_flushed"), s.stat("get_expired")), (2, 0));
    assert_eq!(s.run("flush_all noreply\r\nflush_all -1\r\n"), "OK\r\n");
    assert_eq!(s.stat("cmd_flush"), 4);
    let off = server_with(CacheConfig::default(), false);
    off.run("set a 0 0 1\r\na\r\n");
    assert_eq!(
        off.run("flush_all\r\nflush_all noreply\r\nget a\r\n"),
        "CLIENT_ERROR flush_all not allowed\r\nVALUE a 0 1\r\na\r\nEND\r\n"
    );
}

#[test]
fn version_verbosity_quit_noop() {
    let s = server();
    assert_eq!(s.run("version\r\n"), format!("VERSION {VERSION}\r\n"));
    assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
    assert_eq!(s.run("verbosity 5\r\nverbosity 1 noreply\r\n"), "OK\r\n");
    assert_eq!(s.shared.verbosity.load(Ordering::Relaxed), 1);
    assert_eq!(s.run("mn\r\n"), "MN\r\n");
    let (out, flow) = s.run_flow(b"mn\r\nquit\r\nmn\r\n");
    assert_eq!((out.as_slice(), flow), (&b"MN\r\n"[..], Flow::Close));
}

#[test]
fn stats_lines() {
    let s = server();
    s.run("set a 0 0 1\r\na\r\nget a b\r\n");
    let out = s.run("stats\r\n");
    assert!(out.ends_with("END\r\n"), "{out}");
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    for name in [
        "pid",
        "uptime",
        "time",
        "version",
        "rusage_user",
        "rusage_system",
        "max_connections",
        "curr_connections",
        "total_connections",
        "rejected_connections",
        "cmd_get",
        "cmd_set",
        "cmd_flush",
        "cmd_touch",
        "get_hits",
        "get_misses",
        "get_expired",
        "get_flushed",
        "delete_misses",
        "delete_hits",
        "incr_misses",
        "incr_hits",
        "decr_misses",
        "decr_hits",
        "cas_misses",
        "cas_hits",
        "cas_badval",
        "touch_hits",
        "touch_misses",
        "bytes_read",
        "bytes_written",
        "limit_maxbytes",
        "threads",
        "bytes",
        "curr_items",
        "total_items",
        "evictions",
        "reclaimed",
        "crawler_reclaimed",
    ] {
        assert!(names.contains(&name), "missing {name}");
    }
    assert_eq!(
        names.len(),
        out.lines().count() - 1,
        "only STAT lines before END"
    );
    assert!(out.contains(&format!("STAT version {VERSION}\r\n")));
    assert!(out.contains("STAT threads 2\r\nSTAT bytes "));
    assert!(out.lines().any(|l| l.starts_with("STAT rusage_user ")
        && l.split('.').nth(1).is_some_and(|us| us.len() == 6)));
    assert_eq!(
        (
            s.stat("curr_items"),
            s.stat("total_items"),
            s.stat("total_connections")
        ),
        (1, 1, 3)
    );
    let settings = s.run("stats settings\r\n");
    assert!(
        settings.starts_with("STAT maxbytes 67108864\r\nSTAT maxconns 100\r\n"),
        "{settings}"
    );
    assert!(settings.contains("STAT flush_enabled yes\r\n") && settings.ends_with("END\r\n"));
    assert_eq!(s.run("stats foo\r\nstats reset\r\n"), "ERROR\r\nERROR\r\n");
}

#[test]
fn meta_get_flags_in_request_order() {
    let s = server();
    s.run("set m1 7 0 5\r\nhello\r\n");
    let cas = s.cas("m1");
    s.clock.advance(3);
    // h and l are as they were before this request; gets above fetched it 3 seconds ago.
    assert_eq!(
        s.run("mg m1 s v f t c k O99 h l q\r\n"),
        format!("VA 5 s5 f7 t-1 c{cas} km1 O99 h1 l3\r\nhello\r\n")
    );
    assert_eq!(s.run("mg m1 l\r\n"), "HD l0\r\n");
    assert_eq!(
        s.run("mg m1\r\nmg m1 q\r\nmg m1 k O1 q\r\n"),
        "HD\r\nHD\r\nHD km1 O1\r\n"
    );
    assert_eq!(
        s.run("mg nope v\r\nmg nope v q\r\nmg nope k O5 v s\r\nmn\r\n"),
        "EN\r\nEN knope O5\r\nMN\r\n"
    );
    assert_eq!(s.run("mg m1 T30 t\r\nmg m1 t\r\n"), "HD t30\r\nHD t30\r\n");
    // u: no bump, so the access time stays.
    s.clock.advance(2);
    assert_eq!(
        s.run("mg m1 u l\r\nmg m1 l\r\nmg m1 l\r\n"),
        "HD l2\r\nHD l2\r\nHD l0\r\n"
    );
    assert_eq!((s.stat("cmd_touch"), s.stat("touch_hits")), (1, 1));
}

#[test]
fn meta_get_fresh_item_is_not_yet_hit() {
    let s = server();
    s.run("set f 0 0 1\r\nx\r\n");
    assert_eq!(s.run("mg f h\r\nmg f h\r\n"), "HD h0\r\nHD h1\r\n");
    assert_eq!(s.run("mg f u h\r\n"), "HD h1\r\n");
}

#[test]
fn meta_get_vivify_and_stale_tokens() {
    let s = server();
    let out = s.run("mg viv N30 v c t\r\n");
    assert!(
        out.starts_with("VA 0 c") && out.ends_with(" t30 W\r\n\r\n"),
        "{out}"
    );
    assert_eq!(
        s.run("mg viv N30 v\r\nmg viv\r\n"),
        "VA 0 Z\r\n\r\nHD Z\r\n"
    );
    assert_eq!(
        s.run("ms viv 2\r\nhi\r\nmg viv v\r\n"),
        "HD\r\nVA 2\r\nhi\r\n"
    );
    assert_eq!(
        s.run("md viv I T30\r\nmg viv v t\r\nmg viv v\r\n"),
        "HD\r\nVA 2 t30 X W\r\nhi\r\nVA 2 Z X\r\nhi\r\n"
    );
}

#[test]
fn meta_binary_keys_come_back_in_base64() {
    let s = server();
    assert!(s
        .run("ms YQ== 1 b k c\r\nx\r\n")
        .starts_with("HD kYQ== b c"));
    assert_eq!(
        s.run("mg YQ== b k v\r\nget a\r\n"),
        "VA 1 kYQ== b\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"
    );
    assert_eq!(
        s.run("mg bm9rZXk= b k O5\r\nmd bm9rZXk= b k\r\n"),
        "EN kbm9rZXk= b O5\r\nNF kbm9rZXk= b\r\n"
    );
    assert_eq!(
        s.run("ma bm9rZXk= b k N0 v\r\n"),
        "VA 1 kbm9rZXk= b\r\n0\r\n"
    );
    assert_eq!(s.run("me YQ== b\r\n").split(' ').nth(1), Some("YQ=="));
    // Non-canonical base64 is decoded and echoed canonically.
    assert_eq!(s.run("mg YR== b k\r\n"), "HD kYQ== b\r\n");
}

#[test]
fn meta_set_modes_and_returns() {
    let s = server();
    let out = s.run("ms k 2 T0 F5 c\r\nhi\r\n");
    let cas: u64 = out
        .trim_end()
        .strip_prefix("HD c")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        s.run("mg k v f c t\r\n"),
        format!("VA 2 f5 c{cas} t-1\r\nhi\r\n")
    );
    assert_eq!(s.run("ms k 1 ME c k O7\r\nx\r\n"), "NS c0 kk O7\r\n");
    assert_eq!(s.run("ms nope 1 MR c\r\nx\r\n"), "NS c0\r\n");
    assert_eq!(
        s.run("ms k 1 MA\r\n!\r\nms k 1 MP\r\n<\r\nmg k v\r\n"),
        "HD\r\nHD\r\nVA 4\r\n<hi!\r\n"
    );
    assert_eq!(s.run("ms nope 1 MA\r\nx\r\n"), "NS\r\n");
    assert_eq!(
        s.run("ms k 1 q\r\nx\r\nms k 1 q ME\r\nx\r\nmn\r\n"),
        "NS\r\nMN\r\n"
    );
    // CAS: set and replace become cas, add ignores it, append checks it first.
    let cas = s.cas("k");
    assert_eq!(
        s.run(&format!(
            "ms k 1 C{}\r\ny\r\nms nope 1 C1 q\r\ny\r\n",
            cas + 1
        )),
        "EX\r\nNF\r\n"
    );
    assert_eq!(s.run(&format!("ms k 1 C{cas} MR\r\ny\r\n")), "HD\r\n");
    let cas = s.cas("k");
    assert_eq!(
        s.run(&format!(
            "ms k 1 MA C{}\r\nz\r\nms k 1 MA C{cas}\r\nz\r\nms nope 1 MA C1\r\nz\r\n",
            cas + 1
        )),
        "EX\r\nHD\r\nNS\r\n"
    );
    assert_eq!(
        s.run("ms k 1 ME C1\r\nx\r\nmg k v\r\n"),
        "NS\r\nVA 2\r\nyz\r\n"
    );
    // E sets the new CAS explicitly.
    assert_eq!(s.run("ms e 1 E12345 c\r\nx\r\n"), "HD c12345\r\n");
    assert_eq!(s.run("mg e c\r\n"), "HD c12345\r\n");
    assert_eq!(
        (
            s.stat("cas_hits"),
            s.stat("cas_badval"),
            s.stat("cas_misses")
        ),
        (2, 2, 1)
    );
    // I without C changes nothing.
    assert_eq!(s.run("ms k 1 I\r\nw\r\nmg k v\r\n"), "HD\r\nVA 1\r\nw\r\n");
    assert_eq!(s.run("ms k 1 T-1\r\nx\r\nmg k\r\n"), "HD\r\nEN\r\n");
}

#[test]
fn meta_delete() {
    let s = server();
    s.run("set d 0 0 1\r\n1\r\n");
    let cas = s.cas("d");
    assert_eq!(
        s.run(&format!("md d C{} q k O1\r\n", cas + 1)),
        "EX kd O1\r\n"
    );
    assert_eq!(
        s.run("md d k O1\r\nmd d q\r\nmd d O2\r\n"),
        "HD kd O1\r\nNF\r\nNF O2\r\n"
    );
    s.run("set d 0 0 1\r\n1\r\n");
    assert_eq!(s.run("md d q\r\nmn\r\n"), "MN\r\n");
    assert_eq!((s.stat("delete_hits"), s.stat("delete_misses")), (2, 3));
}

#[test]
fn meta_arith() {
    let s = server();
    s.run("set n 0 0 1\r\n5\r\n");
    assert_eq!(s.run("ma n\r\nma n q\r\nma n v\r\n"), "HD\r\nVA 1\r\n8\r\n");
    let out = s.run("ma n v MD D10 t k O1 c\r\n");
    assert!(
        out.starts_with("VA 1 t-1 kn O1 c") && out.ends_with("\r\n0\r\n"),
        "{out}"
    );
    assert_eq!(
        s.run("ma n M+ D18446744073709551615 v\r\nma n M- v\r\n"),
        "VA 20\r\n18446744073709551615\r\nVA 20\r\n18446744073709551614\r\n"
    );
    assert_eq!(s.run("ma n MI v\r\n"), "VA 20\r\n18446744073709551615\r\n");
    assert_eq!(
        s.run("ma nope\r\nma nope q O3 k\r\n"),
        "NF\r\nNF O3 knope\r\n"
    );
    assert_eq!(
        s.run("ma newn N0 J7 v\r\nma newn N0 J7 v\r\n"),
        "VA 1\r\n7\r\nVA 1\r\n8\r\n"
    );
    assert_eq!(s.run("ma ttl N100 J1 T50 t v\r\n"), "VA 1 t50\r\n1\r\n");
    let cas = s.cas("n");
    assert_eq!(
        s.run(&format!("ma n C{} k\r\nma n C{cas} v\r\n", cas + 1)),
        "EX kn\r\nVA 1\r\n0\r\n"
    );
    assert_eq!(
        s.run("set t 0 0 1\r\nx\r\nma t q\r\n"),
        "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    );
    assert_eq!(
        (
            s.stat("incr_hits"),
            s.stat("decr_hits"),
            s.stat("incr_misses")
        ),
        (9, 2, 2)
    );
}

#[test]
fn meta_debug() {
    let s = server();
    assert_eq!(
        s.run("set fl 7 100 5\r\nhello\r\nme nope\r\n"),
        "STORED\r\nEN\r\n"
    );
    let cas = s.cas("fl");
    s.clock.advance(4);
    assert_eq!(
        s.run("me fl\r\n"),
        format!("ME fl exp=-96 la=4 cas={cas} fetch=yes cls=1 size=70\r\n")
    );
    // me does not bump.
    assert_eq!(
        s.run("me fl\r\n"),
        format!("ME fl exp=-96 la=4 cas={cas} fetch=yes cls=1 size=70\r\n")
    );
    s.run("set a 0 0 1\r\nx\r\n");
    assert_eq!(
        s.run("me a\r\n"),
        format!(
            "ME a exp=-1 la=0 cas={} fetch=no cls=1 size=61\r\n",
            cas + 1
        )
    );
}

#[test]
fn protocol_errors_from_the_parser_pass_through() {
    let s = server();
    assert_eq!(s.run("bogus\r\nset k 0 0 abc\r\nabc\r\nset k 0 0 3\r\nabcde\r\n"), "ERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\n");
}

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Counts this thread's allocations, so that a test can see what a request costs.
struct CountingAllocator;

// SAFETY: forwards to the system allocator unchanged; the counter is a const-initialized
// thread-local Cell, which never allocates.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn a_hundred_key_get_allocates_nothing_per_key() {
    let s = server();
    let mut line = String::from("get");
    for i in 0..100 {
        s.run(&format!("set key:{i} 0 0 10\r\n0123456789\r\n"));
        line.push_str(&format!(" key:{i} miss:{i}"));
    }
    line.push_str("\r\n");
    let limits = Limits::default();
    let stats = &s.shared.workers[0];
    let mut out = Vec::with_capacity(1 << 16);
    let mut cost = |input: &[u8]| {
        out.clear();
        let before = ALLOCATIONS.with(Cell::get);
        let (req, _) = parse_request(input, &limits).unwrap();
        execute(&req, &s.shared, stats, &mut out);
        ALLOCATIONS.with(Cell::get) - before
    };
    let one = cost(b"get key:1 miss:1\r\n");
    let hundred = cost(line.as_bytes());
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 201);
    assert_eq!(hundred, one, "allocations: 1 key {one}, 100 keys {hundred}");
    assert_eq!(hundred, 0);
}
