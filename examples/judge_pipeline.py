"""Generate with one model, judge with another, keep the rows the judge passes.

    python examples/judge_pipeline.py --input examples/data/prompts.parquet --output /tmp/judged.parquet

Two stages of the ``pipeline`` flow, each a batch job on a swarm of its own, brought up for its stage
and stopped when its last row is answered:

1. ``generate`` answers each prompt (``--generator``, default examples/local-stub.yaml: two stub
   engines serving ``stub-model``);
2. ``judge`` is another model (``--judge``, default examples/local-judge.yaml: a stub engine serving
   ``stub-judge``). Its ``prompt_template`` names the question (``{prompt}``) and stage 1's answer
   (``{generate_text}``); it answers JSON following judge_verdict.json (``verdict``: pass or fail,
   ``reason``), one output column per field. ``keep`` lets only the rows it passes into the output.

The output holds the input columns and each stage's outputs as ``<stage>_<column>``
(``generate_text``, ``judge_verdict``, ``judge_reason``, ...); each stage's full output (every row,
with its status, error and tokens) stays in the pipeline's folder. A rerun resumes: a finished
stage sends nothing. The stub answers a verdict from a hash of the request, so about half the rows
pass; a real judge model decides from the text. Through a worker: the ``pipeline/on-demand``
deployment with ``stages(...)`` as its ``stages`` parameter (docs/pipeline.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prefect_swarm.flows import pipeline
from prefect_swarm.flows.params import SwarmArg

HERE = Path(__file__).resolve().parent

JUDGE_PROMPT = (
    "Question: {prompt}\n"
    "Answer: {generate_text}\n\n"
    "Is the answer correct and helpful? Reply with JSON: a verdict (pass or fail) and a one-sentence reason."
)


def stages(generator: SwarmArg, judge: SwarmArg) -> list[dict[str, Any]]:
    """The two stages: ``generator`` answers, ``judge`` judges; rows the judge fails are dropped."""
    return [
        {
            "name": "generate",
            "swarm": generator,
            "job": {
                "job": "chat",
                "id_column": "id",  # the ids go on with the rows: stage 2 keeps them
                "job_kwargs": {"prompt_column": "prompt", "sampling": {"max_tokens": 256, "temperature": 0.7}},
            },
        },
        {
            "name": "judge",
            "swarm": judge,
            "job": {
                "job": "chat",
                "job_kwargs": {
                    "prompt_template": JUDGE_PROMPT,
                    "response_schema": str(HERE / "judge_verdict.json"),
                    "sampling": {"max_tokens": 128, "temperature": 0},
                },
            },
            "keep": {"column": "verdict", "equals": "pass"},
        },
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="parquet file of prompts ('id', 'prompt' columns)")
    parser.add_argument("--output", required=True, help="output parquet file: the rows the judge passed")
    parser.add_argument("--generator", default="examples/local-stub.yaml", help="swarm of stage 1 (block or YAML)")
    parser.add_argument("--judge", default="examples/local-judge.yaml", help="swarm of stage 2 (block or YAML)")
    parser.add_argument("--overlap", action="store_true", help="bring the judge up while stage 1 runs")
    args = parser.parse_args(argv)
    result = pipeline(
        stages=stages(args.generator, args.judge), input=args.input, output=args.output, overlap=args.overlap
    )
    for s in result["stages"]:
        print(f"{s['stage']} ({s['model']}): {s['ok']}/{s['rows']} rows answered, {s['went_on']} went on")
    print(f"{result['rows']} rows passed the judge -> {result['output']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
