"""What every `ramgrid` command shares: the cluster-address options, connecting from them, and the exit statuses.

`ramgrid.cli` (the command), `ramgrid.load.command` (`ramgrid load`) and `ramgrid.mapreduce.wordcount`
(`ramgrid mapreduce`) build on this module, so that none of them imports another's command: `cli` is the top of the
package and nothing imports it.

The cluster address comes from `--spec`, else $RAMGRID_SPEC, else a TOML file (`--config`, $RAMGRID_CONFIG,
./ramgrid.toml, ~/.config/ramgrid/config.toml), else the cluster started by `ramgrid cluster up` (its state file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ramgrid.config import default_state_dir, resolve_settings
from ramgrid.exceptions import RamgridError

# Where `ramgrid cluster up` records the servers it started (in its state directory).
STATE_FILE = "cluster.json"


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def add_address_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """Adds the cluster-address options to `parser`: a command's own (`top`) or a subcommand's."""
    # The same options are accepted before and after the subcommand; SUPPRESS keeps a subcommand's unset option
    # from overwriting one given before it.
    d = None if top else argparse.SUPPRESS
    g = parser.add_argument_group("cluster address")
    g.add_argument("--spec", default=d, help="servers: host:port[,host:port...] or a spec file (env RAMGRID_SPEC)")
    g.add_argument("--token", default=d, help="auth token (env RAMGRID_TOKEN)")
    g.add_argument("--tls-ca", default=d, help="connect over TLS, trusting this CA file (env RAMGRID_TLS_CA)")
    g.add_argument("--tls-cert", default=d, help="TLS client certificate file (env RAMGRID_TLS_CERT)")
    g.add_argument("--tls-key", default=d, help="key of --tls-cert (env RAMGRID_TLS_KEY)")
    g.add_argument(
        "--config", default=d, help="TOML settings file (default ./ramgrid.toml, ~/.config/ramgrid/config.toml)"
    )
    g.add_argument("--timeout", type=float, default=d, help="seconds per request (default 5)")
    g.add_argument("--state-dir", default=d, help="where `cluster up` keeps its state (env RAMGRID_STATE_DIR)")


def state_dir_for(args: argparse.Namespace, file_state_dir: str | None = None) -> Path:
    """The directory of `cluster up`'s state: --state-dir, else the settings file's, else the default."""
    if getattr(args, "state_dir", None):
        return Path(args.state_dir)
    if file_state_dir:
        return Path(file_state_dir)
    return default_state_dir()


def read_state(path: Path) -> dict[str, Any]:
    """The state file `cluster up` wrote (its servers' pids and addresses)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read cluster state {path}: {e}") from None


def connect_from_args(args: argparse.Namespace) -> Any:
    """A `Grid` on the cluster the address options name (see the module); CliError when none is named."""
    import ramgrid

    try:
        s = resolve_settings(
            spec=args.spec,
            token=args.token,
            timeout=args.timeout,
            config=args.config,
            tls_ca=getattr(args, "tls_ca", None),
            tls_cert=getattr(args, "tls_cert", None),
            tls_key=getattr(args, "tls_key", None),
        )
        tls = None
        if s.tls_ca is not None:
            tls = ramgrid.TLS(ca=s.tls_ca, cert=s.tls_cert, key=s.tls_key)
        elif s.tls_cert is not None or s.tls_key is not None:
            raise ValueError("--tls-cert and --tls-key need --tls-ca (the CA that signed the servers' certificates)")
    except ValueError as e:
        raise CliError(str(e)) from None
    spec = s.spec
    if spec is None:
        state_path = state_dir_for(args, s.state_dir) / STATE_FILE
        if state_path.is_file():
            spec = read_state(state_path)["addresses"]
        else:
            raise CliError(
                "no cluster given: pass --spec HOST:PORT[,...], set RAMGRID_SPEC, write ramgrid.toml, "
                "or start one with `ramgrid cluster up`"
            )
    try:
        return ramgrid.connect(
            spec, token=s.token, timeout=s.timeout, ack=s.ack, near_cache_bytes=s.near_cache_bytes, tls=tls
        )
    except ValueError as e:
        raise CliError(str(e)) from None


def run_command(fn: Any) -> int:
    """Runs a command's body and returns its exit status: its own, 2 for a CliError (bad usage) or a missing
    optional package, 1 for a grid error, 130 for Ctrl-C. Errors are printed on one line, without a traceback."""
    try:
        return int(fn())
    except CliError as e:
        print(f"ramgrid: {e}", file=sys.stderr)
        return 2
    except RamgridError as e:
        print(f"ramgrid: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"ramgrid: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
