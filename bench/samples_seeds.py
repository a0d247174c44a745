"""Answers/s of ``samples: N, samples_by: seeds`` (N requests per row, one after another on a request
slot) beside N x as many one-answer rows, at the job's default concurrency, on the GPU-like simulator
(``prefect_swarm.testing.gpu_sim``: capacity grows with the batch up to ``max_num_seqs``; it does not
serve OpenAI's ``n``, as an engine for which ``seeds`` is meant).

    python bench/samples_seeds.py [--rows 2000] [--samples 4] [--max-num-seqs 128] [--repeat 3]

Both jobs send the same number of requests; a ratio near 1 says the sequential sub-requests leave
the replica no emptier than independent rows do (the in-flight controller fills it either way).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from _common import SERVER_CPU, dataset, job_argv, median, run_pinned, spec_file

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine


def answers_per_s(tmp: Path, url: str, rows: int, samples: int, name: str) -> float:
    src = dataset(tmp / f"in-{rows}.parquet", rows)
    kwargs = {"sampling": {"max_tokens": 16}, **({"samples": samples, "samples_by": "seeds"} if samples > 1 else {})}
    spec = spec_file(tmp / name, src, url, job_kwargs=kwargs)
    data = json.loads(spec.read_text())
    del data["concurrency"]  # the defaults: the in-flight controller sizes it from the replica's metrics
    spec.write_text(json.dumps(data))
    code, wall, _ = run_pinned(job_argv(spec))
    if code != 0:
        raise SystemExit(f"{name}: the job exited {code}")
    shutil.rmtree(tmp / name)
    return rows * samples / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000, help="rows of the samples job (the other has N x as many)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="psw-samples-"))
    sim = StubEngine(
        free_port(), module="prefect_swarm.testing.gpu_sim", cpu=SERVER_CPU, max_num_seqs=args.max_num_seqs
    )
    sim.start(timeout_s=60)
    try:
        seeds, plain = [], []
        for _ in range(args.repeat):  # alternate, so drift hits both
            seeds.append(answers_per_s(tmp, sim.url, args.rows, args.samples, "seeds"))
            plain.append(answers_per_s(tmp, sim.url, args.rows * args.samples, 1, "plain"))
        s, p = median(seeds), median(plain)
        print(f"{args.samples} seeded requests per row, {args.rows} rows: {s:.0f} answers/s (median of {args.repeat})")
        print(f"one answer per row, {args.rows * args.samples} rows:   {p:.0f} answers/s")
        print(f"ratio seeds / one-answer rows: {s / p:.2f}")
    finally:
        sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
