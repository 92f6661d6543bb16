"""Join a large file with a side table that lives in the grid: each Dask partition enriches its rows with one batched
lookup per side table, compared with the engine-only join (a Dask merge) for identical output and for time.

    python examples/join_enrich.py                       # KDD Cup 99 (../shared/data) if present, else generated clicks
    python examples/join_enrich.py --synthetic --rows 2000000 --users 1000000
    python examples/join_enrich.py --data kddcup99-10percent.csv.gz --rows 100000

Two datasets:
- KDD Cup 99 network connections (a CSV with protocol and service columns), enriched from two grid tables keyed by
  service: a risk score (f64) and a port number (i64). The reference tables are generated deterministically from the
  service names, and a few services are left out of them on purpose, so the join has misses (NaN / -1).
- A generated click log (click id, user id, url id), enriched from user id -> age (i64) and user id -> segment score
  (f64): the case the grid is for, a side table too big to broadcast comfortably. About 1% of clicks come from users
  missing from the side tables.
The side tables are written as TSV files and loaded with `ramgrid.load.load_table`; the engine-only join reads the
same files with pandas.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import ramgrid
from ramgrid.load import load_table

REPO_ROOT = Path(__file__).resolve().parents[1]
KDD_PATH = REPO_ROOT.parent / "shared" / "data" / "kddcup99-10percent.csv.gz"
KDD_COLUMNS = ["duration", "protocol", "service", "flag", "src_bytes", "dst_bytes"]
LABEL_COLUMN = 41  # the last of KDD's 42 columns: "normal." or an attack type


# ---------------------------------------------------------------------------------------------------------------
# the two sides of each join


def kdd_side(service: str) -> tuple[float, int] | None:
    """The reference data for one service, derived from its name (None: not in the reference tables)."""
    h = zlib.crc32(service.encode())
    if h % 11 == 0:
        return None
    return (h % 1000) / 1000.0, 1 + h % 65535


def user_side(user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Age and segment score of each user, derived from the id."""
    u = user_ids.astype(np.uint64)
    age = (18 + (u * np.uint64(2654435761) % np.uint64(2**32)) % np.uint64(60)).astype(np.int64)
    score = ((u * np.uint64(40503)) % np.uint64(10007)).astype(np.float64) / 10007.0
    return age, score


def prepare_kdd(src: Path, rows: int | None, work: Path) -> dict[str, Any]:
    """Copies the first `rows` connections (all when None) to a plain CSV, with the columns the join uses, and
    writes the two side-table files."""
    out = work / "connections.csv"
    n = 0
    services: set[str] = set()
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as f, open(out, "w") as g:
        g.write(",".join([*KDD_COLUMNS, "label"]) + "\n")
        for line in f:
            if rows is not None and n >= rows:
                break
            fields = line.rstrip("\n").split(",")
            if len(fields) <= LABEL_COLUMN:
                continue
            g.write(",".join([*fields[: len(KDD_COLUMNS)], fields[LABEL_COLUMN]]) + "\n")
            services.add(fields[2])
            n += 1
    known = {s: kdd_side(s) for s in sorted(services)}
    with open(work / "risk.tsv", "w") as r, open(work / "port.tsv", "w") as p:
        for s, v in known.items():
            if v is not None:
                r.write(f"{s}\t{v[0]!r}\n")
                p.write(f"{s}\t{v[1]}\n")
    return {
        "name": f"{src.name} ({n:,} connections)",
        "file": out,
        "rows": n,
        "key": "service",
        "key_type": "str",
        "sides": [("risk", work / "risk.tsv", "f64"), ("port", work / "port.tsv", "i64")],
        "side_keys": sum(v is not None for v in known.values()),
    }


