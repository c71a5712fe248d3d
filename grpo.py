"""GRPO advantages and the combined GRPO + self-distillation update (knows no environment).

    L = L_GRPO + λ · L_SD + β · KL_k3(π_θ ‖ π_ref) − c_H · H(π_θ)

- L_GRPO: the PPO clipped surrogate with dual clip, token-mean over every response token of the mini-batch, on
  trajectory-level GRPO advantages (`grpo_advantages`).
- L_SD: on-policy self-distillation on the response tokens of the turns the router matched. With
  Δ_t = log π_T(y_t) − log π_θ(y_t) on the student's own sampled token y_t, four forms (`sd_losses`, each
  tested against a hand-computed gradient):
    reverse-kl (FullPath-SD, SMRC-SD)  ℓ_t = sg(ρ·(log π_θ − log π_T)) · log π_θ       ∇ = −ρ · Δ · ∇log π_θ
    skill-sd   (Skill-SD)              ℓ_t = ρ · k3,  k3 = e^{−u} − 1 + u,  u = log π_θ − sg(log π_T),
                                       ρ = exp(min(log π_θ − log π_old, IS_LOG_CAP)), not detached
    sdar       (SDAR)                  ℓ_t = g · (sg(log π_T) − log π_θ),  g = σ(β · sg(Δ))  ∇ = −g · ∇log π_θ
    grpo-opsd  (GRPO+OPSD)             the sdar form with g = 0.5
  λ and the form arrive resolved (config.resolve). By default Σ ℓ_t is divided by every response token of the
  mini-batch, as L_GRPO is (`--grpo.sd-norm distilled`: by the distilled ones).
- Δ is taken on one numeric path. The hf teacher scores with the trainer's own code and precision
  (models.score), so Δ = log π_T − log π_θ as written. A teacher on vLLM also scores the student's own prompt
  there (turn.teacher_base_logprobs = log π_old on vLLM's path), and the update composes
      Δ = (log π_T − log π_old)_vLLM + (log π_old − log π_θ)_trainer,
  π_old the trainer's (this forward on the first mini-batch, else the recomputed or the sampler's).
  Checked by the null context (`--router.context none`: Δ = 0 on every token, tests/test_sd_delta.py).
- Truncated importance sampling (`tis_cap`, verl's rollout IS): under vLLM the samples come from the
  sampler's policy, so L_GRPO's per-token loss is weighted by the detached w = min(π_old / π_sampler, C).
- Mini-batches after the first are off-policy: the reverse-kl term is weighted by a detached
  ρ = exp(min(log π_θ − log π_old, log sd_is_cap)) there (ρ = 1 on the first). The teacher is frozen for the
  step: its log-probs come from the weights that sampled.

`update` runs the rollout batch as mini-batches of `mini_batch_size` turn-samples (one guarded optimizer step
each) over length-sorted micro-batches of at most `micro_batch_tokens` padded tokens (gradient accumulation).
Under torchrun the ranks agree on every count through `world` (step and micro-batch counts, token normalisers,
the non-finite decision); in one process those agreements are the identity.
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from measure import term_grads as measure
from models import micro_batches, precision, score, score_rows, token_logprobs
from measure import actor_stats as stats

IS_LOG_CAP = 10.0  # skill-sd's importance weight ρ = exp(min(log π_θ − log π_old, IS_LOG_CAP)), as its anchor
TIS_CAP = 2.0  # --grpo.tis-cap's default under vLLM: verl's rollout-IS threshold (TRL's vLLM IS cap is 3)
KL_CLAMP = 10.0    # the k3 KL estimate is clamped to ±KL_CLAMP per token (verl's low_var_kl)


@dataclass
class GRPOConfig:
    lr: float = 1e-6
    """AdamW learning rate (verl-agent: 1e-6 for 1.5-7B models)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    clip_ratio_low: float = 0.2
    """PPO clip ε below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip ε above 1"""
    clip_ratio_c: float = 3.0
    """dual-clip bound for negative advantages"""
    kl_coef: float = 0.01
    """β of the k3 KL to the initial (frozen) model; 0 disables it and skips the reference model"""
    entropy_coef: float = 0.001
    """entropy bonus c_H (verl-agent's active default)"""
    sd_loss: Literal["reverse-kl", "skill-sd", "sdar", "grpo-opsd"] | None = None
    """form of L_SD (module docstring); None = --algo's row of config.ALGOS"""
    sd_coef: float | None = None
    """λ of L_SD; None = --algo's row of config.ALGOS (the preset's column, else the form's anchor). For a
    model of your own: `python analysis/lambda_pilot.py` (README, "Setting λ")"""
    sd_gate_beta: float = 5.0
    """β of the sdar gate σ(β·sg(Δ)) (SDAR's scripts: 5)"""
    sd_norm: Literal["all", "distilled"] = "all"
    """L_SD divided by every response token of the mini-batch (all, verl token-mean) or by its distilled
    ones"""
    sd_is_cap: float = 2.0
    """truncation of the reverse-kl term's importance ratio ρ on mini-batches after the first (verl's
    truncated-IS cap: 2; inf = untruncated)"""
    term_grad_norms: Literal["auto", "on", "off"] = "auto"
    """measure the GRPO and SD terms' gradient norms apart on a mini-batch of each step (measurement only; two
    parameter-sized buffers and two extra backward passes): auto = on for a small model
    (config.resolve_for_model); `analysis/lambda_pilot.py` turns it on"""
    norm_adv_by_std: bool = True
    """divide group-centred scores by the group std (GRPO); False = Dr.GRPO"""
    max_grad_norm: float = 1.0
    """gradient clipping threshold"""
    mini_batch_size: int = 256
    """turn-samples per optimizer step (verl-agent ALFWorld: 256)"""
    micro_batch_tokens: int = 16384
    """padded tokens per forward/backward micro-batch; sets peak memory"""
    ppo_epochs: int = 1
    """passes over the rollout batch"""
    grad_checkpointing: Literal["auto", "on", "off"] = "auto"
    """recompute each layer's activations in backward (less memory, a slower update). auto = on for a large
    model, on CPU too (config.resolve_for_model)"""
    bf16: bool = True
    """bf16 autocast on CUDA (ignored on CPU, where float32 is used)"""
    ref_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """the frozen KL reference's weights: auto = bfloat16 on CUDA with --grpo.bf16 (half the memory; its
    matmuls ran in bf16 under autocast anyway, so only its norm and embedding weights round further, and the
    KL's log-probs stay float32), float32 on CPU (config.resolve_for_model). Under LoRA the frozen base is
    the reference, so the base takes this dtype and the adapters stay float32 (peft's autocast_adapter_dtype;
    TRL loads a LoRA base in its bf16 checkpoint dtype)"""
    old_logprobs: Literal["auto", "recompute", "sampler"] = "auto"
    """π_old of the PPO ratio on mini-batches after the first: recompute = the trainer's own log-probs before
    the first step (verl's old_log_prob pass: one no-grad forward over the batch, on the same micro-batches,
    so the first mini-batch's ratio is exactly 1 and the sampler's kernels and bf16 never enter a ratio);
    sampler = the rollout engine's sampling log-probs (no extra pass). auto = recompute under a vLLM engine,
    sampler under the transformers engine (same weights and precision: nothing to correct; config.resolve).
    The trainer-sampler gap is logged either way (actor/rollout_logprob_gap)"""
    tis_cap: float | None = None
    """truncated importance sampling of the sampler-trainer mismatch: L_GRPO's per-token loss is weighted by
    the detached w = min(π_old / π_sampler, C), π_old the trainer's (verl's rollout IS, token level; TRL's
    vLLM correction); C = this cap, 0 = off. None = TIS_CAP under a vLLM engine, off under the transformers
    engine (its sampler is the trainer's own module: w = 1 up to rounding; config.resolve). Logged:
    actor/tis_weight (mean w) and actor/tis_capped_share"""
    max_nonfinite_steps: int = 3
    """optimizer steps in a row with a non-finite loss or gradient norm before the run stops with an error;
    each one is skipped (no weight changes) and counted in actor/nonfinite_skips"""


