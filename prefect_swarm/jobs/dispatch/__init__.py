"""How rows reach replicas: the async request loop (``runner``), the in-flight limit per replica
(``control``), the requests-per-minute limit (``ratelimit``), identical requests sent once and the
response cache (``cache``), the shard's ``/metrics`` (``metrics``) and the JSON codec of the hot path
(``fastjson``). It writes finished rows through the checkpoint (``jobs.checkpoint``).
"""
