"""Hadoop's MiniDFSCluster (a real NameNode and DataNode in one JVM) on loopback, for tests, the demo and benchmarks.

    with MiniHDFS() as hdfs:
        fs = fsspec.filesystem("webhdfs", host="127.0.0.1", port=hdfs.webhdfs_port, user="ramgrid")

The jars come from Maven Central through `scripts/hdfs/pom.xml` (`make hdfs-jars`, run here if they are
missing) into `scripts/hdfs/lib`; `RAMGRID_HDFS_HOME` points elsewhere. Java 17 and Maven are needed. The JVM's
standard input is a pipe from this process, so the cluster stops when this process exits, even if killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

# What WebHDFS and the DataNode need opened on Java 17 (reflection into java.base).
JAVA_OPENS = [
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
]


class MiniHDFSError(RuntimeError):
    """The MiniDFSCluster could not be fetched or started."""


def hdfs_home() -> Path:
    """The folder with pom.xml, MiniHdfs.java and lib/ (the jars)."""
    env = os.environ.get("RAMGRID_HDFS_HOME")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "scripts" / "hdfs"


def ensure_jars(home: Path | None = None, timeout: float = 600.0, marker: str = "hadoop-hdfs-*-tests.jar") -> Path:
    """Fetches the runtime dependencies of `home`/pom.xml (default: this module's HDFS folder) into `home`/lib with
    Maven if no jar there matches `marker`; returns the lib folder. Also used for the benchmarks' Hadoop jars."""
    home = home or hdfs_home()
    lib = home / "lib"
    if lib.is_dir() and any(lib.glob(marker)):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MiniHDFSError("Maven (mvn) is needed to fetch Hadoop's jars: apt-get install maven")
    tmp = home / "lib.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise MiniHDFSError(
            f"fetching Hadoop's jars failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)  # whole or not at all: a half-fetched lib/ is never taken for a complete one
    return lib


class MiniHDFS:
    """A running MiniDFSCluster. `webhdfs_port`, `url` ("webhdfs://127.0.0.1:port"), `close()`."""

    def __init__(self, start_timeout: float = 120.0, base_dir: str | None = None) -> None:
        java = shutil.which("java")
        if java is None:
            raise MiniHDFSError("Java (17 or later) is needed for the MiniDFSCluster")
        home = hdfs_home()
        lib = ensure_jars(home)
        self._tmp = None if base_dir else tempfile.mkdtemp(prefix="ramgrid-minihdfs-")
        base = base_dir or self._tmp
        assert base is not None
        self._log = open(Path(base).parent / f"{Path(base).name}.log", "wb")  # noqa: SIM115 (closed in close())
        cmd = [java, "-Xmx512m", *JAVA_OPENS, "-cp", f"{lib}/*", str(home / "MiniHdfs.java"), str(Path(base) / "dfs")]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        assert self._proc.stdout is not None
        ports = self._read_ports(self._proc.stdout, start_timeout)
        self.webhdfs_port: int = int(ports["webhdfs"])
        self.rpc_port: int = int(ports["rpc"])
        self.host = "127.0.0.1"

    def _read_ports(self, out: IO[bytes], timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reader() -> None:
            for line in out:
                if line.startswith(b"MINIHDFS "):
                    found.update(json.loads(line[len(b"MINIHDFS ") :]))
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout)
        if not found:
            self.close()
            raise MiniHDFSError(f"MiniDFSCluster did not start within {timeout:.0f} s; log: {self._log.name}")
        return found

    @property
    def url(self) -> str:
        return f"webhdfs://{self.host}:{self.webhdfs_port}"

    def filesystem(self, **kwargs: Any) -> Any:
        """A fresh (not instance-cached) fsspec WebHDFS file system on this cluster."""
        import fsspec

        kwargs.setdefault("user", "ramgrid")
        return fsspec.filesystem("webhdfs", host=self.host, port=self.webhdfs_port, skip_instance_cache=True, **kwargs)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # MiniHdfs shuts the cluster down when its stdin closes
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            Path(f"{self._tmp}.log").unlink(missing_ok=True)

    def __enter__(self) -> MiniHDFS:  # noqa: PYI034 (not subclassed)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MiniHDFS({self.url})"


def main() -> None:
    """`python -m ramgrid.fs.minihdfs`: start a cluster, print its URL, run until Ctrl-C."""
    with MiniHDFS() as hdfs:
        print(hdfs.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
