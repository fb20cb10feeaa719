"""A lock on the head node so two operators cannot run `up`/`down`/`swap-drafter` at once.

``mkdir`` is atomic on every filesystem; the directory holds an ``owner`` file saying who holds it.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Iterator

from sparkserve import interrupts
from sparkserve.errors import RemoteFailure
from sparkserve.nodes.base import Node

LOCK_DIR = "/tmp/sparkserve.deploy.lock"  # one per machine: the head's
# Read at each call, on this machine: where the head's lock is instead. Only for rigs that pretend several
# machines on one host (tests/rig/supervise_stack.py: each local stack its own), where /tmp is shared.
LOCK_ENV = "SPARKSERVE_DEPLOY_LOCK"


def default_lock_dir() -> str:
    return os.environ.get(LOCK_ENV) or LOCK_DIR


def _owner() -> dict[str, object]:
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}


# mkdir (atomic) and the owner file in one round trip; the path is an argument, never shell text
_TAKE = 'mkdir -- "$1" || exit 3; cat > "$1/owner"'


def _stale(owner_json: str) -> bool:
    """The lock's owner ran on this machine and its process is gone."""
    try:
        o = json.loads(owner_json)
        if o.get("host") != socket.gethostname():
            return False
        os.kill(int(o["pid"]), 0)
    except ProcessLookupError:
        return True
    except (ValueError, TypeError, KeyError, PermissionError, OSError):
        return False
    return False


def acquire(node: Node, *, what: str, lock_dir: str | None = None, _retried: bool = False) -> None:
    """Take the lock on ``node`` for ``what`` (`up`, `down`); RemoteFailure naming who holds it when taken.
    A lock left by a run on this machine whose process is gone is taken over, with a warning."""
    lock_dir = lock_dir or default_lock_dir()
    owner = _owner() | {"what": what}
    res = node.run(["sh", "-c", _TAKE, "sparkserve-lock", lock_dir], stdin=json.dumps(owner).encode(),
                   check=False, step="lock", timeout=20)
    if res.exit_code not in (0, 3):
        node.run(["rm", "-rf", "--", lock_dir], check=False, step="lock", timeout=20)
        raise RemoteFailure(f"{node.name}: lock", f"cannot take {lock_dir}: {' '.join(res.tail(2))}",
                            node=node.name, step="lock")
    if res.exit_code == 3:
        holder = node.run(["cat", f"{lock_dir}/owner"], check=False, step="lock", timeout=20)
        if _stale(holder.stdout) and not _retried:
            # taken by a run on this very machine that no longer exists (killed -9): not a live operator
            print(f"warning: {node.name}: lock: {lock_dir} was left by a run on this machine that is gone "
                  f"(pid {json.loads(holder.stdout).get('pid')}); taking it over", file=sys.stderr)
            release(node, lock_dir=lock_dir)
            acquire(node, what=what, lock_dir=lock_dir, _retried=True)
            return
        try:
            o = json.loads(holder.stdout)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(o.get("since", 0))))
            who = f"{o.get('user')}@{o.get('host')} pid {o.get('pid')} since {since} ({o.get('what', '?')})"
        except (ValueError, TypeError):
            who = "an unknown holder"
        raise RemoteFailure(
            f"{node.name}: lock",
            f"another sparkserve run holds {lock_dir}: {who}; if that run is gone, use --break-lock",
            node=node.name,
            step="lock",
        )


def release(node: Node, *, lock_dir: str | None = None) -> None:
    """Give the lock back (whoever holds it: `--break-lock` uses this too)."""
    lock_dir = lock_dir or default_lock_dir()
    node.run(["rm", "-rf", "--", lock_dir], check=False, step="unlock", timeout=20)


@contextlib.contextmanager
def held(node: Node, *, what: str, break_lock: bool = False, lock_dir: str | None = None) -> Iterator[None]:
    """The lock, held for the ``with`` block; ``break_lock`` first removes a lock someone left behind."""
    lock_dir = lock_dir or default_lock_dir()
    if break_lock:
        release(node, lock_dir=lock_dir)
    try:
        acquire(node, what=what, lock_dir=lock_dir)
    except KeyboardInterrupt:
        # the mkdir may have run on the node before the interrupt reached us: a lock that is ours goes back
        with interrupts.deferred():
            _release_if_ours(node, lock_dir)
        raise
    try:
        yield
    finally:
        with interrupts.deferred():  # a signal now must not leave the lock held
            release(node, lock_dir=lock_dir)


def _release_if_ours(node: Node, lock_dir: str) -> None:
    """Give the lock back only when this very process took it (never someone else's)."""
    holder = node.run(["cat", f"{lock_dir}/owner"], check=False, step="unlock", timeout=20)
    try:
        o = json.loads(holder.stdout)
    except ValueError:
        return
    if isinstance(o, dict) and o.get("host") == socket.gethostname() and o.get("pid") == os.getpid():
        release(node, lock_dir=lock_dir)
