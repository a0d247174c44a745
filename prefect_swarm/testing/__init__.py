"""Fakes shipped for users' tests and ours: a stub OpenAI engine, a fake Lepton API, helpers.

Nothing here is used in production paths.
"""
