"""The `sparkserve` command. Commands live in sparkserve/commands/*, each a thin Typer wrapper.

Command modules are imported lazily: `sparkserve --help` (and a mistyped command) imports none of them, and
`sparkserve status` imports only sparkserve.commands.deploy. Which module registers which top-level command,
and its one-line help, is read from the modules' source (:mod:`sparkserve.commands._index`, cached), so a
command a module's ``register(app)`` adds appears here without editing this file.
"""

from __future__ import annotations

import gc
import io
import json
import sys
from typing import TextIO

from sparkserve import interrupts
from sparkserve.commands.app import INTERRUPTED_EXIT, app
from sparkserve.commands.jsonschema import JSON_SCHEMA
from sparkserve.errors import SparkserveError


def main() -> None:
    # SIGTERM (CI timeouts, systemd) and SIGHUP (a dropped SSH session) must clean up exactly as Ctrl-C does
    interrupts.install()
    watched = _Watched(sys.stdout) if "--json" in sys.argv[1:] else None
    if watched is not None:
        sys.stdout = watched
    try:
        app()
    except SparkserveError as e:  # expected failures: one line, no traceback
        _report(e, watched)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # an interrupt outside Typer's own call (its KeyboardInterrupt: below)
        _interrupted()
    except SystemExit as e:
        if e.code == 130 and interrupts.signal_name():  # Typer turns a KeyboardInterrupt into a silent exit 130
            _interrupted()
        raise
    finally:
        if watched is not None:
            sys.stdout = watched.inner
        # what the command built stays as it is until exit: the collector need not walk it once more on
        # the way out (~80 ms after a big `up` or a log read)
        gc.freeze()


class _Watched(io.TextIOBase):
    """stdout, noting whether anything was written to it (so an error after a --json document adds none)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.written = False

    def write(self, s: str) -> int:
        if s:
            self.written = True
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.inner.encoding


def _report(e: SparkserveError, watched: _Watched | None) -> None:
    """The one `error:` line on stderr; with --json and nothing on stdout yet, also one JSON document there
    (so `--json` output is always one JSON document, the error inside it)."""
    print(e.line(), file=sys.stderr)
    for d in e.details:
        print(f"  {d}", file=sys.stderr)
    if watched is not None and not watched.written:
        doc = {"schema": JSON_SCHEMA, "ok": False,
               "error": {"where": e.where, "what": e.what, "exit_code": e.exit_code, "details": e.details}}
        watched.write(json.dumps(doc, indent=2) + "\n")
        watched.flush()


def _interrupted() -> None:
    print(f"error: interrupted ({interrupts.signal_name() or 'SIGINT'})", file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT)