def prepare_clicks(rows: int, users: int, work: Path, seed: int = 7) -> dict[str, Any]:
    """Writes a click log and the two user side-table files."""
    rng = np.random.default_rng(seed)
    # Heavy-tailed activity: a few users click a lot. 1% of clicks come from ids outside the side tables.
    user = (rng.zipf(1.3, rows) - 1) % users
    unknown = rng.random(rows) < 0.01
    user[unknown] = users + rng.integers(0, users, int(unknown.sum()))
    clicks = pd.DataFrame({"click_id": np.arange(rows), "user_id": user, "url_id": rng.integers(0, 50_000, rows)})
    out = work / "clicks.csv"
    clicks.to_csv(out, index=False)
    ids = np.arange(users, dtype=np.int64)
    age, score = user_side(ids)
    pd.DataFrame({"k": ids, "v": age}).to_csv(work / "age.tsv", sep="\t", header=False, index=False)
    with open(work / "score.tsv", "w") as f:  # repr keeps every float exact through the text file
        f.writelines(f"{i}\t{s!r}\n" for i, s in zip(ids.tolist(), score.tolist()))
    return {
        "name": f"generated click log ({rows:,} clicks, {users:,} users)",
        "file": out,
        "rows": rows,
        "key": "user_id",
        "key_type": "int",
        "sides": [("age", work / "age.tsv", "i64"), ("score", work / "score.tsv", "f64")],
        "side_keys": users,
    }


# ---------------------------------------------------------------------------------------------------------------
# the joins


def _missing(value_type: str) -> Any:
    return -1 if value_type == "i64" else np.nan


def enrich(part: pd.DataFrame, key: str, tables: list[tuple[str, ramgrid.PinnedTable, str]]) -> pd.DataFrame:
    """A map task: one batched lookup per side table for the partition's distinct keys, then a gather."""
    codes, uniq = pd.factorize(part[key])  # hashing, not sorting: a partition's distinct keys in one pass
    keys = uniq.to_numpy(dtype=np.int64) if uniq.dtype.kind in "iu" else uniq.to_numpy(dtype=object)
    out = part.copy()
    for name, table, vt in tables:
        values = np.asarray(table.get_many(keys, default=_missing(vt)))
        out[name] = values[codes]
    return out


def grid_join(ddf: Any, spec: dict[str, Any], tables: list[tuple[str, ramgrid.PinnedTable, str]]) -> pd.DataFrame:
    meta = ddf._meta.copy()
    for name, _, vt in tables:
        meta[name] = pd.Series(dtype=np.int64 if vt == "i64" else np.float64)
    return ddf.map_partitions(enrich, spec["key"], tables, meta=meta).compute()


