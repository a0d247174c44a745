"""The NVIDIA DGX Cloud Lepton backend: ``config`` holds its config models and its entry in the table of
backends, ``client`` wraps the leptonai SDK (imported lazily, an optional extra), ``serving`` manages
the endpoint (deployment), ``compute`` runs one batch job per shard."""
