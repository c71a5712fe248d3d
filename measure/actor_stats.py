"""What grpo.update sums besides the loss, and the actor/ metrics it logs from the sums.

Each micro-batch's per-token terms are summed over its response tokens into one vector that stays on the
device (`row`); a mini-batch's rows and its gradient norm are read in one host sync (`read`), then added in
micro-batch order as float64 sums of the float32 values. `actor_metrics` reduces the sums over the ranks
(scale.distributed.World) into token means with the same meaning as in one process.
"""

import math

import torch


def empty_sums() -> dict:
    """The summed stats of an update, the same keys on every rank (reduced in actor_metrics)."""
    return dict.fromkeys(["pg_loss", "sd_loss", "kl", "entropy", "clipfrac", "ratio", "gap", "gate", "sd_rho",
                          "tis_weight", "tis_capped_share", "rollout_logprob_gap", "tokens", "sd_tokens",
                          "grad_norm_grpo", "grad_norm_sd", "grad_norm_measured"], 0.0)


def row(terms: dict, mask, x, loss) -> torch.Tensor:
    """A micro-batch's per-token terms summed over its response tokens (in `empty_sums`' order), the gap
    between the rollout engine's sampling log-probs and this forward on the same tokens (rounding only in
    float32), the token counts and the loss: one vector, left on the device (`read` reads them)."""
    gap = (x.sampled - x.logp.detach()).abs() * mask
    return torch.stack([(terms[k].detach() * mask).sum() for k in STAT_TERMS] +
                       [gap.sum(), mask.sum(), x.sd_mask.sum(), loss.detach()])


STAT_TERMS = ("pg_loss", "sd_loss", "kl", "entropy", "clipfrac", "ratio", "gap", "gate", "sd_rho",
              "tis_weight", "tis_capped_share")


def read(sums: dict, rows: list[torch.Tensor], grad_norm: torch.Tensor) -> tuple[float, float]:
    """The mini-batch's one host sync: its micro-batches' stat rows and the gradient norm, read together and
    added to `sums` in micro-batch order (float64 sums of float32 values, as before); (loss, gradient
    norm)."""
    values = torch.stack([*rows, grad_norm.reshape(1).expand(rows[0].shape)] if rows else
                         [grad_norm.reshape(1)]).tolist()
    keys = [*STAT_TERMS, "rollout_logprob_gap", "tokens", "sd_tokens"]
    loss = 0.0
    for row in values[:-1]:
        for k, v in zip(keys, row):
            sums[k] += v
        loss += row[-1]
    return loss, values[-1][0]


def actor_metrics(sums: dict, world, grad_norms: list[float], lr: float, skips: int, streak: int) -> dict:
    """The logged actor/ numbers from the summed stats: token means over every rank's tokens (the same meaning
    as in one process); per distilled token for the SD ones; the term gradient norms averaged over the ranks
    that measured them; the optimizer steps taken and skipped."""
    reduced = {k: world.all_sum(sums[k]) for k in sorted(sums)}  # the same order on every rank
    sums = {k: reduced[k] for k in sums}
    n_tok, n_sd, n_gn = sums.pop("tokens"), sums.pop("sd_tokens"), sums.pop("grad_norm_measured")
    per_sd = ("sd_loss", "gap", "gate", "sd_rho", "grad_norm_grpo", "grad_norm_sd")
    out = {f"actor/{k}": v / max(n_tok, 1) for k, v in sums.items() if k not in per_sd}
    out["actor/sd_loss"] = sums["sd_loss"] / max(n_sd, 1)
    out["actor/sd_gap"] = sums["gap"] / max(n_sd, 1) if n_sd else math.nan  # teacher − current policy
    out["actor/sd_gate"] = sums["gate"] / max(n_sd, 1) if n_sd else math.nan  # mean gate (1: ungated forms)
    out["actor/sd_is_ratio"] = sums["sd_rho"] / max(n_sd, 1) if n_sd else math.nan  # mean ρ of reverse-kl
    g_pg, g_sd = (math.nan, math.nan) if not n_gn else (sums["grad_norm_grpo"] / n_gn,
                                                         sums["grad_norm_sd"] / n_gn)
    out.update({"actor/grad_norm_grpo": g_pg, "actor/grad_norm_sd": g_sd,
                # NaN = not measured: no SD term, no measurement, or no GRPO signal to compare with (every
                # advantage of the measured mini-batch 0: its GRPO gradient is exactly 0)
                "actor/sd_grpo_grad_ratio": g_sd / g_pg if n_sd and g_pg > 0 else math.nan,
                "actor/tokens": n_tok,
                "actor/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else math.nan,
                "actor/lr": lr, "actor/optimizer_steps": len(grad_norms),
                "actor/nonfinite_skips": skips, "actor/nonfinite_streak": streak})
    return out
