//! The live dashboard: a web page and its JSON API, served on the HTTP listener that serves
//! `/metrics` (docs/dashboard.md).
//!
//! 1. **Any server shows the whole cluster.** Once a second a sampler reads this server's own
//!    METRICS text and CLUSTER_STATUS (no network). While someone watches (an API request in the
//!    last [`WATCH_FOR`]), it also asks every other member for theirs over the native protocol,
//!    through a peer pool of its own (the token and TLS of server-to-server calls), each call
//!    bounded by [`CALL_DEADLINE`]. Members are the agreed spec's servers, a move's targets, the
//!    failed-over servers and the metadata group's members, as this server's status names them.
//! 2. **Charts** come from per-second samples: the difference between two scrapes of a member's
//!    counters, kept [`series::KEEP`] seconds per member (`series.rs`). A peer's history starts
//!    when watching starts; this server's own is always kept.
//! 3. **Events** are what changed between two looks (`events.rs`), in a bounded ring.
//! 4. **Access** (`http.rs`): with a token, the page and the API answer only requests that bear it
//!    (`Authorization: Bearer`); without one, only on a loopback listener. The page and its
//!    script and style are embedded in the binary; it loads nothing from elsewhere.

pub mod api;
pub mod events;
pub mod http;
pub mod scrape;
pub mod series;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use ramgrid_proto::native::{Request, Response};
use tokio::sync::watch;

use crate::node::Node;
use crate::peer_pool::Pool;
use crate::stats::Shared;
use scrape::{Figures, Status};

/// How often the sampler looks.
pub const TICK: Duration = Duration::from_secs(1);
/// How long after the last API request the sampler keeps asking the peers.
pub const WATCH_FOR: Duration = Duration::from_secs(30);
/// The longest a round waits for one peer's answers.
pub const CALL_DEADLINE: Duration = Duration::from_millis(800);
/// A sample needs at least this long between two scrapes (a round an API request forced
/// right after the sampler's own only refreshes the figures).
const MIN_INTERVAL: Duration = Duration::from_millis(500);

/// What the dashboard knows of one member.
#[derive(Debug, Default)]
pub struct Member {
    /// Its last CLUSTER_STATUS and figures, and when they were read.
    pub last: Option<(Status, Figures, Instant)>,
    /// The figures the next sample's rates count from, and when they were read.
    base: Option<(Figures, Instant)>,
    /// Unix ms of the last successful read.
    pub seen_ms: u64,
    /// Whether the last call to it answered (`None`: not asked yet).
    pub up: Option<bool>,
    /// Why the last call failed.
    pub error: Option<String>,
    /// Its per-second samples.
    pub ring: series::Ring,
    /// The most partitions it had to copy in during the current repair (0: none running).
    pub peak_pending: u64,
    /// Per table: keys, hits and misses per second over the last interval.
    pub table_rates: BTreeMap<String, [f64; 3]>,
}

impl Member {
    /// Takes the outcome of one read of `addr`; returns what changed.
    fn update(
        &mut self,
        addr: &str,
        got: Result<(Status, Figures), String>,
        now: Instant,
        unix_ms: u64,
    ) -> Vec<events::Note> {
        let mut notes = Vec::new();
        match got {
            Ok((status, figures)) => {
                if let Some((s0, f0, _)) = &self.last {
                    notes.extend(events::member(addr, (s0, f0), (&status, &figures)));
                }
                // A read too close to the base for a rate (an API request's, right after the
                // sampler's) only refreshes the figures shown; the base stays.
                match &self.base {
                    Some((_, at)) if now.duration_since(*at) < MIN_INTERVAL => {}
                    Some((f0, at)) => {
                        let secs = now.duration_since(*at).as_secs_f64();
                        self.ring
                            .push(series::Sample::between(f0, &figures, secs, unix_ms / 1000));
                        self.table_rates = table_rates(f0, &figures, secs);
                        self.base = Some((figures.clone(), now));
                    }
                    None => self.base = Some((figures.clone(), now)),
                }
                if self.up == Some(false) {
                    notes.push(("up", addr.to_owned(), format!("{addr} answers again")));
                }
                let pending = status.num("pending_partitions");
                self.peak_pending = if pending == 0 {
                    0
                } else {
                    self.peak_pending.max(pending)
                };
                self.up = Some(true);
                self.error = None;
                self.seen_ms = unix_ms;
                self.last = Some((status, figures, now));
            }
            Err(why) => {
                if self.up != Some(false) {
                    notes.push((
                        "down",
                        addr.to_owned(),
                        format!("{addr} does not answer: {why}"),
                    ));
                }
                self.up = Some(false);
                self.error = Some(why);
            }
        }
        notes
    }
}

