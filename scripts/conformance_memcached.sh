#!/usr/bin/env bash
# Runs the conformance transcripts (all but the ramgrid-only ones) against a real memcached started here,
# to prove that our expected bytes are memcached's bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
memcached -l 127.0.0.1 -p "$port" -U 0 -t 2 -m 64 -I 1m -u "$(id -un)" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
MEMCACHED_ADDR=127.0.0.1:$port cargo test -q -p ramgrid-server --test conformance -- memcached_agrees --exact
