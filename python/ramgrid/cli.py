"""The `ramgrid` command: run servers, manage a local cluster, administer tables, read and write keys.

The cluster address comes from `--spec`, else $RAMGRID_SPEC, else a TOML file (`--config`, $RAMGRID_CONFIG,
./ramgrid.toml, ~/.config/ramgrid/config.toml), else the cluster started by `ramgrid cluster up`.

This module is the top of the package: it imports the commands (`ramgrid.load.command`, `ramgrid.mapreduce.wordcount`,
`ramgrid.lm.__main__`) and nothing imports it. What the commands share lives below them, in `ramgrid._cmdline`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ramgrid import health
from ramgrid._cmdline import (
    STATE_FILE,
    CliError,
    add_address_options,
    connect_from_args,
    read_state,
    run_command,
    state_dir_for,
)
from ramgrid._types import parse_value_type, spell_value_type
from ramgrid.config import ENV_SPEC
from ramgrid.exceptions import RamgridError

SPEC_FILE = "cluster.spec"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ramgrid", description=__doc__.split("\n\n")[0])
    add_address_options(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, **kw)
        add_address_options(sp, top=False)
        return sp

    sub.add_parser("serve", help="run a server in the foreground (ramgrid-server's flags; `ramgrid serve --help`)")

    cl = add("cluster", "a local cluster of server processes, detached from this shell")
    clsub = cl.add_subparsers(dest="action", metavar="ACTION")
    clsub.required = True
    up = clsub.add_parser("up", help="start N servers on loopback and write the state file")
    add_address_options(up, top=False)
    up.add_argument("-n", "--servers", type=int, default=3, help="number of servers (default 3)")
    up.add_argument("--memory", default="256MiB", help="table memory per server (default 256MiB)")
    up.add_argument("--threads", type=int, default=1, help="worker threads per server (default 1)")
    for name, help in (
        ("down", "stop the cluster's servers"),
        ("status", "show the cluster's servers: processes (of `cluster up`), epoch, partitions pending and copied"),
    ):
        sp = clsub.add_parser(name, help=help)
        add_address_options(sp, top=False)
    for name, help in (
        ("add", "add a running, empty server (`ramgrid serve --join MEMBERS`) and move its partitions to it"),
        ("remove", "move every partition off a server and drop it from the cluster (stop it afterwards)"),
    ):
        sp = clsub.add_parser(name, help=help, description=help)
        add_address_options(sp, top=False)
        sp.add_argument("addr", metavar="ADDR", help="the server's host:port")
    rp_help = "put a running, empty server in the place of a dead one (failed over first if it is still in the spec)"
    rp = clsub.add_parser("replace", help=rp_help, description=rp_help)
    add_address_options(rp, top=False)
    rp.add_argument("addr", metavar="DEAD", help="the host:port of the server to replace")
    rp.add_argument("new", metavar="NEW", help="the host:port of the running, empty server that takes its place")
    rc_help = (
        "rebuild the control plane from the live servers after a majority of its voters died for good "
        "(refused while a majority answers); reports the partitions no live server holds"
    )
    rc = clsub.add_parser("recover", help=rc_help, description=rc_help)
    add_address_options(rc, top=False)

    tb = add("table", "create, drop, list, describe or verify tables")
    tbsub = tb.add_subparsers(dest="action", metavar="ACTION")
    tbsub.required = True
    cr = tbsub.add_parser("create", help="create a table")
    add_address_options(cr, top=False)
    cr.add_argument("name")
    cr.add_argument("--partitions", type=int, default=64)
    cr.add_argument("--replication", type=int, default=1)
    cr.add_argument("--type", dest="value_type", default="bytes", help="bytes | i64 | f64 | f32vec:DIM (default bytes)")
    for name, help in (
        ("drop", "drop a table and all its versions"),
        ("describe", "show a table's settings and versions"),
    ):
        sp = tbsub.add_parser(name, help=help)
        add_address_options(sp, top=False)
        sp.add_argument("name")
    ls = tbsub.add_parser("list", help="list tables")
    add_address_options(ls, top=False)
    vf = tbsub.add_parser(
        "verify",
        help="compare the replicas of every partition (exit 1 if any differ)",
        description="Each server that holds a partition says how many items it holds and a hash of them; the "
        "replicas of each partition are compared (docs/replication.md).",
    )
    add_address_options(vf, top=False)
    vf.add_argument("name")
    vf.add_argument("--version", type=int, default=0, help="a version (default: the current one)")
    st = tbsub.add_parser(
        "stats",
        help="count, sum, min, max, mean, std of a numeric table, computed by the servers (one pass per column)",
        description="Summary statistics computed where the data lives (ramgrid.ops): one line per column "
        "(per vector component for f32vec tables).",
    )
    add_address_options(st, top=False)
    st.add_argument("name")
    st.add_argument("--version", type=int, default=0, help="a version (default: the current one)")
    st.add_argument("--columns", type=int, default=8, help="at most this many vector components (default 8)")

    g = add("get", "print the values of keys (tab-separated key, value; exit 1 if any is missing)")
    g.add_argument("table")
    g.add_argument("keys", nargs="+", metavar="KEY")
    g.add_argument("--int-keys", action="store_true", help="keys are integers (int64 keys), not strings")
    g.add_argument("--version", type=int, default=0, help="read this version instead of the current one")

    pu = add("put", "store one key in a table's current version")
    pu.add_argument("table")
    pu.add_argument("key")
    pu.add_argument("value", help="a number for i64/f64 tables, comma-separated floats for f32vec, text for bytes")
    pu.add_argument("--int-keys", action="store_true", help="the key is an integer (int64 key), not a string")

    add("stats", "print every server's counters as JSON, with each table's figures on it under \"tables\"")

    sub.add_parser("bench", help="run benchmarks/native_batch.py --quick (extra arguments are passed on)")
    sub.add_parser(
        "load",
        help="load a TSV/text/CSV/Parquet file or directory into a table as a new version (`ramgrid load --help`)",
    )
    sub.add_parser(
        "mapreduce",
        help="run a MapReduce job on the grid: `ramgrid mapreduce wordcount INPUT --out FILE.tsv`",
    )
    sub.add_parser(
        "demo",
        help="run a demo: `ramgrid demo lm [options]` is the language-model experiment (`ramgrid demo lm --help`)",
    )
    return p


# cluster up / down / status


def _pid_is_server(pid: int) -> bool:
    """True if `pid` is alive (not a zombie) and is a ramgrid server; pids get reused, so never signal blindly."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and b"ramgrid._serve" in cmdline


