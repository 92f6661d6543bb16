"""Starting one ramgrid server process with a data directory, for the benchmarks that time a restart
(recovery.py, log_durability.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from ramgrid._local import server_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    addr: str, data: Path, log: Path, table_memory: str, extra: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], float]:
    """Starts the server; returns it and the seconds until it printed its listening line."""
    args = [sys.executable, "-m", "ramgrid._serve", "--listen", addr, "--threads", "2"]
    args += ["--table-memory", table_memory, "--data-dir", str(data), *(extra or [])]
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    t0 = time.perf_counter()
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.Popen(
            args, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=server_env(None, parent_watch=False)
        )
    while b"listening on" not in out.read_bytes():
        if p.poll() is not None:
            raise RuntimeError(err.read_text())
        time.sleep(0.002)
    return p, time.perf_counter() - t0
