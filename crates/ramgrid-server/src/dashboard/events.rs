//! The dashboard's recent events: what changed between two looks at the cluster. Fail-overs,
//! rejoins, moves, leader changes and table switches come from this server's own view of the
//! agreed state (every server installs the same committed state, so every server reports them);
//! refused requests and repairs from each member's counters; a member that stops or starts
//! answering from this server's calls to it. Kept in a bounded ring, newest last.

use std::collections::{BTreeSet, VecDeque};

use super::scrape::{Figures, Status};

/// Events kept.
pub const KEEP: usize = 200;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Unix time in milliseconds when this server saw it.
    pub t_ms: u64,
    /// What kind: `failover`, `rejoin`, `move`, `leader`, `table`, `refused`, `repair`, `down`, `up`.
    pub kind: &'static str,
    /// The server it concerns ("" for the cluster as a whole).
    pub server: String,
    /// What happened, for people.
    pub text: String,
}

/// An event before it is stamped: (kind, server, text).
pub type Note = (&'static str, String, String);

/// The last [`KEEP`] events.
#[derive(Debug, Default)]
pub struct Ring(VecDeque<Event>);

impl Ring {
    /// Stamps `notes` with `t_ms` and keeps them.
    pub fn add(&mut self, t_ms: u64, notes: Vec<Note>) {
        for (kind, server, text) in notes {
            if self.0.len() == KEEP {
                self.0.pop_front();
            }
            self.0.push_back(Event {
                t_ms,
                kind,
                server,
                text,
            });
        }
    }

    /// The events, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Event> {
        self.0.iter()
    }
}

/// What changed in the agreed state between two CLUSTER_STATUS of this server.
pub fn control_plane(before: &Status, after: &Status) -> Vec<Note> {
    let mut out = Vec::new();
    let set = |s: &Status, k| s.all(k).map(str::to_owned).collect::<BTreeSet<_>>();
    let (failed_a, failed_b) = (set(before, "failed"), set(after, "failed"));
    for addr in failed_b.difference(&failed_a) {
        out.push((
            "failover",
            addr.clone(),
            format!("{addr} failed over: its partitions are re-replicated from the survivors"),
        ));
    }
    let servers_b = after.list("servers");
    for addr in failed_a.difference(&failed_b) {
        if servers_b.contains(addr) {
            out.push((
                "rejoin",
                addr.clone(),
                format!("{addr} rejoined the cluster"),
            ));
        }
    }
    match (before.get("next"), after.get("next")) {
        (None, Some(next)) => out.push((
            "move",
            String::new(),
            format!("move begun: the servers will be {next}"),
        )),
        (Some(_), None) => out.push((
            "move",
            String::new(),
            format!(
                "move ended: the servers are {}",
                after.get("servers").unwrap_or("")
            ),
        )),
        _ => {}
    }
    if after.leader() != before.leader() {
        if let Some(l) = after.leader() {
            out.push((
                "leader",
                l.to_owned(),
                format!(
                    "{l} leads the metadata group (term {})",
                    after.get("meta_term").unwrap_or("?")
                ),
            ));
        }
    }
    out
}

/// What changed in the catalog between two looks at this server's tables.
pub fn tables(before: &Figures, after: &Figures) -> Vec<Note> {
    let mut out = Vec::new();
    for (name, t) in &after.tables {
        match before.tables.get(name) {
            None => out.push(("table", String::new(), format!("table {name} created"))),
            Some(b) if b.current != t.current && t.current > 0 => out.push((
                "table",
                String::new(),
                format!("{name}: version {} is current", t.current),
            )),
            Some(_) => {}
        }
    }
    for name in before.tables.keys() {
        if !after.tables.contains_key(name) {
            out.push(("table", String::new(), format!("table {name} dropped")));
        }
    }
    out
}

/// What one member's counters and status say happened between two looks: requests refused (by
/// reason), a repair begun or finished.
pub fn member(addr: &str, before: (&Status, &Figures), after: (&Status, &Figures)) -> Vec<Note> {
    let mut out = Vec::new();
    for (reason, &n) in &after.1.refused {
        let was = before.1.refused.get(reason).copied().unwrap_or(0);
        if n > was {
            let k = n - was;
            let s = if k == 1 { "" } else { "s" };
            out.push((
                "refused",
                addr.to_owned(),
                format!("{addr} refused {k} request{s}: {reason}"),
            ));
        }
    }
    let (p0, p1) = (
        before.0.num("pending_partitions"),
        after.0.num("pending_partitions"),
    );
    if p0 == 0 && p1 > 0 {
        out.push((
            "repair",
            addr.to_owned(),
            format!("{addr} is copying in {p1} partitions"),
        ));
    } else if p0 > 0 && p1 == 0 {
        out.push((
            "repair",
            addr.to_owned(),
            format!(
                "{addr} has copied in its partitions ({} bytes in all)",
                after.0.num("copied_bytes")
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_over_rejoin_move_and_leader() {
        let a = Status::parse("servers a,b,c\nmeta_leader a 1\nmeta_term 3\n");
        let b = Status::parse("servers a,b\nfailed c\nmeta_leader b 2\nmeta_term 4\n");
        let kinds: Vec<_> = control_plane(&a, &b)
            .into_iter()
            .map(|n| (n.0, n.1))
            .collect();
        assert_eq!(
            kinds,
            vec![("failover", "c".into()), ("leader", "b".into())]
        );
        let c = Status::parse("servers a,b\nnext a,b,c\nfailed c\nmeta_leader b 2\n");
        assert_eq!(control_plane(&b, &c)[0].0, "move");
        let d = Status::parse("servers a,b,c\nmeta_leader b 2\n");
        let kinds: Vec<_> = control_plane(&c, &d).into_iter().map(|n| n.0).collect();
        assert_eq!(kinds, vec!["rejoin", "move"]);
        assert!(control_plane(&d, &d).is_empty());
    }

    #[test]
    fn refusals_and_repairs_of_a_member() {
        let s0 = Status::parse("pending_partitions 0\n");
        let s1 = Status::parse("pending_partitions 3\n");
        let mut f0 = Figures::default();
        f0.refused.insert("NOT_OWNER".into(), 2);
        let mut f1 = f0.clone();
        f1.refused.insert("NOT_OWNER".into(), 5);
        f1.refused.insert("NO_QUORUM".into(), 1);
        let notes = member("x:1", (&s0, &f0), (&s1, &f1));
        let texts: Vec<_> = notes.iter().map(|n| n.2.as_str()).collect();
        assert_eq!(
            texts,
            vec![
                "x:1 refused 3 requests: NOT_OWNER",
                "x:1 refused 1 request: NO_QUORUM",
                "x:1 is copying in 3 partitions"
            ]
        );
        assert_eq!(member("x:1", (&s1, &f1), (&s0, &f1))[0].0, "repair");
        assert!(member("x:1", (&s0, &f1), (&s0, &f1)).is_empty());
    }

    #[test]
    fn the_ring_is_bounded() {
        let mut r = Ring::default();
        for i in 0..(KEEP + 5) {
            r.add(i as u64, vec![("table", String::new(), i.to_string())]);
        }
        assert_eq!(r.iter().count(), KEEP);
        assert_eq!(r.iter().next().map(|e| e.t_ms), Some(5));
    }
}