def _reachable(addr: str, timeout: float = 0.5) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def cmd_cluster_up(args: argparse.Namespace) -> int:
    import ramgrid
    from ramgrid._local import start_servers

    state_dir = state_dir_for(args)
    state_path = state_dir / STATE_FILE
    if state_path.is_file():
        old = read_state(state_path)
        if any(_pid_is_server(p) for p in old.get("pids", [])):
            raise CliError(f"a cluster is already up ({state_path}); run `ramgrid cluster down` first")
    state_dir.mkdir(parents=True, exist_ok=True)
    token = args.token if args.token is not None else os.environ.get("RAMGRID_TOKEN")
    servers = start_servers(
        args.servers, memory=args.memory, threads=args.threads, token=token, log_dir=state_dir, parent_watch=False
    )
    addresses = [str(sp.address) for sp in servers]
    (state_dir / SPEC_FILE).write_text("".join(a + "\n" for a in addresses))
    state = {
        "pids": [sp.pid for sp in servers],
        "addresses": addresses,
        "spec_file": str(state_dir / SPEC_FILE),
        "started": time.time(),
        "token_required": token is not None,
    }
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_path)
    grid = ramgrid.connect(addresses, token=token)
    grid._client().push_spec()
    grid.close()
    for sp in servers:
        # The servers outlive this command on purpose; mark them reaped so Popen does not warn about them.
        sp.proc.returncode = 0
    print(f"started {len(addresses)} servers: {','.join(addresses)}")
    print(f"state: {state_path}")
    print(f"export {ENV_SPEC}={','.join(addresses)}")
    print(f"dashboard: {servers[0].dashboard_url(token)}")
    return 0


