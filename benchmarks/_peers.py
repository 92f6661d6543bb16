"""The word-count benchmark's JVM peers: PySpark in local mode and Hadoop's LocalJobRunner.

Each runner takes the staged plain-text file, the bytes per task and the number of parallel workers, and returns
`(counts, phases)` like the other engines in wordcount.py, or raises `Skipped` with the reason when the engine is
not available (pyspark not importable; java, javac or mvn missing). Both tokenise as Python's `str.split()` does:
PySpark's map function is `str.split` itself; the Hadoop mapper (scripts/hadoop/WordCount.java) splits on an
explicit class of the characters Python's `str.isspace()` accepts, because Java's own whitespace tests differ from
Python's on U+001C..U+001F, U+0085, U+00A0, U+2007 and U+202F.

Neither time includes starting the engine (the SparkContext; the JVM and compiling WordCount.java), as the Dask and
ramgrid times exclude starting their clusters; Hadoop's time is its job from submission to completion, its output
written to files, and the phase "read output" is parsing those files into a dict here.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
import time
from operator import add
from pathlib import Path

HADOOP_HOME = Path(__file__).resolve().parents[1] / "scripts" / "hadoop"

# What Spark (and Hadoop's local job runner) need opened on Java 17 (reflection into java.base).
JAVA_OPENS = [
    f"--add-opens=java.base/{pkg}=ALL-UNNAMED"
    for pkg in ("java.lang", "java.lang.invoke", "java.util", "java.nio", "sun.nio.ch", "java.util.concurrent")
]


class Skipped(Exception):
    """The engine is not available here; the message says why."""


def spark_local(path: Path, chunk: int, procs: int) -> tuple[dict[str, int], dict[str, float]]:
    """The idiomatic RDD word count on `local[procs]`: textFile -> flatMap(split) -> map((w, 1)) ->
    reduceByKey(add) -> collect. textFile is asked for one partition per `chunk` bytes."""
    if importlib.util.find_spec("pyspark") is None:
        raise Skipped("pyspark is not installed")
    if shutil.which("java") is None:
        raise Skipped("pyspark is installed but java is missing")
    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark picks the host's address for its services
    conf = (
        SparkConf()
        .setMaster(f"local[{procs}]")
        .setAppName("ramgrid-wordcount-peer")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.driver.memory", "2g")
        .set("spark.driver.extraJavaOptions", " ".join(JAVA_OPENS))
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        parts = max(1, math.ceil(path.stat().st_size / chunk))
        t0 = time.perf_counter()
        counts = (
            sc.textFile(str(path), minPartitions=parts)
            .flatMap(str.split)  # the floor's tokeniser; a builtin, so workers need no module of ours
            .map(lambda w: (w, 1))
            .reduceByKey(add, numPartitions=procs)
            .collect()
        )
        t_job = time.perf_counter() - t0
        out = dict(counts)
        return out, {"job": t_job, "to dict": time.perf_counter() - t0 - t_job}
    finally:
        sc.stop()


def hadoop_jars(timeout: float = 600.0) -> Path:
    """scripts/hadoop/lib, fetched from Maven Central with scripts/hadoop/pom.xml if missing (whole or not at all)."""
    from ramgrid.fs.minihdfs import MiniHDFSError, ensure_jars

    try:
        return ensure_jars(HADOOP_HOME, timeout, marker="hadoop-mapreduce-client-common-*.jar")
    except MiniHDFSError as e:
        raise Skipped(str(e)) from e


def hadoop_local(path: Path, chunk: int, procs: int, work: Path) -> tuple[dict[str, int], dict[str, float]]:
    """Compiles scripts/hadoop/WordCount.java into `work` and runs it on the LocalJobRunner with `procs` map
    threads and `procs` reducers, splits of at most `chunk` bytes; parses its part-r-* files."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        raise Skipped("java and javac (17 or later) are needed")
    lib = hadoop_jars()
    classes = work / "hadoop-classes"
    classes.mkdir(parents=True, exist_ok=True)
    src = HADOOP_HOME / "WordCount.java"
    subprocess.run([javac, "-cp", f"{lib}/*", "-d", str(classes), str(src)], check=True, capture_output=True)
    out_dir = work / "hadoop-out"
    shutil.rmtree(out_dir, ignore_errors=True)
    log = work / "hadoop.log"
    cmd = [java, "-Xmx2g", *JAVA_OPENS, f"-Dhadoop.tmp.dir={work / 'hadoop-tmp'}", "-cp", f"{classes}:{lib}/*",
           "WordCount", str(path), str(out_dir), str(procs), str(chunk)]  # fmt: skip
    t0 = time.perf_counter()
    with open(log, "wb") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, check=False)
    t_proc = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"Hadoop word count failed (exit {proc.returncode}); log: {log}")
    t_job = float(proc.stdout.split()[-1])
    t1 = time.perf_counter()
    counts: dict[str, int] = {}
    for part in sorted(out_dir.glob("part-r-*")):
        for line in part.read_bytes().split(b"\n"):
            if line:
                word, _, n = line.rpartition(b"\t")
                counts[word.decode("utf-8")] = int(n)
    t_read = time.perf_counter() - t1
    return counts, {"job": t_job, "read output": t_read, "JVM start (not counted)": t_proc - t_job}