class Sample(Protocol):
    """What the update reads of a turn-sample (records.Turn): the turn's prompt, the sampled response and its
    learning signals."""
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    sample_logprobs: list[float]                 # under the sampling policy (one per response token)
    teacher_logprobs: list[float] | None         # set on distilled turns only
    allowed: list[list[int]] | None              # restricted decoding: allowed ids per response position
    teacher_base_logprobs: list[float] | None    # a vLLM teacher's log-probs of the student's own prompt


def grpo_advantages(scores: list[float], group_ids: list, norm_by_std: bool = True,
                    eps: float = 1e-6) -> list[float]:
    """A_i = (s_i − μ_g) / (σ_g + ε) over every turn-sample of group g.

    Convention (verl-agent's `compute_mean_std_cross_steps=True`): the statistics pool all turn-samples of all
    trajectories of a task group, so a long trajectory weighs as many times as it has turns. We keep it
    because it is what the paper's GRPO baseline runs. σ is the unbiased std; a group of one sample gets μ=0,
    σ=1. A group whose scores are all equal gets advantages of exactly 0 (the mean of equal floats is not
    always exact: (s − μ)/(σ + ε) would give ±1e-11, a GRPO gradient that is noise, not signal).
    """
    s = torch.tensor(scores, dtype=torch.float64)
    adv = torch.empty_like(s)
    for g in dict.fromkeys(group_ids):
        idx = torch.tensor([i for i, gi in enumerate(group_ids) if gi == g])
        if len(idx) > 1 and bool((s[idx] == s[idx][0]).all()):
            adv[idx] = 0.0
            continue
        mu, sigma = (s[idx].mean(), s[idx].std()) if len(idx) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        adv[idx] = (s[idx] - mu) / (sigma + eps) if norm_by_std else s[idx] - mu
    return adv.tolist()