def cmd_cluster_down(args: argparse.Namespace) -> int:
    state_path = state_dir_for(args) / STATE_FILE
    if not state_path.is_file():
        print(f"no cluster state at {state_path}; nothing to stop")
        return 0
    state = read_state(state_path)
    pids = [int(p) for p in [*state.get("pids", []), *state.get("left_pids", [])] if p is not None]
    live = [p for p in pids if _pid_is_server(p)]
    for p in live:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_pid_is_server(p) for p in live):
        time.sleep(0.05)
    killed = [p for p in live if _pid_is_server(p)]
    for p in killed:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    state_path.unlink()
    spec_file = Path(state.get("spec_file", ""))
    if spec_file.name == SPEC_FILE and spec_file.is_file():
        spec_file.unlink()
    print(f"stopped {len(live)} server(s)" + (f" ({len(killed)} with SIGKILL)" if killed else ""))
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    """The processes of `cluster up` (if its state file is there), then each member's own view (CLUSTER_STATUS) of
    the cluster named by --spec etc. (or that state file)."""
    state_path = state_dir_for(args) / STATE_FILE
    have_state = state_path.is_file()
    ok = True
    if have_state:
        state = read_state(state_path)
        for pid, addr in zip(state.get("pids", []), state.get("addresses", [])):
            if pid is None:  # added with `cluster add`: not started by `cluster up`
                continue
            alive = _pid_is_server(int(pid))
            reach = alive and _reachable(addr)
            ok = ok and reach
            print(f"{addr}\tpid {pid}\t{'up' if reach else 'running, not answering' if alive else 'down'}")
    try:
        grid = connect_from_args(args)
    except CliError:
        if not have_state:
            print(f"no cluster state at {state_path}")
            return 1
        raise
    try:
        statuses = grid.status()
        group = grid.health(statuses) if any(s.get("ok") for s in statuses) else None
    except RamgridError as e:
        print(f"cluster status unavailable: {type(e).__name__}: {e}")
        return 1
    finally:
        grid.close()
    live = [s for s in statuses if s.get("ok")]
    if live and group is not None:
        print(_group_summary(live))
        print(health.summary(group))
    for s in statuses:
        if not s.get("ok"):
            ok = False
            print(f"{s['server']}\tunreachable: {s.get('error')}")
            continue
        moving = f"\tmoving to {s['next']}" if s.get("next") else ""
        print(
            f"{s['server']}\t{_role(s)}\tepoch {int(s.get('epoch', 0)):016x}\tquorum {s.get('quorum', '-')}"
            f"\tpending partitions {s.get('pending_partitions')}"
            f"\tcopied {s.get('copied_partitions')} partitions, {s.get('copied_bytes')} bytes{moving}"
        )
        for line in str(s.get("repairing") or "").split("; "):
            if line:
                print(f"  repairing {line}")
    return 0 if ok else 1


def _group_summary(statuses: list[dict[str, Any]]) -> str:
    """One line about the metadata group, as the first server that names a leader sees it."""
    s = next((s for s in statuses if str(s.get("meta_leader", "none")) != "none"), statuses[0])
    leader = str(s.get("meta_leader", "none")).split(" ")[0]
    failed = s.get("failed")
    line = f"metadata group: leader {leader}, term {s.get('meta_term', '-')}, {s.get('meta_members', 0)} members"
    line += f", failure timeout {int(s.get('failure_timeout_ms', 0)) / 1000:g} s"
    return line + (f", failed over (not back yet): {failed}" if failed else "")


def _role(s: dict[str, Any]) -> str:
    """leader, voter or learner in the metadata group (or "-" outside one)."""
    if health.leader(s) == s["server"]:
        return "leader"
    return health.members(s).get(str(s["server"]), "-")


def _update_state_addresses(args: argparse.Namespace, to: Sequence[str]) -> None:
    """After a move of the `cluster up` cluster, its state and spec file list the new members, so later commands
    (and `cluster status`) address them; a server added by hand has no pid there."""
    if args.spec is not None or os.environ.get(ENV_SPEC):
        return
    state_path = state_dir_for(args) / STATE_FILE
    if not state_path.is_file():
        return
    state = read_state(state_path)
    pid_of = dict(zip(state.get("addresses", []), state.get("pids", [])))
    # In spec order, which is the partition map's; None where this command did not start the server.
    state["addresses"] = list(to)
    state["pids"] = [pid_of.get(a) for a in to]
    # Servers of `cluster up` that left the cluster still run until `cluster down` (or the user) stops them.
    state["left_pids"] = list(state.get("left_pids", [])) + [p for a, p in pid_of.items() if a not in to and p]
    spec_file = Path(state.get("spec_file", ""))
    if spec_file.name == SPEC_FILE:
        spec_file.write_text("".join(a + "\n" for a in to))
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_path)


