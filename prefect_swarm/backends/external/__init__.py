"""The external backend: a swarm that is an OpenAI-compatible endpoint someone else runs."""