def _pad(rows: list[list[float]], R: int) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (R - len(r)) for r in rows], dtype=torch.float32)


def sd_losses(logp, old_logp, teacher_logp, sd_mask, form: str, beta: float = 5.0, rho=None):
    """Per-token L_SD (B, R) of one form (module docstring) and its gate g (1 where the form has none); 0 off
    the distilled tokens. Off them the teacher's log-prob is set to the student's, so no term sees padding
    values. `rho` (B, R): the reverse-kl form's detached importance ratio (None = 1)."""
    log_pt = torch.where(sd_mask > 0, teacher_logp, logp.detach())            # (B, R) log π_T, else Δ = 0
    delta = (log_pt - logp).detach()                                          # (B, R) sg(Δ)
    gate = torch.ones_like(logp)
    rho = torch.ones_like(logp) if rho is None else rho                       # (B, R) sg(ρ)
    if form == "reverse-kl":
        sd = rho * -delta * logp                                              # sg(−ρ·Δ)·log π_θ
    elif form == "skill-sd":
        u = logp - log_pt                                                     # log π_θ − sg(log π_T)
        k3 = torch.exp(-u) - 1 + u                                            # k3 estimate of KL(π_θ ‖ π_T)
        rho_k3 = torch.exp(torch.clamp(logp - old_logp, max=IS_LOG_CAP))      # ρ, not detached
        sd = rho_k3 * k3
    elif form in ("sdar", "grpo-opsd"):
        gate = torch.sigmoid(beta * delta) if form == "sdar" else torch.full_like(logp, 0.5)  # g = σ(β·sg(Δ))
        sd = gate * (log_pt - logp)                                           # g·(sg(log π_T) − log π_θ)
    else:
        raise ValueError(f"unknown sd_loss {form!r}")
    return sd * sd_mask, gate * sd_mask


@dataclass
class TokenTerms:
    """What `loss_terms` reads of one micro-batch: (B, R) tensors over its response positions (`advantages`:
    (B,))."""
    logp: torch.Tensor                  # log π_θ(y_t) of the sampled tokens, with gradient
    old_logp: torch.Tensor              # log π_old(y_t), the sampling policy's
    ref_logp: torch.Tensor              # log π_ref(y_t), the KL anchor's (logp.detach() without one)
    teacher_logp: torch.Tensor          # log π_T(y_t) on the distilled turns' tokens (0 elsewhere)
    sd_mask: torch.Tensor               # 1 on the distilled turns' response tokens
    advantages: torch.Tensor            # (B,) the turn-samples' GRPO advantages
    entropy: torch.Tensor               # H(π_θ) at each position
    sd_rho: torch.Tensor | None = None  # the reverse-kl term's detached importance ratio (None = 1)
    tis: torch.Tensor | None = None     # truncated IS weight min(π_old / π_sampler, C) of L_GRPO (None = off)
    sampled: torch.Tensor | None = None  # log π_sampler(y_t), the rollout engine's (stats only)


