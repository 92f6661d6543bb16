"""Parallel loads of key -> value files (text/TSV/CSV, Parquet, directories of them) into a new version of a table.

    report = ramgrid.load.load_table(grid, "unigrams", "counts.tsv")          # or table.load("counts.tsv")
    print(report)   # rows, bytes, bad lines, version, seconds, rows/s

A load is cut into tasks: byte ranges of plain text files (each range owns the lines that start inside it), one task
per compressed file, one per Parquet row group. Tasks run on a local thread pool (the native calls and pyarrow's
parser release the GIL) or, given a Dask client, on its workers; each parses its part and writes batches into one
open version of the table, parsing its next piece on a helper thread while it writes the one before
(docs/loading.md). The version is sealed and made current only when every task succeeded: writes use ack="all", so
a batch that returned reached every replica of its partitions. On any failure the version is dropped
and the previous one stays current; a table the load itself created is dropped again.

A bad line stops the load with a `LoadError` (a ValueError) naming the file, line and reason, unless
`skip_bad_lines=True`, which skips and counts such lines. Line semantics for text files: lines end at "\\n" (a "\\r"
before it is dropped), blank lines are ignored, and the key is the text before the first delimiter and the value
the rest of the line, unless `key_column` / `value_column` pick fields (0-based) of a line split at every delimiter.
Keys are the raw bytes of the field (`key_type="int"` parses them as int64 keys); values are parsed as the table's
type (i64, f64) or kept as raw bytes. No quoting is interpreted.

Modules, by role: `parse` (text lines into keys and values, and the options a load parses with), `parquet` (row
groups into keys and values), `infer` (value and key types from the input), `task` (one task: read, parse, write
into the open version), `progress` (the progress line), `run` (the load: plan, open a version, run the tasks on an
engine, seal or drop; its report), `command` (`ramgrid load`).
"""

from __future__ import annotations

from ramgrid.exceptions import LoadError
from ramgrid.load.command import load_main
from ramgrid.load.infer import infer_value_type
from ramgrid.load.parse import _Options as _Options
from ramgrid.load.parse import _parse_fast as _parse_fast
from ramgrid.load.parse import _parse_slow as _parse_slow
from ramgrid.load.parse import _text_options as _text_options
from ramgrid.load.run import LoadReport, load_table, plan_tasks, table_load

__all__ = [
    "LoadError",
    "LoadReport",
    "infer_value_type",
    "load_main",
    "load_table",
    "plan_tasks",
    "table_load",
]
