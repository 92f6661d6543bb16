"""The network-partition scenario of test_partition.py, run inside the hub namespace it builds (the servers each sit
in a namespace of their own, joined to the hub's bridge by a veth pair). Prints one JSON line of results.

    python _partition_scenario.py run PREFIX          (in the hub namespace)
    python _partition_scenario.py minority ADDR TOKEN SECONDS   (in the cut-off server's namespace)

`run` starts three servers, loads a table (replication 2), cuts one server off (its veth link down), keeps writing
(ack=all) on the majority side while a client inside the cut-off server's namespace keeps writing and reading there,
heals the link, waits until the cut-off server has rejoined and copied back, and reads every acknowledged key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
import ramgrid
from _hosts import wait_port  # this script runs from its own directory
from ramgrid._local import server_env
from ramgrid.exceptions import BatchError, RamgridError

TOKEN = "partition-test-token"
N = 3
BASE = 20_000


def _addr(i: int) -> str:
    return f"10.213.0.{i + 1}:7001"


def _until(what: str, cond: Any, timeout: float) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(what)
        time.sleep(0.05)
    return time.monotonic() - start


def _statuses(g: Any) -> list[dict[str, Any]]:
    try:
        return list(g.status())
    except RamgridError:
        return []


def run(prefix: str, logdir: str) -> dict[str, Any]:
    env = server_env(TOKEN, False)
    addrs = [_addr(i) for i in range(N)]
    procs = []
    out: dict[str, Any] = {}
    try:
        for i, a in enumerate(addrs):
            cmd = ["ip", "netns", "exec", f"{prefix}s{i}", sys.executable, "-m", "ramgrid._serve", "--listen", a]
            cmd += ["--threads", "1", "--table-memory", "128MiB", "--failure-timeout-ms", "4000"]
            log = open(f"{logdir}/server{i}.log", "wb")  # noqa: SIM115 - the process owns it
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        for a, p in zip(addrs, procs, strict=True):
            wait_port(a, p)
        g = ramgrid.connect(",".join(addrs), token=TOKEN, call_timeout=10.0)
        g._client().push_spec()

        def formed() -> bool:
            st = _statuses(g)
            leaders = {s.get("meta_leader") for s in st}
            return (
                len(st) == N
                and all(s.get("ok") and s.get("meta_members") == N and s.get("quorum") == "ok" for s in st)
                and len(leaders) == 1
            )

        _until("the group formed", formed, 30)
        t = g.create_table("p", partitions=16, replication=2, value_type="i64")
        base = np.arange(BASE, dtype=np.int64)
        t.put_many(base, base)
        leader = _statuses(g)[0]["meta_leader"].split(" ")[0]
        victim = next(i for i, a in enumerate(addrs) if a != leader)
        subprocess.run(["ip", "link", "set", f"h{victim}", "down"], check=True)
        cut = time.monotonic()
        minority = subprocess.Popen(
            ["ip", "netns", "exec", f"{prefix}s{victim}", sys.executable, __file__, "minority", addrs[victim], "10"],
            env=env,
            stdout=subprocess.PIPE,
        )
        # The majority side: ack=all writes until the minority client is done.
        acked: list[np.ndarray] = []
        failed = ok = 0
        first_ok_after_cut = None
        k = 1_000_000
        while minority.poll() is None:
            keys = np.arange(k, k + 200, dtype=np.int64)
            k += 200
            try:
                t.put_many(keys, keys)
                acked.append(keys)
                ok += 1
                if failed and first_ok_after_cut is None:
                    first_ok_after_cut = time.monotonic() - cut
            except BatchError as e:
                bad = {int(i) for i, _ in e.failures}
                acked.append(np.array([x for j, x in enumerate(keys) if j not in bad], dtype=np.int64))
                failed += 1
                time.sleep(0.02)
            except RamgridError:
                failed += 1
                time.sleep(0.02)
        minority_out = json.loads(minority.stdout.read().decode() if minority.stdout else "{}")
        subprocess.run(["ip", "link", "set", f"h{victim}", "up"], check=True)
        healed = time.monotonic()

        def whole() -> bool:
            st = _statuses(g)
            return len(st) == N and all(
                s.get("ok") and len(str(s.get("servers", "")).split(",")) == N and s.get("pending_partitions") == 0
                for s in st
            )

        rejoin_s = _until("the cut-off server rejoined and copied back", whole, 60)
        all_keys = np.concatenate([base, *acked, np.array(minority_out.get("acked", []), dtype=np.int64)])
        reader = ramgrid.connect(",".join(addrs), token=TOKEN, ack="one", call_timeout=20.0).table("p")
        got = reader.get_many(all_keys, default=-1)
        out = {
            "victim": addrs[victim],
            "majority_batches_acked": ok,
            "majority_batches_failed": failed,
            "majority_writes_flowing_after_s": first_ok_after_cut,
            "minority": minority_out,
            "rejoin_s": round(rejoin_s, 2),
            "heal_to_whole_s": round(time.monotonic() - healed, 2),
            "keys_checked": len(all_keys),
            "keys_wrong": int(np.count_nonzero(got != all_keys)),
            "failovers": sum(int(s.get("failovers", 0)) for s in _statuses(g)),
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


def minority(addr: str, seconds: float) -> dict[str, Any]:
    """Inside the cut-off server's namespace: write (ack=all) and read there for `seconds`."""
    g = ramgrid.connect(addr, token=TOKEN, call_timeout=3.0, timeout=1.0)
    acked: list[int] = []
    refusals: dict[str, int] = {}
    late_refusals = 0
    reads_ok_late = 0
    start = time.monotonic()
    k = 50_000_000
    while time.monotonic() - start < seconds:
        late = time.monotonic() - start > 5.0  # past the 3 s lease, with margin
        keys = list(range(k, k + 50))
        k += 50
        try:
            g.table("p").put_many(keys, keys)
            acked.extend(keys)
        except BatchError as e:
            bad = {int(i) for i, _ in e.failures}
            acked.extend(x for j, x in enumerate(keys) if j not in bad)
            for _, why in e.failures:
                key = "NO_QUORUM" if "NO_QUORUM" in why else "other"
                refusals[key] = refusals.get(key, 0) + 1
                late_refusals += late
        except RamgridError as e:
            key = "NO_QUORUM" if "NO_QUORUM" in str(e) else type(e).__name__
            refusals[key] = refusals.get(key, 0) + 1
            late_refusals += late
        try:
            g.table("p").get_many(list(range(100)))
            reads_ok_late += late
        except RamgridError as e:
            key = "read NO_QUORUM" if "NO_QUORUM" in str(e) else f"read {type(e).__name__}"
            refusals[key] = refusals.get(key, 0) + 1
        time.sleep(0.05)
    return {"acked": acked, "refusals": refusals, "late_refusals": late_refusals, "reads_ok_late": reads_ok_late}


if __name__ == "__main__":
    if sys.argv[1] == "run":
        print(json.dumps(run(sys.argv[2], sys.argv[3])))
    else:
        print(json.dumps(minority(sys.argv[2], float(sys.argv[3]))))