def cmd_cluster_move(args: argparse.Namespace) -> int:
    """`cluster add ADDR` / `cluster remove ADDR` / `cluster replace DEAD NEW`: one move, its report printed."""
    grid = connect_from_args(args)
    try:
        if args.action == "add":
            report = grid.add_server(args.addr)
        elif args.action == "replace":
            report = grid.replace_server(args.addr, args.new)
        else:
            report = grid.remove_server(args.addr)
    except ValueError as e:
        raise CliError(str(e)) from None
    finally:
        grid.close()
    _update_state_addresses(args, report["to"])
    verb = {"add": "added", "replace": f"replaced by {getattr(args, 'new', '')}"}.get(args.action, "removed")
    print(
        f"{verb} {args.addr}: {report['partitions_copied']} partitions ({report['bytes_copied']} bytes) copied "
        f"in {report['seconds']:.2f} s"
    )
    print(f"servers: {','.join(report['to'])}")
    return 0


def cmd_cluster_recover(args: argparse.Namespace) -> int:
    """`cluster recover`: the metadata group rebuilt from the live servers; exit 1 if some data is lost."""
    grid = connect_from_args(args)
    try:
        report = grid.recover()
    except ValueError as e:
        raise CliError(str(e)) from None
    finally:
        grid.close()
    print(f"metadata group rebuilt from {report['leader']} (generation {report['generation']})")
    print(f"joined: {', '.join(report['joined']) or 'none'}")
    print(f"dead (failed over next): {', '.join(report['dead']) or 'none'}")
    if report["unsettled"]:
        print(f"not in the new group yet: {', '.join(report['unsettled'])}")
    for table, parts in sorted(report["lost"].items()):
        print(f"lost: table {table}: partitions {','.join(map(str, parts))} (no live replica)")
    return 1 if report["lost"] else 0


# tables and keys


def cmd_table(args: argparse.Namespace) -> int:
    grid = connect_from_args(args)
    if args.action == "create":
        vt = str(args.value_type)
        if vt.startswith("f32vec"):
            try:
                parse_value_type(vt)
            except ValueError:
                raise CliError("vector tables are --type f32vec:DIM, e.g. f32vec:64") from None
        try:
            grid.create_table(args.name, partitions=args.partitions, replication=args.replication, value_type=vt)
        except ValueError as e:
            raise CliError(str(e)) from None
        print(f"created table {args.name}")
    elif args.action == "drop":
        grid.drop_table(args.name)
        print(f"dropped table {args.name}")
    elif args.action == "list":
        for t in sorted(grid.list_tables(), key=lambda t: str(t.get("name"))):
            vt = spell_value_type(str(t.get("value_type")), int(t.get("dim") or 0))
            print(
                f"{t.get('name')}\t{vt}\tpartitions={t.get('partitions')}"
                f"\treplication={t.get('replication')}\tcurrent_version={t.get('current_version')}"
            )
    elif args.action == "describe":
        print(json.dumps(grid.table(args.name).describe(), indent=2, default=str))
    elif args.action == "stats":
        _table_stats(grid, args)
    elif args.action == "verify":
        return _table_verify(grid, args)
    return 0


def _table_verify(grid: Any, args: argparse.Namespace) -> int:
    r = grid.table(args.name).verify(args.version or None)
    print(f"{args.name} v{r['version']}: {r['agreed']} partitions agree ({r['items']} items)")
    for p, reps in sorted(r["differ"].items()):
        figures = ", ".join(f"{s}: {n} items, digest {d:016x}" for s, (n, d) in sorted(reps.items()))
        print(f"partition {p} DIFFERS: {figures}")
    for p, server, why in r["unanswered"]:
        print(f"partition {p} not compared on {server}: {why}")
    return 1 if r["differ"] else 0


def _table_stats(grid: Any, args: argparse.Namespace) -> None:
    table = grid.table(args.name)
    info = table.describe()
    vt = info.get("value_type")
    if vt == "bytes":
        raise CliError(f"table {args.name} holds bytes; stats need i64, f64 or f32vec values")
    reader = table.pin(args.version) if args.version else table
    columns = min(int(info.get("dim") or 1), max(1, args.columns)) if vt == "f32vec" else 1
    print("column\tcount\tsum\tmin\tmax\tmean\tstd")
    version = None
    for c in range(columns):
        s = reader.stats(column=c)
        version = s.version
        print(f"{c}\t{s.count}\t{s.sum:.6g}\t{s.min:.6g}\t{s.max:.6g}\t{s.mean:.6g}\t{s.std():.6g}")
    if vt == "f32vec" and columns < int(info.get("dim") or 1):
        print(f"(first {columns} of {info.get('dim')} components; --columns N for more)")
    print(f"version {version}")


