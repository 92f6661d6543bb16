"""Cluster specs and settings: parsing `host:port` lists and spec files, and resolving flags > environment > TOML file.

A cluster spec is the ordered list of server addresses; its order matters because every client and server derives
the same partition map from it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

SpecLike = Union[str, "os.PathLike[str]", Sequence[str]]

ENV_SPEC = "RAMGRID_SPEC"
ENV_TOKEN = "RAMGRID_TOKEN"
ENV_TLS_CA = "RAMGRID_TLS_CA"
ENV_TLS_CERT = "RAMGRID_TLS_CERT"
ENV_TLS_KEY = "RAMGRID_TLS_KEY"
ENV_CONFIG = "RAMGRID_CONFIG"
ENV_STATE_DIR = "RAMGRID_STATE_DIR"

__all__ = [
    "Settings",
    "default_config_paths",
    "default_state_dir",
    "load_config_file",
    "parse_address",
    "parse_spec",
    "read_spec_file",
    "resolve_settings",
]

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s\[\]:/,]+):(\d{1,5})$")


def parse_address(addr: str) -> str:
    """Checks one `host:port` (IPv6 as `[::1]:port`) and returns it stripped; raises ValueError saying what is wrong."""
    a = addr.strip()
    m = _HOST_PORT.match(a)
    if not m:
        raise ValueError(f"invalid server address {addr!r}: expected host:port, e.g. 127.0.0.1:11211")
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise ValueError(f"invalid port in server address {addr!r}: must be 1-65535")
    return a


def _check_list(addrs: Sequence[str], origin: str) -> list[str]:
    out = [parse_address(a) for a in addrs]
    if not out:
        raise ValueError(f"empty cluster spec ({origin}): name at least one host:port")
    seen: set[str] = set()
    for a in out:
        if a in seen:
            raise ValueError(f"server {a} appears twice in the cluster spec ({origin})")
        seen.add(a)
    return out


def read_spec_file(path: str | os.PathLike[str]) -> list[str]:
    """Reads a spec file: one `host:port` per line, in order; blank lines and `#` comments are ignored. A line may
    also read `server host:port` (the servers' canonical form, so one file serves servers and clients)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read cluster spec file {str(p)!r}: {e.strerror or e}") from e
    addrs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] in ("next", "token"):
            raise ValueError(
                f"{p}:{lineno}: a {words[0]!r} line is for servers' specs: a client's spec file lists the servers only"
            )
        if words[0] == "server" and len(words) == 2:
            line = words[1]
        try:
            addrs.append(parse_address(line))
        except ValueError as e:
            raise ValueError(f"{p}:{lineno}: {e}") from None
    return _check_list(addrs, f"file {p}")


def parse_spec(spec: SpecLike) -> list[str]:
    """Returns the ordered server list named by `spec`.

    `spec` is a list of `host:port`, a comma-separated string of them, or the path of a spec file (a string naming
    an existing file, or any os.PathLike).
    """
    if isinstance(spec, os.PathLike):
        return read_spec_file(spec)
    if isinstance(spec, str):
        s = spec.strip()
        if not s:
            raise ValueError("empty cluster spec: name at least one host:port")
        if os.path.isfile(s):
            return read_spec_file(s)
        parts = [p for p in (x.strip() for x in s.split(",")) if p]
        try:
            return _check_list(parts, "string")
        except ValueError:
            if "," not in s and ("/" in s or os.sep in s or not _HOST_PORT.match(s)):
                raise ValueError(
                    f"cluster spec {s!r} is neither host:port[,host:port...] nor an existing spec file"
                ) from None
            raise
    if isinstance(spec, (bytes, bytearray)):
        raise TypeError("cluster spec must be str, a path or a list of str, not bytes")
    return _check_list([str(a) for a in spec], "list")


