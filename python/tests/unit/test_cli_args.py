"""The `ramgrid` command's argument handling and where it finds the cluster (no servers involved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ramgrid import _cmdline, cli

pytestmark = pytest.mark.timeout(10)


def _grid_for(argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]) -> list[str]:
    for k in ("RAMGRID_SPEC", "RAMGRID_TOKEN", "RAMGRID_CONFIG", "RAMGRID_STATE_DIR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = cli.build_parser().parse_args(argv)
    return _cmdline.connect_from_args(args).servers


def test_options_before_or_after_the_subcommand() -> None:
    p = cli.build_parser()
    a = p.parse_args(["--spec", "a:1", "get", "t", "k"])
    b = p.parse_args(["get", "t", "k", "--spec", "a:1"])
    assert a.spec == b.spec == "a:1" and a.keys == b.keys == ["k"]


def test_flag_beats_env_beats_file_beats_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / cli.STATE_FILE).write_text(json.dumps({"pids": [], "addresses": ["s:1"]}))
    env = {"RAMGRID_STATE_DIR": str(state)}
    assert _grid_for(["stats"], monkeypatch, tmp_path, env) == ["s:1"]
    (tmp_path / "ramgrid.toml").write_text('spec = "f:1"\n')
    assert _grid_for(["stats"], monkeypatch, tmp_path, env) == ["f:1"]
    assert _grid_for(["stats"], monkeypatch, tmp_path, {**env, "RAMGRID_SPEC": "e:1"}) == ["e:1"]
    assert _grid_for(["--spec", "x:1", "stats"], monkeypatch, tmp_path, {**env, "RAMGRID_SPEC": "e:1"}) == ["x:1"]


def test_no_cluster_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAMGRID_SPEC", raising=False)
    monkeypatch.delenv("RAMGRID_CONFIG", raising=False)
    monkeypatch.setenv("RAMGRID_STATE_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["table", "list"]) == 2
    assert "cluster up" in capsys.readouterr().err


def test_bad_spec_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--spec", "nonsense", "stats"]) == 2
    assert "neither" in capsys.readouterr().err


def test_status_and_down_without_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAMGRID_STATE_DIR", str(tmp_path))
    assert cli.main(["cluster", "status"]) == 1
    assert cli.main(["cluster", "down"]) == 0


def test_pid_check_refuses_foreign_processes() -> None:
    import os

    assert not cli._pid_is_server(os.getpid())  # pytest is alive but is not a ramgrid server
    assert not cli._pid_is_server(2**22 + 12345)
