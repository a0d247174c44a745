"""Processes that live next to replicas and jobs: the replica watchdog, the exit-code wrapper.

Each is a small ``python -m prefect_swarm.sidecar.<name>`` program with no Prefect dependency.
"""
