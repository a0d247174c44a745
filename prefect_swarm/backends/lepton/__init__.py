"""The NVIDIA DGX Cloud Lepton backend: ``client`` wraps the leptonai SDK (imported lazily, an
optional extra), ``serving`` manages the endpoint (deployment), ``compute`` runs one batch job per
shard."""