def _keys(raw: Sequence[str], as_int: bool) -> list[Any]:
    if not as_int:
        return list(raw)
    try:
        return [int(k) for k in raw]
    except ValueError as e:
        raise CliError(f"--int-keys: {e}") from None


def _format(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, list):
        return ",".join(repr(x) for x in v)
    return repr(v) if isinstance(v, float) else str(v)


def cmd_get(args: argparse.Namespace) -> int:
    grid = connect_from_args(args)
    keys = _keys(args.keys, args.int_keys)
    t = grid.table(args.table)
    reader = t.pin(args.version) if args.version else t
    values, found = reader.lookup(keys)
    missing = 0
    for k, v, f in zip(args.keys, values, found):
        if f:
            print(f"{k}\t{_format(v)}")
        else:
            missing += 1
            print(f"{k}\t(missing)")
    return 1 if missing else 0


def cmd_put(args: argparse.Namespace) -> int:
    import numpy as np

    grid = connect_from_args(args)
    t = grid.table(args.table)
    info = t.describe()
    vt = info.get("value_type")
    key = _keys([args.key], args.int_keys)[0]
    try:
        if vt == "f64":
            value: Any = np.array([float(args.value)])
        elif vt == "i64":
            value = np.array([int(args.value)], dtype=np.int64)
        elif vt == "f32vec":
            value = np.array([[float(x) for x in args.value.split(",")]], dtype=np.float32)
            if value.shape[1] != int(info.get("dim", 0)):
                raise CliError(f"table {args.table} holds vectors of {info.get('dim')} floats, got {value.shape[1]}")
        else:
            value = [args.value.encode()]
    except ValueError as e:
        raise CliError(f"value {args.value!r} does not fit a {vt} table: {e}") from None
    t.put_many([key], value)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    grid = connect_from_args(args)
    print(json.dumps(grid.stats(), indent=2, default=str))
    return 0


def cmd_bench(extra: Sequence[str]) -> int:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "native_batch.py"
    if not script.is_file():
        raise CliError(f"{script} not found: `ramgrid bench` runs from a source checkout of ramgrid")
    return subprocess.call([sys.executable, str(script), "--quick", *extra])


def cmd_demo(argv: Sequence[str]) -> int:
    """`ramgrid demo lm ...`: the reference experiment (score a corpus with a unigram model held in the grid)."""
    if not argv or argv[0] != "lm":
        raise CliError("usage: ramgrid demo lm [options]  (the only demo is `lm`)")
    from ramgrid.lm.__main__ import demo_main

    return int(demo_main(list(argv[1:])))


def cmd_serve(argv: Sequence[str]) -> int:
    from ramgrid._serve import main as serve_main

    os.environ.pop("RAMGRID_PARENT_PID", None)
    return serve_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # `serve` and `bench` hand every later argument to another parser, so argparse must not look at them.
    if args_list and args_list[0] == "serve":
        return cmd_serve(args_list[1:])
    if args_list and args_list[0] == "bench":
        return run_command(lambda: cmd_bench(args_list[1:]))
    if args_list and args_list[0] == "load":
        from ramgrid.load.command import load_main

        return load_main(args_list[1:])
    if args_list and args_list[0] == "mapreduce":
        from ramgrid.mapreduce.wordcount import mapreduce_main

        return mapreduce_main(args_list[1:])
    if args_list and args_list[0] == "demo":
        return run_command(lambda: cmd_demo(args_list[1:]))
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command == "serve":  # only reached when options came before `serve`
        parser.error("put `serve` first: ramgrid serve [server flags]")
    if args.command == "bench":
        parser.error("put `bench` first: ramgrid bench [benchmark flags]")
    handlers = {
        ("cluster", "up"): cmd_cluster_up,
        ("cluster", "down"): cmd_cluster_down,
        ("cluster", "status"): cmd_cluster_status,
        ("cluster", "add"): cmd_cluster_move,
        ("cluster", "remove"): cmd_cluster_move,
        ("cluster", "replace"): cmd_cluster_move,
        ("cluster", "recover"): cmd_cluster_recover,
    }
    action = str(getattr(args, "action", ""))
    if (args.command, action) in handlers:
        handler = handlers[(args.command, action)]
    else:
        handler = {"table": cmd_table, "get": cmd_get, "put": cmd_put, "stats": cmd_stats}[args.command]
    return run_command(lambda: handler(args))


if __name__ == "__main__":
    sys.exit(main())
