"""SlurmServing: the ServingBackend protocol on Slurm.

Replicas are array tasks named ``psw-<swarm>-replicas`` (each under the watchdog, writing
``replica-<i>.head`` while healthy), plus one nginx LB job whose reconciler follows the head files
and resubmits a task that left the queue. ``up`` reconciles: it submits only the missing task
indices and cancels only those no longer wanted (see :mod:`members`), so scaling and repairs never
restart healthy replicas. State comes from squeue by job name; ``delete`` scancels by id and by name.

    <swarm>/replicas.sbatch lb.sbatch nginx.conf watchdog-<i>.json   rendered (render.py)
    <swarm>/slurm.json          wanted tasks, task ids, plan hashes (no secrets); slurm.lock guards it
    <swarm>/replica-<i>.head    node:port while replica i is healthy (the port its watchdog picked)
    <swarm>/lb.head             node:port of the LB once nginx answers
    <swarm>/upstreams.conf lb/  the reconciler's and nginx's files"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.common import head_url, host_port, tail_file
from prefect_swarm.backends.engine import engine_env, engine_secret_env, uses_ray
from prefect_swarm.backends.sleep import Sleeper, asleep
from prefect_swarm.backends.slurm import accounting, identity, members, render
from prefect_swarm.backends.slurm.client import QueueEntry, SlurmClient, clean_env
from prefect_swarm.backends.slurm.lb import resolve
from prefect_swarm.config.slurm_time import slurm_seconds
from prefect_swarm.exceptions import BackendError, CapacityError, ConfigError, ReadinessError
from prefect_swarm.interfaces import Capabilities, ServingHandle
from prefect_swarm.interfaces.metrics import MetricsTargets, read_file_sd
from prefect_swarm.interfaces.readiness import ProbeResult, check_answer, check_health
from prefect_swarm.interfaces.types import ReplicaHealth, ReplicaStatus, ServingPhase, ServingStatus, SleepReport
from prefect_swarm.interfaces.usage import GpuUsage
from prefect_swarm.paths import atomic_write_json, atomic_write_text, read_json, read_tail, read_text

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths

log = logging.getLogger("prefect_swarm.slurm")

POLL_S = 1.0
PROGRESS_S = 30.0
"""wait_ready says what it waits for when that changes, and at least this often."""
DRAIN_WAIT_S = 15.0
"""Scale down: how long to wait for the LB to drop the leaving replicas before cancelling them."""
DRAIN_GRACE_S = 2.0
"""Scale down: then how long requests already sent to them get to finish."""
GONE_WAIT_S = 60.0
"""delete() waits this long for its jobs to leave squeue (COMPLETING included)."""
TEARDOWN_S = 30.0
"""Ending a replica or LB job: how long its script's teardown (after TERM) may take before Slurm's
own cancel -- the watchdog stopping the engine (its ``stop_grace_s``, 10 s), then a Ray node's daemons."""

