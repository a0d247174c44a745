"""Full CI runs of one commit, back to back, each on a fresh clone: the suite's flake rate and time.

    python scripts/ci_runs.py --runs 5                  # HEAD of this checkout, `.ci/run` five times
    python scripts/ci_runs.py --runs 2 --ref main --out /var/tmp/ci-runs

Each run clones the checkout into ``OUT/run-N/repo`` (``--ref`` checked out), runs ``.ci/run`` there
(``--command`` runs something else), and meanwhile samples the machine with psutil (run it with the
project's venv): its user, system and idle CPU over the run, and every process's CPU every second,
kept per process with its command line, so the run's CPU can be told by what used it. It prints a
Markdown row per run -- pytest's summary line, pytest's and the whole run's seconds, CPU seconds and
how busy the cores were -- and writes ``OUT/run-N/summary.json`` and ``OUT/run-N/processes.json``.
The clone is removed after its run unless ``--keep``. Run it with nothing else on the machine: the
suite is CPU-bound, so anything beside it shows in its time.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*) in ([\d.]+)s")
TOTAL = re.compile(r"^\[ci\] total (\d+) s")
CONSOLE_SCRIPTS = {
    target.split(":")[0]: name
    for name, target in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].items()
}
"""The package's console scripts by module (``prefect_swarm.cli.main`` -> ``prefect-swarm``): a command
run as ``python -m MODULE`` and as its script is one kind."""


class ProcessSampler(threading.Thread):
    """Every process's CPU (user + system), once a second, per (pid, start time) with its command
    line; a process's CPU before the sampler started is not counted."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[tuple[int, float], list] = {}  # -> [command, cpu at first sight or 0, cpu now]
        self.stop = threading.Event()

    def sample(self, first: bool) -> None:
        for proc in psutil.process_iter(["name", "create_time", "cpu_times"]):
            times = proc.info["cpu_times"]
            if times is None:
                continue  # gone meanwhile, or not ours to read
            cpu, key = times.user + times.system, (proc.pid, proc.info["create_time"])
            if key in self.seen:
                self.seen[key][2] = cpu
                continue
            try:
                cmd = " ".join(proc.cmdline())[:400] or f"({proc.info['name']})"
            except psutil.Error:
                continue
            self.seen[key] = [cmd, cpu if first else 0.0, cpu]

    def run(self) -> None:
        self.sample(first=True)
        while not self.stop.wait(1.0):
            self.sample(first=False)

    def used(self) -> list[dict]:
        return [
            {"pid": pid, "cmd": cmd, "cpu_s": round(now - base, 2)}
            for (pid, _), (cmd, base, now) in self.seen.items()
            if now - base > 0
        ]


def kind(cmd: str) -> str:
    """What a process was, from its command line: ``-m module``, the script it runs, or the program."""
    if "exec(eval(sys.stdin" in cmd:
        return "pytest worker (tests run in it)"
    module = re.search(r" -m ([\w.]+)", cmd)
    if module:
        name = module.group(1)
        return name.split(".")[0] if name.startswith("vllm") else CONSOLE_SCRIPTS.get(name, name)
    parts = cmd.split()
    if not parts:
        return "?"
    if "spawn_main" in cmd:
        return "vllm (engine core)" if "vllm" in cmd else "multiprocessing child"
    if Path(parts[0]).name.startswith("python") and len(parts) > 1:
        return Path(parts[1]).name if parts[1] != "-c" else "python -c"
    return Path(parts[0]).name


def one_run(n: int, args: argparse.Namespace) -> dict:
    here = args.out / f"run-{n}"
    repo = here / "repo"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", str(args.source), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "--quiet", args.ref], check=True)
    commit = subprocess.run(
        ["git", "-C", str(repo), "log", "--oneline", "-1"], capture_output=True, text=True, check=True
    ).stdout.strip()
    sampler = ProcessSampler()
    sampler.start()
    before, t0 = psutil.cpu_times(), time.monotonic()
    with open(here / "ci.log", "w") as log:
        rc = subprocess.run(["bash", "-c", args.command], cwd=repo, stdout=log, stderr=subprocess.STDOUT).returncode
    wall, after = time.monotonic() - t0, psutil.cpu_times()
    sampler.stop.set()
    sampler.join()
    d = {field: getattr(after, field) - getattr(before, field) for field in after._fields}
    user, system, idle = d["user"] + d["nice"], d["system"] + d["irq"] + d["softirq"], d["idle"] + d["iowait"]
    summary, pytest_s, total_s = "", None, None
    for line in (here / "ci.log").read_text(errors="replace").splitlines():
        if m := SUMMARY.match(line):
            summary, pytest_s = m.group(1).strip(" ="), float(m.group(2))
        elif m := TOTAL.match(line):
            total_s = int(m.group(1))
    used = sampler.used()
    by_kind: Counter[str] = Counter()
    for proc in used:
        by_kind[kind(proc["cmd"])] += proc["cpu_s"]
    result = {
        "run": n,
        "commit": commit,
        "rc": rc,
        "pytest_summary": summary,
        "pytest_s": pytest_s,
        "total_s": total_s,
        "wall_s": round(wall),
        "cpu_user_s": round(user),
        "cpu_system_s": round(system),
        "cpu_busy_share": round((user + system) / max(user + system + idle, 1e-9), 3),
        "cpu_by_kind": {k: round(v, 1) for k, v in by_kind.most_common(15)},
    }
    (here / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    (here / "processes.json").write_text(json.dumps(used) + "\n")
    if not args.keep:
        shutil.rmtree(repo, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs, one after another")
    ap.add_argument("--ref", default="HEAD", help="the commit to run (default: this checkout's HEAD)")
    ap.add_argument("--source", type=Path, default=ROOT, help="the repository to clone (default: this one)")
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/prefect-swarm-ci-runs"), help="where runs go")
    ap.add_argument("--command", default=".ci/run", help="what each run runs in its clone")
    ap.add_argument("--keep", action="store_true", help="keep each clone")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: give 1 or more")
    ref = subprocess.run(
        ["git", "-C", str(args.source), "rev-parse", "--verify", "--quiet", f"{args.ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if ref.returncode != 0:
        ap.error(f"--ref {args.ref}: not a commit of {args.source} (try HEAD, a branch or a commit id)")
    args.ref = ref.stdout.strip()
    print("| run | commit | rc | pytest | pytest s | run s | user+system CPU s | cores busy |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for n in range(1, args.runs + 1):
        r = one_run(n, args)
        failed += r["rc"] != 0
        print(
            f"| {n} | {r['commit'][:7]} | {r['rc']} | {r['pytest_summary'] or '-'} | {r['pytest_s'] or '-'} "
            f"| {r['total_s'] or r['wall_s']} | {r['cpu_user_s'] + r['cpu_system_s']} | {r['cpu_busy_share']:.0%} |",
            flush=True,
        )
    print(f"{args.runs - failed} of {args.runs} runs passed; details in {args.out}/run-N/summary.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
