"""Another Unix user, for tests of what a shared site's other users can and cannot do.

    from prefect_swarm.testing.users import NOBODY, as_user

    ok, value = as_user(NOBODY, lambda: Path("/scratch/swarms/prod/swarm.key").read_text())
    assert not ok and "PermissionError" in value      # she may not read the owner's key

:func:`as_user` runs a function in a forked child that dropped to the other user's uid and gid
(so this process must be root), and hands back what it returned or raised. A fork, not a new
interpreter: the other user need not be able to run this venv's Python (a pyenv under /root, say);
anything the function imports lazily must be importable by her or be imported before the call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

NOBODY = 65534
"""uid and gid of ``nobody``: the other user when none is named."""


def as_user(uid: int, fn: Callable[[], Any], gid: int | None = None) -> tuple[bool, Any]:
    """Run ``fn()`` as ``uid`` in a forked child: ``(True, its JSON-able result)``, or ``(False, "Type: message")``
    when it raised. Needs root."""
    if os.geteuid() != 0:
        raise PermissionError("as_user needs root (it drops a forked child to another uid)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the other user, run, report, and never return into the caller
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid if gid is None else gid)
            os.setuid(uid)
            payload = [True, fn()]
        except BaseException as exc:  # reported to the parent as its type and message
            payload = [False, f"{type(exc).__name__}: {exc}"]
        try:
            os.write(write, json.dumps(payload, default=str).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    ok, value = json.loads(data)
    return bool(ok), value
