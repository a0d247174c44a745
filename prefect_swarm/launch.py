"""Job orchestration through a swarm's compute backend: prepare, submit, status, wait, cancel.

Used by the CLI (``prefect-swarm job ...``) and by the Prefect tasks alike; nothing here imports
prefect. A job is one row in the state store (``JobRecord``: id, swarm, spec, status, progress,
``handle = {"submissions": [JobHandle, ...]}``) plus its ledger folder (``spec.job_dir``). The
ledger is the truth for what is done; the compute backend's probe only says whether processes
still run and how they ended.
"""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefect_swarm.exceptions import ConfigError, JobError
from prefect_swarm.interfaces.types import JobHandle, JobStatus
from prefect_swarm.jobs.commit import commit_output
from prefect_swarm.jobs.plan import job_progress, pending_shards
from prefect_swarm.jobs.shard import validate_input
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import JobPaths, SwarmPaths, read_json
from prefect_swarm.state import JobRecord, StateStore

if TYPE_CHECKING:
    from prefect_swarm.swarm import Swarm

ACTIVE = {JobStatus.PENDING.value, JobStatus.RUNNING.value}


def new_job_id() -> str:
    """A fresh, sortable job id: ``job-YYYYmmdd-HHMMSS-xxxxxx``."""
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def prepare_job(spec: JobSpec, *, overwrite: bool = False) -> tuple[JobSpec, JobPaths]:
    """Fill the job id and job dir, validate the job class and the dataset, write ``spec.json``.

    Every refusal (bad job class or kwargs, missing column, duplicate ids, unreadable file)
    happens here, before anything is submitted. ``overwrite`` discards an existing ledger.
    """
    job_id = spec.job_id or new_job_id()
    job_dir = spec.job_dir or str(
        SwarmPaths.for_swarm(spec.swarm).job_dir(job_id) if spec.swarm else JobPaths.standalone(job_id).root
    )
    spec = JobSpec.model_validate({**spec.model_dump(), "job_id": job_id, "job_dir": job_dir})
    paths = JobPaths(spec.paths.root).ensure()
    if overwrite:
        shutil.rmtree(paths.shards_root(), ignore_errors=True)
        for f in (paths.manifest, paths.failed_rows, paths.validated):
            f.unlink(missing_ok=True)
    validate_input(spec)
    spec.save()
    return spec, paths


def _for_swarm(swarm: Swarm, spec: JobSpec, retry_failed: bool) -> JobSpec:
    return JobSpec.model_validate(
        {
            **spec.model_dump(),
            "swarm": swarm.cfg.name,
            "endpoints": spec.endpoints or swarm.endpoints,
            "model": spec.model or swarm.cfg.model_name,
            "swarm_fingerprint": spec.swarm_fingerprint or swarm.fingerprint,
            "retry_failed": retry_failed,
        }
    )


def submit_job(
    swarm: Swarm,
    spec: JobSpec,
    detach: bool = True,
    shard_ids: list[int] | None = None,
    *,
    overwrite: bool = False,
    retry_failed: bool = False,
    commit: bool | None = None,
    store: StateStore | None = None,
) -> JobRecord:
    """Submit the pending shards of ``spec`` (or just ``shard_ids``) to ``swarm``'s compute backend.

    Fills endpoints, model and swarm_fingerprint from the swarm, prepares the job, records it in
    the state store and starts one process per shard (``python -m prefect_swarm.jobs.run``). Shards
    already done are not started. With ``detach=False`` it waits, then commits (unless
    ``commit=False``) when every shard is done. Returns the job's record.
    """
    store = store or StateStore()
    spec, paths = prepare_job(_for_swarm(swarm, spec, retry_failed), overwrite=overwrite)
    assert spec.job_id is not None
    todo = sorted(set(shard_ids)) if shard_ids is not None else pending_shards(spec)
    bad = [i for i in todo if not 0 <= i < spec.shards]
    if bad:
        raise ConfigError(f"shard ids {bad} are out of range for a job of {spec.shards} shards.")
    old = store.get_job(spec.job_id)
    submissions = list((old.handle or {}).get("submissions", [])) if old else []
    rec = store.put_job(
        JobRecord(
            id=spec.job_id,
            spec=spec.model_dump(),
            status=JobStatus.PENDING.value,
            swarm=swarm.cfg.name,
            handle={"submissions": submissions},
            nshards=spec.shards,
            job_dir=str(paths.root),
            created_at=old.created_at if old else time.time(),
        )
    )
    if todo:
        submissions += [h.to_dict() for h in _start(swarm, spec, todo)]
        rec = store.update_job(
            spec.job_id, handle={"submissions": submissions}, status=JobStatus.RUNNING.value
        )
    if detach:
        return rec
    wait_job(spec.job_id, commit=commit is not False and shard_ids is None, store=store)
    return store.require_job(spec.job_id)


