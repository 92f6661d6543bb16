"""Per-table figures from a server's METRICS text (the Prometheus exposition that `--metrics` serves too).

Only the `ramgrid_table_*` series are read; the parser knows the exposition format 0.0.4 as the server writes it
(one sample per line, `name{label="value",...} number`), not every variant Prometheus accepts.
"""

from __future__ import annotations

import re
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_PREFIX = "ramgrid_table_"
# Counters whose sample is one number per table.
_COUNTERS = ("gets", "hits", "misses", "puts", "put_failures", "deletes", "delete_hits", "scan_pages")


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the exposition: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def table_figures(text: str) -> dict[str, dict[str, Any]]:
    """{table: figures} on one server: "items" (of the current version), "bytes" (all versions), "versions",
    "current_version", "by_version" {number: {"items", "bytes"}}, the key counters "gets", "hits", "misses",
    "puts", "put_failures", "deletes", "delete_hits", "scan_pages" (SCAN pages served), "batches" {op: n}, "refused" {reason: n} and
    "batch_seconds" {op: {"count", "sum"}}."""
    tables: dict[str, dict[str, Any]] = {}

    def t(name: str) -> dict[str, Any]:
        return tables.setdefault(
            name, {"by_version": {}, "batches": {}, "refused": {}, "batch_seconds": {}, "versions": 0}
        )

    for name, labels, value in samples(text):
        if not name.startswith(_PREFIX) or "table" not in labels:
            continue
        fig, table = name[len(_PREFIX) :], t(labels["table"])
        if fig in ("items", "bytes"):
            table["by_version"].setdefault(int(labels["version"]), {})[fig] = int(value)
        elif fig in ("versions", "current_version"):
            table[fig] = int(value)
        elif fig.endswith("_total") and fig[: -len("_total")] in _COUNTERS:
            table[fig[: -len("_total")]] = int(value)
        elif fig == "batches_total":
            table["batches"][labels["op"]] = int(value)
        elif fig == "refused_total":
            table["refused"][labels["reason"]] = int(value)
        elif fig in ("batch_seconds_count", "batch_seconds_sum"):
            key = fig[len("batch_seconds_") :]
            table["batch_seconds"].setdefault(labels["op"], {})[key] = value if key == "sum" else int(value)
    for table in tables.values():
        by_version = table["by_version"]
        current = by_version.get(table.get("current_version", 0), {})
        table["items"] = current.get("items", 0)
        table["bytes"] = sum(v.get("bytes", 0) for v in by_version.values())
    return tables
