"""The teacher at scale, hf against vLLM, on the same distilled turns (issue 63, item 7): time and peak memory
per distilled turn, and the null-context error of Δ each backend gives.

A random Qwen3 with the real vocabulary (151,936: the full-vocabulary head is what prompt_logprobs pays for at
every prompt position) and a reduced body (`--hidden`, `--layers`), saved with the tiny tokenizer (token ids
drawn within it), scored at a teacher prompt length of `--prompt-tokens` and `--response-tokens` response
tokens, `--turns` turns:
- hf: `teacher.hf_logprob_fn` (the lm_head and log-softmax on response positions only, micro-batched);
- vllm: `VLLMEngine.score_logprobs` (prompt_logprobs: a float32 log-softmax at every prompt position).
Peak memory is the process's resident high-water mark above its size before the call (scale/memory.py).
Null context: the teacher prompt is the student's; Δ's error is max |log π_T − log π_θ| over the tokens, π_θ
the trainer's scoring path (models.score_rows, other micro-batches): for hf directly; for vLLM both as it was
(vLLM's π_T against the trainer's π_θ) and as composed now ((π_T − π_old) on vLLM + (π_old − π_θ) on the
trainer, teacher.base_logprobs).

    VLLM_CPU_KVCACHE_SPACE=2 python bench/teacher_scale.py --json bench/results/teacher_scale/cpu.json
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import teacher  # noqa: E402
from embedded.warmstart import resolve  # noqa: E402
from models import SamplingConfig, load_tokenizer, micro_batches, score_rows  # noqa: E402
from scale.memory import _status_kib, peak_bytes, reset_peak  # noqa: E402

CPU = torch.device("cpu")


def build(folder: Path, hidden: int, layers: int, seed: int):
    """A random float32 Qwen3 of the real vocabulary, saved with the tiny tokenizer's files."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from scale.memory_plan import PUBLIC
    values = {**PUBLIC["Qwen/Qwen3-1.7B"], "hidden_size": hidden, "intermediate_size": 3 * hidden,
              "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": hidden // 4}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values), dtype=torch.float32).eval()
    model.save_pretrained(folder)
    tiny = Path(resolve("tiny"))
    for f in tiny.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            shutil.copy(f, folder / f.name)
    return model


def measured(fn):
    """(result, seconds, peak resident bytes above the size before the call)."""
    before = _status_kib("VmRSS") * 1024
    reset_peak(CPU)
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, peak_bytes(CPU) - before


def max_abs(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=2048, help="teacher prompt length")
    ap.add_argument("--response-tokens", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384, help="hf teacher (--teacher.*)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    folder = Path(tempfile.mkdtemp(prefix="teacher_scale_"))
    model = build(folder, args.hidden, args.layers, args.seed)
    tok = load_tokenizer(str(folder))
    g = torch.Generator().manual_seed(args.seed)
    ids = lambda n: torch.randint(3, len(tok), (n,), generator=g).tolist()  # noqa: E731
    prompts = [ids(args.prompt_tokens) for _ in range(args.turns)]
    responses = [ids(args.response_tokens) for _ in range(args.turns)]
    pad = tok.pad_token_id
    chunks = micro_batches([len(p) + len(r) for p, r in zip(prompts, responses)], args.micro_batch_tokens)
    trainer = score_rows(model, prompts, responses, [[i] for i in range(args.turns)], pad)  # π_θ, one a batch
    hf_fn = teacher.hf_logprob_fn(model, pad, args.micro_batch_tokens)
    with torch.no_grad():
        hf, hf_s, hf_peak = measured(lambda: hf_fn(prompts, responses, None))
    from scale.vllm_engine import VLLMEngine, engine_limits
    engine = VLLMEngine(str(folder), tok, SamplingConfig(max_new_tokens=1), dtype="float32", seed=args.seed,
                        limits=engine_limits(args.prompt_tokens, args.response_tokens, args.turns))
    engine.score_logprobs(prompts[:1], responses[:1])  # warm-up (first-call compilation)
    vl, vl_s, vl_peak = measured(lambda: engine.score_logprobs(prompts, responses))
    base = engine.score_logprobs(prompts, responses)  # the student's prompt on vLLM: the same, null context
    composed = [[t - b + o for t, b, o in zip(rt, rb, ro)] for rt, rb, ro in zip(vl, base, trainer)]
    engine.shutdown()
    gib = 2 ** 30
    result = {"settings": vars(args) | {"vocab": model.config.vocab_size, "hf_micro_batches": len(chunks)},
              "hf": {"s_per_turn": hf_s / args.turns, "peak_gib": hf_peak / gib,
                     "null_delta_max": max_abs(hf, trainer)},
              "vllm": {"s_per_turn": vl_s / args.turns, "peak_gib": vl_peak / gib,
                       "null_delta_max_uncomposed": max_abs(vl, trainer),
                       "null_delta_max_composed": max_abs(composed, trainer)}}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
