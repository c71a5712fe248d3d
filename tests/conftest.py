"""Shared test set-up: the embedded tiny model is built once per session in a temporary cache,
never in $HOME."""
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SMRC_CACHE", str(Path(tempfile.gettempdir()) / "smrc-test-cache"))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the embedded tiny Qwen3, loaded through from_pretrained."""
    import torch
    from embedded.warmstart import resolve
    from models import load_model
    torch.manual_seed(0)
    return load_model(resolve("tiny"))


@pytest.fixture(scope="session")
def quick_agent() -> str:
    """tiny-agent-quick's folder, built in this worker on all its torch threads before a test needs it. The
    tests run smrc.py on one torch thread, so a build started there took twice as long while the other worker
    waited for it (the build gives the same bytes on 1 and 2 threads). Used by the files that run it."""
    from embedded.warmstart import resolve
    return resolve("tiny-agent-quick")
