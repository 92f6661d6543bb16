"""Recovery time of durable tables: how long a server started with --data-dir takes to load its snapshots.

One server with a fresh data dir gets two durability="snapshot" tables: an f64 table holding `--mb` MB of values
(8 bytes each) and a bytes table holding `--mb` MB of 1000-byte values. Each is loaded as a version, sealed (which
writes its partition images) and made current. The server is then killed with SIGKILL and started again on the same
address with the same data dir; the script reports the time from spawning it to its listening line (it loads every
table before it listens), the per-table lines the server logs, the image bytes on disk, and seconds per GB. Then it
checks a sample of keys read back exactly. A benchmark, not a test: it prints figures and asserts only correctness.

    python benchmarks/recovery.py
    python benchmarks/recovery.py --mb 200 --out benchmarks/results/recovery.txt
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _server
import ramgrid
from _server import free_port


def spawn(addr: str, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Starts the server with a one-server spec; returns it and the seconds until it listened."""
    spec = log.parent / "spec"
    spec.write_text(f"server {addr}\n")
    return _server.spawn(addr, data, log, "12GiB", ["--cluster-spec", str(spec)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="MB of values per table")
    ap.add_argument("--out", type=Path, help="also write the report here")
    a = ap.parse_args()

    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
    say(f"$ python {' '.join(shlex.quote(x) for x in sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="ramgrid-recovery-") as tmp:
        root = Path(tmp)
        addr = f"127.0.0.1:{free_port()}"
        proc, _ = spawn(addr, root / "data", root / "first")
        try:
            g = ramgrid.connect([addr], timeout=60.0, call_timeout=600.0)
            n_f = a.mb * 1_000_000 // 8
            f = g.create_table("f64s", partitions=16, value_type="f64", durability="snapshot")
            keys_f = np.arange(n_f, dtype=np.int64)
            t0 = time.perf_counter()
            with f.new_version() as v:
                for s in range(0, n_f, 1_000_000):
                    v.put_many(keys_f[s : s + 1_000_000], keys_f[s : s + 1_000_000] * 0.5)
            say(
                f"f64 table: {n_f:,} values ({a.mb} MB of values) written and sealed in {time.perf_counter() - t0:.1f} s"
            )
            n_b = a.mb * 1_000_000 // 1000
            b = g.create_table("blobs", partitions=16, value_type="bytes", durability="snapshot")
            t0 = time.perf_counter()
            with b.new_version() as v:
                for s in range(0, n_b, 20_000):
                    ks = [f"blob-{i}".encode() for i in range(s, min(s + 20_000, n_b))]
                    v.put_many(ks, [k.ljust(1000, b"*") for k in ks])
            say(f"bytes table: {n_b:,} values of 1000 bytes written and sealed in {time.perf_counter() - t0:.1f} s")
            g.close()
        finally:
            proc.kill()
            proc.wait()
        images = sum(p.stat().st_size for p in (root / "data").rglob("*.img"))
        say(f"SIGKILL; image files on disk: {images / 1e9:.3f} GB")

        proc, secs = spawn(addr, root / "data", root / "second")
        try:
            for line in (root / "second.err").read_text().splitlines():
                if "loaded table" in line:
                    say("server: " + line.removeprefix("ramgrid-server: "))
            say(
                f"restart to listening: {secs:.2f} s for {images / 1e9:.3f} GB of images = {secs / (images / 1e9):.2f} s/GB"
            )
            g = ramgrid.connect([addr], timeout=60.0, call_timeout=600.0)
            rng = np.random.default_rng(1)
            sample = rng.integers(0, n_f, 100_000)
            assert np.array_equal(g.table("f64s").get_many(sample), sample * 0.5), "f64 values differ after restart"
            ks = [f"blob-{i}".encode() for i in rng.integers(0, n_b, 2_000)]
            assert g.table("blobs").get_many(ks) == [k.ljust(1000, b"*") for k in ks], "bytes differ after restart"
            say("checked: 100,000 f64 keys and 2,000 bytes keys read back exact")
            g.close()
        finally:
            proc.kill()
            proc.wait()
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