def engine_join(ddf: Any, spec: dict[str, Any]) -> pd.DataFrame:
    """The obvious way on the engine: read the side files with pandas and merge (Dask broadcasts the small side)."""
    import dask.dataframe as dd

    key = spec["key"]
    side = None
    for name, path, vt in spec["sides"]:
        dtype = {"k": np.int64 if spec["key_type"] == "int" else str, name: np.int64 if vt == "i64" else np.float64}
        df = pd.read_csv(path, sep="\t", header=None, names=["k", name], dtype=dtype)
        side = df if side is None else side.merge(df, on="k", how="outer")
    assert side is not None
    side = side.rename(columns={"k": key})
    out = dd.merge(ddf, dd.from_pandas(side, npartitions=1), on=key, how="left").compute()
    for name, _, vt in spec["sides"]:
        if vt == "i64":
            out[name] = out[name].fillna(-1).astype(np.int64)
    return out


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in a fixed order and plain dtypes: a merge does not keep row order, and rows may repeat."""
    df = df.reset_index(drop=True)
    for c in df.columns:
        if df[c].dtype.kind not in "iufb":
            df[c] = df[c].astype(object)
    return df.sort_values(list(df.columns), kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------------


def _engine(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    """Starts the engine for the rest of the `stack`: a Dask LocalCluster, or a local Dask scheduler."""
    if args.scheduler != "distributed":
        import dask

        stack.enter_context(dask.config.set(scheduler=args.scheduler))
        return
    from distributed import Client, LocalCluster

    cluster = stack.enter_context(
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
        )
    )
    stack.enter_context(Client(cluster))  # the default client from here on: .compute() runs on the cluster


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help=f"KDD Cup 99 CSV[.gz] (default: {KDD_PATH} when present)")
    p.add_argument("--synthetic", action="store_true", help="use a generated click log even if KDD data is present")
    p.add_argument("--rows", type=int, help="rows of the large file (default: all of KDD, 1,000,000 clicks)")
    p.add_argument("--users", type=int, default=200_000, help="users in the generated side tables (default 200,000)")
    p.add_argument("--servers", type=int, default=2, help="ramgrid servers (default 2)")
    p.add_argument("--workers", type=int, default=2, help="Dask worker processes (default 2)")
    p.add_argument("--partitions", type=int, default=8, help="Dask partitions of the large file (default 8)")
    p.add_argument("--scheduler", choices=("distributed", "threads", "sync"), default="distributed")
    p.add_argument("--repeat", type=int, default=3, help="time each join this many times, report the best (default 3)")
    p.add_argument("--memory", default="512MiB", help="table memory per server (default 512MiB)")
    args = p.parse_args(argv)

    import dask.dataframe as dd

    work = Path(tempfile.mkdtemp(prefix="ramgrid-join-"))
    try:
        data = args.data if args.data is not None else (KDD_PATH if KDD_PATH.exists() and not args.synthetic else None)
        if data is not None:
            if not data.exists():
                p.error(f"--data {data}: no such file")
            spec = prepare_kdd(data, args.rows, work)
        else:
            print("no KDD Cup 99 data found (or --synthetic): using a generated click log", file=sys.stderr)
            spec = prepare_clicks(args.rows or 1_000_000, args.users, work)
        size = spec["file"].stat().st_size
        ddf = dd.read_csv(spec["file"], blocksize=max(1 << 16, size // args.partitions + 1))

        with ramgrid.local(servers=args.servers, memory=args.memory) as grid:
            t0 = time.perf_counter()
            tables = []
            for name, path, vt in spec["sides"]:
                report = load_table(grid, name, path, value_type=vt, key_type=spec["key_type"], progress=False)
                tables.append((name, grid.table(name).pin(report.version), vt))
            load_s = time.perf_counter() - t0

            with contextlib.ExitStack() as stack:
                _engine(args, stack)
                ddf = ddf.persist()  # both joins start from the same partitions already in the engine
                grid_s = engine_s = float("inf")
                # Best of a few runs: the first also pays for connections and imports in each worker.
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    via_grid = grid_join(ddf, spec, tables)
                    grid_s = min(grid_s, time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    via_engine = engine_join(ddf, spec)
                    engine_s = min(engine_s, time.perf_counter() - t0)

        a, b = canonical(via_grid), canonical(via_engine)
        identical = a.shape == b.shape and list(a.columns) == list(b.columns)
        if identical:
            try:
                pd.testing.assert_frame_equal(a, b, check_dtype=False)
            except AssertionError:
                identical = False
        misses = int((via_grid[spec["sides"][0][0]].isna() | (via_grid[spec["sides"][0][0]] == -1)).sum())
        result = {
            "dataset": spec["name"],
            "rows": len(via_grid),
            "side_keys": int(spec["side_keys"]),
            "misses": misses,
            "load_seconds": load_s,
            "grid_join_seconds": grid_s,
            "engine_join_seconds": engine_s,
            "identical": bool(identical),
            "scheduler": args.scheduler,
            "result": via_grid,
        }
        rows = result["rows"]
        print(
            f"join_enrich: {spec['name']}, side tables {[n for n, _, _ in spec['sides']]} "
            f"({spec['side_keys']:,} keys each) on {args.servers} ramgrid servers, Dask scheduler {args.scheduler}"
        )
        print(f"  side tables loaded into the grid     {load_s:8.2f} s")
        print(f"  best of {args.repeat} runs each:")
        print(f"  grid join (get_many per partition)   {grid_s:8.2f} s  {rows / max(grid_s, 1e-9):>12,.0f} rows/s")
        print(f"  engine-only join (dask merge)        {engine_s:8.2f} s  {rows / max(engine_s, 1e-9):>12,.0f} rows/s")
        print(f"  rows {rows:,}, rows without a match {misses:,}, outputs identical: {'yes' if identical else 'NO'}")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["identical"] else 1)