/// Everything the sampler has gathered.
#[derive(Debug, Default)]
pub struct State {
    /// By address.
    pub members: BTreeMap<String, Member>,
    /// Recent events.
    pub events: events::Ring,
    /// When the peers were last asked.
    pub peers_read: Option<Instant>,
}

/// The dashboard of one server.
pub struct Dashboard {
    node: Arc<Node>,
    shared: Arc<Shared>,
    pool: Pool,
    /// The HTTP listener's address: a page without a token is served on loopback only.
    pub bind: SocketAddr,
    state: Mutex<State>,
    /// One sampling round at a time.
    round: tokio::sync::Mutex<()>,
    watched_until: Mutex<Option<Instant>>,
}

impl Dashboard {
    /// The dashboard of `node`, served on a listener bound to `bind`.
    pub fn new(node: Arc<Node>, shared: Arc<Shared>, bind: SocketAddr) -> Arc<Dashboard> {
        let pool = Pool::new(node.token.clone(), node.tls.clone());
        Arc::new(Dashboard {
            node,
            shared,
            pool,
            bind,
            state: Mutex::new(State::default()),
            round: tokio::sync::Mutex::new(()),
            watched_until: Mutex::new(None),
        })
    }

    /// The sampler: one round a second until `stop` turns true. Runs on the HTTP listener's
    /// runtime.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            let watched = self
                .watched_until
                .lock()
                .is_some_and(|t| Instant::now() < t);
            self.round(watched, false).await;
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = stop.changed() => break,
            }
        }
    }

    /// Called by each API request: keeps the peers sampled, and reads them now when the last
    /// read is old (watching just began).
    pub async fn watch(self: &Arc<Self>) {
        *self.watched_until.lock() = Some(Instant::now() + WATCH_FOR);
        if self.peers_stale() {
            self.round(true, true).await;
        }
    }

    fn peers_stale(&self) -> bool {
        self.state
            .lock()
            .peers_read
            .is_none_or(|t| t.elapsed() > TICK * 3)
    }

    /// Runs `f` over the gathered state, with this server's address.
    pub fn with_state<T>(&self, f: impl FnOnce(&State, &str) -> T) -> T {
        f(&self.state.lock(), &self.node.server_id)
    }

    /// The token the page and the API require, if any.
    pub fn token(&self) -> Option<&str> {
        self.node.token.as_deref()
    }

    /// Reads every member once (the peers only with `peers`); with `if_stale`, only when no
    /// round read the peers lately (the page's four requests arrive together: one round serves
    /// them all).
    async fn round(self: &Arc<Self>, peers: bool, if_stale: bool) {
        let _one = self.round.lock().await;
        if if_stale && !self.peers_stale() {
            return;
        }
        let me = self.node.server_id.clone();
        let status = Status::parse(&crate::cluster::status_text(&self.node));
        let figures = scrape::figures(&crate::metrics::render(&self.shared, &self.node));
        let addrs = member_addrs(&me, &status);
        let mut fetched = Vec::new();
        if peers {
            let mut calls = tokio::task::JoinSet::new();
            for addr in addrs.iter().filter(|a| **a != me).cloned() {
                let this = self.clone();
                calls.spawn(async move {
                    let r = this.fetch(&addr).await;
                    (addr, r)
                });
            }
            while let Some(r) = calls.join_next().await {
                if let Ok(x) = r {
                    fetched.push(x);
                }
            }
        }
        let (now, ms) = (Instant::now(), unix_ms());
        let mut st = self.state.lock();
        let mut notes = Vec::new();
        if let Some(m) = st.members.get(&me) {
            if let Some((s0, f0, _)) = &m.last {
                notes.extend(events::control_plane(s0, &status));
                notes.extend(events::tables(f0, &figures));
            }
        }
        st.members.retain(|a, _| addrs.contains(a));
        let own = st.members.entry(me.clone()).or_default();
        notes.extend(own.update(&me, Ok((status, figures)), now, ms));
        for (addr, r) in fetched {
            let m = st.members.entry(addr.clone()).or_default();
            notes.extend(m.update(&addr, r, now, ms));
        }
        if peers {
            st.peers_read = Some(now);
        }
        st.events.add(ms, notes);
    }

    /// One peer's CLUSTER_STATUS and METRICS.
    async fn fetch(&self, addr: &str) -> Result<(Status, Figures), String> {
        let deadline = tokio::time::Instant::now() + CALL_DEADLINE;
        let status = self
            .pool
            .status(addr, deadline)
            .await
            .map_err(|e| e.to_string())?;
        let text = self
            .pool
            .call(addr, &Request::Metrics, deadline, |r| match r {
                Response::Metrics(t) => Ok(t.to_owned()),
                other => Err(format!("unexpected reply to METRICS: {other:?}")),
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok((Status(status), scrape::figures(&text)))
    }
}

/// Per table: keys, hits and misses per second between figures `a` and `b`, `secs` apart.
fn table_rates(a: &Figures, b: &Figures, secs: f64) -> BTreeMap<String, [f64; 3]> {
    let r = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs.max(1e-3);
    b.tables
        .iter()
        .map(|(name, t)| {
            let z = Default::default();
            let p = a.tables.get(name).unwrap_or(&z);
            (
                name.clone(),
                [r(p.keys, t.keys), r(p.hits, t.hits), r(p.misses, t.misses)],
            )
        })
        .collect()
}

/// The members a status names: the spec's servers, a move's targets, failed-over servers and
/// the metadata group's members, with `me`; in spec order, then the others.
pub fn member_addrs(me: &str, status: &Status) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let extra = status
        .list("next")
        .into_iter()
        .chain(status.all("failed").map(str::to_owned))
        .chain(status.meta_members().into_iter().map(|(a, _)| a))
        .chain(std::iter::once(me.to_owned()));
    let mut seen = BTreeSet::new();
    for a in status.list("servers").into_iter().chain(extra) {
        if seen.insert(a.clone()) {
            out.push(a);
        }
    }
    out
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_the_spec_then_the_others_once_each() {
        let s = Status::parse(
            "servers a:1,b:2\nnext a:1,b:2,c:3\nfailed d:4\nmeta_member b:2 2 voter\n",
        );
        assert_eq!(member_addrs("a:1", &s), vec!["a:1", "b:2", "c:3", "d:4"]);
        assert_eq!(member_addrs("z:9", &Status::default()), vec!["z:9"]);
    }

    #[test]
    fn a_member_going_down_and_back_is_noted_once_each() {
        let mut m = Member::default();
        let t0 = Instant::now();
        let ok = || Ok((Status::default(), Figures::default()));
        assert!(m.update("x", ok(), t0, 1000).is_empty());
        let down = m.update("x", Err("refused".into()), t0 + TICK, 2000);
        assert_eq!(down[0].0, "down");
        assert!(m
            .update("x", Err("refused".into()), t0 + TICK * 2, 3000)
            .is_empty());
        let up = m.update("x", ok(), t0 + TICK * 3, 4000);
        assert_eq!(up.iter().map(|n| n.0).collect::<Vec<_>>(), vec!["up"]);
        assert_eq!(
            m.ring.iter().count(),
            1,
            "one interval between the two reads"
        );
        assert_eq!(m.up, Some(true));
    }
}