def default_config_paths(cwd: Path | None = None, home: Path | None = None) -> list[Path]:
    """The TOML files looked for when no `--config` is given, first match wins."""
    cwd = Path.cwd() if cwd is None else cwd
    home = Path.home() if home is None else home
    return [cwd / "ramgrid.toml", home / ".config" / "ramgrid" / "config.toml"]


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where `ramgrid cluster up` keeps its state file: $RAMGRID_STATE_DIR, else $XDG_STATE_HOME/ramgrid, else
    ~/.local/state/ramgrid."""
    env = os.environ if env is None else env
    if env.get(ENV_STATE_DIR):
        return Path(env[ENV_STATE_DIR])
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ramgrid"


def _toml_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised only on 3.9/3.10
        import tomli as tomllib
    return tomllib.loads(text)


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a TOML settings file. Recognised keys: `spec` (list or comma string of host:port, or a spec file path),
    `token`, `timeout` (seconds), `ack`, `near_cache_bytes`, `state_dir`, `tls_ca`, `tls_cert`, `tls_key`. A
    `[ramgrid]` table may hold them too."""
    p = Path(path)
    try:
        data = _toml_loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read config file {str(p)!r}: {e.strerror or e}") from e
    except ValueError as e:  # tomllib.TOMLDecodeError is a ValueError
        raise ValueError(f"config file {p} is not valid TOML: {e}") from e
    if isinstance(data.get("ramgrid"), dict):
        data = {**{k: v for k, v in data.items() if k != "ramgrid"}, **data["ramgrid"]}
    known = {"spec", "token", "timeout", "ack", "near_cache_bytes", "state_dir", "tls_ca", "tls_cert", "tls_key"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"config file {p}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    spec = data.get("spec")
    if isinstance(spec, str) and not os.path.isabs(spec) and (p.parent / spec).is_file():
        # A relative spec file path in a config file is relative to that file, not to wherever the command runs.
        data["spec"] = str(p.parent / spec)
    return data


@dataclass
class Settings:
    """Resolved client settings, with where each came from (for `--verbose` output and error messages)."""

    spec: SpecLike | None = None
    token: str | None = None
    timeout: float = 5.0
    ack: str = "all"
    near_cache_bytes: int = 0
    state_dir: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    sources: dict[str, str] = field(default_factory=dict)


def resolve_settings(
    *,
    spec: str | None = None,
    token: str | None = None,
    timeout: float | None = None,
    config: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> Settings:
    """Resolves settings with precedence flags > environment > TOML file > defaults.

    The file is `config` if given (it must exist), else $RAMGRID_CONFIG, else the first of `default_config_paths()`
    that exists. Environment: RAMGRID_SPEC, RAMGRID_TOKEN, RAMGRID_TLS_CA, RAMGRID_TLS_CERT, RAMGRID_TLS_KEY.
    """
    env = os.environ if env is None else env
    file_data: dict[str, Any] = {}
    file_path: Path | None = None
    if config is not None:
        file_path = Path(config)
        if not file_path.is_file():
            raise ValueError(f"config file {config!r} does not exist")
    elif env.get(ENV_CONFIG):
        file_path = Path(env[ENV_CONFIG])
        if not file_path.is_file():
            raise ValueError(f"config file {str(file_path)!r} (from ${ENV_CONFIG}) does not exist")
    else:
        for cand in default_config_paths(cwd, home):
            if cand.is_file():
                file_path = cand
                break
    if file_path is not None:
        file_data = load_config_file(file_path)
    origin = f"file {file_path}" if file_path else "default"

    s = Settings()
    if spec is not None:
        s.spec, s.sources["spec"] = spec, "flag"
    elif env.get(ENV_SPEC):
        s.spec, s.sources["spec"] = env[ENV_SPEC], f"${ENV_SPEC}"
    elif file_data.get("spec") is not None:
        s.spec, s.sources["spec"] = file_data["spec"], origin
    if token is not None:
        s.token, s.sources["token"] = token, "flag"
    elif env.get(ENV_TOKEN):
        s.token, s.sources["token"] = env[ENV_TOKEN], f"${ENV_TOKEN}"
    elif file_data.get("token") is not None:
        s.token, s.sources["token"] = str(file_data["token"]), origin
    for name, flag, var in (
        ("tls_ca", tls_ca, ENV_TLS_CA),
        ("tls_cert", tls_cert, ENV_TLS_CERT),
        ("tls_key", tls_key, ENV_TLS_KEY),
    ):
        if flag is not None:
            setattr(s, name, flag)
            s.sources[name] = "flag"
        elif env.get(var):
            setattr(s, name, env[var])
            s.sources[name] = f"${var}"
        elif file_data.get(name) is not None:
            setattr(s, name, str(file_data[name]))
            s.sources[name] = origin
    if timeout is not None:
        s.timeout, s.sources["timeout"] = float(timeout), "flag"
    elif file_data.get("timeout") is not None:
        s.timeout, s.sources["timeout"] = float(file_data["timeout"]), origin
    if file_data.get("ack") is not None:
        s.ack, s.sources["ack"] = str(file_data["ack"]), origin
    if file_data.get("near_cache_bytes") is not None:
        s.near_cache_bytes, s.sources["near_cache_bytes"] = int(file_data["near_cache_bytes"]), origin
    if file_data.get("state_dir") is not None:
        s.state_dir, s.sources["state_dir"] = str(file_data["state_dir"]), origin
    return s
