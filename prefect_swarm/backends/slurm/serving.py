"""SlurmServing: the ServingBackend protocol on Slurm.

One ``sbatch --array`` job of replicas (each under the watchdog, writing ``replica-<i>.head`` while
healthy) plus one nginx LB job whose reconciler follows the head files. State comes from squeue
(then sacct for jobs that left the queue); ``delete`` scancels by id and by our job names.

    <swarm>/replicas.sbatch lb.sbatch nginx.conf watchdog-<i>.json   rendered (render.py)
    <swarm>/slurm.json          job ids + plan hash (what `up` submitted; no secrets)
    <swarm>/replica-<i>.head    node:port while replica i is healthy
    <swarm>/lb.head             node:port of the LB once nginx answers
    <swarm>/upstreams.conf lb/  the reconciler's and nginx's files
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.common import head_url
from prefect_swarm.backends.engine import engine_secret_env
from prefect_swarm.backends.slurm import render
from prefect_swarm.backends.slurm.client import QueueEntry, SlurmClient, clean_env
from prefect_swarm.backends.slurm.lb import resolve
from prefect_swarm.exceptions import CapacityError, ReadinessError
from prefect_swarm.interfaces import Capabilities, ServingHandle
from prefect_swarm.interfaces.readiness import ProbeResult, check_chat, check_health
from prefect_swarm.interfaces.types import ReplicaHealth, ReplicaStatus, ServingPhase, ServingStatus
from prefect_swarm.paths import atomic_write_json, atomic_write_text, read_json, read_tail, read_text

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths

POLL_S = 1.0
GONE_WAIT_S = 60.0
"""delete() waits this long for its jobs to leave squeue (COMPLETING included)."""

_LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


@dataclass(frozen=True)
class SwarmJobs:
    """What the queue says about one swarm's two jobs."""

    replicas: list[QueueEntry]
    lb: QueueEntry | None

    @property
    def all(self) -> list[QueueEntry]:
        """Every entry."""
        return [*self.replicas, *([self.lb] if self.lb else [])]

    def pending(self) -> list[QueueEntry]:
        """Entries still waiting for resources."""
        return [e for e in self.all if e.state == "PENDING"]


