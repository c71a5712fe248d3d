"""Shared test set-up: the embedded tiny model is built once per session in a temporary cache,
never in $HOME."""
import os
import subprocess
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
    """tiny-agent-quick's folder, built before a test needs it, in a child process on all the cores. The tests
    run smrc.py on one torch thread, so a build started there took twice as long while the other worker waited
    for it (the build gives the same bytes on 1 and 2 threads); a child, not this worker, so that the worker's
    memory stays as small as a test expects (test_memory's peaks). Used by the files that run it."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    code = "from embedded.warmstart import resolve; print(resolve('tiny-agent-quick'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]