def _start(swarm: Swarm, spec: JobSpec, shards: list[int]) -> list[JobHandle]:
    compute = swarm.compute
    python = getattr(compute, "default_python", lambda: sys.executable)()
    command = [python, "-m", "prefect_swarm.jobs.run", "--spec", str(spec.paths.spec)]
    secret = {"PREFECT_SWARM_API_KEY": swarm.cfg.api_key.get_secret_value()} if swarm.cfg.api_key else {}
    common: dict[str, Any] = {"name": spec.job_id, "env": {}, "secret_env": secret, "detach": True}
    n = spec.shards
    if shards == list(range(n)):
        cmd = command if n > 1 else [*command, "--shard-id", "0", "--nshards", "1"]
        return [compute.submit(command=cmd, nshards=n, **common)]
    return [
        compute.submit(
            command=[*command, "--shard-id", str(i), "--nshards", str(n)], nshards=n, shard_id=i, **common
        )
        for i in shards
    ]


def _probe(rec: JobRecord) -> list[dict[str, Any]]:
    """The compute backend's view of each submission (never raises: errors are 'could not tell')."""
    subs = (rec.handle or {}).get("submissions", [])
    if not subs or not rec.swarm:
        return []
    try:
        from prefect_swarm.swarm import Swarm

        compute = Swarm.from_state(rec.swarm).compute
    except Exception as exc:
        return [
            {"id": s.get("id"), "status": None, "error": f"cannot reach swarm '{rec.swarm}': {exc}"}
            for s in subs
        ]
    out = []
    for sub in subs:
        try:
            p = compute.probe(JobHandle.from_dict(sub))
            out.append(
                {
                    "id": sub.get("id"),
                    "status": p.status.value if p.status else None,
                    "exit_code": p.exit_code,
                    "error": p.error,
                    "detail": p.detail,
                }
            )
        except Exception as exc:
            out.append({"id": sub.get("id"), "status": None, "error": str(exc)})
    return out


def _overall(
    spec: JobSpec, progress: dict[str, Any], probes: list[dict[str, Any]], old: str
) -> tuple[str, bool]:
    """(status, committed) from the ledger, the manifest and the processes."""
    manifest = read_json(spec.paths.manifest)
    pending = pending_shards(spec.model_copy(update={"retry_failed": False}))
    committed = bool(manifest) and not pending and manifest.get("fingerprint") is not None
    running = any(p.get("status") in ACTIVE for p in probes)
    if running or (not probes and old in ACTIVE and pending):
        return JobStatus.RUNNING.value, committed
    if not pending:
        return JobStatus.SUCCEEDED.value, committed
    if old == JobStatus.CANCELLED.value or any(p.get("status") == JobStatus.CANCELLED.value for p in probes):
        return JobStatus.CANCELLED.value, committed
    return JobStatus.FAILED.value, committed


