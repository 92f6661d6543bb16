"""Entry point of a server process: `python -m ramgrid._serve [ramgrid-server flags]`.

Used by `ramgrid.local()` and `ramgrid cluster up`. When RAMGRID_PARENT_PID is set (by `ramgrid.local()`), a watchdog
thread stops the server once that parent is gone, so a killed owner leaves no orphan servers behind.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

PARENT_PID_ENV = "RAMGRID_PARENT_PID"
_POLL_S = 0.25
_GRACE_S = 5.0


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    # Reparented: the owner died without stopping us. Ask the server to shut down cleanly, then make sure.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(_GRACE_S)
    os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent:
        if int(parent) != os.getppid():
            print(f"ramgrid._serve: owner process {parent} is already gone; not starting", file=sys.stderr)
            return 1
        threading.Thread(target=_watch_parent, args=(int(parent),), name="ramgrid-parent-watch", daemon=True).start()
    from ramgrid import _native
    from ramgrid.exceptions import RamgridError

    try:
        _native.run_server(args)
    except (ValueError, OSError, RamgridError) as e:
        print(f"ramgrid-server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
