"""Save a SwarmSpec block from a swarm config file: what the UI's "Swarm Spec" form makes, from Python.

    python examples/swarm_spec_block.py --config examples/local-stub.yaml --name local-stub

Needs a Prefect API (``PREFECT_API_URL``) on which ``prefect block register -m prefect_swarm``
ran. The block holds the config's values, not its path, so a worker on another host (or in a
temporary folder) loads the same swarm; secrets (an API key, a Lepton token) are stored as the
block's secret fields. Runs then take ``swarm=swarm-spec/NAME`` (or pick it in the run form).
"""

from __future__ import annotations

import argparse

from prefect_swarm.blocks import SwarmSpec
from prefect_swarm.config import load_config


# --8<-- [start:main]
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a swarm config YAML (prefect-swarm validate -c FILE checks it)")
    ap.add_argument("--name", required=True, help="the block's name: runs refer to swarm-spec/NAME")
    ap.add_argument("--overwrite", action="store_true", help="replace a block of that name")
    args = ap.parse_args()
    cfg = load_config(args.config)  # validated here, with this machine's defaults and environment
    SwarmSpec.from_config(cfg).save(args.name, overwrite=args.overwrite)
    print(f"saved swarm-spec/{args.name}: {cfg.replicas} x {cfg.model} on {cfg.backend.type}")


# --8<-- [end:main]


if __name__ == "__main__":
    main()
