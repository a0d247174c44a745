"""A flow of your own on a swarm: hold it, ask it directly, run a batch job on it, let go.

    python examples/own_flow.py --swarm examples/local-stub.yaml --input examples/data/prompts.parquet \\
        --output /tmp/answers.parquet

``hold_swarm`` brings the swarm up (or shares it with whoever holds it already), waits until every
replica answers, yields where to send requests (a ``LiveSwarm``), and lets go of it however the
body ends: the swarm stops unless another run, a job or ``prefect-swarm up`` still holds it. The
``run_job`` flow runs a batch job on it as a subflow (sharded, checkpointed, committed). The hooks
let go of the swarm when the run is cancelled or crashes (a ``finally`` does not run then).

Deployed like any flow of yours (``own_flow.from_source(...).deploy(...)``, or ``prefect deploy``
with the entrypoint ``examples/own_flow.py:own_flow``); docs/own-flow.md walks through it.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
from prefect import flow, task

from prefect_swarm.flows import run_job
from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import JobArg, SwarmArg
from prefect_swarm.tasks.swarm import LiveSwarm, hold_swarm


@task
def ask(live: LiveSwarm, question: str) -> str:
    """One chat completion, sent straight to the swarm's OpenAI-compatible endpoint."""
    resp = httpx.post(
        f"{live.endpoint}/v1/chat/completions",
        headers=live.headers,
        json={"model": live.model, "messages": [{"role": "user", "content": question}], "max_tokens": 32},
        timeout=60,
    )
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"])


@flow(name="own-flow", on_cancellation=[teardown_hook], on_crashed=[teardown_hook])
def own_flow(
    swarm: SwarmArg, input: str, output: str, job: JobArg = "chat", question: str = "Say hello."
) -> dict[str, Any]:
    """Hold ``swarm`` (a SwarmSpec block or its name, a YAML path, an inline config), ask it
    ``question``, run ``job`` over ``input`` into ``output``, and let go of the swarm."""
    with hold_swarm(swarm) as live:
        answer = ask(live, question)
        result = run_job(name=live.name, job=job, input=input, output=output)
    return {"swarm": live.name, "answer": answer, "rows": result["rows"], "ok": result["ok"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swarm", required=True, help="SwarmSpec block name, YAML path or inline config")
    parser.add_argument("--input", required=True, help="parquet file of prompts ('id', 'prompt' columns)")
    parser.add_argument("--output", required=True, help="output parquet file")
    args = parser.parse_args(argv)
    result = own_flow(swarm=args.swarm, input=args.input, output=args.output)
    print(f"swarm {result['swarm']}: {result['ok']}/{result['rows']} rows ok; it said: {result['answer']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