def loss_terms(x: TokenTerms, cfg: GRPOConfig, sd_scale: float = 1.0):
    """Per-token loss (B, R) from straight-line tensor math; the caller sums over response tokens and divides
    by N_tokens. `sd_scale` (N_tokens / N_distilled with sd_norm = distilled, else 1) makes L_SD's share of
    that Σ ℓ_t / N_distilled."""
    A = x.advantages.unsqueeze(-1)                                                # (B, 1)
    ratio = torch.exp(x.logp - x.old_logp)                                        # (B, R)
    pg_losses1 = -A * ratio
    pg_losses2 = -A * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)                             # (B, R) PPO clip
    pg_losses = torch.where(A < 0, torch.minimum(pg_losses, -A * cfg.clip_ratio_c), pg_losses)  # dual clip
    tis = torch.ones_like(x.logp) if x.tis is None else x.tis                    # (B, R) sg(w), 1 when off
    if x.tis is not None:
        pg_losses = tis * pg_losses                                               # TIS: w · ℓ_PPO (verl)
    rho = torch.ones_like(x.logp) if x.sd_rho is None else x.sd_rho              # (B, R) sg(ρ) of reverse-kl
    sd, gate = sd_losses(x.logp, x.old_logp, x.teacher_logp, x.sd_mask, cfg.sd_loss, cfg.sd_gate_beta,
                         rho)                                                     # (B, R)
    log_r = x.ref_logp - x.logp
    kl = (torch.exp(log_r) - log_r - 1).clamp(-KL_CLAMP, KL_CLAMP)                # (B, R) k3 estimator
    loss = pg_losses + cfg.sd_coef * sd_scale * sd + cfg.kl_coef * kl - cfg.entropy_coef * x.entropy
    clipped = (pg_losses2 > pg_losses1).float()
    return loss, dict(pg_loss=pg_losses, sd_loss=sd, kl=kl, entropy=x.entropy, clipfrac=clipped, ratio=ratio,
                      gap=(x.teacher_logp - x.logp).detach() * x.sd_mask, gate=gate, sd_rho=rho * x.sd_mask,
                      tis_weight=tis, tis_capped_share=(tis >= (cfg.tis_cap or math.inf)).float())


class _OneProcess:
    """What the ranks agree on, in one process: nothing (scale.distributed.World reduces under torchrun)."""
    world_size = 1

    @staticmethod
    def all_sum(x: float) -> float:
        return x

    @staticmethod
    def all_max(x: int) -> int:
        return x


def update(model, optimizer, samples: list[Sample], cfg: GRPOConfig, *, pad_id: int, temperature: float = 1.0,
           ref_model=None, world=None, nonfinite_streak: int = 0) -> dict:
    """One rollout batch of guarded optimizer steps, L = L_GRPO + λ·L_SD + β·KL − c_H·H; returns the actor/
    metrics. `world`: a multi-process scale.distributed.World (None: one process). A mini-batch whose loss or
    gradient norm is not finite (on any rank) takes no step; `nonfinite_streak` carries the count of such
    steps in a row across calls, and at cfg.max_nonfinite_steps the run stops with an error."""
    world = world or _OneProcess()
    minis = _mini_batches(samples, cfg.mini_batch_size, world)  # one optimizer step each
    on_policy = len(minis) == 1 and cfg.ppo_epochs == 1  # then π_old is this forward's, detached
    measured = measure.measured_mini_batch(minis) if measure.can_measure(cfg, model) else None
    sums, grad_norms, skips = stats.empty_sums(), [], 0
    model.train()
    recomputed = (None if on_policy or cfg.old_logprobs != "recompute" else  # π_old from the trainer
                  _recompute_old(model, ref_model, minis, cfg, world, pad_id, temperature))
    for epoch in range(cfg.ppo_epochs):
        for m, mb in enumerate(minis):
            first = epoch == 0 and m == 0  # on the weights that sampled: ρ = 1
            norm, sd_scale = _normalisers(mb, cfg, world)  # token-mean over the global mini-batch
            term_grads = {} if (epoch, m) == (0, measured) else None
            optimizer.zero_grad(set_to_none=True)
            rows = []  # each micro-batch's summed stats and loss, kept on the device until the step
            for chunk in _micro_batch_passes(model, ref_model, mb, cfg, world, pad_id, temperature):
                x, mask = _token_terms(model, ref_model, chunk, cfg, pad_id, temperature,
                                       first=first, old=None if on_policy else recomputed or "sampler")
                loss_tok, terms = loss_terms(x, cfg, sd_scale)                                  # (B, R)
                loss = (loss_tok * mask).sum() / norm
                if term_grads is not None:  # measurement only: ∇L_GRPO and ∇(λ·L_SD) apart
                    measure.add(term_grads, model, terms, mask, norm, cfg.sd_coef * sd_scale)
                loss.backward()
                rows.append(stats.row(terms, mask, x, loss))
            measure.record_norms(sums, term_grads)
            mb_loss, grad_norm = stats.read(sums, rows, _clip_grad_norm(model, cfg.max_grad_norm))
            nonfinite_streak = _guarded_step(optimizer, mb_loss, grad_norm, nonfinite_streak, cfg, world)
            skips += nonfinite_streak > 0
            grad_norms += [grad_norm] if nonfinite_streak == 0 else []
    lr = optimizer.param_groups[0]["lr"]
    return stats.actor_metrics(sums, world, grad_norms, lr, skips, nonfinite_streak)


