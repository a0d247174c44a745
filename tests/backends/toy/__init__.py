"""The toy backend: replicas as processes on this machine, like ``local``, under a name and a field of its own.

Built from CONTRIBUTING.md's "Adding a backend" recipe by ``tests/backends/test_toy_backend.py``, which
copies this folder to ``prefect_swarm/backends/toy/`` in a copy of the package and lists it in the table.
"""
