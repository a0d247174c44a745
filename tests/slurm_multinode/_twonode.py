"""Helpers of the multi-node Slurm tests (imported as ``_twonode``): the two-node test cluster of
scripts/slurm/two-node-up.sh, as the tests see it."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "slurm"
NODES = ("node1", "node2")


@dataclass(frozen=True)
class TwoNodeCluster:
    """Where the running two-node cluster lives and how to talk to it."""

    root: Path
    """SLURM_2NODE_DIR: slurm.conf, logs, run/<machine>.pid (PID 1 of each machine's namespaces)."""

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the two-node cluster."""
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf"), "SLURM_2NODE_DIR": str(self.root)}

    def slurm(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; raises with its stderr when it fails."""
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def address(self, node: str) -> str:
        """The node's address on the cluster's bridge (from the hosts file every node sees)."""
        for line in (self.root / "hosts").read_text().splitlines():
            fields = line.split()
            if fields[1:] == [node]:
                return fields[0]
        raise KeyError(f"{node} not in {self.root / 'hosts'}")

    def node_pids(self, node: str) -> list[int]:
        """PIDs (as the root namespace sees them) of every process running on ``node``."""
        init = int((self.root / "run" / f"{node}.pid").read_text())
        ns = os.readlink(f"/proc/{init}/ns/pid")
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "pid") == ns:
                        pids.append(int(entry.name))
                except OSError:  # gone meanwhile
                    continue
        return pids

    def processes(self, node: str, pattern: re.Pattern[bytes], width: int = 200) -> list[str]:
        """Command lines (cut to ``width``) of the processes on ``node`` that match ``pattern``."""
        found = []
        for pid in self.node_pids(node):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if pattern.search(cmdline):
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:width])
        return found
