"""Local serving: each replica is an engine process on this machine, each under its own watchdog.

    <swarm>/watchdog-<i>.json   spec the watchdog runs from (no secrets)
    <swarm>/watchdog-<i>.pid    {"pid", "create_time"} of the watchdog (identity-checked)
    <swarm>/replica-<i>.status.json / .log   written by the watchdog

Replica ``i`` listens on ``cfg.port + i``. There is no load balancer: the handle lists every
replica URL (``meta["replica_urls"]``) and the job runner spreads requests over them. The API key
reaches replicas only through the watchdog's environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.common import tail_file
from prefect_swarm.backends.engine import engine_launch, engine_secret_env
from prefect_swarm.backends.local.processes import spawn, stop
from prefect_swarm.backends.sleep import Sleeper, asleep
from prefect_swarm.config import LocalConfig
from prefect_swarm.config.cost import held_gpu_hours
from prefect_swarm.exceptions import BackendError, ConfigError, ReadinessError
from prefect_swarm.interfaces import Capabilities, Capability, ServingHandle
from prefect_swarm.interfaces.metrics import MetricsTargets, engine_targets, read_file_sd, write_file_sd
from prefect_swarm.interfaces.readiness import ProbeResult, check_answer, check_health
from prefect_swarm.interfaces.types import ReplicaHealth, ReplicaStatus, ServingPhase, ServingStatus, SleepReport
from prefect_swarm.interfaces.usage import GpuUsage
from prefect_swarm.paths import atomic_write_json, read_json, read_tail
from prefect_swarm.sidecar.procref import ProcRef
from prefect_swarm.sidecar.stage import StageError, stage
from prefect_swarm.sidecar.watchdog import WatchdogSpec

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths

STOP_GRACE_S = 10.0
"""Seconds a replica gets to exit after SIGTERM before SIGKILL (the watchdog's, and delete's)."""

STALE_AFTER_S = 30.0
"""A status file not rewritten for this long (plus a few health intervals) is not trusted."""

_WILDCARD = {"0.0.0.0", "::", ""}


class LocalServing:
    """ServingBackend for replicas on this machine."""

    backend = "local"

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths) -> None:
        self.cfg = cfg
        self.paths = paths

    @property
    def local(self) -> LocalConfig:
        """The local backend section of the config."""
        return _local(self.cfg)

    def validate(self, cfg: SwarmConfig, *, ask: bool = True) -> list[str]:
        """``backend.gpus`` covers every replica, and the engine can take the API key without exposing
        it; no warnings (everything is checked here)."""
        local = _local(cfg)
        need = cfg.replicas * cfg.gpus_per_replica
        if local.gpus is not None and need > len(local.gpus):
            raise ConfigError(
                f"backend.gpus lists {len(local.gpus)} GPU(s) but replicas x gpus_per_replica = {need}. "
                "List more GPUs, or lower replicas or gpus_per_replica."
            )
        engine_launch(cfg, host=local.host, port=cfg.port)
        return []

    def plan(self) -> dict[str, str]:
        """The watchdog spec of each replica (its engine command, URL and environment; no secrets)."""
        specs = {self.paths.watchdog_spec(i).name: self._spec(i).to_dict() for i in range(self.cfg.replicas)}
        return {name: json.dumps(spec, indent=2, sort_keys=True) + "\n" for name, spec in specs.items()}

    def capabilities(self) -> Capabilities:
        """Watchdog, wall time and detached jobs; one machine, no LB, no preemption, no containers."""
        return Capabilities.all_but(
            "local",
            {
                Capability.MULTI_NODE: "every replica runs on this machine",
                Capability.LOAD_BALANCER: "no proxy: clients spread requests over meta['replica_urls']",
                Capability.PREEMPTION_SIGNAL: "nothing preempts local processes",
                Capability.CONTAINERS: "replicas run as host processes (the slurm backend runs containers)",
            },
        )

    # ------------------------------------------------------------------ addresses
    def replica_url(self, i: int) -> str:
        """Base URL of replica ``i`` (a wildcard listen address is reached over loopback)."""
        host = self.local.host
        host = "127.0.0.1" if host in _WILDCARD else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.cfg.port + i}"

    def _urls(self, handle: ServingHandle) -> list[str]:
        urls = handle.meta.get("replica_urls")
        return list(urls) if urls else [self.replica_url(i) for i in range(self.cfg.replicas)]

    # ------------------------------------------------------------------ create
    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Start a watchdog per replica; live replicas with an unchanged spec are left alone."""
        self.validate(cfg)
        self.cfg = cfg
        launch = engine_launch(cfg, host=self.local.host, port=cfg.port)
        self.paths.ensure()
        self.paths.stopped.unlink(missing_ok=True)  # brought up again: a budget stop is over
        plan = [(self._spec(i), self._watchdog(i)) for i in range(cfg.replicas)]
        stale = [
            spec
            for spec, ref in plan
            if ref is None or read_json(self.paths.watchdog_spec(spec.index)) != spec.to_dict()
        ]
        for spec in stale:
            self._stop_index(spec.index)
        for spec in stale:  # every port is checked before anything starts
            self._check_port(cfg.port + spec.index)
        if stale and cfg.stage_source and cfg.staged_model:  # the engines load the staged copy
            try:
                stage(Path(cfg.stage_source), Path(cfg.staged_model))
            except StageError as exc:
                raise BackendError(str(exc), hint="fix stage.from (or model), or remove `stage`.") from exc
        refs = {spec.index: ref for spec, ref in plan if ref is not None}
        started: list[ProcRef] = []
        try:
            for spec in stale:
                refs[spec.index] = self._launch(spec, launch.secret_env)
                started.append(refs[spec.index])
        except BaseException:
            stop(started, grace_s=STOP_GRACE_S + 5)  # leave no half-launched replica behind
            raise
        self._stop_extra(cfg.replicas)
        urls = [self.replica_url(i) for i in range(cfg.replicas)]
        self._write_targets()
        return ServingHandle(
            name=cfg.name,
            backend=self.backend,
            url=urls[0],
            meta={
                "replica_urls": urls,
                "watchdogs": [{"index": i, **refs[i].to_dict()} for i in sorted(refs)],
                "root": str(self.paths.root),
            },
        )

    def _write_targets(self) -> None:
        """targets.json <- every replica but those asleep: the list running jobs and `top` follow."""
        out = asleep(self.paths)
        awake = [(i, self.replica_url(i).split("://", 1)[1]) for i in range(self.cfg.replicas) if i not in out]
        write_file_sd(self.paths.metrics_targets, engine_targets(self.cfg.name, awake))

    def _replica_env(self, i: int) -> dict[str, str]:
        launch = engine_launch(self.cfg, host=self.local.host, port=self.cfg.port + i)
        env = dict(launch.env)
        gpus, per = self.local.gpus, self.cfg.gpus_per_replica
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * per : (i + 1) * per])
        return env

    def _spec(self, i: int) -> WatchdogSpec:
        loc, eng = self.local, self.cfg.engine
        launch = engine_launch(self.cfg, host=loc.host, port=self.cfg.port + i)
        return WatchdogSpec(
            swarm=self.cfg.name,
            root=str(self.paths.root),
            index=i,
            argv=launch.argv,
            url=self.replica_url(i),
            env=self._replica_env(i),
            health_path=eng.health_path,
            health_interval_s=loc.health_interval_s,
            startup_grace_s=loc.startup_grace_s,
            startup_timeout_s=eng.startup_timeout_s,
            max_restarts=loc.max_restarts,
            restart_backoff_s=loc.restart_backoff_s,
            wall_time_s=loc.wall_time_s,
            stop_grace_s=STOP_GRACE_S,
            budget=self.cfg.backend.cost.model_dump() if self.cfg.backend.cost.capped else None,
            gpus=max(self.cfg.gpus_per_replica, 0),
        )

    def _launch(self, spec: WatchdogSpec, secret_env: dict[str, str]) -> ProcRef:
        i = spec.index
        self.paths.replica_status(i).unlink(missing_ok=True)
        self.paths.replica_asleep(i).unlink(missing_ok=True)  # a fresh engine is awake
        atomic_write_json(self.paths.watchdog_spec(i), spec.to_dict())
        argv = [
            sys.executable,
            "-m",
            "prefect_swarm.sidecar.watchdog",
            "--spec",
            str(self.paths.watchdog_spec(i)),
        ]
        ref = spawn(argv, {**os.environ, **secret_env}, self.paths.watchdog_log(i), self.paths.root)
        atomic_write_json(self.paths.watchdog_pid(i), ref.to_dict())
        return ref

    def _check_port(self, port: int) -> None:
        host = self.local.host
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise BackendError(
                    f"port {port} on {host} is taken, so replica {port - self.cfg.port} of swarm "
                    f"'{self.cfg.name}' cannot listen there ({exc.strerror}).",
                    hint=f"set `port:` to a base with {self.cfg.replicas} free ports, or free port {port}.",
                ) from exc

    # ------------------------------------------------------------------ processes
    def _watchdog(self, i: int) -> ProcRef | None:
        """The live watchdog of replica ``i``, or None."""
        ref = ProcRef.from_dict(read_json(self.paths.watchdog_pid(i)))
        return ref if ref is not None and ref.alive() else None

    def _replica_ref(self, i: int) -> ProcRef | None:
        data = read_json(self.paths.replica_status(i)) or {}
        return ProcRef.from_dict(
            {"pid": data.get("pid"), "create_time": data.get("pid_create_time"), "boot_time": data.get("pid_boot_time")}
        )

    def _indices(self, handle: ServingHandle | None = None) -> list[int]:
        """Every replica index with files or a record: the config's, the handle's, and any extra on disk."""
        found = set(range(self.cfg.replicas))
        if handle is not None:
            found |= {int(w["index"]) for w in handle.meta.get("watchdogs", []) if "index" in w}
        i = max(found, default=-1) + 1
        while self.paths.watchdog_pid(i).exists() or self.paths.replica_status(i).exists():
            found.add(i)
            i += 1
        return sorted(found)

    def _stop_index(self, i: int) -> None:
        """Stop replica ``i``: its watchdog (which stops the replica), then any replica left over."""
        stop([ProcRef.from_dict(read_json(self.paths.watchdog_pid(i)))], grace_s=STOP_GRACE_S + 5)
        stop([self._replica_ref(i)], grace_s=STOP_GRACE_S)

    def _stop_extra(self, replicas: int) -> None:
        for i in self._indices():
            if i >= replicas:
                self._stop_index(i)
                self.paths.watchdog_pid(i).unlink(missing_ok=True)

    # ------------------------------------------------------------------ readiness
    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """Every replica: /health 200 and one real chat completion. Fails early once a replica has failed."""
        deadline = time.monotonic() + timeout_s
        urls = self._urls(handle)
        ready: dict[int, ProbeResult] = {}
        last: dict[int, ProbeResult] = {}
        while True:
            self._raise_if_hopeless(handle)
            for i, url in enumerate(urls):
                if i not in ready:
                    last[i] = self._probe(url, deadline)
                    if last[i].ok:
                        ready[i] = last[i]
            if len(ready) == len(urls):
                self._await_watchdogs(handle, deadline)
                return self._ready_status(handle)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout_error(handle, timeout_s, last)
            time.sleep(min(1.0, left))

    def _probe(self, url: str, deadline: float) -> ProbeResult:
        left = max(1.0, deadline - time.monotonic())
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key else None
        health = check_health(url, self.cfg.engine.health_path, timeout_s=min(5.0, left), api_key=key)
        if not health.ok:
            return ProbeResult(False, f"health: {health.detail}")
        chat = check_answer(url, self.cfg.model_name, key, timeout_s=min(60.0, left))
        return chat if chat.ok else ProbeResult(False, f"chat: {chat.detail}")

    def _raise_if_hopeless(self, handle: ServingHandle) -> None:
        st = self.status(handle)
        failed = [r for r in st.replicas if _is_failed(self._raw(r.index))]
        if failed:
            raise ReadinessError(
                f"swarm '{self.cfg.name}': {len(failed)} of {len(st.replicas)} replica(s) failed, "
                "so not every replica can become ready.\n" + _evidence(failed),
                hint=f"fix the engine (logs: {self.paths.root}/replica-<i>.log), then bring it up again.",
            )
        if st.phase is ServingPhase.STOPPED:
            raise ReadinessError(
                f"swarm '{self.cfg.name}' has no running watchdog: it was stopped (deleted, or its wall time ran out).",
                hint=f"bring it up again with `prefect-swarm up -c {self.paths.config}`.",
            )

    def _await_watchdogs(self, handle: ServingHandle, deadline: float) -> None:
        """Readiness can answer before a watchdog's next health check (0.5 s apart until healthy): wait
        for that check, briefly, so that `status` right after `up` agrees with readiness."""
        until = min(deadline, time.monotonic() + 2.0)
        while self.status(handle).phase is not ServingPhase.RUNNING and time.monotonic() < until:
            time.sleep(0.1)

    def _ready_status(self, handle: ServingHandle) -> ServingStatus:
        st = self.status(handle)
        reps = tuple(dataclasses.replace(r, health=ReplicaHealth.HEALTHY, detail="ready") for r in st.replicas)
        return ServingStatus(ServingPhase.RUNNING, handle.url, f"{len(reps)}/{len(reps)} replicas ready", reps)

    def _timeout_error(self, handle: ServingHandle, timeout_s: float, last: dict[int, ProbeResult]) -> ReadinessError:
        st = self.status(handle)
        waiting = [
            dataclasses.replace(r, detail=f"{r.detail}; last probe: {last[r.index].detail}")
            for r in st.replicas
            if r.index in last and not last[r.index].ok
        ]
        return ReadinessError(
            f"swarm '{self.cfg.name}' was not ready after {timeout_s:g}s: {len(waiting)} replica(s) never "
            "answered a chat completion.\n" + _evidence(waiting, tail_of=self.paths.replica_log),
            hint="raise ready_timeout_s if the model loads slowly; otherwise read the replica logs above.",
        )

    # ------------------------------------------------------------------ status
    def _raw(self, i: int) -> dict[str, Any]:
        data = read_json(self.paths.replica_status(i))
        return data if isinstance(data, dict) else {}

    def _replica(self, i: int, url: str) -> tuple[ReplicaStatus, dict[str, Any], bool]:
        raw, dog = self._raw(i), self._watchdog(i) is not None
        health = ReplicaHealth(raw.get("health", ReplicaHealth.UNKNOWN.value))
        detail = str(raw.get("detail", "starting" if dog else "not running"))
        fresh = time.time() - float(raw.get("updated_at") or 0) < STALE_AFTER_S + 3 * self.local.health_interval_s
        if _is_failed(raw):
            health = ReplicaHealth.UNHEALTHY
        elif not dog:
            health, detail = (
                ReplicaHealth.UNKNOWN,
                ("stopped" if raw.get("stopped") else "watchdog not running"),
            )
        elif raw and not fresh:
            health, detail = ReplicaHealth.UNKNOWN, f"status not updated for a while ({detail})"
        elif i in (sleeping := asleep(self.paths)):
            detail = f"asleep (level {sleeping[i].get('level')}): out of rotation, allocation kept"
        rs = ReplicaStatus(
            index=i,
            health=health,
            url=url,
            restarts=int(raw.get("restarts") or 0),
            last_exit_code=raw.get("last_exit_code"),
            external_id=str(raw["pid"]) if raw.get("pid") else None,
            detail=detail,
            log_tail=str(raw.get("log_tail") or "") if _is_failed(raw) else "",
        )
        return rs, raw, dog

    def status(self, handle: ServingHandle) -> ServingStatus:
        """Per-replica status from the watchdogs' files and liveness; reads files only, never blocks."""
        urls = self._urls(handle)
        seen = [self._replica(i, url) for i, url in enumerate(urls)]
        reps = tuple(r for r, _, _ in seen)
        phase, detail = _phase(seen)
        why = (read_json(self.paths.stopped) or {}).get("reason") if phase is ServingPhase.STOPPED else None
        return ServingStatus(
            phase=phase, url=handle.url, detail=str(why) if why else detail, replicas=reps, stopped_at_budget=bool(why)
        )

    # ------------------------------------------------------------------ delete
    def delete(self, handle: ServingHandle) -> None:
        """Stop every watchdog and replica this swarm started (identity-checked pids). Idempotent."""
        indices = self._indices(handle)
        dogs = [ProcRef.from_dict(w) for w in handle.meta.get("watchdogs", [])]
        dogs += [ProcRef.from_dict(read_json(self.paths.watchdog_pid(i))) for i in indices]
        stop(dogs, grace_s=STOP_GRACE_S + 5)
        stop([self._replica_ref(i) for i in indices], grace_s=STOP_GRACE_S)
        for i in indices:
            self.paths.watchdog_pid(i).unlink(missing_ok=True)
            self.paths.replica_asleep(i).unlink(missing_ok=True)
        self.paths.metrics_targets.unlink(missing_ok=True)

    # ------------------------------------------------------------------ park
    def park(self, handle: ServingHandle) -> dict[str, Any]:
        """Stop every engine (as :meth:`delete`); the swarm's folder and the staged weights stay.
        Returns the ports the replicas listen on again at :meth:`restore`."""
        self.delete(handle)
        return {"ports": [self.cfg.port + i for i in range(self.cfg.replicas)], "replica_urls": self._urls(handle)}

    def restore(self, cfg: SwarmConfig, parked: dict[str, Any]) -> ServingHandle:
        """Start the engines again on the ports they had (``port + i``: :meth:`create_or_update`, which
        stages nothing already staged); a port taken meanwhile is refused with its name."""
        want = [cfg.port + i for i in range(cfg.replicas)]
        had = [int(p) for p in parked.get("ports") or want]
        if had != want:
            raise ConfigError(
                f"swarm '{cfg.name}' was parked listening on ports {had}, but its config now asks for {want}: "
                "restore it with the config it was parked with, or `prefect-swarm down` it and bring it up again."
            )
        return self.create_or_update(cfg)

    def gpu_usage(self, handle: ServingHandle) -> GpuUsage:
        """Wall time x GPUs of each replica whose watchdog still runs (a stopped replica's time is not kept)."""
        per = max(self.cfg.gpus_per_replica, 0)
        live = [ref for ref in (ProcRef.from_dict(w) for w in handle.meta.get("watchdogs", [])) if ref and ref.alive()]
        return GpuUsage(held_gpu_hours((ref.create_time for ref in live), per), "wall", gpus=per * len(live))

    def exec_command(self, handle: ServingHandle, replica: int, argv: Sequence[str]) -> int:
        """Run ``argv`` as the engine of replica ``replica`` runs: its environment (``CUDA_VISIBLE_DEVICES``,
        the swarm's and engine's env, the API key), ``PORT`` = its port, the swarm folder as working dir."""
        if self._watchdog(replica) is None:
            raise ReadinessError(
                f"replica {replica} of swarm '{self.cfg.name}' is not running (its watchdog is gone): "
                "there is nothing to run a command in.",
                hint=f"`prefect-swarm status {self.cfg.name}` tells why; `prefect-swarm up -c {self.paths.config}` "
                "brings it back.",
            )
        urls = self._urls(handle)
        port = urls[replica].rsplit(":", 1)[1] if replica < len(urls) else str(self.cfg.port + replica)
        env = {**os.environ, **engine_secret_env(self.cfg), **self._replica_env(replica), "PORT": port}
        try:
            return subprocess.run(list(argv), env=env, cwd=self.paths.root, check=False).returncode
        except OSError as exc:  # not found, not executable
            raise ConfigError(f"cannot run {argv[0]!r} in replica {replica}: {exc.strerror}.") from exc

    def replica_log(self, handle: ServingHandle, replica: int, *, follow: bool = False) -> Iterator[str]:
        """The replica's engine log file; followed while its watchdog lives."""
        del handle
        return tail_file(
            self.paths.replica_log(replica), follow=follow, alive=lambda: self._watchdog(replica) is not None
        )

    # --- sleep and wake ---
    def _sleeper(self) -> Sleeper:
        return Sleeper(
            self.cfg,
            self.paths,
            self.client_key(),
            url_of=lambda i: self.replica_url(i) if self._watchdog(i) is not None else None,
            leave=lambda i, url: self._write_targets(),
            rejoin=lambda i: self._write_targets(),
        )

    def sleep(self, handle: ServingHandle, replicas: Sequence[int] = (), level: int = 1) -> list[SleepReport]:
        """See :meth:`ServingBackend.sleep`: a sleeping replica leaves targets.json and the job endpoints
        (:meth:`LocalCompute.endpoints`); its watchdog keeps it running (its ``/health`` still answers)."""
        del handle
        return self._sleeper().sleep(replicas, level)

    def wake(self, handle: ServingHandle, replicas: Sequence[int] = ()) -> list[SleepReport]:
        """See :meth:`ServingBackend.wake`."""
        del handle
        return self._sleeper().wake(replicas)

    def client_key(self) -> str | None:
        """See :meth:`ServingBackend.client_key`."""
        return self.cfg.api_key.get_secret_value() if self.cfg.api_key is not None else None

    def key_sources(self) -> list[str]:
        """See :meth:`ServingBackend.key_sources`: none beyond the swarm's own."""
        return []

    def metrics_targets(self, handle: ServingHandle) -> MetricsTargets:
        """Every replica's engine (written by ``create_or_update``; gone after ``delete``)."""
        found = read_file_sd(self.paths.metrics_targets)
        return found if found.targets else MetricsTargets(reason=f"no {self.paths.metrics_targets.name}: is it up?")


