"""The SD/GRPO gradient-norm measurement (measurement only: nothing enters the weights): on one mini-batch of
a step, ‖∇L_GRPO‖ and ‖∇(λ·L_SD)‖ apart, by `torch.autograd.grad` on the graph the update's real backward then
uses. grpo.update calls it; the ratio (actor/sd_grpo_grad_ratio) is what analysis/lambda_pilot.py reads to set
λ. It costs two extra backward passes per micro-batch of that mini-batch and parameter-sized buffers (the two
sums, the new gradient and their sum while adding), so `--grpo.term-grad-norms auto` leaves it off for
a large model (config.resolve_for_model); the pilot turns it on.

A leaf: imports nothing from the project (the update's sample records are duck-typed).
"""

import torch


def can_measure(cfg, model) -> bool:
    """--grpo.term-grad-norms on, and not under FSDP (its gradients are sharded)."""
    return cfg.term_grad_norms == "on" and not hasattr(model, "unshard")


def measured_mini_batch(mini_batches: list[list]) -> int:
    """Where the term gradient norms are measured: the first mini-batch with distilled turns and a non-zero
    advantage (the first ones often hold only all-fail groups, with neither), else the first with distilled
    turns, else the first."""
    has_sd = [any(s.teacher_logprobs is not None for s in mb) for mb in mini_batches]
    both = [h and any(s.advantage != 0 for s in mb) for h, mb in zip(has_sd, mini_batches)]
    return next((m for m, b in enumerate(both) if b), next((m for m, h in enumerate(has_sd) if h), 0))


def add(acc: dict, model, terms: dict, mask, norm: float, sd_weight: float) -> None:
    """Add this micro-batch's ∇L_GRPO (the PPO term) and ∇(λ·L_SD), each as it enters the loss, to `acc` (by
    autograd.grad on the graph the real backward then uses: measurement only, nothing goes into .grad). Costs
    two extra backward passes per micro-batch of the step's first mini-batch and two parameter-sized
    buffers."""
    params = [p for p in model.parameters() if p.requires_grad]
    for name, term in (("grpo", terms["pg_loss"]), ("sd", sd_weight * terms["sd_loss"])):
        grads = torch.autograd.grad((term * mask).sum() / norm, params, retain_graph=True, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]
        acc[name] = grads if name not in acc else [a + g for a, g in zip(acc[name], grads)]


def record_norms(sums: dict, term_grads: dict | None) -> None:
    """The measured mini-batch's ‖∇L_GRPO‖ and ‖∇(λ·L_SD)‖ into `sums`."""
    for name, grads in (term_grads or {}).items():
        sums[f"grad_norm_{name}"] = float(torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt())
    sums["grad_norm_measured"] += 1.0 if term_grads else 0.0
