"""deploy/grafana/ramgrid.json against real servers: every metric (and label) that a panel's PromQL or a template
variable's query names is one a running 3-server grid exports on its `/metrics` endpoint.

The PromQL is read by a small tokenizer that knows the language's shape (strings, numbers and durations, selectors
`name{label op "value"}`, ranges `[5m]`, calls `f(...)`, grouping `by (...)`), so a metric name is an identifier
that is neither a function or aggregation (those are followed by `(`), nor a keyword, nor a label name inside `{}` or
a grouping clause. A histogram's `_bucket`, `_sum` and `_count` series are the histogram family's. Grafana's own
variables (`$__rate_interval`, `$job`...) are replaced before reading, and each must be a variable the dashboard
defines or a Grafana built-in.
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "ramgrid.json"

pytestmark = pytest.mark.timeout(120)

# PromQL (Prometheus 2.x and 3.x): functions, aggregation operators, keywords.
FUNCTIONS = frozenset(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max
    clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv
    double_exponential_smoothing exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
    histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase info irate label_join
    label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
    predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort
    sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time
    timestamp vector year""".split()  # noqa: SIM905 (a list literal would take 80 lines)
)
AGGREGATIONS = frozenset(
    "avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum topk".split()  # noqa: SIM905
)
BINARY_KEYWORDS = frozenset(("and", "or", "unless", "atan2", "bool", "offset"))
GROUPING = frozenset(("by", "without", "on", "ignoring", "group_left", "group_right"))
NUMBER_WORDS = frozenset(("inf", "nan"))
# Labels Prometheus attaches at scrape time; histograms' buckets carry `le`, which the exposition shows.
TARGET_LABELS = frozenset(("instance", "job"))
# Grafana's built-in variables, replaced by something of the same shape.
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h", "__interval_ms": "60000"}

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)
    |(?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?))
    |(?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}\[\]:@])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """An expression this reader cannot make sense of."""


@dataclass
class Names:
    """What one expression names: metric selectors (with the labels each matches on), and grouping labels."""

    selectors: list[tuple[str, list[str]]] = field(default_factory=list)
    grouping: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> set[str]:
        return {m for m, _ in self.selectors}


def tokenize(expr: str) -> list[tuple[str, str]]:
    """(kind, text) tokens; whitespace dropped. Raises PromQLError on a character no token starts with."""
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLError(f"unexpected {expr[pos : pos + 10]!r} at {pos} in {expr!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def names_in(expr: str) -> Names:
    """The metric names, selector labels and grouping labels of a PromQL expression. Raises PromQLError on
    unbalanced brackets, an unknown function, or a selector this reader does not follow."""
    toks = tokenize(expr)
    names = Names()
    stack: list[str] = []  # "(": expression, "call", "labels": a grouping list, "{": matchers, "[": range
    current: list[str] | None = None  # the label list of the selector being read
    pending_grouping = False
    closers = {")": ("(", "call", "labels"), "}": ("{",), "]": ("[",)}
    for i, (kind, text) in enumerate(toks):
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        ctx = stack[-1] if stack else ""
        if text in closers and kind == "op":
            if ctx not in closers[text]:
                raise PromQLError(f"unbalanced {text!r} in {expr!r}")
            stack.pop()
            if text == "}":
                current = None
            continue
        if kind == "op" and text == "(":
            stack.append("labels" if pending_grouping else "(")
            pending_grouping = False
            continue
        if kind == "op" and text == "[":
            stack.append("[")
            continue
        if kind == "op" and text == "{":
            prev = toks[i - 1] if i else ("", "")
            if prev[0] != "ident" or not names.selectors or names.selectors[-1][0] != prev[1]:
                raise PromQLError(f"a selector without a metric name in {expr!r}")
            current = names.selectors[-1][1]
            stack.append("{")
            continue
        if kind != "ident":
            continue
        if ctx == "{":
            if nxt not in ("=", "!=", "=~", "!~"):
                raise PromQLError(f"label {text!r} without a matcher in {expr!r}")
            assert current is not None
            current.append(text)
        elif ctx == "labels":
            names.grouping.append(text)
        elif ctx == "[":
            raise PromQLError(f"{text!r} inside a range in {expr!r}")
        elif text in GROUPING:
            if nxt == "(":
                pending_grouping = True
            elif text not in ("group_left", "group_right"):  # only these may stand without a label list
                raise PromQLError(f"{text!r} without its label list in {expr!r}")
        elif text in BINARY_KEYWORDS or text.lower() in NUMBER_WORDS:
            continue
        elif nxt == "(":
            if text not in FUNCTIONS and text not in AGGREGATIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
            stack.append("call")
            toks[i + 1] = ("call-open", "(")  # consumed here: the `(` opens the call
        elif text in AGGREGATIONS and nxt in ("by", "without"):
            continue
        else:
            names.selectors.append((text, []))
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {expr!r}")
    return names


def substitute(expr: str, variables: set[str]) -> str:
    """`expr` with Grafana's variables replaced: built-ins by a value of their shape, the dashboard's own by `.*`
    (they stand in regex matchers). Raises PromQLError for a variable the dashboard does not define."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in variables:
            raise PromQLError(f"undefined variable ${name} in {expr!r}")
        return ".*"

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", one, expr)


def label_values_query(query: str) -> str:
    """A template variable's query as a PromQL expression: `label_values(selector, label)` (Grafana's own syntax)
    as `count by (label) (selector)`, `query_result(expr)` as `expr`."""
    m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*", query)
    if m:
        return f"count by ({m.group(2)}) ({m.group(1)})"
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query)
    if m:
        return m.group(1)
    raise PromQLError(f"a variable query this test does not read: {query!r}")


def dashboard_queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target (rows' collapsed panels included) and every query variable."""
    variables = {v["name"] for v in dash["templating"]["list"]}

    def panels(ps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} target {t['refId']}", substitute(t["expr"], variables)
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            yield f"variable {v['name']!r}", substitute(label_values_query(q), variables)


