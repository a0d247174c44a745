"""Prefix affinity: rows/s with and without it, on simulated replicas with a prefix cache.

    python bench/prefix_affinity.py [--replicas 4] [--rows 12000] [--prefixes 8] [--prefix-words 600]
        [--cache-blocks 128] [--repeat 3]

The dataset: every row is one of ``prefixes`` long shared prefixes (``prefix-words`` words: a
system prompt with few-shot examples) followed by its own question. The replicas
(``prefect_swarm.testing.gpu_sim --prefix-cache``, pinned to core 0) cache ``cache-blocks`` blocks
of 16 tokens each (128: 2048 tokens, about three of the prefixes: a KV cache shared with the
running batch holds a few), and prefill every token they do not find cached (0.02 ms a token). One
job process (pinned to core 1, defaults: in flight sized from the replicas) runs the rows with
``prefix_affinity`` on, then off; the runs alternate. Reported: rows/s of the request phase (the
shard's progress file) and the replicas' prefix-cache hit rate (``vllm:prefix_cache_hits_total`` ÷
``vllm:prefix_cache_queries_total``), medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import SERVER_CPU, job_argv, run_pinned, spec_file  # noqa: E402
from scale import wait_healthy  # noqa: E402

from prefect_swarm.interfaces.metrics import parse, total  # noqa: E402
from prefect_swarm.testing import free_port_block  # noqa: E402

SIM = ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", "prefect_swarm.testing.gpu_sim"]


def prompts(path: Path, rows: int, prefixes: int, words: int) -> Path:
    shared = [" ".join(f"p{k}w{i}" for i in range(words)) for k in range(prefixes)]
    ids = [f"r{i:08d}" for i in range(rows)]
    text = [f"{shared[i % prefixes]} question {i} about a topic" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "prompt": text}), path)
    return path


def cache_rate(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        samples = parse(httpx.get(url + "/metrics", timeout=5).text)
        hits += total(samples, "vllm:prefix_cache_hits_total") or 0
        queries += total(samples, "vllm:prefix_cache_queries_total") or 0
    return hits, queries


def one_run(tmp: Path, src: Path, a: argparse.Namespace, affinity: bool, tag: str) -> dict[str, float]:
    base = free_port_block(a.replicas)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(a.replicas)]
    sims = [
        subprocess.Popen(
            [*SIM, "--port", str(base + i), "--prefix-cache", "--prefix-cache-blocks", str(a.cache_blocks)],
            stderr=subprocess.DEVNULL,
        )
        for i in range(a.replicas)
    ]
    try:
        wait_healthy(urls)
        job_dir = tmp / tag
        spec = spec_file(
            job_dir, src, urls[0], endpoints=urls, concurrency=None, job_kwargs={}, prefix_affinity=affinity
        )
        code, _, _ = run_pinned(job_argv(spec))
        assert code == 0, code
        progress = json.loads(next(job_dir.rglob("progress.json")).read_text())
        hits, queries = cache_rate(urls)
        return {
            "rows_s": a.rows / (progress["updated_at"] - progress["started_at"]),
            "cache_hit_rate": hits / max(queries, 1.0),
        }
    finally:
        for sim in sims:
            sim.terminate()
        for sim in sims:
            sim.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-words", type=int, default=600)
    ap.add_argument("--cache-blocks", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as d:
        tmp = Path(d)
        src = prompts(tmp / "in.parquet", a.rows, a.prefixes, a.prefix_words)
        for rep in range(a.repeat):
            for affinity in (True, False):
                res = one_run(tmp, src, a, affinity, f"{'on' if affinity else 'off'}-{rep}")
                runs[affinity].append(res)
                print(json.dumps({"affinity": affinity, "run": rep, **{k: round(v, 3) for k, v in res.items()}}))
    med = {
        aff: {k: statistics.median(r[k] for r in rs) for k in ("rows_s", "cache_hit_rate")} for aff, rs in runs.items()
    }
    print(
        json.dumps(
            {
                "median_on": med[True],
                "median_off": med[False],
                "gain": round(med[True]["rows_s"] / med[False]["rows_s"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