class SlurmServing:
    """ServingBackend for a replica array job + an nginx LB job on Slurm."""

    backend = "slurm"

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths, client: SlurmClient | None = None) -> None:
        self.cfg = cfg
        self.sc = render.slurm_section(cfg)
        self.paths = render.swarm_paths(cfg, paths)
        self.client = client or SlurmClient()
        self.names = render.job_names(cfg)

    def capabilities(self) -> Capabilities:
        """Every capability: LB, watchdog, preemption signal, GPUs, nodes, containers, wall time."""
        return Capabilities.all_but("slurm", {})

    def validate(self, cfg: SwarmConfig) -> None:
        """Render everything once (no submission): a value no script can hold, or an API key the engine
        cannot take safely, fails here, before any GPU."""
        render.render_files(cfg, self.paths)
        engine_secret_env(cfg)

    def plan(self) -> dict[str, str]:
        """The sbatch scripts, nginx.conf and watchdog specs ``up`` writes (name -> text); secrets
        never reach them. See :func:`render.render_plan`."""
        return render.render_plan(self.cfg, self.paths)

    # ------------------------------------------------------------------ create
    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Submit what is not already queued for this swarm; a job whose script changed is replaced."""
        if cfg is not self.cfg:
            self.cfg, self.sc, self.names = cfg, render.slurm_section(cfg), render.job_names(cfg)
        files = render.render_files(self.cfg, self.paths)
        plan = {path.name: text for path, text in files.items()}
        self.paths.ensure()
        record = read_json(self.paths.slurm_record, {}) or {}
        live = self._jobs(record)
        replicas_id = self._reuse(live.replicas[0].array_job_id if live.replicas else None, record, "replicas", plan)
        lb_id = self._reuse(live.lb.raw_id if live.lb else None, record, "lb", plan)
        for path, text in files.items():
            atomic_write_text(path, text)
        env = clean_env(engine_secret_env(self.cfg))
        if replicas_id is None:
            for i in range(self.cfg.replicas):
                self.paths.replica_head(i).unlink(missing_ok=True)
            replicas_id = self.client.sbatch(
                self.paths.replicas_script,
                env=env,
                what=f"start the replicas of swarm '{self.cfg.name}'",
            )
        if lb_id is None:
            self.paths.lb_head.unlink(missing_ok=True)
            lb_id = self.client.sbatch(
                self.paths.lb_script,
                env=env,
                what=f"start the load balancer of swarm '{self.cfg.name}'",
            )
        record = {
            "replicas_job": replicas_id,
            "lb_job": lb_id,
            "hashes": {k: self._group_hash(plan, k) for k in ("replicas", "lb")},
            "submitted_at": time.time(),
        }
        atomic_write_json(self.paths.slurm_record, record)
        return self._handle(replicas_id, lb_id)

    def _reuse(self, live_id: str | None, record: dict[str, Any], kind: str, plan: dict[str, str]) -> str | None:
        """``live_id`` when what it runs is unchanged; else cancel it (if any) and return None."""
        if live_id is None:
            return None
        if (record.get("hashes") or {}).get(kind) == self._group_hash(plan, kind):
            return live_id
        self.client.scancel([live_id])
        return None

    def _handle(self, replicas_id: str, lb_id: str) -> ServingHandle:
        return ServingHandle(
            name=self.cfg.name,
            backend="slurm",
            url=self._lb_url(),
            meta={
                "replicas_job": replicas_id,
                "lb_job": lb_id,
                "swarm_dir": str(self.paths.root),
                "replicas": self.cfg.replicas,
                "per_task": render.per_task(self.cfg),
                "job_names": self.names.all(),
            },
        )

    # ------------------------------------------------------------------ look
    def _jobs(self, meta: dict[str, Any]) -> SwarmJobs:
        ids = [str(meta[k]) for k in ("replicas_job", "lb_job") if meta.get(k)]
        entries = {e.id: e for e in self.client.squeue(ids, names=self.names.all())}
        live = [e for e in entries.values() if e.state in _LIVE]
        replicas = sorted((e for e in live if e.name == self.names.replicas), key=lambda e: int(e.task_id or 0))
        lbs = [e for e in live if e.name == self.names.lb]
        return SwarmJobs(replicas=replicas, lb=lbs[0] if lbs else None)

    def _lb_url(self) -> str | None:
        return head_url(self.paths.lb_head)

    def _replica_url(self, i: int) -> str | None:
        return head_url(self.paths.replica_head(i))

    def _group_hash(self, plan: dict[str, str], kind: str) -> str:
        """Hash of the files one job runs from: the LB script + nginx.conf, or the rest."""
        lb_files = (self.paths.lb_script.name, self.paths.nginx_conf.name)
        names = sorted(n for n in plan if (n in lb_files) == (kind == "lb"))
        return hashlib.sha256("\0".join(f"{n}\0{plan[n]}" for n in names).encode()).hexdigest()[:16]

    def status(self, handle: ServingHandle) -> ServingStatus:
        """Phase, LB URL and each replica with its Slurm task id (``123_0``) and state."""
        try:
            jobs = self._jobs(handle.meta)
        except Exception as exc:  # an unreachable scheduler is UNKNOWN, not FAILED
            return ServingStatus(ServingPhase.UNKNOWN, detail=f"cannot ask Slurm: {exc}")
        replicas = tuple(self._replica_status(handle, i, jobs) for i in range(int(handle.meta.get("replicas", 0))))
        phase, detail = self._phase(jobs, replicas)
        return ServingStatus(phase, url=self._lb_url() if jobs.lb else None, detail=detail, replicas=replicas)

    def _replica_status(self, handle: ServingHandle, i: int, jobs: SwarmJobs) -> ReplicaStatus:
        task = str(i // int(handle.meta.get("per_task", 1)))
        entry = next((e for e in jobs.replicas if e.task_id == task), None)
        ext = f"{handle.meta.get('replicas_job')}_{task}"
        raw = read_json(self.paths.replica_status(i), {}) or {}
        url = self._replica_url(i)
        if entry is None:
            return ReplicaStatus(i, ReplicaHealth.UNHEALTHY, external_id=ext, detail="not in the Slurm queue")
        health = (
            ReplicaHealth.HEALTHY
            if entry.state == "RUNNING" and url
            else (ReplicaHealth.UNKNOWN if entry.state in ("PENDING", "RUNNING") else ReplicaHealth.UNHEALTHY)
        )
        where = f"on {entry.nodes}" if entry.state == "RUNNING" else f"({entry.reason})"
        return ReplicaStatus(
            i,
            health,
            url=url,
            restarts=int(raw.get("restarts") or 0),
            last_exit_code=raw.get("last_exit_code"),
            external_id=entry.id,
            detail=f"{entry.state} {where}; {raw.get('detail', 'no watchdog status yet')}",
            log_tail=str(raw.get("log_tail") or ""),
        )

    def _phase(self, jobs: SwarmJobs, replicas: tuple[ReplicaStatus, ...]) -> tuple[ServingPhase, str]:
        if not jobs.all:
            return ServingPhase.STOPPED, "no job of this swarm is in the Slurm queue"
        if jobs.pending():
            return ServingPhase.PENDING, "queued: " + _reasons(jobs.pending())
        healthy = sum(r.health is ReplicaHealth.HEALTHY for r in replicas)
        if jobs.lb and healthy == len(replicas) and self._lb_url():
            return ServingPhase.RUNNING, f"{healthy}/{len(replicas)} replicas healthy behind {self._lb_url()}"
        return ServingPhase.INITIALIZING, f"{healthy}/{len(replicas)} replicas healthy"

    # ------------------------------------------------------------------ readiness
    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """Both jobs RUNNING, the LB's /health, one chat completion per replica, every replica in the LB.

        Stuck PENDING past ``backend.queue_timeout_s``: scancel everything, CapacityError with
        Slurm's reason. A job that left the queue: ReadinessError with its log tail.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        chatted: dict[int, ProbeResult] = {}
        last = "nothing checked yet"
        while time.monotonic() < deadline:
            jobs = self._jobs(handle.meta)
            self._check_queue(handle, jobs, time.monotonic() - start)
            if len(jobs.replicas) == render.array_tasks(self.cfg) and jobs.lb and not jobs.pending():
                last = self._probe(chatted)
                if last == "":
                    return self.status(handle)
            else:
                last = "waiting for both jobs to run: " + (_reasons(jobs.all) or "none queued")
            time.sleep(POLL_S)
        raise ReadinessError(
            f"swarm '{self.cfg.name}' was not ready after {timeout_s:g}s: {last}",
            hint=f"replica logs: {self.paths.root}/replica-<i>.log and watchdog-<i>.log; "
            f"LB: {self.paths.root}/lb-*.out",
        )

    def _check_queue(self, handle: ServingHandle, jobs: SwarmJobs, waited: float) -> None:
        missing = self._missing(handle, jobs)
        if missing:
            self.delete(handle)
            raise ReadinessError(
                f"swarm '{self.cfg.name}': {missing} left the Slurm queue before the swarm was ready.",
                stderr=self._evidence(),
                hint=f"see {self.paths.root} for the job outputs.",
            )
        pending = jobs.pending()
        if pending and waited > self.sc.queue_timeout_s:
            self.delete(handle)
            raise CapacityError(
                f"swarm '{self.cfg.name}' stayed queued for {waited:.0f}s (backend.queue_timeout_s="
                f"{self.sc.queue_timeout_s:g}): {_reasons(pending)}. Everything it submitted was cancelled.\n"
                "Hint: fewer replicas or GPUs per replica, another partition/qos, "
                "or a longer queue_timeout_s."
            )

    def _missing(self, handle: ServingHandle, jobs: SwarmJobs) -> str:
        if jobs.lb is None:
            return f"the LB job {handle.meta.get('lb_job')}"
        if len(jobs.replicas) < render.array_tasks(self.cfg):
            seen = {e.task_id for e in jobs.replicas}
            gone = [
                f"{handle.meta.get('replicas_job')}_{t}"
                for t in range(render.array_tasks(self.cfg))
                if str(t) not in seen
            ]
            return "replica task(s) " + ", ".join(gone)
        return ""

    def _probe(self, chatted: dict[int, ProbeResult]) -> str:
        """'' when ready, else what is missing."""
        lb = self._lb_url()
        if lb is None:
            return "the LB has not announced itself yet (lb.head)"
        health = check_health(lb, self.cfg.engine.health_path)
        if not health.ok:
            return f"LB {lb}/health: {health.detail}"
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key else None
        for i in range(self.cfg.replicas):
            if i in chatted and chatted[i].ok:
                continue
            url = self._replica_url(i)
            if url is None:
                return f"replica {i} is not healthy yet (no head file)"
            chatted[i] = check_chat(url, self.cfg.model_name, key, timeout_s=30.0)
            if not chatted[i].ok:
                return f"replica {i} at {url}: chat completion failed: {chatted[i].detail}"
        return self._unrouted()

    def _unrouted(self) -> str:
        """'' when the LB's upstream list holds every replica (the reconciler lags the head files by
        up to its interval), else which replica it lacks."""
        upstreams = read_text(self.paths.upstreams) or ""
        servers = {line.split()[1] for line in upstreams.splitlines() if line.startswith("server ")}
        for i in range(self.cfg.replicas):
            head = read_text(self.paths.replica_head(i))
            addr = resolve(head) if head else None
            if addr is None or addr not in servers:
                return f"the LB does not route to replica {i} ({head}) yet"
        return ""

    def _evidence(self) -> str:
        tails = []
        for path in sorted(self.paths.root.glob("*.out"))[-3:]:
            tails.append(f"--- {path.name}\n{read_tail(path) or '(missing)'}")
        for i in range(min(self.cfg.replicas, 2)):
            log = self.paths.replica_log(i)
            tails.append(f"--- {log.name}\n{read_tail(log) or '(missing)'}")
        return "\n".join(tails)

    # ------------------------------------------------------------------ delete
    def delete(self, handle: ServingHandle) -> None:
        """scancel both jobs (by id and by our names), wait until they left the queue. Idempotent."""
        ids = [str(handle.meta[k]) for k in ("replicas_job", "lb_job") if handle.meta.get(k)]
        live = self._ours(ids)
        self.client.scancel(sorted({*ids, *(e.array_job_id if e.task_id else e.raw_id for e in live)}))
        end = time.monotonic() + GONE_WAIT_S
        while self._ours(ids) and time.monotonic() < end:
            time.sleep(0.5)
        for i in range(int(handle.meta.get("replicas", self.cfg.replicas))):
            self.paths.replica_head(i).unlink(missing_ok=True)
        self.paths.lb_head.unlink(missing_ok=True)

    def _ours(self, ids: list[str]) -> list[QueueEntry]:
        """Queued jobs of this swarm: by id OR by our names (squeue ANDs ``-j`` and ``-n``, so two calls).

        By name catches what a handle does not list: a job submitted by an ``up`` whose record was
        never written (sbatch of the LB failed after the replicas' went through) or a replaced one.
        """
        by_id = self.client.squeue(ids) if ids else []
        by_name = self.client.squeue(names=self.names.all())
        return list({e.id: e for e in (*by_id, *by_name)}.values())


def _reasons(entries: list[QueueEntry]) -> str:
    return ", ".join(f"{e.id} {e.state} ({e.reason})" for e in entries)