def _token_terms(model, ref_model, chunk: list[Sample], cfg: GRPOConfig, pad_id: int, temperature: float, *,
                 first: bool, old) -> tuple[TokenTerms, torch.Tensor]:
    """One micro-batch's forward and what loss_terms reads of it, and its response mask (B, R). `old`: None =
    on-policy (π_old is this forward's, detached), "sampler" = the rollout engine's log-probs, else the
    trainer's recomputed ones by sample id."""
    batch, logp, entropy = score(model, [s.prompt_ids for s in chunk], [s.response_ids for s in chunk],
                                 pad_id, temperature, [s.allowed for s in chunk], cfg.bf16, with_entropy=True)
    mask = batch.response_mask.float()                                                      # (B, R)
    R, device = mask.shape[1], mask.device
    ref_logp = _ref_logprobs(ref_model, cfg, batch, temperature, chunk, logp)               # (B, R)
    sampled, teacher_logp, distilled, advantages, base = _sample_tensors(chunk, R, device)
    old_logp = (logp.detach() if old is None else sampled if isinstance(old, str) else
                _pad([old[id(s)] for s in chunk], R).to(device))                            # (B, R)
    if base is not None:  # Δ on one numeric path: the teacher engine's log π_T − log π_old + the trainer's
        teacher_logp = teacher_logp - base + (logp.detach() if first else old_logp)
    # the reverse-kl term's ρ: 1 on the weights that sampled, else π_θ / π_old (detached, capped)
    sd_rho = None if first else torch.exp(torch.clamp(logp.detach() - old_logp, max=math.log(cfg.sd_is_cap)))
    # truncated IS of the sampler-trainer mismatch: min(π_old / π_sampler, C) per token (0 = off)
    tis = torch.exp(old_logp - sampled).clamp(max=cfg.tis_cap) if cfg.tis_cap else None
    return TokenTerms(logp, old_logp, ref_logp, teacher_logp, distilled * mask, advantages, entropy, sd_rho,
                      tis, sampled), mask


# ---- what `update` leaves off the loss's page: batching, rank agreements, bookkeeping --------------------


def _mini_batches(samples: list[Sample], size: int, world) -> list[list[Sample]]:
    """Consecutive mini-batches of about `size` turn-samples over every rank's samples; every rank takes as
    many (one optimizer step each), so the count is agreed on globally."""
    n_mini = world.all_max(max(1, math.ceil(len(samples) * world.world_size / size)))
    bounds = [round(i * len(samples) / n_mini) for i in range(n_mini + 1)]
    return [samples[bounds[m]:bounds[m + 1]] for m in range(n_mini)]


def _normalisers(mb: list[Sample], cfg: GRPOConfig, world) -> tuple[float, float]:
    """(this rank's share of the global mini-batch's response tokens: the loss's divisor, DDP averaging the
    gradients over ranks; sd_scale: N_tokens / N_distilled with --grpo.sd-norm distilled, else 1)."""
    n_tokens = world.all_sum(float(sum(len(s.response_ids) for s in mb)))
    n_sd = world.all_sum(float(sum(len(s.response_ids) for s in mb if s.teacher_logprobs is not None)))
    sd_scale = max(n_tokens, 1.0) / max(n_sd, 1.0) if cfg.sd_norm == "distilled" else 1.0
    return max(n_tokens, 1.0) / world.world_size, sd_scale


