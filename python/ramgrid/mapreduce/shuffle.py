"""The shuffle: a map task's combined output, cut by reduce partition, stored in the job's intermediate grid table.

Layout. The intermediate table is a bytes table of R partitions (R = the job's reduce partitions), replication 2
where the cluster has two servers or more. A map task's output for reduce partition r is one pickled dict
{key: value}, cut into chunks below the servers' item limit, each stored under the key

    "<job>/m<task>/a<attempt>/r<r>/c<chunk>/<nonce>"

where the nonce is the smallest number that makes the key's grid partition r (`partition_of(key, R) == r`). So
grid partition r of the intermediate table holds exactly reduce partition r's input, and a reduce task run beside
its owners reads it from the local server.

Idempotence. Keys name the (map task, attempt): a task that runs twice with the same attempt writes the same keys
with the same values (the output of a task is a function of its split), and a second attempt writes other keys.
Reduce tasks read only the attempt the job log committed for each task (`joblog.py`), so no pair is counted twice
whatever ran.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["CHUNK_BYTES", "blob_key", "cut", "encode_bucket", "reduce_partition"]

# Below the servers' default item limit (1 MiB for key + value + overhead).
CHUNK_BYTES = 768 << 10


def _native() -> Any:
    from ramgrid import _native

    return _native


def reduce_partition(key: Any, partitions: int) -> int:
    """The reduce partition of a key (str, bytes or int): its grid partition in an R-partition table."""
    return int(_native().partition_of(key, partitions))


def cut(combined: dict[Any, Any], partitions: int) -> list[dict[Any, Any]]:
    """Splits a task's combined output into one dict per reduce partition."""
    pof = _native().partition_of
    out: list[dict[Any, Any]] = [{} for _ in range(partitions)]
    for k, v in combined.items():
        out[pof(k, partitions)][k] = v
    return out


def encode_bucket(bucket: dict[Any, Any]) -> list[bytes]:
    """One reduce partition's pairs as pickled chunks of at most about CHUNK_BYTES each ([] when empty)."""
    if not bucket:
        return []
    whole = pickle.dumps(bucket, protocol=pickle.HIGHEST_PROTOCOL)
    if len(whole) <= CHUNK_BYTES:
        return [whole]
    items = list(bucket.items())
    n = len(whole) // CHUNK_BYTES + 1
    out: list[bytes] = []
    step = -(-len(items) // n)
    for i in range(0, len(items), step):
        part = dict(items[i : i + step])
        blob = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > CHUNK_BYTES and len(part) > 1:
            out.extend(encode_bucket(part))  # a few very long keys or values: cut finer
        else:
            out.append(blob)
    return out


def blob_key(job: str, task: int, attempt: int, r: int, chunk: int, partitions: int) -> bytes:
    """The intermediate key of a chunk, placed in grid partition r (see the module)."""
    pof = _native().partition_of
    base = f"{job}/m{task}/a{attempt}/r{r}/c{chunk}/".encode()
    nonce = 0
    while True:
        k = base + str(nonce).encode()
        if pof(k, partitions) == r:
            return k
        nonce += 1


def decode_chunks(blobs: Iterable[bytes]) -> Iterator[dict[Any, Any]]:
    for b in blobs:
        yield pickle.loads(b)
