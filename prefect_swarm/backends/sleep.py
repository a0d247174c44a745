"""Replicas that sleep and wake (vLLM's sleep mode): the one path every backend that reaches its
replicas' own ports takes (local, Slurm).

    sleep i:  replica-<i>.asleep written (JSON: url, level, since)
              -> the backend takes replica i out of rotation (``leave``: local, the replica list jobs
                 and targets.json read; Slurm, its task stops publishing the head file and the LB's
                 reconciler drops it from nginx) and it keeps its allocation
              -> requests in flight finish (up to ``SLEEP_DRAIN_S``; what is still running then is
                 aborted by the engine with a 503, which a job retries on another replica)
              -> ``POST /sleep?level=L`` -> ``GET /is_sleeping`` says true
    wake i:   level 1: ``POST /wake_up``
              level 2 (the weights were discarded; vLLM's sleep-mode docs): ``POST /wake_up?tags=weights``
                 (memory reallocated) -> ``POST /collective_rpc {"method": "reload_weights"}`` (loaded
                 again from the model's files) -> ``POST /wake_up?tags=kv_cache`` -> ``POST
                 /reset_prefix_cache`` (no cached block of the old KV cache is reused)
              -> ``GET /is_sleeping`` says false -> one real chat completion
              -> the marker is removed -> the backend puts it back in rotation (``rejoin``)

The marker is written before the engine is asked to sleep and removed only after the engine has
answered again, so no client is ever sent to an engine that is asleep. vLLM serves these routes only
with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (``engine.sleep_mode`` sets both); each
step of a wake is safe to repeat, so a wake that failed half way is finished by the next ``wake``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prefect_swarm.exceptions import BackendError, ConfigError, ReadinessError
from prefect_swarm.interfaces.capabilities import Capabilities, Capability
from prefect_swarm.interfaces.metrics import RUNNING, WAITING, parse, total
from prefect_swarm.interfaces.readiness import check_answer, http_client
from prefect_swarm.interfaces.types import ServingHandle, SleepReport
from prefect_swarm.paths import atomic_write_json, read_json

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths

SLEEP_DRAIN_S = 30.0
"""Seconds requests in flight at a replica that left rotation get to finish before it sleeps."""
WAKE_TIMEOUT_S = 300.0
"""Seconds a replica may take from ``/wake_up`` to its first answer (a level-2 wake reloads weights)."""
_POLL_S = 0.2
WAKE_STEPS: dict[int, tuple[tuple[str, dict[str, Any] | None], ...]] = {
    1: (("/wake_up", None),),
    2: (
        ("/wake_up?tags=weights", None),
        ("/collective_rpc", {"method": "reload_weights"}),
        ("/wake_up?tags=kv_cache", None),
        ("/reset_prefix_cache", None),
    ),
}
"""Sleep level -> the engine calls (route, JSON body) that wake a replica slept at that level."""
_ASLEEP = re.compile(r"^replica-(\d+)\.asleep$")


def asleep(paths: SwarmPaths) -> dict[int, dict[str, Any]]:
    """Replica index -> its sleep record (url, level, since), for every replica asleep or going to sleep."""
    out = {}
    for path in paths.root.glob("replica-*.asleep"):
        m = _ASLEEP.match(path.name)
        record = read_json(path) if m else None
        if m and isinstance(record, dict):
            out[int(m.group(1))] = record
    return out


def asleep_urls(paths: SwarmPaths) -> set[str]:
    """Base URLs of the replicas out of rotation because they sleep."""
    return {str(r.get("url")) for r in asleep(paths).values() if r.get("url")}


def require_sleep_mode(cfg: SwarmConfig) -> None:
    """ConfigError unless the swarm was brought up with ``engine.sleep_mode``."""
    if not cfg.engine.sleep_mode:
        raise ConfigError(
            f"swarm '{cfg.name}' runs without engine.sleep_mode, so its engines cannot sleep. Set "
            "engine.sleep_mode: true and bring it up again (`prefect-swarm up`)."
        )


def check_indices(cfg: SwarmConfig, replicas: Sequence[int] | None) -> list[int]:
    """The replicas asked for (all when None or empty), each checked against the swarm's replica count."""
    picked = sorted(set(replicas or range(cfg.replicas)))
    bad = [i for i in picked if not 0 <= i < cfg.replicas]
    if bad:
        raise ConfigError(
            f"replica {bad[0]} is not one of swarm '{cfg.name}' (it has replicas 0..{cfg.replicas - 1}). "
            "Pass --replica with an index in that range."
        )
    return picked


