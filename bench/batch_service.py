"""The batch service vs `prefect-swarm job submit`, the same batch on the same swarm, side by side.

    python bench/batch_service.py [--replicas 2] [--rows 10000] [--repeat 2] [--max-tokens 32]

A local swarm of ``replicas`` GPU-like simulated engines (``prefect_swarm.testing.gpu_sim``, defaults:
256 sequences batched, 32-token answers) serves model ``stub-model`` for a batch service
(``prefect-swarm serve batches``) started on loopback. A first one-line batch brings the swarm up;
then, ``repeat`` times, alternating:

- **job submit**: ``prefect-swarm job submit -n SWARM --input in.jsonl --output out.jsonl --job
  openai-batch``, its wall time from start to exit (the CLI's start, validation, the job, the commit);
- **service**: the real ``openai`` SDK: ``files.create``, ``batches.create``, ``batches.retrieve``
  every 0.2 s until ``completed``, ``files.content`` of the output; wall time from the upload to the
  downloaded output.

Printed per repeat: each wall time, rows/s and service ÷ job submit (rows/s); then the fixed
overhead per batch: a one-line batch through each path, and the service's wall time minus job
submit's at ``rows``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLI = [str(Path(sys.executable).with_name("prefect-swarm"))]
SWARM = "bench-batch"


def lines(path: Path, n: int, max_tokens: int) -> Path:
    """``n`` chat request lines."""
    with path.open("w") as fh:
        for i in range(n):
            body = {"model": "stub-model", "messages": [{"role": "user", "content": f"question {i} about a topic"}],
                    "max_tokens": max_tokens}  # fmt: skip
            fh.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            fh.write("\n")
    return path


def start_service(home: Path, replicas: int, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """The service, serving the simulated swarm; returns once it listens."""
    from prefect_swarm.testing import gpu_sim
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    cfg = home / "batch-service.yaml"
    swarm = stub_swarm_config(SWARM, replicas=replicas, module=gpu_sim.MODULE)
    cfg.write_text(yaml.safe_dump({"models": {"stub-model": swarm}, "idle_release_s": 3600}))
    argv = [*CLI, "serve", "batches", "-c", str(cfg), "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "batch service on" in line:
            break
    else:
        raise SystemExit(f"the service exited {proc.wait()}")
    return proc


def via_service(client: Any, src: Path) -> float:
    """Upload, create, poll, download: seconds."""
    t0 = time.monotonic()
    upload = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.failed == 0, batch
    client.files.content(batch.output_file_id).read()
    return time.monotonic() - t0


def via_job_submit(src: Path, out: Path, env: dict[str, str]) -> float:
    """`prefect-swarm job submit ... --job openai-batch`, waited on: seconds."""
    t0 = time.monotonic()
    res = subprocess.run(
        [*CLI, "job", "submit", "-n", SWARM, "--input", str(src), "--output", str(out), "--job", "openai-batch"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    import openai

    from prefect_swarm.testing import free_port

    with tempfile.TemporaryDirectory(prefix="bench-batch-service-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "PREFECT_SWARM_HOME": str(work / "home")}
        (work / "home").mkdir(mode=0o700)
        key = subprocess.run([*CLI, "serve", "keys", "create", "bench"], capture_output=True, text=True, env=env)
        port = free_port()
        proc = start_service(work / "home", args.replicas, port, env)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key.stdout.strip(), max_retries=0)
            one = lines(work / "one.jsonl", 1, args.max_tokens)
            via_service(client, one)  # brings the swarm up
            src = lines(work / "in.jsonl", args.rows, args.max_tokens)
            for i in range(args.repeat):
                job_s = via_job_submit(src, work / f"out-{i}.jsonl", env)
                svc_s = via_service(client, src)
                print(json.dumps({
                    "rows": args.rows, "replicas": args.replicas, "job_submit_s": round(job_s, 2),
                    "service_s": round(svc_s, 2), "job_submit_rows_s": round(args.rows / job_s, 1),
                    "service_rows_s": round(args.rows / svc_s, 1), "service_over_job_submit": round(job_s / svc_s, 3),
                    "service_minus_job_submit_s": round(svc_s - job_s, 2),
                }), flush=True)  # fmt: skip
            one_job = via_job_submit(one, work / "one-out.jsonl", env)
            one_svc = via_service(client, one)
            print(json.dumps({"one_line_job_submit_s": round(one_job, 2), "one_line_service_s": round(one_svc, 2)}))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            subprocess.run([*CLI, "down", SWARM, "-y", "--force"], capture_output=True, env=env)


if __name__ == "__main__":
    main()
