"""Takes the dashboard screenshot the README shows (docs/dashboard.png): a 4-server local grid under a varying
read/write load for a while, one server killed part way (so the page shows a fail-over and its re-replication),
photographed by headless Chromium.

    .venv/bin/python scripts/dashboard_screenshot.py --out docs/dashboard.png --seconds 90
"""

from __future__ import annotations

import argparse
import math
import shutil
import threading
import time

import numpy as np
import ramgrid
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def load(grid: ramgrid.LocalGrid, stop: threading.Event) -> None:
    """Reads and writes at a rate that rises and falls, with some misses."""
    words, vectors = grid.table("words"), grid.table("embeddings")
    rng = np.random.default_rng(1)
    start = time.monotonic()
    while not stop.is_set():
        phase = (time.monotonic() - start) / 20.0
        keys = [f"w{i}".encode() for i in rng.integers(0, 12_000, 300)]
        try:
            words.get_many(keys, default=None)
            if rng.random() < 0.3:
                words.put_many(keys[:100], [b"v" * 24] * 100)
            ids = rng.integers(0, 3_000, 100).astype(np.int64)
            vectors.get_many(ids, default=None)
        except ramgrid.RamgridError:
            pass  # during the fail-over
        time.sleep(0.002 + 0.02 * (1 + math.sin(phase)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/dashboard.png")
    p.add_argument("--seconds", type=float, default=90.0)
    args = p.parse_args()
    with ramgrid.local(servers=4, memory="128MiB", extra_args=["--failure-timeout-ms", "3000"]) as grid:
        words = grid.create_table("words", partitions=16, replication=2)
        words.put_many([f"w{i}".encode() for i in range(10_000)], [b"v" * 24] * 10_000)
        vectors = grid.create_table("embeddings", partitions=16, replication=2, value_type="f64")
        vectors.put_many(np.arange(2_500, dtype=np.int64), np.arange(2_500, dtype=np.float64))
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1450"):
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
        stop = threading.Event()
        worker = threading.Thread(target=load, args=(grid, stop), daemon=True)
        try:
            url = grid.dashboard_url
            assert url is not None
            # Open from the start: a server samples its peers while someone watches.
            driver.get(url)
            worker.start()
            time.sleep(args.seconds * 0.7)
            grid.kill(3)
            time.sleep(args.seconds * 0.3)
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
            stop.set()
            if worker.is_alive():
                worker.join()
    crop(args.out)
    print(f"wrote {args.out}")


def crop(path: str) -> None:
    """Cuts the empty page below the last section."""
    image = Image.open(path).convert("RGB")
    pixels = np.asarray(image).astype(int)
    used = np.where((np.abs(pixels - pixels[-1, 5]).sum(axis=2) > 10).any(axis=1))[0]
    image.crop((0, 0, image.width, min(image.height, int(used.max()) + 20))).save(path, optimize=True)


if __name__ == "__main__":
    main()
