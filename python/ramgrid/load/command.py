"""`ramgrid load TABLE PATH [options]`: the command's arguments, the load, and its report printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ramgrid import splits
from ramgrid._cmdline import CliError, add_address_options, connect_from_args, run_command
from ramgrid.exceptions import LoadError
from ramgrid.load.run import load_table


def _unescape(s: str) -> str:
    return {"\\t": "\t", "tab": "\t", "\\s": " ", "space": " "}.get(s, s)


def load_main(argv: Sequence[str]) -> int:
    """`ramgrid load TABLE PATH [options]`: the arguments after `load`. Prints the report; exit 0 when loaded, 1 on
    bad input or a grid error (nothing became visible), 2 on bad usage."""
    p = argparse.ArgumentParser(
        prog="ramgrid load",
        description="load a key -> value file or directory (text/TSV/CSV, Parquet) into a new version of a table",
    )
    add_address_options(p, top=True)
    p.add_argument("table")
    p.add_argument("path", help="a file or a directory of files")
    p.add_argument("--format", choices=splits.FORMATS, help="default: from the file names")
    p.add_argument("--type", dest="value_type", help="i64 | f64 | bytes (default: the table's, else inferred)")
    p.add_argument("--key-type", choices=("str", "int"), help="keys are strings (default for text) or int64")
    p.add_argument("--key-column", help="text: 0-based field index; Parquet: column name or index")
    p.add_argument("--value-column", help="text: 0-based field index; Parquet: column name or index")
    p.add_argument("--delimiter", help=r"field delimiter (default: tab, ',' for .csv; '\t' is understood)")
    p.add_argument("--header", action="store_true", help="skip each text file's first line")
    p.add_argument("--partitions", type=int, default=64, help="for a new table (default 64)")
    p.add_argument("--replication", type=int, default=1, help="for a new table (default 1)")
    p.add_argument("--no-create", action="store_true", help="fail if the table does not exist")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count bad lines instead of failing")
    p.add_argument("--workers", type=int, help="local loader threads (default: CPU count)")
    p.add_argument("--dask", metavar="SCHEDULER", help="run the tasks on this Dask scheduler's workers")
    p.add_argument("--chunk-mib", type=int, help="text MiB per task (default: 4 tasks a worker, 4-64 MiB each)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(list(argv))

    def column(v: str | None) -> Any:
        return int(v) if v is not None and v.lstrip("-").isdigit() else v

    def run() -> int:
        import json

        grid = connect_from_args(args)
        dask_client = None
        if args.dask:
            from distributed import Client

            dask_client = Client(args.dask)
        try:
            report = load_table(
                grid,
                args.table,
                args.path,
                format=args.format,
                value_type=args.value_type,
                key_type=args.key_type,
                key_column=column(args.key_column),
                value_column=column(args.value_column),
                delimiter=_unescape(args.delimiter) if args.delimiter is not None else None,
                header=args.header,
                partitions=args.partitions,
                replication=args.replication,
                create=not args.no_create,
                dask_client=dask_client,
                workers=args.workers,
                chunk_bytes=max(1, args.chunk_mib) << 20 if args.chunk_mib is not None else None,
                skip_bad_lines=args.skip_bad_lines,
                progress=not args.no_progress,
            )
        except LoadError as e:
            print(f"ramgrid: load failed, nothing loaded: {e}", file=sys.stderr)
            return 1
        except (ValueError, TypeError) as e:
            raise CliError(str(e)) from None
        finally:
            if dask_client is not None:
                dask_client.close()
        print(json.dumps(report.to_dict(), default=str) if args.json else report)
        for path, line, reason in report.bad_samples:
            print(f"  skipped {path}:{line}: {reason}", file=sys.stderr)
        return 0

    return run_command(run)
