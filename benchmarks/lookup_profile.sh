#!/usr/bin/env bash
# Profiles ramgrid-server under a multi-get load (perf record with DWARF call graphs) and writes a
# summary of where its CPU goes: the flat top of `perf report` (self time per symbol) and the
# callers' tree of the hottest paths. The raw perf.data (~250 MB) is deleted unless KEEP_PERF_DATA=1.
#
#   bash benchmarks/lookup_profile.sh OUT.txt [ramgrid-bench workload flags...]
#   bash benchmarks/lookup_profile.sh benchmarks/results/lookup_profile_after.txt \
#       --workload multiget --keys-per-get 100
#
# Needs perf, and the release binaries (cargo build --release -p ramgrid-server -p ramgrid-bench).
# Environment: KEYS (default 1000000), SECONDS_PROFILED (default 5), THREADS (server, default 2),
# CARGO_TARGET (default target/release), SERVER (the ramgrid-server to profile; default the one
# in CARGO_TARGET: another build, for a before/after with the same load generator).
set -euo pipefail

out=${1:?usage: lookup_profile.sh OUT.txt [workload flags]}
shift
flags=("$@")
if [ ${#flags[@]} -eq 0 ]; then
    flags=(--workload multiget --keys-per-get 100)
fi
keys=${KEYS:-1000000}
secs=${SECONDS_PROFILED:-5}
threads=${THREADS:-2}
bin=${CARGO_TARGET:-target/release}
work=$(mktemp -d /tmp/lookup_profile.XXXXXX)
server_pid=""
bench_pid=""
cleanup() {
    [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null || true
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${KEEP_PERF_DATA:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
# Groups `perf report --sort symbol` lines ("  12.34%  [.] name") into what the lookup path spends.
CLASSIFY='
import re, sys
groups = [
    ("cache lookup: prefetch stages, shard locks, inlined lookup (get_each, get_values, prefetch_*)",
     r"Cache::get_many|Cache::get_each|Cache::prefetch|lookup_hashed|Cache::get_with|Cache::lookup|dispatch::get_values"),
    ("meta mg execution (flags, inlined lookup and reply)", r"meta::meta_get|write_mg_hit"),
    ("probe and key compare (index find, memcmp)", r"ShardInner::find|memcmp|index::|Index::|bcmp"),
    ("native: table lookup (partition get_packed, table and version lookup)", r"tables::|partition::"),
    ("native: frame decoding and key-group iteration", r"native::data::|KeyGroupIter|KeyBatch|FlatMap|native::wire"),
    ("hashing", r"hash_one|foldhash|Hasher"),
    ("request parsing", r"memchr|parse|Tokens|meta_flags|MetaFlags"),
    ("reply composition (copy, number formatting)", r"push_u64|memmove|memcpy|write_value|write_meta|GetReplyWriter|fill_packed"),
    ("allocation", r"malloc|free|realloc|_int_|alloc::|cfree"),
    ("kernel: syscalls, TCP, scheduling", r"^\[k\]"),
]
tot = {g: 0.0 for g, _ in groups}
other = 0.0
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
    if not m:
        continue
    pct, name = float(m.group(1)), m.group(2).strip()
    for g, rx in groups:
        if re.search(rx, name):
            tot[g] += pct
            break
    else:
        other += pct
for g, _ in groups:
    print(f"  {tot[g]:6.2f}%  {g}")
print(f"  {other:6.2f}%  everything else (tokio runtime, connection loop, libc, ...)")
'
# perf's report without its comment lines, blank lines and the padding of empty columns.
tidy() { grep -v '^#' | grep -v '^$' | sed -e 's/[ -]*$//'; }

server=${SERVER:-$bin/ramgrid-server}
"$server" --listen 127.0.0.1:0 --threads "$threads" --memory 1024MiB \
    >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
for _ in $(seq 100); do
    grep -q "listening on" "$work/server.out" 2>/dev/null && break
    sleep 0.1
done
addr=$(sed -n 's/^ramgrid-server listening on //p' "$work/server.out")
[ -n "$addr" ] || { echo "server did not start" >&2; exit 1; }

common=(--server "$addr" --key-count "$keys" --key-size 14 --value-size 8 --connections 50)
"$bin/ramgrid-bench" "${common[@]}" --workload load >/dev/null
"$bin/ramgrid-bench" "${common[@]}" "${flags[@]}" --warmup 1 --duration $((secs + 3)) \
    --server-pid "$server_pid" >"$work/bench.txt" &
bench_pid=$!
sleep 1.5
perf record -q -F 1999 --call-graph dwarf,16384 -p "$server_pid" -o "$work/perf.data" \
    -- sleep "$secs" 2>"$work/perf.err"
wait "$bench_pid"
bench_pid=""

{
    echo "# ramgrid-server CPU profile under: ramgrid-bench ${flags[*]}"
    echo "# command: bash benchmarks/lookup_profile.sh $out ${flags[*]}"
    echo "# server: $server${SERVER:+ (SERVER=$SERVER)}"
    echo "# $(date -u +%FT%TZ); commit $(git rev-parse --short HEAD); $(nproc) CPUs; server --threads $threads;" \
        "$keys keys x 14 B, 8 B values, 50 connections"
    echo "# perf record -F 1999 --call-graph dwarf,16384 -p SERVER -- sleep $secs"
    echo "# load generator over the whole run (profiling costs the server some throughput):"
    sed 's/^/#   /' "$work/bench.txt"
    echo
    echo "## Where the time goes (self time of every symbol, grouped by name; [k] = kernel)"
    perf report -i "$work/perf.data" --stdio --no-children --sort symbol -g none 2>/dev/null | tidy \
        | python3 -c "$CLASSIFY"
    echo
    echo "## Self time per source line (perf report --sort srcline, top 16; raw_mutex.rs = shard locks)"
    perf report -i "$work/perf.data" --stdio --no-children --sort srcline -g none --percent-limit 0.5 \
        2>/dev/null | tidy | head -16
    echo
    echo "## Self time per symbol (perf report --no-children --sort symbol, top 45)"
    perf report -i "$work/perf.data" --stdio --no-children --sort symbol -g none --percent-limit 0.4 \
        2>/dev/null | tidy | head -45
    echo
    echo "## Self time per shared object (perf report --sort dso)"
    perf report -i "$work/perf.data" --stdio --no-children --sort dso -g none 2>/dev/null | tidy | head -8
    echo
    echo "## Inclusive time (perf report --children --sort symbol, top 40, callers folded)"
    perf report -i "$work/perf.data" --stdio --children --sort symbol -g none --percent-limit 2 \
        2>/dev/null | tidy | grep -v ' (inlined)$' | head -40
} >"$out"
echo "wrote $out${KEEP_PERF_DATA:+ (perf.data in $work)}" >&2