_HISTOGRAM_SERIES = re.compile(r"(.*)_(bucket|sum|count)$")


@dataclass
class Exposition:
    """What the servers export: the metric families with their types (`# TYPE` lines), and per series name the
    label names its samples carry."""

    kinds: dict[str, str] = field(default_factory=dict)
    labels: dict[str, set[str]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                self.kinds[name] = kind
            elif line and not line.startswith("#"):
                m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
                assert m, f"unreadable sample line {line!r}"
                found = re.findall(r'([a-zA-Z_]\w*)="', m.group(2) or "")
                self.labels.setdefault(m.group(1), set()).update(found)

    def family(self, series: str) -> str | None:
        """The family a series name belongs to: itself, or the histogram it is a `_bucket`, `_sum` or `_count` of;
        None if the servers export no such series."""
        if self.kinds.get(series, "histogram") != "histogram":
            return series
        m = _HISTOGRAM_SERIES.fullmatch(series)
        if m and self.kinds.get(m.group(1)) == "histogram":
            return m.group(1)
        return None

    def problems(self, where: str, names: Names) -> list[str]:
        """What `names` asks for that these servers do not export."""
        out = []
        known = set(TARGET_LABELS)
        for metric, used in names.selectors:
            if self.family(metric) is None:
                hint = " (a histogram: use its _bucket, _sum or _count)" if metric in self.kinds else ""
                out.append(f"{where}: no server exports {metric}{hint}")
                continue
            # A family with no sample yet (a refusal reason not seen so far) shows no label names: its matchers
            # cannot be checked.
            have = self.labels.get(metric, set())
            known |= have
            for label in used if have else []:
                if label not in have | TARGET_LABELS:
                    out.append(f"{where}: {metric} has no label {label!r} (it has {sorted(have)})")
        for label in names.grouping:
            if label not in known:
                out.append(f"{where}: no metric of the expression has the label {label!r}")
        return out


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as f:
        dash: dict[str, Any] = json.load(f)
    return dash


# --- the reader itself (no server) -------------------------------------------------------------------------------


def test_reader_finds_metrics_not_functions_keywords_or_labels() -> None:
    n = names_in(
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{job=~".*",op="get"}[1m]))) '
        "/ on (instance) group_left sum without (op) (b_total offset 5m) > bool 0 and c unless sum(d) by (table)"
    )
    assert n.metrics == {"a_seconds_bucket", "b_total", "c", "d"}
    assert n.selectors[0] == ("a_seconds_bucket", ["job", "op"])
    assert n.grouping == ["instance", "le", "instance", "op", "table"]
    assert names_in("rate(x[5m:30s]) * -1e3 + Inf").metrics == {"x"}


@pytest.mark.parametrize(
    "expr",
    ["rate(x[1m]", "sum(x))", "rat(x[1m])", 'x{job="a"', "x[1m}", "x{job}", "sum by instance (x)", '{__name__="x"}'],
)
def test_reader_refuses_what_it_cannot_read(expr: str) -> None:
    with pytest.raises(PromQLError):
        names_in(expr)


def test_undefined_variable_is_refused() -> None:
    assert substitute('rate(x{a=~"$job"}[$__rate_interval])', {"job"}) == 'rate(x{a=~".*"}[1m])'
    with pytest.raises(PromQLError, match=r"\$nope"):
        substitute('x{a=~"${nope}"}', {"job"})


