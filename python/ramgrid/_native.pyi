"""Type stubs for ramgrid._native, the PyO3 module (crates/ramgrid-py).

CONTRACT between the binding (crates/ramgrid-py) and the Python package (python/ramgrid). The binding only
converts types, releases the GIL and maps errors (to the classes of ramgrid.exceptions); every policy lives in the Rust client (crates/ramgrid-client)
or in the Python package.

Keys: a list of str (UTF-8) / bytes, a 1-D numpy int64 array (each key is its 8-byte little-endian encoding),
or a packed form `(offsets, data)` where offsets is a numpy int64 array of n+1 offsets into the bytes `data`
(the Python layer turns numpy 'S'/'U' arrays and pyarrow string/binary arrays into this form).
Int keys given in a list are encoded like int64 array keys, so `[1, 2]` and `np.array([1, 2])` address the same items.
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias, final

import numpy as np
import numpy.typing as npt

KeysLike: TypeAlias = Sequence[str | bytes | int] | npt.NDArray[np.int64] | tuple[npt.NDArray[np.int64], bytes]

@final
class Client:
    def __new__(
        cls,
        servers: list[str],
        token: str | None = None,
        timeout_ms: int = 5000,
        connect_timeout_ms: int = 1000,
        ack: str = "all",  # "all" | "majority" | "one": replicas that must acknowledge a write
        near_cache_bytes: int = 0,  # near cache for pinned (sealed) versions; 0 = off
        pool_size: int = 4,  # idle connections kept per server
        call_timeout_ms: int = 30000,  # limit for a whole call, retries and failovers included
        tls_ca: str | None = None,  # connect over TLS trusting this CA file (docs/tls.md)
        tls_cert: str | None = None,  # client certificate, for servers with --tls-client-ca
        tls_key: str | None = None,  # its private key
        tls_server_name: str | None = None,  # the name the certificates carry; default: each server's host
        consistency: str = "linearizable",  # or "replica": reads of open versions spread over the replicas
    ) -> Client: ...
    def servers(self) -> list[str]: ...
    def epoch(self) -> int: ...
    def refresh_spec(self) -> None: ...
    def push_spec(self) -> None:
        """Sends this client's spec to every server (SET_SPEC): how a new local cluster is configured."""
    # tables
    def create_table(
        self,
        name: str,
        partitions: int = 64,
        replication: int = 1,
        value_type: str = "bytes",
        dim: int = 0,
        durability: str = "memory",
    ) -> None:
        """value_type: "bytes" | "i64" | "f64" | "f32vec" (dim > 0). Creates an open version 1 that is current."""
    def drop_table(self, name: str) -> None: ...
    def list_tables(self) -> list[dict[str, Any]]: ...
    def describe_table(self, name: str) -> dict[str, Any]:
        """{"name", "partitions", "replication", "value_type", "dim", "current_version",
        "versions": [{"version", "sealed", "items", "bytes"}], "unreachable": [address, ...]} aggregated over the
        servers that answered (items/bytes summed over primaries; short when "unreachable" is not empty)."""
    # versions
    def create_version(self, table: str) -> int:
        """Creates the next version number on every server (open, not current) and returns it."""
    def seal_version(self, table: str, version: int) -> None: ...
    def set_current(self, table: str, version: int) -> None:
        """Makes a sealed version current on every server."""
    def drop_version(self, table: str, version: int) -> None: ...
    def current_version(self, table: str) -> int: ...
    def verify(
        self, table: str, version: int = 0
    ) -> tuple[int, int, int, list[tuple[int, list[tuple[str, int, int]]]], list[tuple[int, str, str]]]:
        """Compares the replicas of every partition (DIGEST): (version, partitions agreed, their items, partitions
        that differ with each replica's (server, items, digest), (partition, server, why) not compared)."""
    def partition_owners(self, table: str) -> list[list[str]]:
        """For each partition of the table, its replicas' server addresses, primary first, under the spec this
        client routes by (what a job needs to run a partition's work next to its data)."""
    def partitions(self, table: str) -> int:
        """The table's number of partitions (fixed at creation; cached like `value_type`)."""
    def value_type(self, table: str) -> tuple[str, int]:
        """(value type name, dim): dim is 0 unless "f32vec". Cached by the client after the first call."""
    # data (version 0 = current; a non-zero version pins)
    def incarnation(self, table: str) -> int:
        """The table's incarnation id as this client knows it (a table created again under its name has another)."""
    def get_many(
        self, table: str, keys: KeysLike, version: int = 0, incarnation: int = 0, shared_memory: bool = True
    ) -> tuple[Any, npt.NDArray[np.bool_]]:
        """Returns (values, found). With `incarnation` (non-zero), refuses (TableNotFound) to read a table of that
        name created since. `shared_memory=False`: over TCP even if the version is mapped (shm_attach). values: float64/int64 ndarray (0 where missing) for numeric tables,
        float32 ndarray of shape (n, dim) for f32vec tables, list[bytes | None] for bytes tables."""
    def shm_attach(self, table: str, version: int, incarnation: int = 0) -> dict[str, Any]:
        """Maps the partitions of a pinned (sealed) version that servers on this host hold, so reads of that version
        answer them from shared memory: {"mapped": [partition, ...], "bytes", "servers", "skipped":
        [(server, why), ...]}. Counted: one shm_detach per attach."""
    def shm_detach(self, table: str, version: int, incarnation: int = 0) -> bool: ...
    def shm_stats(self) -> dict[str, int]:
        """{"hits", "misses", "remote", "attached", "mapped_bytes"}: keys answered from shared memory (found, missing),
        keys of attached versions read over TCP, versions attached, bytes mapped."""
    def put_many(self, table: str, keys: KeysLike, values: Any, version: int = 0, merge: str = "store") -> None:
        """values: a numpy array (numeric/f32vec tables; converted to the table's type with numpy's same_kind casting,
        which wraps and overflows silently: ramgrid.grid checks the values with `_keys.fit_values` first), or for bytes
        tables a list of bytes/str or packed `(offsets, data)`: a 1-D int64 array of n + 1 offsets and the bytes.
        Raises BatchError listing failed keys if any key was refused; the others are stored."""
    def delete_many(self, table: str, keys: KeysLike, version: int = 0) -> int: ...
    def server_stats(self) -> list[dict[str, Any]]: ...
    def server_metrics(self) -> list[dict[str, Any]]:
        """Per server of the spec: {"server": addr, "text": Prometheus exposition} or {"server": addr, "error": str}."""
    def add_server(self, addr: str) -> dict[str, Any]:
        """Adds the running, empty server at `addr` and moves its partitions to it; the move report:
        {"from", "to", "partitions_copied", "bytes_copied", "seconds"}."""
    def remove_server(self, addr: str) -> dict[str, Any]:
        """Moves every partition off `addr` and drops it from the spec; the move report (as add_server)."""
    def replace_server(self, dead: str, new: str) -> dict[str, Any]:
        """Puts the running, empty server `new` in the place of `dead` (failed over first if silent); the move
        report (as add_server)."""
    def recover(self) -> dict[str, Any]:
        """Rebuilds the metadata group from the live servers after it lost its majority for good: {"generation",
        "leader", "joined", "dead", "lost": {table: [partitions]}, "unsettled"}."""
    def cluster_status(self) -> list[dict[str, Any]]:
        """Per server of the spec: {"server": addr, "ok", "error", "server_id", "epoch", "pending_partitions",
        "copied_partitions", "copied_bytes", ...}."""
    def close(self) -> None: ...

