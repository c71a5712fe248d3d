"""Rollout throughput: the vLLM engine against the transformers engine on the same prompts, plus weight-sync
time.

One run on one model (default: the embedded tiny model): both engines sample the same ALFWorld-style turn
prompts (chat template applied) at batch sizes 8 and 64 for exactly `max_new_tokens` tokens each (vLLM:
ignore_eos; HF: min_new_tokens = max_new_tokens), after one warm-up call each; HF is timed before vLLM starts
in the process (vLLM's start-up binds this process's threads). Generated tokens are counted, not assumed.
Also: the time of one `sync_weights`, and the gap between vLLM's sampling log-probs and the trainer's (float32
and bfloat16 vLLM against the float32 trainer).

Run from the repository root: VLLM_CPU_KVCACHE_SPACE=2 python bench/bench_rollout.py [--max-new-tokens 64]
"""

import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# the project's modules, however the script is started
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import tyro  # noqa: E402

import envs  # noqa: E402
from embedded.warmstart import resolve  # noqa: E402
from models import HFEngine, SamplingConfig, chat_ids, collate, load_model, token_logprobs  # noqa: E402
from rollout import RolloutConfig  # noqa: E402
from scale.vllm_engine import VLLMEngine, engine_limits, logprob_gap  # noqa: E402


@dataclass
class Args:
    model: str = "tiny"
    """model name or directory (tiny, tiny-agent, a hub id or a directory)"""
    batch_sizes: tuple[int, ...] = (8, 64)
    """prompts per generate call"""
    max_new_tokens: int = 64
    """tokens generated per prompt (EOS ignored by both engines)"""
    repeats: int = 5
    """timed calls per (engine, batch size) after one warm-up call"""
    gap_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    """vLLM dtypes whose sampling log-probs are compared with the float32 trainer"""
    seed: int = 0


def alfworld_prompts(tokenizer, n: int) -> list[list[int]]:
    """n chat-templated ALFWorld turn prompts (a few distinct turns, cycled), as the trainer sends them."""
    obs = ["You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
           "a countertop 1, a fridge 1, a microwave 1, a sinkbasin 1, and a stoveburner 1.",
           "You arrive at cabinet 1. The cabinet 1 is closed.",
           "You open the fridge 1. In it, you see an apple 1."]
    actions = [["go to cabinet 1", "go to countertop 1", "go to fridge 1", "look", "inventory"],
               ["open cabinet 1", "go to fridge 1", "look"], ["take apple 1 from fridge 1", "close fridge 1"]]
    texts = [envs.build_prompt("alfworld", "put a clean apple in fridge", [(obs[0], "go to cabinet 1")][:i],
                               i, obs[i], actions[i], history_length=2) for i in range(3)]
    ids = [chat_ids(tokenizer, t) for t in texts]
    return [ids[i % len(ids)] for i in range(n)]


def timed(generate, prompts, repeats) -> dict:
    """Wall and CPU seconds per call (after a warm-up). On a shared machine the best wall time and the CPU
    time of this process (all its threads) are the stable numbers; the median wall time is shown beside
    them."""
    generate(prompts)  # warm-up (first-call kernel set-up, allocator growth)
    wall, cpu, tokens = [], [], 0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        gens = generate(prompts)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        tokens = sum(len(g.response_ids) for g in gens)
    return dict(tokens=tokens, best_s=min(wall), median_s=sorted(wall)[len(wall) // 2],
                cpu_s=sum(cpu) / len(cpu))


def limits(args) -> dict:
    """vLLM sized as a training run sizes it (smrc.vllm_limits): the default prompt budget, the response, the
    largest batch measured."""
    return engine_limits(RolloutConfig().max_prompt_tokens, args.max_new_tokens, max(args.batch_sizes))


def logprob_gap_for(dtype: str, model, tokenizer, prompts, args) -> dict:
    engine = VLLMEngine(resolve(args.model), tokenizer, SamplingConfig(max_new_tokens=args.max_new_tokens),
                        dtype=dtype, seed=args.seed, limits=limits(args))
    engine.sync_weights(model)
    gens = engine.generate(prompts)
    batch = collate(prompts, [g.response_ids for g in gens], tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(model.eval(), batch)
    gap = logprob_gap(gens, [logp[i, :len(g.response_ids)].tolist() for i, g in enumerate(gens)])
    engine.shutdown()
    return gap


def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    model, tok = load_model(resolve(args.model))
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens)
    hf = HFEngine(model, tok, cfg, batch_size=max(args.batch_sizes))
    # HFEngine passes its own arguments to generate; this forces the full length
    # so both engines do the same work
    model.generate = partial(model.generate, min_new_tokens=args.max_new_tokens)
    # transformers first: vLLM's start-up binds threads and memory of this process, HF runs unaffected
    rows = []
    for bs in args.batch_sizes:
        rows.append(dict(engine="hf", batch=bs,
                         **timed(hf.generate, alfworld_prompts(tok, bs), args.repeats)))
    del model.generate  # back to the class method
    t0 = time.perf_counter()
    vl = VLLMEngine(resolve(args.model), tok, cfg, dtype="float32", seed=args.seed, ignore_eos=True,
                    limits=limits(args))
    start_s = time.perf_counter() - t0
    for bs in args.batch_sizes:
        rows.append(dict(engine="vllm", batch=bs,
                         **timed(vl.generate, alfworld_prompts(tok, bs), args.repeats)))
    syncs = [vl.sync_weights(model) for _ in range(5)]
    vl.shutdown()
    prompts = alfworld_prompts(tok, 8)
    gaps = {d: logprob_gap_for(d, model, tok, prompts, args) for d in args.gap_dtypes}

    print(f"\nmodel {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params), "
          f"{torch.get_num_threads()} torch threads, prompt ~{len(prompts[0])} tokens, "
          f"{args.max_new_tokens} new tokens each, {args.repeats} timed calls after a warm-up; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'engine':<6} {'batch':>5} {'tokens':>7} {'best s':>7} {'median s':>8} {'tok/s best':>10} "
          f"{'tok/s median':>12} {'tok/CPU-s':>9}")
    for r in rows:
        n = r["tokens"]
        print(f"{r['engine']:<6} {r['batch']:>5} {n:>7} {r['best_s']:>7.2f} {r['median_s']:>8.2f} "
              f"{n / r['best_s']:>10.1f} {n / r['median_s']:>12.1f} {n / r['cpu_s']:>9.1f}")
    by = {(r["engine"], r["batch"]): r for r in rows}
    for bs in args.batch_sizes:
        v, h = by["vllm", bs], by["hf", bs]
        print(f"vLLM / HF at batch {bs}: {h['best_s'] / v['best_s']:.2f}x (best wall), "
              f"{h['median_s'] / v['median_s']:.2f}x (median wall), "
              f"{h['cpu_s'] / v['cpu_s']:.2f}x (CPU time)")
    print(f"vLLM engine start: {start_s:.1f} s | weight sync: mean {sum(syncs) / len(syncs):.3f} s "
          f"(min {min(syncs):.3f}, max {max(syncs):.3f}, {len(syncs)} syncs)")
    for d, g in gaps.items():
        print(f"log-prob gap, vLLM {d} vs float32 trainer: mean {g['rollout/logprob_gap_mean']:.2e}, "
              f"max {g['rollout/logprob_gap_max']:.2e} over {g['rollout/logprob_gap_tokens']} tokens")


if __name__ == "__main__":  # vLLM may start worker processes with spawn: nothing may run at import time
    main(tyro.cli(Args))
