"""Handles on a grid and its tables: `Grid`, `Table`, `PinnedTable`, `VersionWriter`, and `connect()`.

A handle holds configuration only (the server list, options, a table name, a pinned version). The native client
behind it is looked up per process in a registry keyed by that configuration (`ramgrid._clients`), so handles pickle
without sockets, reconnect lazily in a new process, and share one connection pool per process.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ramgrid._clients import GridConfig, _existing_client, client_for, native, release_client
from ramgrid._keys import NativeKeys, convert_keys, convert_values, fit_values, key_count
from ramgrid._metrics import table_figures
from ramgrid._sentinels import RAISE
from ramgrid._types import ValueTypeLike, parse_value_type
from ramgrid.aio import _PipelinedReads
from ramgrid.arrow import _Arrow
from ramgrid.config import SpecLike, parse_spec
from ramgrid.exceptions import KeysNotFound, RamgridError
from ramgrid.ops import _Operators
from ramgrid.reduce import _Reduce
from ramgrid.scan import _Scans
from ramgrid.tls import TLS

# The client's events (tables created and dropped, versions committed, aborted and dropped, servers added and
# removed) go to this logger at INFO; it has no handler of its own, so they show only where the application
# configures logging. Per-request detail stays out: a batch is not an event.
log = logging.getLogger("ramgrid")

if TYPE_CHECKING:
    from typing_extensions import Self

    from ramgrid._native import Client

__all__ = ["Grid", "GridConfig", "PinnedTable", "Table", "VersionPart", "VersionWriter", "connect", "native"]

ValueType = ValueTypeLike


class _Elsewhere:
    """Sentinel: a shared-memory reader handle could not answer; read through the client."""

    def __repr__(self) -> str:
        return "<elsewhere>"


_ELSEWHERE: Any = _Elsewhere()


class Grid:
    """A handle on a ramgrid cluster. Cheap to create, safe to pickle; connects on first use."""

    def __init__(self, config: GridConfig) -> None:
        self._config = config

    @property
    def config(self) -> GridConfig:
        return self._config

    @property
    def servers(self) -> list[str]:
        """The cluster spec: server addresses in partition-map order. After a move (`add_server`,
        `remove_server`, or one this process's client learned of from the servers) this is the spec the client
        works under, not the list the handle was created with."""
        c = _existing_client(self._config)
        if c is not None:
            return list(c.servers())
        return list(self._config.servers)

    def _client(self) -> Client:
        return client_for(self._config)

    def __reduce__(self) -> Any:
        # The live spec travels, so a handle unpickled after a move does not start from servers that left.
        servers = tuple(self.servers)
        config = self._config if servers == self._config.servers else replace(self._config, servers=servers)
        return (Grid, (config,))

    def __repr__(self) -> str:
        return f"Grid({self.servers!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes this process's connections for this configuration. Other handles with the same configuration
        reconnect on their next call."""
        release_client(self._config)

    # tables

    def table(self, name: str) -> Table:
        """A handle on table `name` (no request is made until it is used)."""
        return Table(self, name)

    def create_table(
        self,
        name: str,
        partitions: int = 64,
        replication: int | None = None,
        value_type: ValueType = "bytes",
        *,
        dim: int = 0,
        exist_ok: bool = False,
        durability: str = "memory",
    ) -> Table:
        """Creates a table and returns its handle. `replication`: copies of each partition (None: the grid's default,
        1; a `ramgrid.dask` grid's is the one given to `start`).

        `value_type`: "bytes", "i64", "f64", or ("f32vec", dim) for fixed-length float32 vectors. The new table has
        an open version 1 that is current, so plain `put_many` writes to it; use `Table.new_version()` to load later
        versions atomically. With `exist_ok`, an existing table of that name is returned as is. `durability`:
        "memory" (a server restart loses it), "snapshot" (servers started with `--data-dir` write each sealed
        version to disk and load it at restart) or "log" (as "snapshot", and every write to an open version is also
        appended to a write-ahead log, fsynced before it is acknowledged, and replayed at restart). Each created table gets a new incarnation id, so a table created
        again under the same name is a different table to every client.
        """
        vt, d = parse_value_type(value_type, dim)
        if replication is None:
            replication = 1
        if partitions < 1 or replication < 1:
            raise ValueError("partitions and replication must be >= 1")
        client = self._client()
        # The client's spec, not the handle's list: servers may have been added or removed since.
        servers = len(client.servers())
        if replication > servers:
            raise ValueError(f"replication {replication} exceeds the number of servers ({servers})")
        from ramgrid.exceptions import TableExists

        try:
            client.create_table(
                name, partitions=partitions, replication=replication, value_type=vt, dim=d, durability=durability
            )
            log.info(
                "created table %s (%d partitions, replication %d, %s, durability %s)",
                name,
                partitions,
                replication,
                vt if not d else f"{vt}[{d}]",
                durability,
            )
        except TableExists:
            if not exist_ok:
                raise
        return Table(self, name)

    def tables(self) -> list[str]:
        """Names of the tables on the cluster, sorted."""
        return sorted(str(t["name"]) for t in self._client().list_tables())

    def list_tables(self) -> list[dict[str, Any]]:
        """The tables with their settings (name, partitions, replication, value_type, dim, current_version)."""
        return list(self._client().list_tables())

    def drop_table(self, name: str) -> None:
        """Drops a table with all its versions."""
        self._client().drop_table(name)
        log.info("dropped table %s", name)

    def client_stats(self) -> dict[str, int]:
        """This process's client counters of shared memory (docs/shared-memory.md): "shm_hits" and "shm_misses"
        (keys answered from mapped partitions, found or not), "shm_remote" (keys of mapped versions read over TCP),
        "shm_attached" (versions mapped) and "shm_mapped_bytes"."""
        return {f"shm_{k}": int(v) for k, v in self._client().shm_stats().items()}

    def stats(self) -> list[dict[str, Any]]:
        """One dict of counters per server, in spec order: the memcached `stats` counters, and under "tables" each
        table's figures on that server (from METRICS, see `ramgrid._metrics.table_figures`: items, bytes, versions,
        gets, hits, misses, puts, deletes, refused requests by reason, batch counts and latency sums). A server
        whose METRICS failed has "tables_error" instead."""
        client = self._client()
        out = [dict(d) for d in client.server_stats()]
        metrics = {m["server"]: m for m in client.server_metrics()}
        for d in out:
            m = metrics.get(d["server"], {})
            if "text" in m:
                d["tables"] = table_figures(m["text"])
            elif "error" in m:
                d["tables_error"] = m["error"]
        return out

    def local_servers(self) -> list[str]:
        """The servers of the cluster that run on this host, in spec order (`ramgrid.hosts`: a server is local
        when this machine owns its address; `RAMGRID_LOCAL_SERVERS` overrides). On a Dask worker of a cluster
        with one server per host, this is the worker's own server."""
        from ramgrid.hosts import local_servers

        return local_servers(self.servers)

    def epoch(self) -> int:
        """The partition-map epoch this process's client works under."""
        return int(self._client().epoch())

    # membership

    def add_server(self, addr: str) -> dict[str, Any]:
        """Adds the server at `addr` ("host:port": running, started empty, best with `--join` of the members) to
        the cluster and moves to it the partitions it now holds. Reads and writes keep working during the move:
        the partitions are copied from their current holders first, and the new spec takes effect on every
        server only when every copy is done. Blocks until then (at most 10 minutes).

        Returns the move report: {"from": [...], "to": [...], "partitions_copied": int, "bytes_copied": int,
        "seconds": float}. Raises ValueError if `addr` is a member already or another move is in progress, and
        MoveFailed (retryable) if the move could not be done or finished: a member that does not answer is waited
        for (up to 30 s) until the control plane fails it over, then the move goes on without it; a move refused
        at the start is undone, and one that fails later is resumed by asking for the same move again."""
        report = dict(self._client().add_server(str(addr)))
        return _logged_move("added", addr, report)

    def remove_server(self, addr: str) -> dict[str, Any]:
        """Moves every partition off the server at `addr` to the servers that hold it next, then drops `addr` from
        the spec; the server can be stopped afterwards. Returns the move report, as `add_server`. Raises
        ValueError if `addr` is not a member, or is the last one."""
        report = dict(self._client().remove_server(str(addr)))
        return _logged_move("removed", addr, report)

    def replace_server(self, dead: str, new: str) -> dict[str, Any]:
        """Replaces the server at `dead` (down for good, or to be retired) with the running, empty server at `new`
        ("host:port", best started with `--join` of the members), in one move: `new` takes `dead`'s place and its
        partitions. A `dead` server that does not answer is failed over by the control plane first (within its
        failure timeout; this waits up to 30 s for it), after which `new` is added. Returns the move report, as
        `add_server`. Raises MoveFailed (retryable: nothing moved, or the move was undone) or ValueError (`new` is
        a member already)."""
        report = dict(self._client().replace_server(str(dead), str(new)))
        return _logged_move(f"replaced {dead} with", new, report)

    def recover(self) -> dict[str, Any]:
        """Rebuilds the control plane after it lost its majority for good (a majority of its voters died with their
        state; docs/control-plane.md, "Recovering a lost majority"). The live server that applied the most of the
        group's log forms a new group from its metadata (spec, tables, versions) and the other live servers join
        it; the servers that do not answer are then failed over as usual, and one of them that comes back later
        joins the new group by itself. Only for servers that are gone: one merely cut off, with a majority on its
        side, would go on deciding there. Returns {"generation": the new group's, "leader": address, "joined":
        [addresses], "dead": [addresses that did not answer], "lost": {table: [partitions every replica of which
        is dead]}, "unsettled": [live servers not in the new group after 30 s]}. Raises ValueError while a
        majority answers (nothing to recover) or when no server answers."""
        report = dict(self._client().recover())
        log.warning(
            "recovered the metadata group (generation %s) from %s; dead: %s; partitions lost: %s",
            report["generation"],
            report["leader"],
            ", ".join(report["dead"]) or "none",
            report["lost"] or "none",
        )
        return report

    def status(self) -> list[dict[str, Any]]:
        """Each server's view of the cluster (CLUSTER_STATUS), in spec order (both ends of a move in progress):
        {"server": address, "ok": bool, "error": str | None, "server_id", "epoch": int, "servers": str,
        "pending_partitions": int (partitions not yet copied in, refused to readers meanwhile),
        "pending_versions", "catalog_learned", "copied_partitions", "copied_bytes", "copy_failures", ...}.
        A server that cannot be reached has "ok" False and "error" saying why. A restarted server has finished
        repairing when its "pending_partitions" is 0 and "catalog_learned" is 1."""
        return list(self._client().cluster_status())

    def health(self, statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The metadata group's health from `status()` (or from `statuses`, a list it returned just now):
        {"leader", "voters", "voters_alive", "majority",
        "tolerates" (how many more voters may fail with the cluster still deciding; -1 without a majority now),
        "mode" ("full service", or "degraded: ..." saying what is served without a majority), "whole",
        "unavailable": {table: [partitions none of whose replicas answers]} (tables with some only)}
        (`ramgrid.health.group_health`; docs/control-plane.md, "Without a majority")."""
        from ramgrid.health import group_health, unavailable_partitions

        if statuses is None:
            statuses = self.status()
        h = group_health(statuses)
        answering = {str(x.get("server")) for x in statuses if x.get("ok")}
        try:
            owners = {name: self.table(name).owners() for name in self.tables()}
        except RamgridError:  # no server could list the tables: nothing more to say
            owners = {}
        h["unavailable"] = unavailable_partitions(owners, answering)
        return h


def _logged_move(verb: str, addr: str, report: dict[str, Any]) -> dict[str, Any]:
    log.info(
        "%s server %s: %s partitions copied in %.1f s",
        verb,
        addr,
        report.get("partitions_copied"),
        report.get("seconds", 0),
    )
    return report


def _first_missing_key(keys: NativeKeys, found: np.ndarray) -> tuple[list[int], int, Any]:
    missing = np.flatnonzero(~np.asarray(found, dtype=bool))
    idx = [int(i) for i in missing[:20]]
    first = idx[0]
    if isinstance(keys, tuple):
        offsets, data = keys
        key: Any = data[int(offsets[first]) : int(offsets[first + 1])]
    elif isinstance(keys, np.ndarray):
        key = keys[first].item()
    else:
        key = keys[first]
    return idx, int(missing.size), key


class _Reader(_PipelinedReads):
    """Read methods shared by Table, PinnedTable and VersionWriter; `_read_version` 0 means the current version."""

    _grid: Grid
    name: str
    _read_version: int = 0
    # The table incarnation reads are meant for (0: whichever exists); set by PinnedTable.
    _read_incarnation: int = 0
    # False: reads go over TCP even where this process maps the version (PinnedTable(shared_memory=False)).
    _read_shm: bool = True

    def owners(self) -> list[list[str]]:
        """Who holds what: for each partition of the table (index = partition number, as `partition_of` gives
        it), the addresses of the servers that hold a replica, primary first, under the partition map this
        process's client routes by. A job runs a partition's work beside one of them (`ramgrid.engines`)."""
        return [list(r) for r in self._client().partition_owners(self.name)]

    def lookup(self, keys: Any) -> tuple[Any, np.ndarray]:
        """Returns `(values, found)`: values as `get_many` would, with zeros (numeric) or None (bytes) where
        `found` is False. Never raises for a missing key."""
        result: tuple[Any, np.ndarray] = self._client().get_many(
            self.name, convert_keys(keys), self._read_version, self._read_incarnation, self._read_shm
        )
        return result

    def get_many(self, keys: Any, default: Any = RAISE) -> Any:
        """Looks up a batch of keys (list, numpy array or pyarrow array) in one round trip per server.

        Returns a float64 / int64 numpy array for numeric tables, a float32 array of shape (n, dim) for vector
        tables, a list of bytes for bytes tables. A missing key raises KeysNotFound (a KeyError) unless `default`
        is given, which then fills the missing slots (e.g. `default=np.nan`).
        """
        k = convert_keys(keys)
        values, found = self._client().get_many(
            self.name, k, self._read_version, self._read_incarnation, self._read_shm
        )
        return self._finish_get(k, values, found, default)

    def _finish_get(self, k: Any, values: Any, found: np.ndarray, default: Any) -> Any:
        """`get_many`'s result from the native `(values, found)` of converted keys `k`."""
        if found.all():
            return values
        if default is RAISE:
            idx, count, first = _first_missing_key(k, found)
            raise KeysNotFound(
                f"{count} of {key_count(k)} keys not found in table {self.name!r} (first: {first!r} at index {idx[0]})",
                idx,
                count,
            )
        if isinstance(values, np.ndarray):
            values[~found] = default
            return values
        return [default if v is None else v for v in values]

    def get(self, key: Any, default: Any = RAISE) -> Any:
        """One key's value (a Python float/int, bytes, or a float32 vector); KeyError if missing and no default."""
        values, found = self._client().get_many(
            self.name, [key], self._read_version, self._read_incarnation, self._read_shm
        )
        if not found[0]:
            if default is RAISE:
                raise KeysNotFound(f"key {key!r} not found in table {self.name!r}", [0], 1)
            return default
        v = values[0]
        return v.item() if isinstance(v, np.generic) else v

    def __getitem__(self, key: Any) -> Any:
        return self.get(key)

    def __contains__(self, key: Any) -> bool:
        _, found = self._client().get_many(self.name, [key], self._read_version, self._read_incarnation, self._read_shm)
        return bool(found[0])

    def _client(self) -> Client:
        return self._grid._client()


class Table(_Operators, _Reader, _Scans, _Arrow, _Reduce):
    """A handle on a named table. Reads and writes go to its current version (resolved by the servers per request).

    Use `pin()` for a job that must see one version throughout, and `new_version()` to load a new version that
    becomes visible all at once.
    """

    def __init__(self, grid: Grid, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a table name is a non-empty str")
        self._grid = grid
        self.name = name

    @property
    def grid(self) -> Grid:
        return self._grid

    def __reduce__(self) -> Any:
        return (Table, (self._grid, self.name))

    def __repr__(self) -> str:
        return f"Table({self.name!r}, servers={list(self._grid.servers)!r})"

    # writes to the current version

    def put_many(self, keys: Any, values: Any, merge: str = "store") -> None:
        """Stores a batch. `values`: a numpy array (numeric/vector tables) or a list of bytes/str (bytes tables),
        as long as `keys`. A refused key (too large, no memory) raises BatchError listing the failed indices after
        every other key has been stored.

        `merge`: "store" overwrites; on i64 and f64 tables "add", "min" or "max" merge each value into the stored
        one on the server, under the partition's write lock, so concurrent writers lose no update (a missing key
        takes the value; a repeated key is merged once per occurrence; an i64 sum that would overflow is refused
        for that key). Any other table refuses a merge with ValueError before anything is sent. A call that
        raised may have been merged at some replicas: merges are not idempotent (docs/protocol-native.md 7.3).

        Values must fit the table's type; nothing is converted in a way that changes it. Before anything is sent,
        a value that does not fit raises ValueOutOfRange (a ValueError) naming the first one and its index, and
        nothing of the call is stored: for an i64 table, ints outside int64 (uint64 above 2**63-1, larger Python
        ints) and floats that are not integers (1.0 is stored as 1; 2.5, nan, inf are refused, never truncated);
        for an f32vec table, finite values whose magnitude float32 cannot hold (above ~3.4e38, which would become
        inf), while nan and inf given as such are kept and other values are rounded to float32; for an f64 table,
        numbers float64 cannot hold."""
        _put(self._client(), self.name, keys, values, 0, merge)

    def put(self, key: Any, value: Any) -> None:
        """Stores one key."""
        _put(self._client(), self.name, [key], _single_value(value), 0)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def delete_many(self, keys: Any) -> int:
        """Deletes a batch from the current version; returns how many existed."""
        k = convert_keys(keys)
        if key_count(k) == 0:
            return 0
        return int(self._client().delete_many(self.name, k, 0))

    def __delitem__(self, key: Any) -> None:
        if self._client().delete_many(self.name, [key], 0) == 0:
            raise KeysNotFound(f"key {key!r} not found in table {self.name!r}", [0], 1)

    # metadata and versions

    def describe(self) -> dict[str, Any]:
        """Settings, current version and per-version item/byte counts, aggregated over the servers that answer.
        "unreachable" lists the servers that did not (down or failing); the counts then cover the others only."""
        return dict(self._client().describe_table(self.name))

    def versions(self) -> list[dict[str, Any]]:
        """The table's versions: [{"version", "sealed", "items", "bytes"}]."""
        return list(self.describe()["versions"])

    def current_version(self) -> int:
        """The version reads without a pin see now."""
        return int(self._client().current_version(self.name))

    def verify(self, version: int | None = None) -> dict[str, Any]:
        """Compares the replicas of every partition of a version (default: the current one): each server that holds
        a partition says how many items it holds and an order-independent hash of them. Returns {"version",
        "agreed" (partitions whose replicas all answered and agree), "items", "differ": {partition: {server: (items,
        digest)}}, "unanswered": [(partition, server, why)]}. A difference is looked at three times, 0.2 s apart,
        before it is reported, so writes in flight are not taken for one (docs/replication.md)."""
        from ramgrid.verify import verify_table

        return verify_table(self._client(), self.name, version)

    def drop_version(self, version: int) -> None:
        """Frees an old version. The current version cannot be dropped (the servers refuse it)."""
        self._client().drop_version(self.name, int(version))
        log.info("dropped version %d of %s", int(version), self.name)

    def pin(self, version: int | None = None, shared_memory: bool | None = None) -> PinnedTable:
        """A read-only handle on one version: `version`, or the current one resolved now, once. Pass it to a job's
        tasks so every task reads the same version even if the table is switched meanwhile.

        `shared_memory` (docs/shared-memory.md): the partitions that servers on this host hold are mapped read-only
        and read in place, with no request; the others go over TCP in the same call. None (default): where it
        applies (a sealed version, a server on this host), else TCP; False: never; True: raise RamgridError if
        nothing could be mapped. Each process that unpickles the handle maps for itself. Where anything is mapped,
        the handle's `get`, `[]`, `in`, `get_many` and `lookup` read through a native reader handle resolved at pin
        time: a 1-key get returns a Python scalar made from the mapped bytes, with no request and no numpy array."""
        v = self.current_version() if version is None else int(version)
        if v <= 0:
            raise ValueError(f"versions are numbered from 1, got {v}")
        if shared_memory not in (None, True, False):
            raise ValueError(f"shared_memory must be None, True or False, got {shared_memory!r}")
        return PinnedTable(self._grid, self.name, v, self._client().incarnation(self.name), shared_memory)

    def load(self, path: Any, **options: Any) -> Any:
        """Loads a file or directory into this table as a new version (see `ramgrid.load.load_table` for the options);
        the new version becomes current only when every task succeeded. Returns a `LoadReport`."""
        from ramgrid.load import table_load

        return table_load(self, path, **options)

    def new_version(self) -> VersionWriter:
        """Context manager for loading a new version: writes go to a fresh open version; on normal exit it is sealed
        and made current on every server at once; on an exception it is dropped and the previous version stays
        current.

            with table.new_version() as v:
                v.put_many(keys, values)
        """
        return VersionWriter(self._grid, self.name)


class PinnedTable(_Operators, _Reader, _Scans, _Arrow, _Reduce):
    """A read-only handle on one version of a table. Pickles with its version, so tasks of a job agree on it."""

    def __init__(
        self, grid: Grid, name: str, version: int, incarnation: int = 0, shared_memory: bool | None = False
    ) -> None:
        self._grid = grid
        self.name = name
        self.version = int(version)
        self._read_version = self.version
        # The table the version belongs to: if it is dropped and created again under its name,
        # reads are refused (TableNotFound) rather than served from the new table.
        self.incarnation = int(incarnation)
        self._read_incarnation = self.incarnation
        self.shared_memory = shared_memory
        self._read_shm = shared_memory is not False
        # What this process mapped (None: not asked); the client counts attaches, __del__ undoes this one.
        self._shm: dict[str, Any] | None = None
        self._attached = False
        # The native reader handle's bound methods (docs/shared-memory.md, "The fast path"), bound once so that a
        # read costs no attribute lookups: None where nothing is mapped. They return _ELSEWHERE when the handle
        # cannot answer (detached, a forked child, the table created again, a key of an unmapped partition).
        self._shm_get: Any = None
        self._shm_contains: Any = None
        self._shm_get_many: Any = None
        if shared_memory is not False:
            self._attach(required=shared_memory is True)

    def _attach(self, required: bool) -> None:
        try:
            info = dict(self._client().shm_attach(self.name, self.version, self.incarnation))
        except RamgridError as e:
            if required:
                raise
            info = {"mapped": [], "bytes": 0, "servers": [], "skipped": [("", str(e))]}
        self._shm = info
        self._attached = bool(info["mapped"])
        if required and not self._attached:
            why = "; ".join(f"{s or 'client'}: {w}" for s, w in info["skipped"]) or "no server on this host"
            raise RamgridError(f"shared memory unavailable for {self.name!r} version {self.version}: {why}")
        if self._attached:
            reader = native().shm_reader(self._client(), self.name, self.version, self.incarnation, _ELSEWHERE)
            if reader is not None:
                self._shm_get, self._shm_contains, self._shm_get_many = reader.get, reader.contains, reader.get_many
            log.debug(
                "mapped %d partitions (%d bytes) of %s version %d",
                len(info["mapped"]),
                info["bytes"],
                self.name,
                self.version,
            )

    def get(self, key: Any, default: Any = RAISE) -> Any:
        """One key's value (a Python float/int, bytes, or a float32 vector); KeyError if missing and no default.
        Where this process maps the key's partition, read in place: no request, no numpy array."""
        shm_get = self._shm_get
        if shm_get is not None:
            v = shm_get(key, default)
            if v is RAISE:
                raise KeysNotFound(f"key {key!r} not found in table {self.name!r}", [0], 1)
            if v is not _ELSEWHERE:
                return v
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        shm_get = self._shm_get
        if shm_get is not None:
            v = shm_get(key, RAISE)
            if v is not RAISE and v is not _ELSEWHERE:
                return v
        return self.get(key)

    def __contains__(self, key: Any) -> bool:
        shm_contains = self._shm_contains
        if shm_contains is not None:
            v = shm_contains(key)
            if v is not _ELSEWHERE:
                return bool(v)
        return super().__contains__(key)

    def lookup(self, keys: Any) -> tuple[Any, np.ndarray]:
        """Returns `(values, found)`: values as `get_many` would, with zeros (numeric) or None (bytes) where
        `found` is False. Never raises for a missing key."""
        return self._read(convert_keys(keys))

    def get_many(self, keys: Any, default: Any = RAISE) -> Any:
        """Looks up a batch of keys (list, numpy array or pyarrow array): mapped partitions are read in place (an int64
        array's keys without a copy, only the output allocated), the others in one round trip per server.

        Returns a float64 / int64 numpy array for numeric tables, a float32 array of shape (n, dim) for vector
        tables, a list of bytes for bytes tables. A missing key raises KeysNotFound (a KeyError) unless `default`
        is given, which then fills the missing slots (e.g. `default=np.nan`).
        """
        k = convert_keys(keys)
        values, found = self._read(k)
        return self._finish_get(k, values, found, default)

    def _read(self, k: NativeKeys) -> tuple[Any, np.ndarray]:
        """The native `(values, found)` of converted keys: from the reader handle if it can answer them all."""
        shm_get_many = self._shm_get_many
        if shm_get_many is not None:
            got = shm_get_many(k)
            if got is not _ELSEWHERE:
                return cast("tuple[Any, np.ndarray]", got)
        result: tuple[Any, np.ndarray] = self._client().get_many(
            self.name, k, self._read_version, self._read_incarnation, self._read_shm
        )
        return result

    def __del__(self) -> None:
        self._shm_get = self._shm_contains = self._shm_get_many = None
        if getattr(self, "_attached", False):
            self._attached = False
            c = _existing_client(self._grid.config)
            if c is not None:
                # At interpreter shutdown the module may be half torn down: the mappings go with the process.
                with contextlib.suppress(Exception):
                    c.shm_detach(self.name, self.version, self.incarnation)

    def __reduce__(self) -> Any:
        return (PinnedTable, (self._grid, self.name, self.version, self.incarnation, self.shared_memory))

    def describe(self) -> dict[str, Any]:
        """The pinned version and what this process reads from shared memory: {"table", "version", "incarnation",
        "shared_memory": None (not asked) or {"mapped": [partition, ...], "bytes", "servers", "skipped":
        [(server, why), ...]}}."""
        return {
            "table": self.name,
            "version": self.version,
            "incarnation": self.incarnation,
            "shared_memory": None if self._shm is None else dict(self._shm),
        }

    def __repr__(self) -> str:
        return f"PinnedTable({self.name!r}, version={self.version}, servers={list(self._grid.servers)!r})"

    def table(self) -> Table:
        """The unpinned table handle."""
        return Table(self._grid, self.name)


class VersionWriter(_Reader):
    """A version being loaded: writes and reads go to it. Use via `Table.new_version()` as a context manager, or
    call `commit()` / `abort()` yourself."""

    def __init__(self, grid: Grid, name: str) -> None:
        self._grid = grid
        self.name = name
        self.version = 0
        self._state = "new"

    def __repr__(self) -> str:
        return f"VersionWriter({self.name!r}, version={self.version}, state={self._state})"

    def __reduce__(self) -> Any:
        raise TypeError(
            "a VersionWriter cannot be pickled (it owns the commit): pass writer.part() to the tasks that write "
            "into the version, and commit or abort here once they are done"
        )

    @classmethod
    def adopt(cls, grid: Grid, name: str, version: int) -> VersionWriter:
        """A writer for open version `version` of `name` that another writer began (a job's driver that died):
        commit or abort it as if this one had begun it. Nothing is checked until then."""
        w = cls(grid, name)
        w.version = int(version)
        w._read_version = w.version
        w._state = "open"
        return w

    def part(self) -> VersionPart:
        """A picklable handle for the tasks of a job that fill this version in parallel (Dask, multiprocessing):
        they write through it; this writer, in the driver, commits or aborts once they are done."""
        self._check_open()
        return VersionPart(self._grid, self.name, self.version)

    def begin(self) -> Self:
        if self._state != "new":
            raise RamgridError(f"version writer for {self.name!r} already {self._state}")
        self.version = int(self._client().create_version(self.name))
        self._read_version = self.version
        self._state = "open"
        return self

    def __enter__(self) -> Self:
        return self.begin()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._state != "open":
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _check_open(self) -> None:
        if self._state != "open":
            raise RamgridError(f"version {self.version} of {self.name!r} is {self._state}, not open for writes")

    def put_many(self, keys: Any, values: Any, merge: str = "store") -> None:
        """Writes a batch into the new version (see Table.put_many)."""
        self._check_open()
        _put(self._client(), self.name, keys, values, self.version, merge)

    def put(self, key: Any, value: Any) -> None:
        self._check_open()
        _put(self._client(), self.name, [key], _single_value(value), self.version)

    def delete_many(self, keys: Any) -> int:
        self._check_open()
        k = convert_keys(keys)
        if key_count(k) == 0:
            return 0
        return int(self._client().delete_many(self.name, k, self.version))

    def commit(self) -> int:
        """Seals the version and makes it current on every server; returns its number."""
        self._check_open()
        c = self._client()
        try:
            c.seal_version(self.name, self.version)
            c.set_current(self.name, self.version)
        except BaseException:
            # The switch may have been committed all the same (a reply lost, a server gone mid-call): then the
            # version is current and the abort's drop is refused, which says so; the caller gets the first error.
            self.abort()
            raise
        self._state = "committed"
        log.info("committed version %d of %s: it is current", self.version, self.name)
        return self.version

    def abort(self) -> None:
        """Drops the version; the previous one stays current. After a commit that failed, the switch may have taken
        effect all the same: then the version is current and stays (logged)."""
        if self._state != "open":
            return
        self._state = "aborted"
        log.info("aborted version %d of %s: the previous version stays current", self.version, self.name)
        try:
            self._client().drop_version(self.name, self.version)
        except ValueError as e:
            # Refused as the current version: a commit that failed took effect after all. It stays (and current).
            log.warning("version %d of %s: not dropped after the abort: %s", self.version, self.name, e)
        except RamgridError as e:
            log.warning(
                "version %d of %s: the drop after the abort failed (%s); it stays invisible", self.version, self.name, e
            )
            # The version is invisible either way: it was never made current. A server that missed the drop keeps
            # an orphan version that `versions()` lists and `drop_version()` removes.


class VersionPart(_Reader):
    """The writing end of an open version, for a job's tasks: `put_many`, `put`, `delete_many` and reads of the open
    version. It pickles (configuration, table, version), so it travels to Dask workers and other processes; only the
    `VersionWriter` that opened the version commits or aborts it. A write after the commit is refused (the version
    is sealed: VersionSealed), one after an abort too (the version is gone: VersionNotFound): never applied."""

    def __init__(self, grid: Grid, name: str, version: int) -> None:
        self._grid = grid
        self.name = name
        self.version = int(version)
        self._read_version = self.version

    def __reduce__(self) -> Any:
        return (VersionPart, (self._grid, self.name, self.version))

    def __repr__(self) -> str:
        return f"VersionPart({self.name!r}, version={self.version})"

    def put_many(self, keys: Any, values: Any, merge: str = "store") -> None:
        """Writes a batch into the open version (see Table.put_many)."""
        _put(self._client(), self.name, keys, values, self.version, merge)

    def put(self, key: Any, value: Any) -> None:
        _put(self._client(), self.name, [key], _single_value(value), self.version)

    def delete_many(self, keys: Any) -> int:
        """Deletes a batch from the open version; returns how many existed."""
        k = convert_keys(keys)
        if key_count(k) == 0:
            return 0
        return int(self._client().delete_many(self.name, k, self.version))


def _single_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return [bytes(value) if not isinstance(value, str) else value]
    arr = np.asarray(value)
    return arr.reshape(1, -1) if arr.ndim == 1 else arr.reshape(1)


_MERGES = ("store", "add", "min", "max")


def _put(client: Any, name: str, keys: Any, values: Any, version: int, merge: str = "store") -> None:
    if merge not in _MERGES:
        raise ValueError(f"merge must be one of {', '.join(_MERGES)}, got {merge!r}")
    k = convert_keys(keys)
    n = key_count(k)
    v = convert_values(values)
    nv = key_count(v)  # packed bytes values count as packed keys do
    if nv != n:
        raise ValueError(f"{n} keys but {nv} values")
    if n == 0:
        return
    # Checked whole before anything is sent, so a value that does not fit stores nothing of the call.
    vt, dim = client.value_type(name)
    if merge != "store":
        if vt not in ("i64", "f64"):
            raise ValueError(f"merge={merge!r} needs an i64 or f64 table; {name!r} holds {vt} values")
        client.put_many(name, k, fit_values(v, vt, dim, source=values), version, merge)
        return
    client.put_many(name, k, fit_values(v, vt, dim, source=values), version)


def connect(
    spec: SpecLike,
    *,
    token: str | None = None,
    timeout: float = 5.0,
    ack: str = "all",
    near_cache_bytes: int = 0,
    connect_timeout: float = 1.0,
    pool_size: int = 4,
    call_timeout: float = 30.0,
    tls: TLS | None = None,
    consistency: str = "linearizable",
) -> Grid:
    """A handle on the cluster named by `spec`: a list of "host:port", a comma-separated string of them, or the
    path of a spec file (one host:port per line). The order of servers defines the partition map, so every client
    of a cluster must use the same order.

    `timeout`: seconds per request; `call_timeout`: seconds per call at most, every retry and failover included;
    `ack`: "all" (the default; "majority" is the same today): each partition's primary orders its writes and answers
    once every replica applied them, waiting for a silent replica's fail-over; "one": the first replica up takes the
    write and answers without waiting for a silent one (available while a replica is down; docs/replication.md);
    `consistency`: what a read of an open version may return: "linearizable" (the default: from the partition's
    primary, never missing a write that returned before the read began) or "replica" (spread over the replicas:
    every acknowledged write, but a write still in flight may show at one replica before another; docs/replication.md);
    `near_cache_bytes`: size of the in-process cache for pinned (immutable) versions, 0 = off;
    `tls`: a `ramgrid.TLS` to connect over TLS (servers started with --tls-cert; docs/tls.md).
    Connections are opened on first use, in whichever process uses the handle.
    """
    servers = tuple(parse_spec(spec))
    return Grid(
        GridConfig(
            servers=servers,
            token=token,
            timeout=float(timeout),
            connect_timeout=float(connect_timeout),
            ack=ack,
            near_cache_bytes=int(near_cache_bytes),
            pool_size=int(pool_size),
            call_timeout=float(call_timeout),
            tls=tls,
            consistency=consistency,
        )
    )
