"""The end of a job with an output table: seal its output version and make it current, which needs every server of
the cluster, so it first waits (bounded) for a server that is down to come back and repair itself.

Why waiting is enough. While a replica was down the job wrote at ack=one: every write reached the replicas that were
up. A server restarted on its address copies, before it serves them, every partition it holds of every open version
from a replica that has it (docs/membership.md), so once it reports nothing pending it
holds the output version as its replicas do, provided no output write was still going on when it came back (the
window the architecture names: a write acknowledged at ack=one by a client that still counted it down). The driver
waits only here, after the last write of the job: a server that comes back while the driver waits holds everything.

The wait is bounded by the job's `commit_timeout`: then `CommitPending` names the servers, and the job's tables and
open version stay, so `resume(job_id, grid)` seals and switches once they are back (or removed from the cluster).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ramgrid.exceptions import CommitPending, RamgridError
from ramgrid.grid import Grid

log = logging.getLogger("ramgrid.mapreduce")

__all__ = ["DEFAULT_COMMIT_TIMEOUT", "commit_output", "wait_whole"]

# Seconds a job waits at its commit for a down server to come back (a job option, `commit_timeout`).
DEFAULT_COMMIT_TIMEOUT = 60.0

_POLL = 0.2


def _not_ready(status: list[dict[str, Any]]) -> dict[str, str]:
    """Servers that cannot take part in a seal yet, with why: down, or restarted and still copying its partitions."""
    out: dict[str, str] = {}
    for s in status:
        addr = str(s.get("server"))
        if not s.get("ok"):
            out[addr] = f"down ({s.get('error')})"
        elif s.get("catalog_learned") != 1 or (s.get("pending_partitions") or 0) > 0:
            out[addr] = f"repairing ({s.get('pending_partitions')} partitions left to copy in)"
    return out


def wait_whole(grid: Grid, deadline: float, what: str, job_id: str, on_wait: Any = None) -> float:
    """Waits until every server of the cluster is up with nothing left to repair; returns the seconds waited. Raises
    `CommitPending` naming the servers that are not once `deadline` (time.monotonic) passes. `on_wait(servers)` is
    called once when the first poll finds some server not ready (the driver notes it in the job log)."""
    t0 = time.monotonic()
    noted = False
    while True:
        try:
            bad = _not_ready(grid.status())
        except RamgridError as e:  # the status call itself failed (every server unreachable)
            bad = {",".join(grid.servers): f"unreachable ({e})"}
        if not bad:
            return time.monotonic() - t0
        if not noted:
            noted = True
            log.warning("job %s: %s waits for %s", job_id, what, "; ".join(f"{a} {w}" for a, w in bad.items()))
            if on_wait is not None:
                on_wait(sorted(bad))
        if time.monotonic() >= deadline:
            raise CommitPending(
                f"job {job_id}: {what} needs every server, and "
                + "; ".join(f"{a} is {w}" for a, w in sorted(bad.items()))
                + f" after {time.monotonic() - t0:.0f} s (commit_timeout). The job's work is done and kept: once "
                f"{'that server is' if len(bad) == 1 else 'those servers are'} back (or removed from the cluster), "
                f"ramgrid.mapreduce.resume({job_id!r}, grid) seals and switches the output without running any task "
                f"again; ramgrid.mapreduce.abandon({job_id!r}, grid) gives the job up.",
                job_id,
                tuple(sorted(bad)),
            )
        time.sleep(_POLL)


def commit_output(grid: Grid, table: str, version: int, job_id: str, timeout: float, on_wait: Any = None) -> float:
    """Seals `version` of `table` on every server and makes it current, waiting up to `timeout` seconds for the
    cluster to be whole; returns the seconds waited. Unlike `VersionWriter.commit` a failure never aborts the version
    (the job's output stays for `resume`). Sealing and switching are idempotent, so a retry after a partial one (a
    server lost between the two) is safe."""
    deadline = time.monotonic() + timeout
    waited = 0.0
    c = grid._client()
    while True:
        waited += wait_whole(grid, deadline, f"switching its output version {version} of {table!r}", job_id, on_wait)
        try:
            c.seal_version(table, version)
            c.set_current(table, version)
            return waited
        except RamgridError as e:
            # A server went down between the status and the seal, or this client still counts a restarted one down
            # until its probe answers (client rule 4): ask the cluster again.
            if time.monotonic() >= deadline:
                waited += wait_whole(grid, deadline, f"switching its output version {version}", job_id, on_wait)
                raise CommitPending(
                    f"job {job_id}: the seal of version {version} of {table!r} kept failing ({e}); "
                    f"ramgrid.mapreduce.resume({job_id!r}, grid) tries it again without running any task",
                    job_id,
                ) from e
            log.info("job %s: the seal of %s version %d failed (%s); trying again", job_id, table, version, e)
            time.sleep(_POLL)
