"""The checkpoint: each shard's ledger of finished rows (``ledger``), the job's fingerprint that a
resume must match (``fingerprint``), which shards are pending and how far each got (``plan``), and
the summary of failed rows (``failures``). It reads the input and storage (``jobs.rows``), never the
request loop (``jobs.dispatch``).
"""
