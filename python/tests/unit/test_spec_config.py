"""Cluster spec parsing and settings precedence (flags > environment > TOML file > defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ramgrid.config import default_state_dir, load_config_file, parse_address, parse_spec, resolve_settings

pytestmark = pytest.mark.timeout(10)


def test_list_string_and_file_specs_agree(tmp_path: Path) -> None:
    f = tmp_path / "cluster.spec"
    f.write_text("# servers in partition-map order\n127.0.0.1:7001\n\n  127.0.0.1:7002  # second\n")
    want = ["127.0.0.1:7001", "127.0.0.1:7002"]
    assert parse_spec(want) == want
    assert parse_spec("127.0.0.1:7001, 127.0.0.1:7002") == want
    assert parse_spec(str(f)) == want
    assert parse_spec(f) == want


def test_a_servers_spec_file_reads_the_same(tmp_path: Path) -> None:
    # The servers' canonical form (`server host:port`) and bare addresses mix; one file serves both sides.
    f = tmp_path / "spec"
    f.write_text("server 10.0.0.1:11211\n10.0.0.2:11211\n")
    assert parse_spec(str(f)) == ["10.0.0.1:11211", "10.0.0.2:11211"]
    f.write_text("server 10.0.0.1:11211\ntoken s3cret\n")
    with pytest.raises(ValueError, match=r"spec:2: a 'token' line is for servers"):
        parse_spec(str(f))


def test_order_is_kept() -> None:
    assert parse_spec("b:2,a:1") == ["b:2", "a:1"]


def test_ipv6_and_hostnames() -> None:
    assert parse_address("[::1]:7000") == "[::1]:7000"
    assert parse_address("node-3.example:11211") == "node-3.example:11211"


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:", ":80", "host:0", "host:70000", "a b:1", "host:port"])
def test_bad_addresses_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_address(bad)


def test_empty_and_duplicate_specs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_spec("")
    with pytest.raises(ValueError, match="empty"):
        parse_spec([])
    with pytest.raises(ValueError, match="twice"):
        parse_spec("a:1,b:2,a:1")
    empty = tmp_path / "empty.spec"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="empty"):
        parse_spec(str(empty))


def test_bad_line_in_spec_file_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "c.spec"
    f.write_text("127.0.0.1:1\nnot-an-address\n")
    with pytest.raises(ValueError, match=r"c\.spec:2"):
        parse_spec(str(f))


def test_missing_spec_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither"):
        parse_spec(str(tmp_path / "nope.spec"))
    with pytest.raises(ValueError, match="cannot read"):
        parse_spec(tmp_path / "nope.spec")


def _write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = _write(tmp_path / "ramgrid.toml", 'spec = ["f:1"]\ntoken = "file-token"\ntimeout = 2.5\n')
    env = {"RAMGRID_SPEC": "e:1", "RAMGRID_TOKEN": "env-token"}
    s = resolve_settings(spec="flag:1", token="flag-token", config=str(cfg), env=env)
    assert (s.spec, s.token, s.timeout) == ("flag:1", "flag-token", 2.5)
    assert s.sources["spec"] == "flag" and s.sources["timeout"].startswith("file")
    s = resolve_settings(config=str(cfg), env=env)
    assert (s.spec, s.token) == ("e:1", "env-token")
    s = resolve_settings(config=str(cfg), env={})
    assert (s.spec, s.token) == (["f:1"], "file-token")
    assert parse_spec(s.spec) == ["f:1"]


def test_default_files_cwd_before_home(tmp_path: Path) -> None:
    cwd, home = tmp_path / "work", tmp_path / "home"
    _write(home / ".config" / "ramgrid" / "config.toml", 'spec = "h:1"\n')
    cwd.mkdir()
    assert resolve_settings(env={}, cwd=cwd, home=home).spec == "h:1"
    _write(cwd / "ramgrid.toml", 'spec = "c:1"\n')
    assert resolve_settings(env={}, cwd=cwd, home=home).spec == "c:1"
    # RAMGRID_CONFIG beats the default locations.
    other = _write(tmp_path / "other.toml", 'spec = "o:1"\n')
    assert resolve_settings(env={"RAMGRID_CONFIG": str(other)}, cwd=cwd, home=home).spec == "o:1"


def test_no_settings_anywhere_gives_defaults(tmp_path: Path) -> None:
    s = resolve_settings(env={}, cwd=tmp_path, home=tmp_path)
    assert s.spec is None and s.token is None and s.timeout == 5.0 and s.ack == "all"


def test_config_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_settings(config=str(tmp_path / "missing.toml"), env={})
    bad = _write(tmp_path / "bad.toml", "spec = [\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config_file(bad)
    typo = _write(tmp_path / "typo.toml", 'spek = "a:1"\n')
    with pytest.raises(ValueError, match="unknown key.*spek"):
        load_config_file(typo)


def test_relative_spec_file_in_config_is_relative_to_config(tmp_path: Path) -> None:
    _write(tmp_path / "conf" / "servers.spec", "127.0.0.1:9\n")
    cfg = _write(tmp_path / "conf" / "ramgrid.toml", '[ramgrid]\nspec = "servers.spec"\n')
    assert parse_spec(load_config_file(cfg)["spec"]) == ["127.0.0.1:9"]


def test_state_dir_env_and_xdg(tmp_path: Path) -> None:
    assert default_state_dir({"RAMGRID_STATE_DIR": str(tmp_path)}) == tmp_path
    assert default_state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "ramgrid"