def job_status(job_id: str, *, refresh: bool = True, store: StateStore | None = None) -> dict[str, Any]:
    """The job now: status, per-shard progress, backend view; the state row is updated.

    ``SUCCEEDED`` means every shard is done; ``committed`` says whether the output is written.
    With ``refresh=False`` the compute backend is not asked (ledger files only).
    """
    store = store or StateStore()
    rec = store.require_job(job_id)
    if "input" not in rec.spec:  # a submit-script job: the backend is the only source
        probes = _probe(rec) if refresh else []
        status = next((p["status"] for p in probes if p.get("status")), rec.status)
        store.update_job(job_id, status=status)
        return {
            "id": job_id,
            "swarm": rec.swarm,
            "status": status,
            "kind": "script",
            "backend": probes,
            "spec": rec.spec,
            "created_at": rec.created_at,
        }
    spec = JobSpec.model_validate(rec.spec)
    progress = job_progress(spec)
    probes = _probe(rec) if refresh else []
    status, committed = _overall(spec, progress, probes, rec.status)
    store.update_job(job_id, status=status, progress={k: v for k, v in progress.items() if k != "shards"})
    return {
        "id": job_id,
        "swarm": rec.swarm,
        "status": status,
        "committed": committed,
        "kind": "batch",
        "input": spec.input,
        "output": spec.output,
        "job_dir": spec.job_dir,
        "nshards": spec.shards,
        "progress": progress,
        "backend": probes,
        "manifest": read_json(spec.paths.manifest) if committed else None,
        "created_at": rec.created_at,
    }


def wait_job(
    job_id: str,
    *,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    commit: bool = True,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    store: StateStore | None = None,
) -> dict[str, Any]:
    """Poll until no shard process runs; then commit if every shard is done. Returns the final status.

    Raises JobError on timeout (the job keeps running).
    """
    store = store or StateStore()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        doc = job_status(job_id, store=store)
        if on_progress:
            on_progress(doc)
        if doc["status"] not in ACTIVE:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(
                f"job {job_id} still {doc['status']} after {timeout_s:g}s; it keeps running. "
                f"`prefect-swarm job status {job_id}` shows its progress."
            )
        time.sleep(poll_s)
    if (
        doc["status"] == JobStatus.SUCCEEDED.value
        and commit
        and doc.get("kind") == "batch"
        and not doc["committed"]
    ):
        commit_output(JobSpec.model_validate(store.require_job(job_id).spec))
        doc = job_status(job_id, refresh=False, store=store)
    return doc


def cancel_job(job_id: str, *, store: StateStore | None = None) -> dict[str, Any]:
    """Stop every process of the job (they flush and exit 75); mark it CANCELLED. Idempotent."""
    store = store or StateStore()
    rec = store.require_job(job_id)
    subs = (rec.handle or {}).get("submissions", [])
    if subs and rec.swarm:
        from prefect_swarm.swarm import Swarm

        compute = Swarm.from_state(rec.swarm).compute
        for sub in subs:
            compute.cancel(JobHandle.from_dict(sub))
    store.update_job(job_id, status=JobStatus.CANCELLED.value)
    return {"id": job_id, "status": JobStatus.CANCELLED.value}


def submit_script(
    swarm: Swarm, script: str, args: list[str], *, detach: bool = True, store: StateStore | None = None
) -> JobRecord:
    """Run an arbitrary Python script next to the swarm, with ENDPOINT and MODEL in its environment."""
    store = store or StateStore()
    compute = swarm.compute
    python = getattr(compute, "default_python", lambda: sys.executable)()
    job_id = new_job_id()
    secret = {"PREFECT_SWARM_API_KEY": swarm.cfg.api_key.get_secret_value()} if swarm.cfg.api_key else {}
    env = {
        "ENDPOINT": swarm.endpoint,
        "MODEL": swarm.cfg.model_name,
        "PREFECT_SWARM_ENDPOINTS": ",".join(swarm.endpoints),
    }
    rec = store.put_job(
        JobRecord(
            id=job_id, spec={"script": script, "args": list(args)}, status="PENDING", swarm=swarm.cfg.name
        )
    )
    handle = compute.submit(
        name=job_id, command=[python, script, *args], env=env, secret_env=secret, detach=detach
    )
    status = JobStatus.RUNNING.value
    if not detach:
        probe = compute.probe(handle)
        status = probe.status.value if probe.status else status
    return store.update_job(rec.id, handle={"submissions": [handle.to_dict()]}, status=status)


def list_jobs(swarm: str | None = None, *, store: StateStore | None = None) -> list[JobRecord]:
    """Every recorded job (of one swarm if given), oldest first."""
    return (store or StateStore()).list_jobs(swarm)
