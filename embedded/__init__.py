"""The embedded models that need no download: the tiny tokenizer and Qwen3-architecture model (tiny.py) and
the behaviour-cloning warm start that builds `tiny-agent` from it (warmstart.py, which also resolves both
names)."""