_LIVE = members.LIVE_STATES
_COUNT_LINES = re.compile(r"^(#SBATCH --array=|REPLICAS=|# prefect-swarm: replicas of swarm ).*$", re.M)
"""Lines of the replica script that change with the replica count only."""


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
        self.sc = render.slurm_section(cfg)
        self.paths = render.swarm_paths(cfg, paths)
        self.cfg = identity.with_key(cfg, self.paths)
        self.client = client or SlurmClient()
        self.names = render.job_names(cfg)

    def capabilities(self) -> Capabilities:
        """Every capability: LB, watchdog, preemption signal, GPUs, nodes, containers, wall time."""
        return Capabilities.all_but("slurm", {})

    def validate(self, cfg: SwarmConfig, *, ask: bool = True) -> list[str]:
        """Render everything once (no submission): a value no script can hold, or an API key the engine
        cannot take safely, fails here, before any GPU. Then (``ask``) ask Slurm (``sbatch --test-only``)
        whether it would take each job with its resources: a partition, account, QOS or GRES it does not
        have is a ConfigError naming it. A cluster that cannot be asked is a warning (returned)."""
        files = render.render_files(cfg, self.paths)
        render.check_shared_allocation(cfg)
        render.check_api_key(cfg)
        render.check_ray_ports(cfg)
        if cfg.engine.kind == "sglang" and identity.generated(cfg):
            raise ConfigError(
                "a Slurm swarm's endpoint is closed by default (a generated API key), but SGLang takes a key "
                "only on its command line, where other users of the node can read it. Use engine.kind 'vllm' "
                "or a 'command' engine, or set backend.open_endpoint: true to serve without a key."
            )
        engine_secret_env(cfg)
        check_model_path(cfg)
        return self._ask_slurm(cfg, {path.name: text for path, text in files.items()}) if ask else []

    def _ask_slurm(self, cfg: SwarmConfig, plan: dict[str, str]) -> list[str]:
        """``sbatch --test-only`` of the replica array, the LB job and (``backend.jobs``) a shard job;
        [] when Slurm would take them all, a warning when it cannot be asked (no sbatch, controller down)."""
        shard = (
            render.shard_job_argv(
                cfg,
                name=f"{self.names.shard_prefix}check",
                log=self.paths.root / "check.log",
                workdir=self.paths.root,
                command=["true"],
            )
            if render.slurm_section(cfg).jobs is not None
            else None
        )
        checks: list[tuple[str | None, list[str], str]] = [
            (plan[self.paths.replicas_script.name], ["--array=0"], "check the replica job (sbatch --test-only)"),
            (plan[self.paths.lb_script.name], [], "check the load-balancer job (sbatch --test-only)"),
        ]
        if shard is not None:
            checks.append((None, shard[1:], "check a batch-job shard job (backend.jobs; sbatch --test-only)"))
        for script, args, what in checks:
            try:
                self.client.test_only(script, what=what, args=args)
            except (ConfigError, CapacityError):
                raise
            except BackendError as exc:
                first = str(exc).splitlines()[0]
                return [
                    f"could not ask Slurm whether it would take these jobs ({first}); the partition, "
                    "account, QOS and GRES are checked only when `up` submits them."
                ]
        return []

    def plan(self) -> dict[str, str]:
        """The sbatch scripts, nginx.conf and watchdog specs ``up`` writes (name -> text); secrets
        never reach them. See :func:`render.render_plan`."""
        return render.render_plan(self.cfg, self.paths)

    # ------------------------------------------------------------------ create
    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Reconcile the queue with ``cfg``; never restarts what does not need it.

        * replica tasks: a wanted task index not in the queue is submitted on its own
          (``sbatch --array=<i>``); a task past the wanted count (scale down), or one whose set of
          replicas changed (a partly filled last task), is cancelled alone; the others keep running
          and keep their ids. Only a change of what a replica runs (script or engine) replaces them all.
        * the LB job: kept unless its script or nginx.conf changed; resubmitted when it left the queue.
        """
        if cfg is not self.cfg:
            self.sc, self.names = render.slurm_section(cfg), render.job_names(cfg)
        render.check_shared_allocation(cfg)
        self.cfg = identity.with_key(cfg, self.paths, create=True)
        if uses_ray(self.cfg):
            identity.ensure_ray_token(self.paths)  # Ray refuses whoever lacks it (replicas.sbatch.j2)
        files = render.render_files(self.cfg, self.paths)
        plan = {path.name: text for path, text in files.items()}
        self.paths.ensure()
        env = clean_env(engine_secret_env(self.cfg))
        want, per = render.array_tasks(self.cfg), render.per_task(self.cfg)
        self._await_ending()
        with members.locked(self.paths):
            record = read_json(self.paths.slurm_record, {}) or {}
            live = members.live_tasks(self.client, self.names.replicas)
            hashes = record.get("hashes") or {}
            same = hashes.get("replicas") == self._group_hash(plan, "replicas") and record.get("per_task") == per
            old_n = int(record.get("replicas") or 0)
            drop = [
                t
                for t in live
                if not same or t >= want or _task_members(t, per, old_n) != _task_members(t, per, self.cfg.replicas)
            ]
            if same and drop:
                self._drain([i for t in drop for i in _task_members(t, per, old_n)])
            self.client.terminate(sorted(live[t].id for t in drop), grace_s=TEARDOWN_S, full=False)
            kept = {t: live[t] for t in live if t not in drop}
            lb = self._lb_entry()
            lb_id = lb.raw_id if lb and hashes.get("lb") == self._group_hash(plan, "lb") else None
            if lb and lb_id is None:
                self.client.scancel([lb.raw_id])
            for path, text in files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, text)
            for i in range(self.cfg.replicas, max(old_n, self.cfg.replicas)):
                self.paths.replica_head(i).unlink(missing_ok=True)
            record = {
                "replicas_job": record.get("replicas_job") if kept else None,
                "lb_job": lb_id,
                "hashes": {k: self._group_hash(plan, k) for k in ("replicas", "lb")},
                "scripts": members.script_digests(
                    {p: files[p] for p in (self.paths.replicas_script, self.paths.lb_script)}
                ),
                "replicas": self.cfg.replicas,
                "per_task": per,
                "array_tasks": want,
                "task_args": self._task_args(),
                "tasks": {str(t): e.id for t, e in kept.items()},
                "resubmits": {},
                "submitted_at": time.time(),
                **self._life(record, submits=len(kept) < want or lb_id is None),
            }
            missing = [t for t in range(want) if t not in kept]
            if missing:
                for t in missing:
                    for i in _task_members(t, per, self.cfg.replicas):
                        self.paths.replica_head(i).unlink(missing_ok=True)
                job_id = members.submit_tasks(
                    self.client,
                    self.paths,
                    record,
                    missing,
                    env,
                    f"start the replicas of swarm '{self.cfg.name}'",
                    script=files[self.paths.replicas_script],
                )
                record["replicas_job"] = record["replicas_job"] or job_id
            atomic_write_json(self.paths.slurm_record, record)
            if lb_id is None:
                self.paths.lb_head.unlink(missing_ok=True)
                lb_id = self.client.sbatch(
                    files[self.paths.lb_script], env=env, what=f"start the load balancer of swarm '{self.cfg.name}'"
                )
                record["lb_job"] = lb_id
                atomic_write_json(self.paths.slurm_record, record)
        return self._handle(str(record["replicas_job"]), str(lb_id), record["tasks"])

    def _refused_tasks(self) -> str:
        """The replica tasks the reconciler stopped resubmitting because they kept failing at start, and
        why ('' when none): they stay out of the queue until `up`."""
        record = read_json(self.paths.slurm_record, {}) or {}
        failures = record.get("start_failures") or {}
        refused = [
            t
            for t in range(int(record.get("array_tasks") or 0))
            if failures.get(str(t), 0) >= members.MAX_START_FAILURES
        ]
        return "; ".join(
            f"replica task {t} is not resubmitted: {members.no_replacement(record, str(t))}" for t in refused
        )

    def _life(self, record: dict[str, Any], *, submits: bool) -> dict[str, float]:
        """``ends_at`` (``backend.time_limit`` from now when this ``up`` submits a job, else as it was)
        and ``min_life_s`` (what a replacement needs left): see :mod:`members`."""
        limit = slurm_seconds(self.sc.time_limit) or 0.0
        ends = time.time() + limit if submits or not record.get("ends_at") else float(record["ends_at"])
        return {"ends_at": ends, "min_life_s": self.sc.ending_s}

    def _await_ending(self) -> None:
        """Wait for this swarm's jobs that are ending -- COMPLETING, or running within
        ``backend.signal_seconds`` + ``SIGNAL_EARLY_S`` of their time limit -- to leave the queue (at
        most their time left + ``GONE_WAIT_S``, then scancel them, then at most ``GONE_WAIT_S`` more):
        ``up`` then submits fresh ones, never keeps a job about to be killed (nor starts a replica next
        to one that would remove its head file)."""
        floor = self.sc.ending_s
        deadline: float | None = None
        while True:
            ending = [
                e
                for e in self.client.squeue(names=self.names.all())
                if e.state == "COMPLETING"
                or (e.state == "RUNNING" and e.time_left_s is not None and e.time_left_s < floor)
            ]
            if not ending:
                return
            if deadline is None:
                deadline = time.monotonic() + max(e.time_left_s or 0.0 for e in ending) + GONE_WAIT_S
                why = "; ".join(
                    f"{e.id} is completing (cancelled or ended)"
                    if e.state == "COMPLETING"
                    else f"{e.id} is {e.time_left_s or 0:.0f}s from its time limit"
                    for e in ending
                )
                log.info(
                    "swarm '%s': waiting for job(s) on their way out to leave the queue before submitting fresh "
                    "ones (%s)",
                    self.cfg.name,
                    why,
                )
            if time.monotonic() > deadline + GONE_WAIT_S:
                log.warning("swarm '%s': job(s) %s are still ending; going on", self.cfg.name, ending)
                return
            if time.monotonic() > deadline:
                self.client.scancel(sorted({e.raw_id for e in ending}))
            time.sleep(POLL_S)

    def _task_args(self) -> dict[str, list[str]]:
        """sbatch options of a last task that runs fewer replicas than the script asks for."""
        per, n = render.per_task(self.cfg), self.cfg.replicas
        last = render.array_tasks(self.cfg) - 1
        runs = len(_task_members(last, per, n))
        return {str(last): render.task_resources(self.cfg, runs)} if runs < per else {}

    def _drain(self, indices: list[int]) -> None:
        """Take replicas out of the LB before their task is cancelled (scale down): their task stops
        publishing the head file, the reconciler drops them, requests in flight get ``DRAIN_GRACE_S``."""
        addrs = set()
        for i in indices:
            addr = self._replica_addr(i)
            if addr:
                addrs.add(addr)
            self.paths.replica_drain(i).touch()
        if self._wait_routed(addrs, routed=False):
            time.sleep(DRAIN_GRACE_S)

    def _replica_addr(self, i: int) -> str | None:
        """``ip:port`` of replica ``i`` from its head file (as the LB's reconciler resolves it), or None."""
        head = read_text(self.paths.replica_head(i))
        return resolve(head) if head else None

    def _wait_routed(self, addrs: set[str], *, routed: bool, wait_s: float = DRAIN_WAIT_S) -> bool:
        """Wait (up to ``wait_s``) until the LB's upstream file lists every address (``routed``) or none;
        True when it came to that."""
        end = time.monotonic() + wait_s
        while addrs and time.monotonic() < end:
            text = read_text(self.paths.upstreams) or ""
            listed = [f"server {a} " in text for a in addrs]
            if all(listed) if routed else not any(listed):
                return True
            time.sleep(0.25)
        return False

    def _lb_entry(self) -> QueueEntry | None:
        """The LB job that is (or will be) there; one COMPLETING is on its way out."""
        lbs = [e for e in self.client.squeue(names=[self.names.lb]) if e.state in members.LIVE_STATES - {"COMPLETING"}]
        return lbs[0] if lbs else None

    def _handle(self, replicas_id: str, lb_id: str, tasks: dict[str, str]) -> ServingHandle:
        return ServingHandle(
            name=self.cfg.name,
            backend="slurm",
            url=self._lb_url(),
            meta={
                "replicas_job": replicas_id,
                "lb_job": lb_id,
                "tasks": dict(tasks),
                "swarm_dir": str(self.paths.root),
                "replicas": self.cfg.replicas,
                "per_task": render.per_task(self.cfg),
                "job_names": self.names.all(),
            },
        )

    # ------------------------------------------------------------------ look
    def _jobs(self, meta: dict[str, Any]) -> SwarmJobs:
        """This swarm's live jobs, by its job names (replica tasks may come from several array jobs)."""
        del meta  # names are this user's and this swarm's: they find resubmitted tasks too
        live = [e for e in self.client.squeue(names=self.names.all()) if e.state in _LIVE]
        replicas = sorted(
            (e for e in live if e.name == self.names.replicas),
            key=lambda e: (int(e.task_id or 0), e.state == "COMPLETING"),  # a replacement before the one leaving
        )
        lbs = [e for e in live if e.name == self.names.lb]
        return SwarmJobs(replicas=replicas, lb=lbs[0] if lbs else None)

    def gpu_usage(self, handle: ServingHandle) -> GpuUsage:
        """sacct: elapsed x allocated GPUs of the replica and LB jobs (see :mod:`.accounting`)."""
        hours = accounting.swarm_gpu_hours(self.client, self.paths, self.sc.gres_name, handle.meta)
        return GpuUsage(hours, "sacct", gpus=self.cfg.replicas * max(self.cfg.gpus_per_replica, 0))

    def replica_log(self, handle: ServingHandle, replica: int, *, follow: bool = False) -> Iterator[str]:
        """The replica's engine log on the shared run dir; followed while its array task is queued or
        running (one squeue a second at most, and only while the log is quiet)."""

        def alive() -> bool:
            task = str(replica // int(handle.meta.get("per_task") or render.per_task(self.cfg)))
            entry = next((e for e in self._jobs(handle.meta).replicas if e.task_id == task), None)
            return entry is not None and entry.state in ("PENDING", "CONFIGURING", "RUNNING")

        return tail_file(self.paths.replica_log(replica), follow=follow, alive=alive, poll_s=1.0)

    def exec_command(self, handle: ServingHandle, replica: int, argv: Sequence[str]) -> int:
        """``srun --jobid=<replica's array task> --overlap`` on the replica's node (its head file; the
        task's first node while it has none), with the engine's environment, the API key and
        ``PORT`` = the engine's port, through srun's environment (never its command line)."""
        task = str(replica // int(handle.meta.get("per_task") or render.per_task(self.cfg)))
        entry = next((e for e in self._jobs(handle.meta).replicas if e.task_id == task), None)
        if entry is None or entry.state != "RUNNING":
            where = f"its task {entry.id} is {entry.state} ({entry.reason})" if entry else "its task is not queued"
            raise ReadinessError(
                f"replica {replica} of swarm '{self.cfg.name}' is not running: {where}.",
                hint=f"`prefect-swarm status {self.cfg.name}` tells more.",
            )
        head = read_text(self.paths.replica_head(replica))
        parsed = host_port(head) if head else None
        node = parsed[0] if parsed else None
        port = parsed[1] if parsed else (read_json(self.paths.replica_status(replica), {}) or {}).get("port")
        env = {**engine_env(self.cfg), **engine_secret_env(self.cfg), **({"PORT": str(port)} if port else {})}
        return self.client.srun_overlap(entry.raw_id, argv, node=node, env=env)

    # --- sleep and wake ---
    def _sleeper(self) -> Sleeper:
        def url_of(i: int) -> str | None:
            addr = self._replica_addr(i)
            return f"http://{addr}" if addr else None

        def leave(i: int, url: str) -> None:  # the task stops publishing the head file, the reconciler drops it
            self._wait_routed({url.split("://", 1)[1]}, routed=False)

        def rejoin(i: int) -> None:  # the task publishes the head file again within a second
            end = time.monotonic() + DRAIN_WAIT_S
            while (addr := self._replica_addr(i)) is None and time.monotonic() < end:
                time.sleep(0.25)
            if addr:
                self._wait_routed({addr}, routed=True)

        return Sleeper(self.cfg, self.paths, self.client_key(), url_of=url_of, leave=leave, rejoin=rejoin)

    def sleep(self, handle: ServingHandle, replicas: Sequence[int] = (), level: int = 1) -> list[SleepReport]:
        """See :meth:`ServingBackend.sleep`: the replica's task stops publishing its head file (the LB's
        reconciler drops it from nginx, job steps from their replica list) and keeps its allocation."""
        del handle
        return self._sleeper().sleep(replicas, level)

    def wake(self, handle: ServingHandle, replicas: Sequence[int] = ()) -> list[SleepReport]:
        """See :meth:`ServingBackend.wake`: back in the LB once its task publishes the head file again."""
        del handle
        return self._sleeper().wake(replicas)

    def client_key(self) -> str | None:
        """See :meth:`ServingBackend.client_key` (the generated key once `up` made it)."""
        return self.cfg.api_key.get_secret_value() if self.cfg.api_key is not None else None

    def key_sources(self) -> list[str]:
        """See :meth:`ServingBackend.key_sources`: none beyond the swarm's own."""
        return []

    def metrics_targets(self, handle: ServingHandle) -> MetricsTargets:
        """The replicas the LB reconciler routes to (it keeps ``targets.json`` next to the upstream file)."""
        del handle  # the file is in this swarm's folder
        found = read_file_sd(self.paths.metrics_targets)
        return found if found.targets else MetricsTargets(reason="the LB reconciler lists no live replica yet")

    def _lb_url(self) -> str | None:
        return head_url(self.paths.lb_head)

    def _replica_url(self, i: int) -> str | None:
        return head_url(self.paths.replica_head(i))

    def _group_hash(self, plan: dict[str, str], kind: str) -> str:
        """Hash of what one job runs: the LB script + nginx.conf, or what a replica runs (its script
        and watchdog spec without the replica count, so scaling does not replace running tasks)."""
        if kind == "lb":
            texts = [plan[self.paths.lb_script.name], plan[self.paths.nginx_conf.name]]
        else:
            script = plan[self.paths.replicas_script.name]
            texts = [_COUNT_LINES.sub("", script), plan.get(self.paths.watchdog_spec(0).name, "")]
        return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]

    def status(self, handle: ServingHandle) -> ServingStatus:
        """Phase, LB URL (only while the LB job runs) and each replica with its Slurm task id and state."""
        try:
            jobs = self._jobs(handle.meta)
        except Exception as exc:  # an unreachable scheduler is UNKNOWN, not FAILED
            return ServingStatus(ServingPhase.UNKNOWN, detail=f"cannot ask Slurm: {exc}")
        replicas = tuple(self._replica_status(handle, i, jobs) for i in range(int(handle.meta.get("replicas", 0))))
        phase, detail = self._phase(jobs, replicas)
        url = self._lb_url() if jobs.lb is not None and jobs.lb.state == "RUNNING" else None
        return ServingStatus(phase, url=url, detail=detail, replicas=replicas)

    def _replica_status(self, handle: ServingHandle, i: int, jobs: SwarmJobs) -> ReplicaStatus:
        task = str(i // int(handle.meta.get("per_task", 1)))
        entry = next((e for e in jobs.replicas if e.task_id == task), None)
        ext = (handle.meta.get("tasks") or {}).get(task) or f"{handle.meta.get('replicas_job')}_{task}"
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
        sleeping = asleep(self.paths).get(i)
        what = f"asleep (level {sleeping.get('level')}): out of the LB, allocation kept" if sleeping else None
        return ReplicaStatus(
            i,
            health,
            url=url,
            restarts=int(raw.get("restarts") or 0),
            last_exit_code=raw.get("last_exit_code"),
            external_id=entry.id,
            detail=f"{entry.state} {where}; {what or raw.get('detail', 'no watchdog status yet')}",
            log_tail=str(raw.get("log_tail") or ""),
        )

    def _phase(self, jobs: SwarmJobs, replicas: tuple[ReplicaStatus, ...]) -> tuple[ServingPhase, str]:
        """STOPPED (nothing queued), FAILED (the LB job is gone: no endpoint), PENDING (queued),
        RUNNING (LB up, at least one replica healthy; "degraded" with n/m below strength),
        INITIALIZING (LB up, no replica healthy yet)."""
        if not jobs.all:
            stopped = (read_json(self.paths.slurm_record, {}) or {}).get("stopped") or {}
            why = f": stopped because {stopped['reason']}" if stopped.get("reason") else ""
            return ServingPhase.STOPPED, f"no job of this swarm is in the Slurm queue{why}"
        healthy = sum(r.health is ReplicaHealth.HEALTHY for r in replicas)
        n = f"{healthy}/{len(replicas)} replicas healthy"
        if jobs.lb is None or jobs.lb.state == "COMPLETING":  # COMPLETING: it ended, Slurm cleans up after it
            stopped = (read_json(self.paths.slurm_record, {}) or {}).get("stopped") or {}
            if stopped:
                return ServingPhase.FAILED, f"stopping: {stopped.get('reason')}"
            gone = "has ended" if jobs.lb else "left the Slurm queue"
            return ServingPhase.FAILED, (
                f"the load balancer job {gone}: no endpoint ({n}); a replica task resubmits it "
                f"within {members.KEEP_LB_S:g}s; `prefect-swarm down {self.cfg.name}` stops the swarm"
            )
        if jobs.lb.state != "RUNNING" or not self._lb_url():
            if jobs.pending():
                return ServingPhase.PENDING, "queued: " + _reasons(jobs.pending())
            return ServingPhase.INITIALIZING, f"the load balancer is starting; {n}"
        if healthy == len(replicas):
            return ServingPhase.RUNNING, f"{n} behind {self._lb_url()}"
        refused = self._refused_tasks()
        if refused and not healthy and not jobs.pending():
            return ServingPhase.FAILED, f"{n}; {refused}"
        if refused:
            return ServingPhase.RUNNING, f"degraded: {n} behind {self._lb_url()}; {refused}"
        if healthy:
            missing = [str(r.index) for r in replicas if r.health is not ReplicaHealth.HEALTHY]
            return ServingPhase.RUNNING, (
                f"degraded: {n} behind {self._lb_url()}; replica(s) {', '.join(missing)} "
                "being replaced or starting (the LB's reconciler resubmits a task that left the queue)"
            )
        if jobs.pending():
            return ServingPhase.PENDING, "queued: " + _reasons(jobs.pending())
        return ServingPhase.INITIALIZING, n

    # ------------------------------------------------------------------ readiness
    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """Both jobs RUNNING, the LB's /health, one chat completion per replica, every replica in the LB.

        Stuck PENDING past ``backend.queue_timeout_s``: scancel everything, CapacityError with
        Slurm's reason. A replica task that left the queue is resubmitted on its own
        (:func:`members.replenish`) unless its engine failed (the watchdog gave up) or its budget is
        spent; then, as for an LB job that left the queue, ReadinessError with the log tail.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        n, tasks = self._wanted(handle)
        chatted: dict[int, ProbeResult] = {}
        last, said, said_at = "nothing checked yet", "", 0.0
        while time.monotonic() < deadline:
            jobs = self._jobs(handle.meta)
            self._check_queue(handle, jobs, time.monotonic() - start)
            wanted = {str(t) for t in range(tasks)}
            if wanted <= {e.task_id for e in jobs.replicas} and jobs.lb and not jobs.pending():
                last = self._probe(chatted, n)
                if last == "":
                    return self.status(handle)
            else:
                last = "waiting for both jobs to run: " + (_reasons(jobs.all) or "none queued")
            now = time.monotonic()
            gist = re.sub(r"\d+", "#", last)  # "starting (35s)" is no news a second later
            if gist != said or now - said_at >= PROGRESS_S:  # a long start says what it waits for
                log.info("swarm '%s' (%.0fs): %s", self.cfg.name, now - start, last)
                said, said_at = gist, now
            time.sleep(POLL_S)
        raise ReadinessError(
            f"swarm '{self.cfg.name}' was not ready after {timeout_s:g}s: {last}",
            hint=f"replica logs: {self.paths.root}/replica-<i>.log and watchdog-<i>.log; "
            f"LB: {self.paths.root}/lb-*.out and lb-*.err",
        )

    def _check_queue(self, handle: ServingHandle, jobs: SwarmJobs, waited: float) -> None:
        missing = self._missing(handle, jobs)
        if missing.startswith("replica") and not self._engine_failed(handle):
            env = clean_env(engine_secret_env(self.cfg))
            with members.locked(self.paths):
                if members.replenish(self.client, self.paths, self.names.replicas, env):
                    return
        if missing:
            self.delete(handle)
            why = "".join(f"\n{reason}" for reason in self._failures(handle))
            raise ReadinessError(
                f"swarm '{self.cfg.name}': {missing} left the Slurm queue before the swarm was ready.{why}",
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

    def _engine_failed(self, handle: ServingHandle) -> bool:
        """True when a replica's watchdog gave up on its engine, or its task's setup failed
        (resubmitting would not help)."""
        return any(why.startswith("replica") for why in self._failures(handle))

    def _failures(self, handle: ServingHandle) -> list[str]:
        """``replica <i>: <why>`` for each replica whose status says ``failed``, and ``LB: <why>``
        when the LB job stopped before nginx started."""
        n, _ = self._wanted(handle)
        status = {i: read_json(self.paths.replica_status(i), {}) or {} for i in range(n)}
        lb = read_text(self.paths.lb_failed)
        return [f"replica {i}: {s.get('detail')}" for i, s in status.items() if s.get("failed")] + (
            [f"LB: {lb}"] if lb else []
        )

    def _missing(self, handle: ServingHandle, jobs: SwarmJobs) -> str:
        if jobs.lb is None:
            return f"the LB job {handle.meta.get('lb_job')}"
        seen = {e.task_id for e in jobs.replicas}
        _, want = self._wanted(handle)
        if not {str(t) for t in range(want)} <= seen:
            ids = handle.meta.get("tasks") or {}
            gone = [
                ids.get(str(t)) or f"{handle.meta.get('replicas_job')}_{t}" for t in range(want) if str(t) not in seen
            ]
            return "replica task(s) " + ", ".join(gone)
        return ""

    def _wanted(self, handle: ServingHandle) -> tuple[int, int]:
        """(replicas, array tasks) the handle was submitted for: readiness checks what runs, also
        when the caller's config asks for another count (that is ``create_or_update``'s to apply)."""
        n = int(handle.meta.get("replicas") or self.cfg.replicas)
        per = int(handle.meta.get("per_task") or render.per_task(self.cfg))
        return n, -(-n // per)

    def _probe(self, chatted: dict[int, ProbeResult], n: int) -> str:
        """'' when ready, else what is missing."""
        lb = self._lb_url()
        if lb is None:
            return "the LB has not announced itself yet (lb.head)"
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key else None
        health = check_health(lb, self.cfg.engine.health_path, api_key=key)
        if not health.ok:
            return f"LB {lb}/health: {health.detail}"
        for i in range(n):
            if i in chatted and chatted[i].ok:
                continue
            url = self._replica_url(i)
            if url is None:
                watchdog = (read_json(self.paths.replica_status(i), {}) or {}).get("detail") or "no watchdog status yet"
                return f"replica {i} is not healthy yet: {watchdog}"
            chatted[i] = check_answer(url, self.cfg.model_name, key, timeout_s=30.0)
            if not chatted[i].ok:
                return f"replica {i} at {url}: chat completion failed: {chatted[i].detail}"
        return self._unrouted(n)

    def _unrouted(self, n: int) -> str:
        """'' when the LB's upstream list holds every replica (the reconciler lags the head files by
        up to its interval), else which replica it lacks."""
        upstreams = read_text(self.paths.upstreams) or ""
        servers = {line.split()[1] for line in upstreams.splitlines() if line.startswith("server ")}
        for i in range(n):
            head = read_text(self.paths.replica_head(i))
            addr = resolve(head) if head else None
            if addr is None or addr not in servers:
                return f"the LB does not route to replica {i} ({head}) yet"
        return ""

    def _evidence(self) -> str:
        tails = []
        for path in sorted([*self.paths.root.glob("*.out"), *self.paths.root.glob("*.err")])[-4:]:
            tails.append(f"--- {path.name}\n{read_tail(path) or '(missing)'}")
        for i in range(min(self.cfg.replicas, 2)):
            log = self.paths.replica_log(i)
            tails.append(f"--- {log.name}\n{read_tail(log) or '(missing)'}")
        return "\n".join(tails)

    # ------------------------------------------------------------------ delete
    def delete(self, handle: ServingHandle) -> None:
        """scancel every job of the swarm (by id and by our names), wait until they left the queue.

        The record wants no replica first (under the lock), so the LB's reconciler resubmits nothing
        behind this. Idempotent.
        """
        self._end(handle, shards=True)

    def park(self, handle: ServingHandle) -> dict[str, Any]:
        """End the replica jobs and the LB job (nothing of the swarm stays in the queue but shard jobs
        of their own, ``backend.jobs``: they pause until the restore); the swarm's folder, its rendered
        scripts, key and staged weights on shared storage stay. Returns the LB's address, for the record:
        the restored LB takes its preferred port again on the node Slurm gives it (docs/parking.md)."""
        lb = read_text(self.paths.lb_head)
        self._end(handle, shards=False)
        return {"lb_head": lb.strip() if lb else None, "replicas_job": handle.meta.get("replicas_job")}

    def restore(self, cfg: SwarmConfig, parked: dict[str, Any]) -> ServingHandle:
        """Submit the replica and LB jobs again from the kept scripts (:meth:`create_or_update`: what
        changed nothing is rendered the same); the replicas publish their new addresses in their head
        files, which the LB and the jobs' endpoints follow."""
        del parked  # the addresses come back through the head files, as at every start
        return self.create_or_update(cfg)

    def _end(self, handle: ServingHandle, *, shards: bool) -> None:
        ids = [str(handle.meta[k]) for k in ("replicas_job", "lb_job") if handle.meta.get(k)]
        if self.paths.root.is_dir():
            with members.locked(self.paths):
                record = read_json(self.paths.slurm_record, {}) or {}
                if record.get("array_tasks"):
                    atomic_write_json(self.paths.slurm_record, {**record, "array_tasks": 0})
        if shards and self.sc.jobs is not None:  # shard jobs of their own: TERM them (they flush), as the LB's are
            own = [e.raw_id for e in self.client.user_jobs() if e.name.startswith(self.names.shard_prefix)]
            self.client.scancel(own, signal="TERM", full=True)
        # each job's script tears down at its own pace (TEARDOWN_S at most; see SlurmClient.terminate)
        self.client.terminate(sorted({e.id for e in self._ours(ids)}), grace_s=TEARDOWN_S, full=False)
        live = self._ours(ids)
        self.client.scancel(sorted({*ids, *(e.array_job_id if e.task_id else e.raw_id for e in live)}))
        end = time.monotonic() + GONE_WAIT_S
        while (left := self._ours(ids)) and time.monotonic() < end:
            running = [e for e in left if e.state not in ("COMPLETING", "CANCELLED")]
            if running:
                self.client.scancel(sorted({e.array_job_id if e.task_id else e.raw_id for e in running}))
            time.sleep(0.5)
        for i in range(int(handle.meta.get("replicas", self.cfg.replicas))):
            self.paths.replica_head(i).unlink(missing_ok=True)
            self.paths.replica_asleep(i).unlink(missing_ok=True)
        self.paths.lb_head.unlink(missing_ok=True)

    def _ours(self, ids: list[str]) -> list[QueueEntry]:
        """Queued jobs of this swarm: by id OR by our names (squeue ANDs ``-j`` and ``-n``, so two calls).

        By name catches what a handle does not list: a job submitted by an ``up`` whose record was
        never written (sbatch of the LB failed after the replicas' went through) or a replaced one.
        """
        by_id = self.client.squeue(ids) if ids else []
        by_name = self.client.squeue(names=self.names.all())
        return list({e.id: e for e in (*by_id, *by_name)}.values())


def check_model_path(cfg: SwarmConfig) -> None:
    """ConfigError unless a local ``model`` (``/...``, ``./...``, ``../...``) is a model folder here.

    Compute nodes usually have no internet (``backend.hf_offline``), so a local model must exist; it
    is checked on the submit host, which sees the same shared filesystem.
    """
    model = cfg.model
    if not model.startswith(("/", "./", "../")):
        return
    path = Path(model)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError(
            f"model '{model}' (the engine's model path) {what} on this host. Give the folder of a "
            "downloaded model (it holds config.json) on a filesystem the nodes share, or a Hugging Face id."
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model '{model}' (the engine's model path) has no config.json: it is not a model folder. "
            "Point it at the folder that holds config.json and the weights."
        )


def _task_members(task: int, per_task: int, replicas: int) -> tuple[int, ...]:
    """Replica indices array task ``task`` runs when the swarm has ``replicas`` replicas."""
    return tuple(range(task * per_task, min((task + 1) * per_task, replicas)))


def _reasons(entries: list[QueueEntry]) -> str:
    return ", ".join(f"{e.id} {e.state} ({e.reason})" for e in entries)