@final
class ShmReader:
    """A pinned version's shared-memory reader handle (docs/shared-memory.md, "The fast path"): reads the mapped
    partitions in place, with no lock or lookup by name per call. Every method returns the `elsewhere` marker given
    to `shm_reader` when it cannot answer (the version detached, a forked child, the table created again, a key of a
    partition not mapped); the caller then reads through `Client.get_many`. It never goes to the network itself."""

    @property
    def version(self) -> int: ...
    def get(self, key: str | bytes | int, default: Any) -> Any:
        """One key's value (int, float, bytes, or a float32 vector of shape (dim,)), `default` if missing."""
    def contains(self, key: str | bytes | int) -> Any:
        """Whether the key is present (a bool)."""
    def get_many(self, keys: KeysLike) -> Any:
        """(values, found) as `Client.get_many` returns them, int64 array keys read in place; the GIL is released
        only for batches of 8192 keys or more."""

def shm_reader(client: Client, table: str, version: int, incarnation: int, elsewhere: Any) -> ShmReader | None:
    """The reader handle of a version `client` has attached (`Client.shm_attach`) with some partition mapped, else
    None. It does not count as an attach: once the last attach is undone, its calls return `elsewhere`."""

def run_server(args: list[str]) -> None:
    """Runs a ramgrid server in this process with ramgrid-server's flags (e.g. ["--listen", "127.0.0.1:0"]);
    prints its 'ramgrid-server listening on ADDR' line and blocks until SIGTERM/SIGINT."""

def partition_of(key: str | bytes | int, partitions: int) -> int: ...
def error_classes() -> list[tuple[str, str]]:
    """(Rust client error kind, name of the exception raised for it) for every kind: a class of ramgrid.exceptions,
    or "ValueError" for bad arguments. The exception classes themselves are defined in ramgrid.exceptions."""

