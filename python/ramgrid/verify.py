"""Comparing a table's replicas (`Table.verify`, `ramgrid table verify`): the native client asks every server for
a digest of each partition it holds (protocol 6.9) and compares; this shapes its answer for Python."""

from __future__ import annotations

from typing import Any


def verify_table(client: Any, name: str, version: int | None) -> dict[str, Any]:
    """{"version", "agreed", "items", "differ": {partition: {server: (items, digest)}}, "unanswered": [(partition,
    server, why)]} for `name` at `version` (None: the current one)."""
    v, agreed, items, differ, unanswered = client.verify(name, int(version or 0))
    return {
        "version": v,
        "agreed": agreed,
        "items": items,
        "differ": {p: {s: (n, d) for s, n, d in reps} for p, reps in differ},
        "unanswered": [tuple(u) for u in unanswered],
    }