@dataclass
class Sleeper:
    """Sleeps and wakes replicas of one swarm; the backend says where each listens and how it leaves
    and rejoins rotation."""

    cfg: SwarmConfig
    paths: SwarmPaths
    key: str | None
    url_of: Callable[[int], str | None]
    """Where replica i's engine listens now (None: it is not running)."""
    leave: Callable[[int, str], None]
    """Take replica i (at url) out of rotation; returns once no new request is routed to it."""
    rejoin: Callable[[int], None]
    """Put replica i back in rotation (its marker is gone)."""
    drain_s: float = SLEEP_DRAIN_S

    def sleep(self, indices: Sequence[int], level: int = 1) -> list[SleepReport]:
        """Sleep each replica (see the module doc); one that sleeps already is reported as it is."""
        require_sleep_mode(self.cfg)
        if level not in (1, 2):
            raise ConfigError(f"sleep level {level} is not valid: 1 keeps the weights in CPU memory, 2 discards them.")
        return [self._sleep_one(i, level) for i in check_indices(self.cfg, indices)]

    def wake(self, indices: Sequence[int]) -> list[SleepReport]:
        """Wake each sleeping replica (see the module doc); one that is awake is reported as it is."""
        require_sleep_mode(self.cfg)
        return [self._wake_one(i) for i in check_indices(self.cfg, indices)]

    def _sleep_one(self, i: int, level: int) -> SleepReport:
        t0 = time.monotonic()
        record = asleep(self.paths).get(i)
        if record is not None:  # asleep already (at the level it went to sleep with)
            return SleepReport(i, str(record["url"]), True, 0.0, record.get("level"))
        url = self.url_of(i)
        if url is None:
            raise ReadinessError(
                f"replica {i} of swarm '{self.cfg.name}' is not running, so it cannot be put to sleep.",
                hint=f"`prefect-swarm status {self.cfg.name}` tells why.",
            )
        atomic_write_json(self.paths.replica_asleep(i), {"url": url, "level": level, "since": time.time()})
        try:
            self.leave(i, url)
            self._drain(url)
            self._post(url, f"/sleep?level={level}")
        except BaseException:  # the engine did not go to sleep: it goes back in rotation
            self.paths.replica_asleep(i).unlink(missing_ok=True)
            self.rejoin(i)
            raise
        self._until(url, sleeping=True, timeout_s=WAKE_TIMEOUT_S)
        return SleepReport(i, url, True, time.monotonic() - t0, level)

    def _wake_one(self, i: int) -> SleepReport:
        t0 = time.monotonic()
        record = asleep(self.paths).get(i)
        if record is None:
            return SleepReport(i, self.url_of(i) or "", False, 0.0)
        url = str(record["url"])
        for route, body in WAKE_STEPS[2 if record.get("level") == 2 else 1]:
            self._post(url, route, body)
        self._until(url, sleeping=False, timeout_s=WAKE_TIMEOUT_S)
        answer = check_answer(url, self.cfg.model_name, self.key, timeout_s=WAKE_TIMEOUT_S)
        if not answer.ok:
            raise ReadinessError(
                f"replica {i} of swarm '{self.cfg.name}' woke but does not answer: {answer.detail}. It stays out "
                "of rotation.",
                hint=f"read its log (`prefect-swarm logs {self.cfg.name} --replica {i}`), then wake it again.",
            )
        self.paths.replica_asleep(i).unlink(missing_ok=True)
        self.rejoin(i)
        return SleepReport(i, url, False, time.monotonic() - t0, record.get("level"))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def _post(self, url: str, route: str, body: dict[str, Any] | None = None) -> None:
        import httpx

        try:
            resp = http_client().post(url + route, json=body, headers=self._headers(), timeout=WAKE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {url}{route} failed: {exc}.", hint="is the replica running?") from exc
        if resp.status_code != 200:
            raise BackendError(
                f"POST {url}{route} answered HTTP {resp.status_code}: {resp.text[:200]}",
                hint="vLLM serves it only with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 "
                "(engine.sleep_mode sets both; a 'command' engine must serve it itself).",
            )

    def _sleeping(self, url: str) -> bool | None:
        import httpx

        try:
            resp = http_client().get(url + "/is_sleeping", headers=self._headers(), timeout=5)
            return bool(json.loads(resp.content)["is_sleeping"]) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _until(self, url: str, *, sleeping: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (seen := self._sleeping(url)) is not sleeping:
            if time.monotonic() > deadline:
                raise ReadinessError(
                    f"{url}/is_sleeping did not say {str(sleeping).lower()} within {timeout_s:g}s (last: {seen}).",
                    hint="read the replica's log.",
                )
            time.sleep(_POLL_S)

    def _in_flight(self, url: str) -> float | None:
        """Requests running or waiting at the engine (its ``/metrics``); None when it does not tell."""
        import httpx

        try:
            resp = http_client().get(url + "/metrics", headers=self._headers(), timeout=5)
            samples = parse(resp.text) if resp.status_code == 200 else {}
        except httpx.HTTPError:
            return None
        running, waiting = total(samples, RUNNING), total(samples, WAITING)
        return None if running is None or waiting is None else running + waiting

    def _drain(self, url: str) -> None:
        """Wait (up to ``drain_s``) for the requests in flight to finish; an engine without metrics gets a moment."""
        deadline = time.monotonic() + self.drain_s
        while (n := self._in_flight(url)) is None or n > 0:
            if n is None or time.monotonic() > deadline:
                return
            time.sleep(_POLL_S)


__all__ = ["SLEEP_DRAIN_S", "WAKE_STEPS", "Sleeper", "asleep", "asleep_urls", "check_indices", "require_sleep_mode"]


class _Declares(Protocol):
    def capabilities(self) -> Capabilities: ...


class SleepRefused:
    """``sleep``/``wake`` of a backend that lacks :attr:`Capability.SLEEP_WAKE`: each refuses with the
    reason its own ``capabilities()`` gives (ConfigError) and calls nothing."""

    def sleep(
        self: _Declares, handle: ServingHandle, replicas: Sequence[int] = (), level: int = 1
    ) -> list[SleepReport]:
        """Refused: ConfigError with the reason the backend lacks :attr:`Capability.SLEEP_WAKE`."""
        del handle, replicas, level
        self.capabilities().require(Capability.SLEEP_WAKE, "`prefect-swarm sleep`")
        return []  # pragma: no cover - require raised

    def wake(self: _Declares, handle: ServingHandle, replicas: Sequence[int] = ()) -> list[SleepReport]:
        """Refused, as :meth:`sleep`."""
        del handle, replicas
        self.capabilities().require(Capability.SLEEP_WAKE, "`prefect-swarm wake`")
        return []  # pragma: no cover - require raised