def run_op(
    client: Client,
    table: str,
    version: int,
    incarnation: int,
    op: str,
    column: int = 0,
    predicate: tuple[int, float, float] | None = None,
    edges: list[float] | None = None,
    weights: list[float] | None = None,
    l2: float = 0.0,
    components: int = 0,
    centroids: list[float] | None = None,
) -> dict[str, Any]: ...
def lookup_reduce(
    client: Client,
    table: str,
    records: Sequence[str | bytes]
    | Sequence[Sequence[str | bytes]]
    | tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], bytes],
    version: int = 0,
    incarnation: int = 0,
    reduce: str = "sum",  # "sum" (math.fsum, bit for bit) | "mean" (fsum / n) | "max"
    default: float | None = None,  # value of a missing token; None: missing tokens are skipped
    tokenize: str = "whitespace",  # "whitespace": records are texts (str, or bytes decoded with "replace");
    # "none": records are token lists, or (record offsets n+1, token offsets m+1, token bytes)
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64], int, int, int]:
    """Fused lookup-reduce on an f64 table: each distinct token of the batch looked up once, then one value per
    record. Returns (values, misses per record, tokens per record, version read, distinct tokens, tokens dropped
    for being longer than 100 characters). Texts are split as python/ramgrid/lm/corpus.py does."""

# Scans, filters and top_k (crates/ramgrid-py/src/scan.rs; the Python API is python/ramgrid/scan.py).
# A chunk is (partition, key_offsets int64[n+1], key_data uint8[], values): values a numpy array for numeric
# tables (float32 (n, dim) for vectors), or (offsets int64[n+1], data uint8[]) for bytes tables.
@final
class ScanIter:
    version: int
    restarts: int
    def __iter__(self) -> ScanIter: ...
    def __next__(self) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.uint8], Any]: ...
    def close(self) -> None: ...

@final
class PipelinedGets:
    """`(values, found)` per key batch, in order, with up to `depth` batches in flight (pipeline.rs)."""

    redone: int
    def __iter__(self) -> PipelinedGets: ...
    def __next__(self) -> tuple[Any, npt.NDArray[np.bool_]]: ...

def get_many_pipelined(
    client: Client,
    table: str,
    batches: Iterator[Any],
    depth: int = 8,
    version: int = 0,
    incarnation: int = 0,
    shared_memory: bool = True,
) -> PipelinedGets: ...

@final
class AioReader:
    """One I/O thread keeping asyncio batches in flight; the loop watches `fileno()` and calls `drain()`."""

    def __new__(cls, client: Client, depth: int = 32) -> AioReader: ...
    def submit(
        self, table: str, keys: Any, version: int, incarnation: int, token: int, shared_memory: bool = True
    ) -> None: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, bool, Any]]: ...  # (token, ok, (values, found) or exception)
    def close(self) -> None: ...

def scan(
    client: Client,
    table: str,
    version: int = 0,
    incarnation: int = 0,
    predicate: tuple[int, float, float] | None = None,  # (component, lo, hi): lo <= v < hi
    chunk_items: int = 65536,
    max_restarts: int = 8,
    partitions: tuple[int, int] | None = None,  # (start, end): partitions start..end-1 only
    prefer: str | None = None,  # "host:port": asked first where every replica holds the data
) -> ScanIter: ...

@final
class MappedBuffer:
    """One mapped partition's fixed-width values (entry order, little-endian), read-only through the buffer protocol
    (`pa.py_buffer(b)`, `memoryview(b)`): the mapping stays while the object or a buffer made from it lives."""

    # Exports the buffer protocol (read-only); Python 3.11 shows no __buffer__ for a stub to state.
    def __len__(self) -> int: ...

# Per partition: None (not mapped: scan it over TCP) or (partition, items, keys, values); keys (offsets buffer of
# items + 1 int64, data buffer, data bytes used) in buffers from `alloc`, or None; values a MappedBuffer (i64, f64,
# f32 vectors), (offsets, data, used) (bytes), or None.
def shm_columns(
    client: Client,
    table: str,
    version: int,
    incarnation: int,
    partitions: list[int],
    alloc: Callable[[int], Any],
    keys: bool = True,
    values: bool = True,
    threads: int = 1,
) -> list[tuple[int, int, tuple[Any, Any, int] | None, Any] | None] | None:
    """The key and value columns of `partitions` of a pinned version read from this process's mappings: keys (and
    bytes values) written into fresh writable buffers from `alloc(nbytes)` (`pyarrow.allocate_buffer`) on up to
    `threads` threads with the GIL released, fixed-width values in place. None when nothing can be read from the
    mappings now (not attached, detached, the table created again)."""

def top_k(
    client: Client,
    table: str,
    k: int,
    version: int = 0,
    incarnation: int = 0,
    column: int = 0,
    largest: bool = True,
    predicate: tuple[int, float, float] | None = None,
) -> tuple[list[bytes], npt.NDArray[np.float64]]: ...