def test_checker_reports_a_metric_or_label_no_server_exports() -> None:
    e = Exposition()
    e.add(
        '# TYPE m_total counter\nm_total{op="get"} 1\n# TYPE h_seconds histogram\n'
        'h_seconds_bucket{le="+Inf"} 1\nh_seconds_sum 0.1\nh_seconds_count 1\n# TYPE r_total counter\n'
    )
    assert e.problems("q", names_in('sum by (op) (rate(m_total{op="get"}[1m])) + h_seconds_count + r_total')) == []
    assert e.problems("q", names_in("histogram_quantile(0.5, sum by (le) (rate(h_seconds_bucket[1m])))")) == []
    assert e.problems("q", names_in("rate(m_bogus_total[1m])")) == ["q: no server exports m_bogus_total"]
    assert e.problems("q", names_in("m_total_count")) == ["q: no server exports m_total_count"]
    assert e.problems("q", names_in("h_seconds")) == [
        "q: no server exports h_seconds (a histogram: use its _bucket, _sum or _count)"
    ]
    assert e.problems("q", names_in('m_total{table="t"}'))[0].startswith("q: m_total has no label 'table'")
    assert e.problems("q", names_in("sum by (reason) (m_total)")) == [
        "q: no metric of the expression has the label 'reason'"
    ]


# --- the dashboard -------------------------------------------------------------------------------------------------


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    """The shape Grafana's import needs: a uid, a Prometheus data source chosen by a variable, unique panel ids, every
    panel inside the 24-column grid, and the job, instance and table variables."""
    dash = load_dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int) and dash.get("id") is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance", "table"} <= set(variables)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for cell in itertools.product(range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])):
            assert cell not in taken, f"{p['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    # What issue 28 asks to see, per server and per table.
    exprs = " ".join(q for _, q in dashboard_queries(dash))
    for needed in (
        "histogram_quantile(0.99, sum by (instance, op, le) (rate(ramgrid_native_batch_seconds_bucket",
        "histogram_quantile(0.99, sum by (table, op, le) (rate(ramgrid_table_batch_seconds_bucket",
        "ramgrid_native_hits_total",
        "ramgrid_table_hits_total",
        "ramgrid_table_bytes",
        "ramgrid_meta_quorum",
        "ramgrid_meta_leader",
        "ramgrid_cluster_servers_failed",
        "ramgrid_replica_checks_total",
    ):
        assert needed in exprs, needed


def test_every_query_reads_and_every_variable_is_defined() -> None:
    queries = list(dashboard_queries(load_dashboard()))
    assert len(queries) > 40
    for where, expr in queries:
        assert names_in(expr).metrics, f"{where} names no metric: {expr}"


@pytest.fixture(scope="module")
def exposition() -> Exposition:
    """The union of what the three servers of a local grid serve at /metrics, after traffic on a table with two
    versions (so per-table series exist) and refused requests (so refusal reasons exist)."""
    pytest.importorskip("ramgrid._native", reason="ramgrid._native is not importable: build it with `make develop`")
    import ramgrid
    from ramgrid.exceptions import TableNotFound, VersionSealed

    e = Exposition()
    with ramgrid.local(servers=3, memory="64MiB", extra_args=["--metrics", "127.0.0.1:0"]) as grid:
        t = grid.create_table("grafana_watched", partitions=6, value_type="i64", replication=2)
        t.put_many([1000, 1001], [1, 2])  # into version 1, open since the create
        t.delete_many([1000, 5000])
        with t.new_version() as v:  # version 2, current once sealed
            v.put_many(list(range(100)), list(range(100)))
        t.get_many(list(range(150)), default=-1)
        with pytest.raises(VersionSealed):  # refused whole: a reason in the per-table refusals
            t.put_many([1], [1])
        with pytest.raises(TableNotFound):
            grid.table("grafana_absent").get(1)
        for i in range(3):
            m = re.search(r'server started .*metrics="([^"]+)"', grid.server_stderr(i))
            assert m, grid.server_stderr(i)[-2000:]
            with urllib.request.urlopen(f"http://{m.group(1)}/metrics", timeout=10) as r:
                e.add(r.read().decode())
    # The traffic made what the panels show: per-table series, a refusal reason, latency buckets.
    assert e.labels["ramgrid_table_items"] == {"table", "version"}
    assert e.labels["ramgrid_native_refused_total"] == {"reason"}
    assert e.labels["ramgrid_table_refused_total"] == {"table", "reason"}
    assert (
        e.kinds["ramgrid_table_batch_seconds"] == "histogram" and "le" in e.labels["ramgrid_table_batch_seconds_bucket"]
    )
    return e


def test_every_panel_names_a_metric_the_servers_export(exposition: Exposition) -> None:
    problems = []
    for where, expr in dashboard_queries(load_dashboard()):
        problems += exposition.problems(where, names_in(expr))
    assert problems == [], "\n".join(problems)


def test_the_dashboard_covers_every_metric_family(exposition: Exposition) -> None:
    """A series the servers add later should get a panel, or be named here as left out on purpose."""
    left_out: set[str] = set()
    used = set()
    for _, expr in dashboard_queries(load_dashboard()):
        used |= {exposition.family(m) for m in names_in(expr).metrics}
    missing = set(exposition.kinds) - used - left_out
    assert missing == set(), f"no panel of {DASHBOARD.name} shows {sorted(missing)}: add one, or list it in left_out"
