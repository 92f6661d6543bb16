"""The live dashboard (docs/dashboard.md) of a real 3-server local grid: its JSON API over plain HTTP, then the page
in a real headless Chromium driven by Selenium. The page finds the members and a table by name, its figures move
after traffic, a token keeps it shut until given, and a killed server shows down, then failed over.

A screenshot of the page is kept as a test artifact: `$RAMGRID_TEST_ARTIFACTS/dashboard.png`, by default
`out/test-artifacts/dashboard.png` (ignored by git). The browser tests are skipped only when Chromium, its driver
or Selenium is missing (`make setup` installs them)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "ramgrid._native", reason="ramgrid._native is not importable: build it with `maturin develop --release`"
)
import ramgrid
from _until import until

pytestmark = pytest.mark.timeout(90)

REPO_ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("RAMGRID_TEST_ARTIFACTS", REPO_ROOT / "out" / "test-artifacts"))
# Short enough for a fail-over within the test, long enough for a busy 2-core machine.
FAILOVER_ARGS = ["--failure-timeout-ms", "2000"]


def api(url: str, path: str, token: str | None = None) -> Any:
    """GET a dashboard document (`url` is `dashboard_url`, its fragment ignored)."""
    base = url.split("#")[0].rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/json"
        return json.loads(r.read())


def http_status(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def put_words(grid: ramgrid.LocalGrid, n: int) -> None:
    table = grid.table("words")
    table.put_many([f"w{i}".encode() for i in range(n)], [b"x" * 16] * n)
    table.get_many([f"w{i}".encode() for i in range(n + 10)], default=None)


# --- the JSON API, no browser -------------------------------------------------------------------------------------


def test_the_api_shows_the_whole_cluster_from_any_server() -> None:
    with ramgrid.local(servers=3, memory="64MiB") as grid:
        url = grid.dashboard_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        grid.create_table("words", partitions=8)
        put_words(grid, 100)
        # Every server answers for the whole cluster, not for itself.
        for sp in grid._servers:
            other = sp.dashboard_url()
            assert other is not None
            cluster = until(
                "three members up with a leader",
                lambda u=other: (
                    c
                    if (c := api(u, "/api/cluster"))["leader"] and [m["state"] for m in c["members"]] == ["up"] * 3
                    else None
                ),
            )
            assert [m["addr"] for m in cluster["members"]] == grid.addresses
            assert sum(m["self"] for m in cluster["members"]) == 1
            assert cluster["quorum"] == "ok"
            assert {m["role"] for m in cluster["members"]} <= {"leader", "voter", "learner"}
            words = until(
                "the table's items",
                lambda u=other: next((t for t in api(u, "/api/tables")["tables"] if t["items"] == 100), None),
            )
            assert words["name"] == "words" and words["current"] >= 1
            assert set(words["bytes_per_server"]) == set(grid.addresses)
        series = until("samples of every member", lambda: (s := api(url, "/api/series"))["t"] and s)
        assert set(series["servers"]) == set(grid.addresses)
        assert len(series["total"]["ops"]) == len(series["t"]) == len(series["total"]["p99_ms"])
        events = api(url, "/api/events")["events"]
        assert any(e["kind"] == "table" and "words" in e["text"] for e in events)
        # The same listener still serves Prometheus; other paths and methods are refused.
        assert http_status(url + "metrics")[0] == 200
        assert http_status(url + "nope")[0] == 404
        # Without a token, a page served under another name (DNS rebinding) is refused.
        assert http_status(url + "api/cluster", {"Host": f"evil.example:{url.split(':')[2].rstrip('/')}"})[0] == 403


def test_with_a_token_the_page_and_api_need_it() -> None:
    token = "dash-s3cret"
    with ramgrid.local(servers=1, memory="64MiB", token=token) as grid:
        url = grid.dashboard_url
        assert url is not None and url.endswith(f"#token={token}")
        base = url.split("#")[0]
        code, body = http_status(base)
        assert code == 401 and b'id="login"' in body and b"/api/cluster" not in body
        assert http_status(base + "api/cluster")[0] == 401
        assert http_status(base + "api/cluster", {"Authorization": "Bearer nope"})[0] == 401
        assert http_status(base, {"Authorization": f"Bearer {token}"})[0] == 200
        assert api(url, "/api/cluster", token)["members"][0]["state"] == "up"


def test_with_tls_the_dashboard_is_served_over_https(tmp_path: Path) -> None:
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "tls-test-certs.sh"), str(tmp_path)], check=True, timeout=60)
    flags = ["--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key")]
    with ramgrid.local(servers=1, memory="64MiB", extra_args=flags, tls=ramgrid.TLS(ca=tmp_path / "ca.pem")) as grid:
        url = grid.dashboard_url
        assert url is not None and url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with urllib.request.urlopen(url + "api/cluster", context=ctx, timeout=5) as r:
            assert json.loads(r.read())["members"][0]["state"] == "up"
        with urllib.request.urlopen(url + "metrics", context=ctx, timeout=5) as r:
            assert b"ramgrid_uptime_seconds" in r.read()
        # Plain HTTP gets no HTTP answer from a TLS listener (a TLS alert at most).
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen("http" + url.removeprefix("https") + "api/cluster", timeout=5)


_OFF_LOOPBACK = r"""
import json, subprocess, sys, time, urllib.error, urllib.request
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "10.9.9.1/32", "dev", "lo"], check=True)
def code(url, token=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
def serve(port, *flags):
    args = [sys.executable, "-m", "ramgrid._serve", "--listen", "127.0.0.1:0", "--threads", "1"]
    p = subprocess.Popen([*args, "--http", f"10.9.9.1:{port}", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    return p
out = {}
p = subprocess.run([sys.executable, "-m", "ramgrid._serve", "--http", "10.9.9.1:9100"], capture_output=True, timeout=30)
out["no_token"] = (p.returncode, p.stderr.decode())
p = serve(9101, "--token", "T")
u = "http://10.9.9.1:9101/"
out["token"] = [code(u + "metrics"), code(u + "metrics", "T"), code(u), code(u + "api/cluster", "T")]
p.terminate(); p.wait()
p = serve(9102, "--insecure-no-auth")
u = "http://10.9.9.1:9102/"
out["insecure"] = [code(u + "metrics"), code(u), code(u + "api/cluster")]
p.terminate(); p.wait()
print(json.dumps(out))
"""


def test_off_loopback_the_token_guards_the_page_and_the_metrics() -> None:
    """A listener on a non-loopback address, inside a network namespace of the test's own (so nothing is reachable
    from outside): refused without a token; with one, page, API and metrics need it; --insecure-no-auth opens the
    metrics and never the page."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs unshare and ip")
    if subprocess.run(["unshare", "-n", "true"], check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    run = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", _OFF_LOOPBACK], check=False, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["no_token"][0] != 0 and "without a token" in out["no_token"][1]
    assert out["token"] == [401, 200, 401, 200]
    assert out["insecure"] == [200, 403, 403]


# --- in a real browser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.skip("Chromium or chromedriver is not installed (make setup installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (make setup)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1500",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_bin))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, what: str, check: Callable[[Any], Any], timeout: float = 30.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check, f"timed out waiting for {what}")


def member_states(driver: Any) -> dict[str, str]:
    """{address: state} of the members table's rows (read in one script: the page redraws every second)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#members tbody tr')].map(r => [r.dataset.member, r.dataset.state])"
    )
    return {str(a): str(s) for a, s in rows}


def text_of(driver: Any, css: str) -> str:
    """The text of every element `css` selects, joined by newlines ("" when none)."""
    return str(
        driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim()).join('\\n')", css
        )
    )


def screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path)), "no screenshot"
    return path


def test_the_page_shows_members_tables_and_moving_figures(browser: Any) -> None:
    with ramgrid.local(servers=3, memory="64MiB") as grid:
        url = grid.dashboard_url
        assert url is not None
        grid.create_table("words", partitions=8)
        browser.get(url)
        states = wait_for(
            browser, "three members up", lambda d: (s := member_states(d)) and set(s.values()) == {"up"} and s
        )
        assert sorted(states) == sorted(grid.addresses)
        wait_for(browser, "the table by name", lambda d: text_of(d, 'tr[data-table="words"] .name') == "words")
        assert text_of(browser, 'tr[data-table="words"] .items') == "0"
        assert text_of(browser, "#leader") in grid.addresses
        keys_before = text_of(browser, "#keys")
        put_words(grid, 500)
        wait_for(browser, "the items to count the puts", lambda d: text_of(d, 'tr[data-table="words"] .items') == "500")
        wait_for(browser, "the keys served to move", lambda d: text_of(d, "#keys") not in ("", keys_before))
        wait_for(
            browser,
            "a chart line",
            lambda d: text_of(d, "#chart-ops svg") != "" and d.find_elements("css selector", "#chart-ops path"),
        )
        path = screenshot(browser, "dashboard.png")
        assert path.stat().st_size > 10_000


def test_the_page_needs_the_token(browser: Any) -> None:
    token = "dash-s3cret"
    with ramgrid.local(servers=3, memory="64MiB", token=token) as grid:
        url = grid.dashboard_url
        assert url is not None
        base = url.split("#")[0]
        browser.get(base)
        wait_for(browser, "the login form", lambda d: d.find_elements("id", "login"))
        assert member_states(browser) == {}
        browser.find_element("id", "token").send_keys("wrong")
        browser.find_element("css selector", "#login button").click()
        wait_for(browser, "the refusal", lambda d: text_of(d, "#error") == "wrong token")
        assert member_states(browser) == {}
        # The token in the URL's fragment opens the page, and is taken out of the address bar.
        browser.get(url)
        wait_for(browser, "three members", lambda d: len(member_states(d)) == 3)
        assert "token" not in browser.current_url
        browser.execute_script("sessionStorage.clear()")


def test_a_killed_server_shows_down_then_failed_over(browser: Any) -> None:
    with ramgrid.local(servers=3, memory="64MiB", extra_args=FAILOVER_ARGS) as grid:
        grid.create_table("words", partitions=8, replication=2)
        url = grid.dashboard_url
        assert url is not None and grid._servers[0].address in grid.addresses
        browser.get(url)
        wait_for(browser, "three members up", lambda d: list(member_states(d).values()) == ["up"] * 3)
        victim = grid.addresses[2]
        grid.kill(2)
        # Down as soon as the serving server's calls to it fail; failed over once the leader gives up on it.
        wait_for(browser, f"{victim} down", lambda d: member_states(d).get(victim) in ("down", "failed"))
        wait_for(browser, f"{victim} failed over", lambda d: member_states(d).get(victim) == "failed", timeout=45)
        for kind in ("down", "failover"):
            wait_for(
                browser, f"the {kind} event", lambda d, k=kind: victim in text_of(d, f'#events li[data-kind="{k}"]')
            )
        assert set(member_states(browser).values()) - {"failed"} == {"up"}
        screenshot(browser, "dashboard-failover.png")
