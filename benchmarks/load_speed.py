"""Loads at the parser's speed (issue 26 item 5): `Table.load` of the same TSV, CSV and Parquet file beside pyarrow
reading and parsing that file into Arrow, and beside memcached taking the same number of sets, all in one run.

The corpus is real: bigram counts ("word word<TAB>count") of the first sentences of the English Wikipedia extract
in ../shared/data (or any text file given with --corpus), cut at --rows distinct bigrams; tokens with a comma, a
quote or a control character are left out so that the same rows make a TSV, a CSV and a memcached key (a space in
a key becomes "_" for memcached). The Parquet file holds the same rows (key: string, value: int64) in row groups of
pyarrow's default size. The files are cached in --work.

Peers, per round, interleaved so that drift in the shared machine's load favours none:
- pyarrow.csv.read_csv of the TSV / CSV (same delimiter, no quoting, key binary and value int64 as the load parses
  them) and pyarrow.parquet.read_table of the Parquet file, on pyarrow's thread pool (`--threads`);
- memcached (`-t --server-threads`, a fresh process per round) loaded with the same number of keys of the corpus's
  mean key and value length by ramgrid-bench's `load` workload (pipelined batches of sets, a native client), and
  with the corpus's own keys and values by pymemcache's set_many(noreply=True) from this process (Python-bound).
ramgrid: `ramgrid.local(servers=--servers, threads=--server-threads)`, `Table.load(file, workers=--threads)` into
a new table each round (dropped after), with the count of the loaded table checked; with --reload, the same file
again into that table (a new version beside the one the first load made: a periodic refresh).

    .venv/bin/python benchmarks/load_speed.py --out benchmarks/results/load_speed.txt
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import ramgrid

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "enwiki-2015-sentences.txt.gz"
LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5_000_000, help="distinct bigrams in the corpus (default 5,000,000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="pyarrow's and the loader's threads")
    p.add_argument("--servers", type=int, default=1, help="ramgrid servers of the local grid (default 1)")
    p.add_argument("--server-threads", type=int, default=2, help="worker threads of each server and of memcached")
    p.add_argument("--formats", default="tsv,csv,parquet", help="comma-separated (default %(default)s)")
    p.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="a text file (.gz or plain), one sentence a line"
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/ramgrid-load-bench"), help="where the files are cached")
    p.add_argument("--no-memcached", action="store_true", help="skip the memcached peers")
    p.add_argument(
        "--reload", action="store_true", help="also time a second load of each file into the table the first made"
    )
    p.add_argument("--out", type=Path, help="also write the report here")
    p.add_argument(
        "--perf",
        type=Path,
        help="after the rounds, profile --perf-loads loads of the first format (perf record -g on the servers and this "
        "process) and write perf's summary here",
    )
    p.add_argument("--perf-loads", type=int, default=3, help="loads profiled with --perf (default 3)")
    return p.parse_args()


# --- corpus -------------------------------------------------------------------------------------------------------


def _clean(token: str) -> bool:
    return len(token) <= 100 and not any(c in ',"' or ord(c) < 33 or ord(c) == 127 for c in token)


def corpus_files(a: argparse.Namespace) -> dict[str, Path]:
    """The TSV, CSV and Parquet files of the first `--rows` distinct bigrams of the corpus, built once and cached."""
    a.work.mkdir(parents=True, exist_ok=True)
    stem = a.work / f"bigrams-{a.rows}"
    files = {"tsv": stem.with_suffix(".tsv"), "csv": stem.with_suffix(".csv"), "parquet": stem.with_suffix(".parquet")}
    if all(f.exists() for f in files.values()):
        return files
    if not a.corpus.exists():
        sys.exit(f"no corpus at {a.corpus}: give a text file with --corpus")
    t0 = time.perf_counter()
    counts: collections.Counter[str] = collections.Counter()
    opener: Callable[..., Any] = gzip.open if a.corpus.suffix == ".gz" else open
    with opener(a.corpus, "rt", encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            t = [w for w in line.split() if _clean(w)]
            counts.update(x + " " + y for x, y in zip(t, t[1:]))
            if i % 10_000 == 0 and len(counts) >= a.rows:
                break
    keys = list(counts)[: a.rows]
    if len(keys) < a.rows:
        sys.exit(f"the corpus has only {len(keys):,} distinct bigrams; ask for fewer --rows")
    for fmt, sep in (("tsv", "\t"), ("csv", ",")):
        tmp = files[fmt].with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            out.writelines(f"{k}{sep}{counts[k]}\n" for k in keys)
        tmp.rename(files[fmt])
    table = pa.table({"key": pa.array(keys, pa.string()), "value": pa.array([counts[k] for k in keys], pa.int64())})
    tmp = files["parquet"].with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.rename(files["parquet"])
    print(f"built the corpus files from {a.corpus} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return files


# --- peers --------------------------------------------------------------------------------------------------------


def pyarrow_csv(path: Path, delimiter: str) -> pa.Table:
    """Reads and parses the file as the load parses it: two columns, the key as bytes, the count as int64."""
    return pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(autogenerate_column_names=True, use_threads=True),
        parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char=False, escape_char=False),
        convert_options=pcsv.ConvertOptions(column_types={"f0": pa.binary(), "f1": pa.int64()}),
    )


def pyarrow_read(fmt: str, path: Path) -> pa.Table:
    """The peer of a load of `path`: pyarrow reading and parsing the same file into Arrow."""
    if fmt == "parquet":
        return pq.read_table(path, use_threads=True)
    return pyarrow_csv(path, "\t" if fmt == "tsv" else ",")


class Run:
    """One timed run: wall seconds, and CPU seconds of every process that took part (this one and the servers)."""

    def __init__(self, wall: float, cpu: float) -> None:
        self.wall, self.cpu = wall, cpu


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(f: Callable[..., Any], *args: Any, pids: Sequence[int] = ()) -> Run:
    """Runs `f(*args)`, charging it the CPU of this process and of `pids`."""
    cpu0 = time.process_time() + sum(cpu_seconds(p) for p in pids)
    t0 = time.perf_counter()
    f(*args)
    wall = time.perf_counter() - t0
    return Run(wall, time.process_time() + sum(cpu_seconds(p) for p in pids) - cpu0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Memcached:
    """A memcached process on loopback, stopped on exit."""

    def __init__(self, threads: int, memory_mb: int) -> None:
        self.port = free_port()
        self.cmd = ["memcached", "-l", "127.0.0.1", "-p", str(self.port), "-t", str(threads), "-m", str(memory_mb)]
        self.cmd += ["-U", "0", "-c", "1024"] + (["-u", "root"] if os.geteuid() == 0 else [])
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("memcached did not start") from None
                time.sleep(0.05)

    def items(self) -> int:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"stats\r\n")
            buf = b""
            while not buf.endswith(b"END\r\n"):
                buf += s.recv(65536)
        for line in buf.decode().splitlines():
            if line.startswith("STAT curr_items "):
                return int(line.split()[2])
        return -1

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def __enter__(self) -> Memcached:  # noqa: PYI034 (a final class)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bench_binary() -> Path:
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ramgrid-bench"], cwd=REPO, check=True)
    return REPO / "target" / "release" / "ramgrid-bench"


def memcached_native(a: argparse.Namespace, bench: Path, n: int, key_size: int, value_size: int) -> Run:
    """ramgrid-bench's load workload (pipelined batches of 100 sets on 50 connections) setting `n` keys in a new
    memcached: its measured window, and the CPU of memcached and of ramgrid-bench in that window."""
    with Memcached(a.server_threads, 4096) as mc:
        cmd = [str(bench), "--server", f"127.0.0.1:{mc.port}", "--server-pid", str(mc.proc.pid), "--workload", "load"]
        cmd += ["--json", "--key-count", str(n), "--key-size", str(key_size), "--value-size", str(value_size)]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout)
        if out["keys"] != n or mc.items() != n:
            raise RuntimeError(f"memcached holds {mc.items()} items after setting {out['keys']} of {n}")
    return Run(out["window_s"], out["server_cpu_s"] + out["client_cpu_s"])


def memcached_pymemcache(a: argparse.Namespace, keys: list[bytes], values: list[bytes]) -> Run:
    """pymemcache's set_many(noreply=True) of the corpus's own keys and values, 10,000 a call, from this process."""
    from pymemcache.client.base import Client

    def load(client: Client) -> None:
        for lo in range(0, len(keys), 10_000):
            client.set_many(dict(zip(keys[lo : lo + 10_000], values[lo : lo + 10_000])), noreply=True)
        client.version()  # a reply after the last noreply set: every set was read by the server

    with Memcached(a.server_threads, 4096) as mc:
        client = Client(("127.0.0.1", mc.port), no_delay=True)
        run = measured(load, client, pids=[mc.proc.pid])
        client.close()
        if mc.items() != len(keys):
            raise RuntimeError(f"memcached holds {mc.items()} items after loading {len(keys)}")
    return run


def ramgrid_load(grid: Any, path: Path, rows: int, threads: int, name: str, keep: bool = False) -> Run:
    """`Table.load` of `path` into table `name` (a new table, or a new version of it if it exists), dropped after
    unless `keep`: wall seconds, CPU of this process and the servers."""

    def load() -> None:
        report = grid.table(name).load(path, value_type="i64", progress=False, workers=threads, partitions=64)
        if report.rows != rows:
            raise RuntimeError(f"{name}: loaded {report.rows} rows, not {rows}")

    run = measured(load, pids=grid.pids)
    if grid.table(name).count() != rows:
        raise RuntimeError(f"{name}: the table counts {grid.table(name).count()} rows, not {rows}")
    if not keep:
        grid.drop_table(name)
    return run


def profile_loads(a: argparse.Namespace, grid: Any, path: Path, rows: int) -> None:
    """`perf record -g` on the servers and this process over `--perf-loads` loads of `path`; writes to `--perf` the
    share of samples per process and thread, and the top symbols by self time (perf report --no-children)."""
    data = a.work / "load.perf.data"
    pids = ",".join(str(p) for p in [*grid.pids, os.getpid()])
    rec = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-g", "-p", pids, "-o", str(data)])
    time.sleep(1.0)  # perf attaches before the first load starts
    try:
        for i in range(a.perf_loads):
            ramgrid_load(grid, path, rows, a.threads, f"profiled_{i}")
    finally:
        rec.send_signal(2)
        rec.wait(60)
    report = ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--percent-limit", "0.7"]
    out = [
        subprocess.run([*report, "--sort", sort, "-g", "none"], check=True, capture_output=True, text=True).stdout
        for sort in ("comm", "comm,symbol")
    ]
    keep = [ln.rstrip(" -") for ln in "".join(out).splitlines() if ln.strip() and not ln.startswith("#")]
    head = f"# perf record -F 999 -g -p <servers>,<loader> over {a.perf_loads} loads of {path.name}; {commit_line()}"
    a.perf.parent.mkdir(parents=True, exist_ok=True)
    a.perf.write_text("\n".join([head, *keep]) + "\n")
    data.unlink(missing_ok=True)


def commit_line() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True)
    return f"commit {out.stdout.strip()}"


# --- run ----------------------------------------------------------------------------------------------------------


def main() -> int:
    a = parse_args()
    formats = [f for f in a.formats.split(",") if f]
    pa.set_cpu_count(a.threads)
    pa.set_io_thread_count(max(a.threads, 1))
    files = corpus_files(a)
    raw = pyarrow_csv(files["tsv"], "\t")
    n = raw.num_rows
    keys = [k.replace(b" ", b"_") for k in raw.column("f0").to_pylist()]
    values = [str(v).encode() for v in raw.column("f1").to_pylist()]
    key_size = round(sum(map(len, keys)) / n)
    value_size = round(sum(map(len, values)) / n)
    del raw

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True
    )
    say(f"# load speed, {datetime.datetime.now().isoformat(timespec='seconds')}, commit {commit.stdout.strip()}")
    say(f"# {shlex.join([sys.executable.split('/')[-1], *sys.argv])}")
    say(f"# {os.cpu_count()} CPUs, {platform.platform()}, pyarrow {pa.__version__}; load average {os.getloadavg()}")
    sizes = ", ".join(f"{f} {files[f].stat().st_size / 2**20:.1f} MiB" for f in formats)
    say(f"# corpus: {n:,} bigram counts of {a.corpus.name} ({sizes}); mean key {key_size} B, value {value_size} B")
    say(
        f"# threads: pyarrow and loader {a.threads}; {a.servers} ramgrid server(s) and memcached, {a.server_threads} each"
    )
    say(f"# {a.rounds} rounds, interleaved; medians over the rounds (ratios: median of each round's ratio)")
    bench = None if a.no_memcached else bench_binary()

    runs: dict[str, list[Run]] = collections.defaultdict(list)
    with ramgrid.local(servers=a.servers, threads=a.server_threads, memory="3GiB") as grid:
        ramgrid_load(grid, files[formats[0]], n, a.threads, "warm_up")  # the servers' first touch of their memory
        for r in range(a.rounds):
            for fmt in formats:
                runs[f"pyarrow {fmt}"].append(measured(pyarrow_read, fmt, files[fmt]))
                runs[f"ramgrid {fmt}"].append(ramgrid_load(grid, files[fmt], n, a.threads, f"load_{fmt}_{r}", True))
                if a.reload:
                    # The same file again: a new version of the table the load above made, as a periodic refresh.
                    runs[f"ramgrid {fmt} reload"].append(
                        ramgrid_load(grid, files[fmt], n, a.threads, f"load_{fmt}_{r}")
                    )
                else:
                    grid.drop_table(f"load_{fmt}_{r}")
            if bench is not None:
                runs["memcached ramgrid-bench"].append(memcached_native(a, bench, n, key_size, value_size))
                runs["memcached pymemcache"].append(memcached_pymemcache(a, keys, values))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
        if a.perf is not None:
            profile_loads(a, grid, files[formats[0]], n)

    if not runs:
        return 0

    def med(what: str, field: str = "wall") -> float:
        return statistics.median(getattr(x, field) for x in runs[what])

    def ratio(num: str, den: str, field: str = "wall") -> float:
        return statistics.median(getattr(x, field) / getattr(y, field) for x, y in zip(runs[num], runs[den]))

    say("")
    say(f"{'what':<26}{'seconds':>9}{'(min-max)':>16}{'rows/s':>13}{'CPU s':>8}{'CPU ns/row':>12}")
    for k, v in runs.items():
        walls = [x.wall for x in v]
        say(
            f"{k:<26}{med(k):>9.3f} ({min(walls):6.3f}-{max(walls):6.3f}){n / med(k):>13,.0f}"
            f"{med(k, 'cpu'):>8.2f}{med(k, 'cpu') * 1e9 / n:>12.0f}"
        )
    say("")
    say(
        "ramgrid load against pyarrow parsing the same file (time ratio, target <= 2) and memcached's set rate (target >= 4):"
    )
    for fmt in formats:
        for what in (f"ramgrid {fmt}", f"ramgrid {fmt} reload"):
            if what not in runs:
                continue
            line = (
                f"  {what[8:]:<15} {ratio(what, f'pyarrow {fmt}'):5.2f}x pyarrow's time"
                f" ({ratio(what, f'pyarrow {fmt}', 'cpu'):4.2f}x its CPU)"
            )
            for peer in ("memcached ramgrid-bench", "memcached pymemcache"):
                if peer in runs:
                    line += f"; {ratio(peer, what):5.2f}x the rate of {peer}"
            say(line)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
