"""Write a small sample dataset for batch jobs: parquet with ``id`` and ``prompt`` (and JSONL).

    python examples/data/make_prompts.py [--rows 1000] [--out examples/data/prompts.parquet] [--jsonl]

``--jsonl`` also writes the same rows in the OpenAI Batch input format (``prompts.jsonl``).
Then, on a swarm that is up::

    prefect-swarm job submit -n SWARM --input examples/data/prompts.parquet --output /tmp/answers.parquet \\
        --id-column id --shards 2 --job-kwargs '{"sampling": {"max_tokens": 32}}'
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TOPICS = [
    "the moon",
    "tea",
    "rivers",
    "prime numbers",
    "bicycles",
    "volcanoes",
    "owls",
    "glass",
    "maps",
    "bread",
]
ASKS = [
    "Explain {} to a child.",
    "Write a haiku about {}.",
    "Give three facts about {}.",
    "Why do people like {}?",
]


def prompts(n: int) -> list[str]:
    """``n`` varied prompts (deterministic)."""
    return [ASKS[i % len(ASKS)].format(TOPICS[(i // len(ASKS)) % len(TOPICS)]) for i in range(n)]


def main() -> None:
    """Write the files."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("prompts.parquet"))
    ap.add_argument("--jsonl", action="store_true")
    a = ap.parse_args()
    ids, texts = [f"q{i:06d}" for i in range(a.rows)], prompts(a.rows)
    pq.write_table(pa.table({"id": ids, "prompt": texts}), a.out)
    if a.jsonl:
        with a.out.with_suffix(".jsonl").open("w") as fh:
            for i, text in zip(ids, texts, strict=True):
                body = {"model": "MODEL", "messages": [{"role": "user", "content": text}], "max_tokens": 32}
                fh.write(json.dumps({"custom_id": i, "method": "POST", "url": "/v1/chat/completions", "body": body}))
                fh.write("\n")
    print(a.out)


if __name__ == "__main__":
    main()