def _micro_batch_passes(model, ref_model, mb: list[Sample], cfg: GRPOConfig, world, pad_id: int,
                        temperature: float, backward: bool = True):
    """The mini-batch's length-sorted micro-batches (at most --grpo.micro-batch-tokens padded tokens each),
    each yielded inside DDP's no_sync (FSDP2: without gradient sync) but the last (gradients accumulate, then
    sync once). Every rank runs as
    many passes (DDP syncs on the last, FSDP gathers parameters on each, the policy's and the sharded
    reference's): a rank with fewer micro-batches runs zero-loss passes of one pad token instead (forward
    only with `backward` False)."""
    chunks = micro_batches([len(s.prompt_ids) + len(s.response_ids) for s in mb], cfg.micro_batch_tokens)
    n_passes = world.all_max(len(chunks))
    for c in range(n_passes):
        last = c == n_passes - 1
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter on the last pass only
            model.set_requires_gradient_sync(last)
        with nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            if c < len(chunks):
                yield [mb[i] for i in chunks[c]]
                continue
            batch, logp, _ = score(model, [[pad_id]], [[pad_id]], pad_id, temperature, bf16=cfg.bf16)
            if backward:
                _ref_logprobs(ref_model, cfg, batch, temperature, None, logp)  # as a real pass (FSDP)
            if backward:
                (logp.sum() * 0.0).backward()


@torch.no_grad()
def _recompute_old(model, ref_model, minis: list[list[Sample]], cfg: GRPOConfig, world, pad_id: int,
                   temperature: float) -> dict[int, list[float]]:
    """log π_old(y_t) of every turn-sample (by id) from the trainer's weights before the first step, over the
    same micro-batches as the update's passes (every rank runs as many: DDP and FSDP forwards are
    collectives)."""
    out = {}
    for mb in minis:
        passes = _micro_batch_passes(model, ref_model, mb, cfg, world, pad_id, temperature, backward=False)
        for chunk in passes:
            rows = score_rows(model, [s.prompt_ids for s in chunk], [s.response_ids for s in chunk],
                              [range(len(chunk))], pad_id, temperature, [s.allowed for s in chunk], cfg.bf16)
            out.update(zip(map(id, chunk), rows))
    return out


def _ref_logprobs(ref_model, cfg: GRPOConfig, batch, temperature: float, chunk, logp):
    """log π_ref of the sampled tokens (no gradient; on the batch `score` built for `chunk`'s samples, in the
    trainer's precision), or logp.detach() (a KL of 0) without a KL anchor."""
    if cfg.kl_coef <= 0 or ref_model is None:
        return logp.detach()
    allowed = [s.allowed for s in chunk] if chunk and any(s.allowed is not None for s in chunk) else None
    with torch.no_grad(), precision(batch.input_ids.device, cfg.bf16):
        return token_logprobs(ref_model, batch, temperature, allowed=allowed)[0]


def _sample_tensors(mb: list[Sample], R: int, device):
    """The turn-samples' recorded lists as tensors: sampling log-probs (B, R), teacher log-probs (B, R; 0 off
    the distilled turns), which turns are distilled (B, 1), advantages (B,), and the teacher engine's
    log-probs of the student's own prompt (B, R), or None where no turn has them (a teacher on the trainer's
    path)."""
    sampled = _pad([s.sample_logprobs for s in mb], R).to(device)
    teacher = _pad([s.teacher_logprobs or [] for s in mb], R).to(device)
    distilled = torch.tensor([[1.0] if s.teacher_logprobs is not None else [0.0] for s in mb], device=device)
    advantages = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=device)
    bases = [s.teacher_base_logprobs for s in mb]
    base = _pad([b or [] for b in bases], R).to(device) if any(b is not None for b in bases) else None
    return sampled, teacher, distilled, advantages, base


def _clip_grad_norm(model, max_norm: float) -> torch.Tensor:
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor


def _guarded_step(optimizer, loss: float, grad_norm: float, streak: int, cfg: GRPOConfig, world) -> int:
    """optimizer.step() when the mini-batch's loss and gradient norm are finite on every rank (returns 0);
    else skip the step and return streak + 1, stopping the run when that reaches cfg.max_nonfinite_steps
    (before anything is saved: the weights and optimizer state stay finite). Either way the gradients are
    freed (set to None): none lives on through the next rollout."""
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    bad = bool(world.all_max(int(not finite)))  # every rank takes the same decision (the loss is per rank)
    if not bad:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0
    optimizer.zero_grad(set_to_none=True)
    if streak + 1 >= cfg.max_nonfinite_steps:  # on every rank (the decision is shared); rank 0 says it
        raise SystemExit(1 if not getattr(world, "is_main", True) else
                         f"error: {streak + 1} optimizer steps in a row had a non-finite loss or gradient "
                         f"norm (last: loss {loss}, grad norm {grad_norm}); each was skipped, and the run "
                         f"stops here without saving (limit: --grpo.max-nonfinite-steps "
                         f"{cfg.max_nonfinite_steps})")
    return streak + 1