def _local(cfg: SwarmConfig) -> LocalConfig:
    if not isinstance(cfg.backend, LocalConfig):
        raise ConfigError(f"LocalServing needs backend.type 'local', not '{cfg.backend.type}'.")
    return cfg.backend


def _is_failed(raw: dict[str, Any]) -> bool:
    return bool(raw.get("failed"))


def _evidence(reps: list[ReplicaStatus], tail_of: Callable[[int], Path] | None = None) -> str:
    lines = []
    for r in reps:
        lines.append(
            f"replica {r.index} ({r.url}): {r.detail}; restarts={r.restarts}, last exit code={r.last_exit_code}"
        )
        tail = r.log_tail or (read_tail(tail_of(r.index)) if tail_of else "")
        if tail:
            lines.append("  log tail:\n" + "\n".join("    " + ln for ln in tail.splitlines()[-40:]))
    return "\n".join(lines)


def _phase(seen: list[tuple[ReplicaStatus, dict[str, Any], bool]]) -> tuple[ServingPhase, str]:
    n = len(seen)
    failed = sum(_is_failed(raw) for _, raw, _ in seen)
    alive = sum(dog for _, _, dog in seen)
    healthy = sum(r.health is ReplicaHealth.HEALTHY for r, _, _ in seen)
    counts = f"{healthy}/{n} healthy, {failed} failed"
    if failed and not healthy:
        return ServingPhase.FAILED, counts
    if alive == 0:
        return ServingPhase.STOPPED, "no replica is running"
    if not any(raw for _, raw, _ in seen):
        return ServingPhase.PENDING, "watchdogs starting"
    if healthy == n:
        return ServingPhase.RUNNING, counts
    if healthy and all(raw.get("ever_healthy") or _is_failed(raw) for _, raw, _ in seen):
        return ServingPhase.RUNNING, "degraded: " + counts
    return ServingPhase.INITIALIZING, counts
