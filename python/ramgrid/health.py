"""The cluster's health in one dict, from the servers' CLUSTER_STATUS: the metadata group's leader, its voters and
how many of them answer, how many more failures it tolerates, and what the cluster serves now
(docs/control-plane.md, "Without a majority"). Pure functions of `Grid.status()`'s list: `Grid.health()`,
`ramgrid cluster status` and `LocalGrid.wait_repaired()` use them."""

from __future__ import annotations

from typing import Any

FULL = "full service"
# The voters the metadata group's leader keeps when it can (crates/ramgrid-server/src/meta/leader.rs, VOTERS).
VOTERS = 3
DEGRADED = (
    "degraded: no majority of the metadata group's voters answers; pinned reads of sealed versions are served by "
    "any live replica, unpinned reads, writes, version switches and catalog changes are refused (NO_QUORUM)"
)


def members(status: dict[str, Any]) -> dict[str, str]:
    """The group's members as one server sees them: {address: "voter" | "learner"}."""
    out: dict[str, str] = {}
    for m in str(status.get("meta_member") or "").split(";"):
        parts = m.split()
        if len(parts) == 3:
            out[parts[0]] = parts[2]
    return out


def leader(status: dict[str, Any]) -> str | None:
    """The leader's address as one server sees it; None when it knows of none."""
    name = str(status.get("meta_leader") or "none").split(" ")[0]
    return None if name == "none" else name


def group_health(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """{"leader": address | None (the one every answering server names, in contact with a majority; None if
    none, if they disagree, or without a majority),
    "voters": [addresses], "voters_alive": [those answering], "majority": int, "tolerates": int (more voters that
    may fail with the group still able to decide; -1 without a majority now), "mode": FULL or DEGRADED,
    "whole": bool (one leader known to every answering server, every answering server a member, and the voters
    the leader keeps: up to 3 of them answering)}.

    Without a metadata group (servers started without one) the leader is None, the voters empty and the mode
    full service."""
    live = [s for s in statuses if s.get("ok")]
    grouped = [s for s in live if "meta_leader" in s]
    if not grouped:
        return {
            "leader": None,
            "voters": [],
            "voters_alive": [],
            "majority": 0,
            "tolerates": 0,
            "mode": FULL,
            "whole": True,
        }
    # The widest view of the membership: the one of the server that knows the most members.
    view = max((members(s) for s in grouped), key=len)
    voters = sorted(a for a, role in view.items() if role == "voter")
    answering = {str(s.get("server")) for s in live}
    alive = [a for a in voters if a in answering]
    majority = len(voters) // 2 + 1
    leaders = {leader(s) for s in grouped}
    one_leader = leaders.pop() if len(leaders) == 1 else None
    quorum_ok = one_leader is not None and len(alive) >= majority and all(s.get("quorum") == "ok" for s in grouped)
    # Whole: every answering server a member, and as many voters as the leader keeps (up to 3 live ones).
    whole = quorum_ok and all(str(s.get("server")) in view for s in live) and len(alive) >= min(VOTERS, len(live))
    return {
        "leader": one_leader if quorum_ok else None,
        "voters": voters,
        "voters_alive": alive,
        "majority": majority,
        "tolerates": len(alive) - majority if quorum_ok else -1,
        "mode": FULL if quorum_ok else DEGRADED,
        "whole": whole,
    }


def unavailable_partitions(owners: dict[str, list[list[str]]], answering: set[str]) -> dict[str, list[int]]:
    """{table: [partitions none of whose replicas is among `answering`]}, for the tables with any: data that
    cannot be read until a replica comes back (or, for a server lost for good without `--data-dir`, lost)."""
    out: dict[str, list[int]] = {}
    for table, parts in owners.items():
        dead = [p for p, replicas in enumerate(parts) if not any(r in answering for r in replicas)]
        if dead:
            out[table] = dead
    return out


def summary(h: dict[str, Any]) -> str:
    """One line for people: "3 of 3 voters answer (leader A); tolerates 1 more failure; full service"."""
    if not h["voters"]:
        return "no metadata group; full service"
    lead = f"leader {h['leader']}" if h["leader"] else "no leader with a majority"
    n = h["tolerates"]
    tol = "no majority" if n < 0 else f"tolerates {n} more failure{'' if n == 1 else 's'}"
    missing = sorted(set(h["voters"]) - set(h["voters_alive"]))
    gone = f" (not answering: {', '.join(missing)})" if missing else ""
    line = f"{len(h['voters_alive'])} of {len(h['voters'])} voters answer{gone}, {lead}; {tol}; {h['mode']}"
    lost = h.get("unavailable") or {}
    if lost:
        line += "\npartitions with no replica answering: " + "; ".join(f"{t} {ps}" for t, ps in sorted(lost.items()))
    return line
