"""One way for a test to wait: on something the product writes (a state, a file, a status), never a sleep.

    st = wait_until("replica 0 healthy", lambda: swarm.status(), until=lambda st: st.healthy >= 1, timeout_s=30)

:func:`wait_until` calls ``look`` until what it returns passes ``until`` (truthy, by default) and
returns that; past ``timeout_s`` it fails with :class:`WaitTimedOut`, naming what it waited for and
what it saw last, so a lost race on a loaded machine is read from the failure, not rerun.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.2
"""How often :func:`wait_until` looks, by default."""


class WaitTimedOut(AssertionError):
    """What a test waited for did not come: the message names it and what was seen last."""


def wait_until(
    what: str,
    look: Callable[[], T],
    *,
    until: Callable[[T], object] = bool,
    timeout_s: float,
    poll_s: float = POLL_S,
) -> T:
    """Call ``look`` until its value passes ``until``; return that value. :class:`WaitTimedOut` after
    ``timeout_s`` seconds, with ``what`` and the last value seen (an exception ``look`` raised counts as
    one: it is seen, kept, and looked past). An AssertionError from ``look`` ends the wait at once: it
    is the test saying waiting longer is pointless (the process it waits on has exited).

    A test that reports how long the product took measures it around the call (``time.monotonic()``)."""
    deadline = time.monotonic() + timeout_s
    last: object = "nothing yet"
    while True:
        try:
            value = look()
        except AssertionError:
            raise
        except Exception as exc:  # the thing looked at is not there yet (a file, a server)
            last = exc
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() > deadline:
            raise WaitTimedOut(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {last!r}")
        time.sleep(poll_s)
