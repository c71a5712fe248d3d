"""Multi-process training on CPU (gloo): gradients equal to one process (ranks that differ in distilled
turns), kill and resume, the process group destroyed on exit. The torchrun runs of the engine x strategy
matrix are in tests/test_ranks.py.

Run: pytest tests/test_dist.py -q   (about 3 minutes on 2 cores)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as td
import torch.multiprocessing as tmp_mp

import grpo
from fakes import GradRecorder, sample
from grpo import GRPOConfig
from scale.distributed import World, close, init_distributed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
FAST = ["--preset", "tiny", "--rollout.tasks-per-step", "2", "--rollout.group-size", "2",
        "--alfworld.max-steps", "3", "--alfworld.num-workers", "1"]


def _samples():
    g = torch.Generator().manual_seed(3)
    return [sample(torch.randint(3, 500, (n,), generator=g).tolist(),
                   torch.randint(3, 500, (r,), generator=g).tolist(), a, [-7.0] * r,
                   [-6.5] * r if i % 2 else None)
            for i, (n, r, a) in enumerate([(5, 3, 1.0), (9, 6, -1.0), (17, 2, 0.5), (4, 8, -0.2),
                                           (12, 5, 2.0), (7, 7, -0.7)])]


def _grads(model, samples, world=None):
    """The update's gradient, over micro-batches of at most 32 padded tokens (several per rank: the
    gradient is synced on the last one only)."""
    opt = GradRecorder(model.parameters())
    cfg = GRPOConfig(kl_coef=0.0, max_grad_norm=1e9, sd_loss="reverse-kl", sd_coef=1.0, micro_batch_tokens=32)
    grpo.update(model, opt, samples, cfg, pad_id=0, world=world)
    full = [g.full_tensor() if hasattr(g, "full_tensor") else g  # FSDP: a DTensor shard
            for g in (p.last_grad for p in grpo_module(model).parameters())]
    return torch.cat([g.flatten() for g in full])


def grpo_module(model):
    return getattr(model, "module", model)


def _distil_then_grads(model, samples, world=None):
    """What a step does with a rank's turns: the teacher (smrc.teacher_logprob_fn, the transformers backend)
    re-scores the distilled ones (those with teacher log-probs) under a longer, privileged prompt, on this
    rank alone and only if it has any; then the update's gradient."""
    from types import SimpleNamespace
    import smrc
    cfg = smrc.parse_config(["--preset", "tiny"])
    fn = smrc.teacher_logprob_fn(cfg, SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=0)))
    distilled = [s for s in samples if s.teacher_logprobs is not None]
    if distilled:
        prompts = [[7, 8, 9, 10] + s.prompt_ids for s in distilled]  # a longer, privileged prompt
        scored = fn(prompts, [s.response_ids for s in distilled], None)
        for s, lp in zip(distilled, scored):
            s.teacher_logprobs = lp
    return _grads(model, samples, world)


