"""`python -m kiln ...` is the `kiln` command line, run in this process by the native library
(`kiln build`, `kiln run`, `kiln target`, `kiln devices`, ...: the same program)."""

import json
import os
import signal
import sys
import threading

from . import _native


def main(argv=None) -> int:
    """Runs `kiln <argv>` and returns its exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    # As the `kiln` binary does: output into a closed pipe (`python -m kiln devices | head`)
    # ends the process quietly (Python starts with SIGPIPE ignored).
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # `kiln tune` measures in a worker process started as `<this program> tune-worker`: this
    # program is Python.
    os.environ.setdefault("KILN_TUNE_WORKER", json.dumps([sys.executable, "-m", "kiln"]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C as in the `kiln` binary: the default action (the process ends), except where a
    # command handles it (`kiln tune` stops its search after the candidate being measured and
    # keeps what it found; a second Ctrl-C ends it). Python's own handler would only raise
    # KeyboardInterrupt once the command has returned.
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return int(_native.lib().cli(json.dumps(args)))
    finally:
        if restore is not None:
            signal.signal(signal.SIGINT, restore)


def console() -> None:
    """The `kiln` console script that `pip install` writes: the same command line."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