def _rank_main(rank, port, model_dir, out):
    """Both 2-rank checks in one spawn (a spawn costs ~15 s): DDP gradients with the teacher on one rank, then
    FSDP's sharded reference and the weight stream."""
    from datetime import timedelta
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    td.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))  # fail, not hang
    from transformers import AutoModelForCausalLM
    from scale.distributed import wrap
    model = wrap(AutoModelForCausalLM.from_pretrained(model_dir), World(rank=rank, world_size=2), "ddp")
    g = _distil_then_grads(model, _samples()[rank::2], World(rank=rank, world_size=2))
    torch.save(g, Path(out) / f"grad{rank}.pt")
    _fsdp_part(rank, model_dir, out)
    td.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The folder where the two spawned ranks of `_rank_main` left their results."""
    from embedded.warmstart import resolve
    out = tmp_path_factory.mktemp("two_ranks")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp_mp.start_processes(_rank_main, args=(port, resolve("tiny"), str(out)), nprocs=2, start_method="spawn")
    return out


def test_gradients_split_over_two_ranks_equal_one_process(tiny, two_ranks):
    """Rank 1 holds every distilled turn and runs the teacher; rank 0 has none and runs no teacher pass (the
    case that hung: the teacher's forward through DDP broadcast buffers on one rank only)."""
    model, _ = tiny
    samples = _samples()
    assert all(s.teacher_logprobs is None for s in samples[0::2])
    assert all(s.teacher_logprobs is not None for s in samples[1::2])
    single = _distil_then_grads(__import__("copy").deepcopy(model), samples)
    g0, g1 = torch.load(two_ranks / "grad0.pt"), torch.load(two_ranks / "grad1.pt")
    # DDP all-reduced: every rank holds the same gradient
    assert torch.equal(g0, g1)
    # and it is the single-process gradient of the batch
    assert torch.allclose(g0, single, rtol=1e-4, atol=1e-7)


def _torchrun(*args, **kw):
    from embedded.warmstart import resolve
    # the tiny preset's model, built here once: the timed torchrun run only loads it
    resolve("tiny-agent-quick")
    return subprocess.Popen([*TORCHRUN, str(ROOT / "smrc.py"), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_killed_two_process_run_resumes_from_its_checkpoint(tmp_path):
    """With one task group a step over 2 ranks (the documented uneven shard: rank 1 holds none, yet joins
    every collective), through a kill and a resume."""
    args = [*FAST, "--rollout.tasks-per-step", "1", "--steps", "8", "--save-every", "1"]
    proc = _torchrun(*args, "--output-dir", str(tmp_path))
    deadline = time.time() + 600
    while not (tmp_path / "step_000002").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, "run ended before it could be killed: " + proc.communicate()[0][-3000:]
    # the whole job, no clean-up: torchrun and every rank (ranks run in their own sessions; their command
    # lines name this run's unique output dir)
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
    proc.wait()
    time.sleep(1)
    latest = tmp_path / (tmp_path / "latest").read_text().strip()
    done = int(latest.name.split("_")[1])
    # 'latest' only ever names a complete save
    assert 2 <= done < 8 and (latest / "trainer_state.pt").exists()
    resumed = _torchrun(*args, "--resume", "--output-dir", str(tmp_path))
    log = resumed.communicate(timeout=900)[0]
    assert resumed.returncode == 0, log[-4000:]
    assert ("[smrc] --rollout.tasks-per-step 1 over 2 ranks: a rank holds 0 or 1 task groups; ranks 1..1 "
            "hold none") in log
    assert f"steps {done}->8" in log, [x for x in log.splitlines() if "[smrc]" in x]
    assert [r["step"] for r in _rows(tmp_path)] == list(range(1, 9))  # no step lost, none logged twice
    assert (tmp_path / "latest").read_text().strip() == "step_000008"
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_close_destroys_the_group_init_distributed_started(monkeypatch):
    """Also a one-process torchrun group (world size 1): on CUDA,
    NCCL warns about leaked resources otherwise."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    world = init_distributed("cpu")
    assert td.is_initialized() and world.owns_process_group and not world.enabled
    close(world)
    assert not td.is_initialized()


def _fsdp_part(rank, model_dir, out):
    from transformers import AutoModelForCausalLM
    from scale.distributed import stream_weights, wrap, wrap_frozen
    world = World(rank=rank, world_size=2)
    policy = wrap(AutoModelForCausalLM.from_pretrained(model_dir), world, "fsdp")
    ref = wrap_frozen(AutoModelForCausalLM.from_pretrained(model_dir).requires_grad_(False), world, "fsdp")
    local = {name: sum(p.to_local().numel() for p in m.parameters()) for name, m in (("policy", policy),
                                                                                     ("ref", ref))}
    streamed = {k: (v.dtype, v.clone()) for k, v in stream_weights(policy, torch.bfloat16)}
    grads = _grads(policy, _samples()[rank::2], world)  # the samples' own teacher log-probs
    torch.save({"local": local, "total": sum(p.numel() for p in ref.parameters()), "streamed": streamed,
                "grads": grads}, Path(out) / f"fsdp{rank}.pt")


def test_fsdp_shards_the_reference_and_streams_full_tensors_in_the_engine_dtype(tiny, two_ranks):
    """Under FSDP the frozen KL reference is sharded like the policy (each rank holds about half of it), the
    weight sync's stream gives every tensor in full, in the engine's dtype, one at a time, and the gradient
    equals one process's."""
    model, _ = tiny
    tmp_path = two_ranks
    ranks = [torch.load(tmp_path / f"fsdp{r}.pt") for r in (0, 1)]
    total = ranks[0]["total"]
    for r in ranks:
        assert r["local"]["ref"] == r["local"]["policy"] < 0.6 * total  # a shard, not a full copy
    assert sum(r["local"]["ref"] for r in ranks) >= total
    expected = model.state_dict()
    for r in ranks:
        assert set(r["streamed"]) == set(expected)
        for k, (dtype, v) in r["streamed"].items():
            assert dtype == torch.bfloat16 and torch.equal(v, expected[k].to(torch.bfloat16)), k
    # the gradient, reduce-scattered on each mini-batch's last micro-batch only, is the one-process gradient
    single = _grads(__import__("copy").deepcopy(model), _samples())
    assert torch.equal(ranks[0]["grads"], ranks[1]["grads"])
    assert torch.allclose(ranks[0]["grads"], single, rtol=1e-4, atol=1e-7)


def test_lines_every_rank_prints_alike_come_from_rank_0_only(monkeypatch, capsys):
    """scale.distributed.rank0_stdout: the tasks' lines before the process group exists, once under torchrun
    (RANK 0, or no RANK: a plain run), none on the other ranks; an error still leaves every rank."""
    from scale.distributed import rank0_stdout
    for rank, shown in ((None, True), ("0", True), ("1", False)):
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        with rank0_stdout():
            print("alfworld generated train: 2 of 2 games")
        assert ("alfworld generated train" in capsys.readouterr().out) == shown, rank
    with pytest.raises(SystemExit, match="error: no games"), rank0_stdout():
        raise SystemExit("error: no games")
