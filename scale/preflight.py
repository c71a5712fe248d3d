"""Checks a run passes before any heavy work (no model, env or engine exists yet), each failure one `error:` line
naming the flag and what it allows.

- `validate_config(cfg)`: the numbers of the config (RULES: flag, allowed range); every algorithm here is GRPO-based,
  so a group needs at least 2 rollouts for its baseline.
- `prepare_output_dir(out, fresh)` (rank 0): the output folder is a folder and takes a file; a fresh run (no
  --resume) refuses a folder that holds checkpoints, so two runs' steps never mix (continue it with --resume, or pick
  a new --output-dir); stale `.tmp_step_*` folders of a save that did not finish are removed.
"""

import math
import shutil
import tempfile
from pathlib import Path

from scale.checkpoint import checkpoints


def _int(lo: int):
    return (lambda v: isinstance(v, int) and v >= lo), f"an integer >= {lo}"


def _real(lo: float, hi: float = math.inf, open_lo: bool = False):
    ok = (lambda v: math.isfinite(v) and (v > lo if open_lo else v >= lo) and v <= hi)
    return ok, f"a finite number {'>' if open_lo else '>='} {lo:g}" + (f" and <= {hi:g}" if hi < math.inf else "")


RULES = [  # (config field, (check, allowed)); {env} is the run's env section
    ("steps", _int(1)),
    ("save_every", _int(1)),
    ("keep_checkpoints", _int(1)),
    ("archive_max_turns", _int(0)),
    ("eval_every", _int(0)),
    ("eval_tasks", _int(0)),
    ("eval_temperature", _real(0)),
    ("router.history_window", _int(0)),  # None (the prompt's history length) passes
    ("router.archive_size", _int(0)),
    ("rollout.tasks_per_step", _int(1)),
    ("rollout.group_size", (_int(2)[0], "an integer >= 2 (GRPO's baseline is the mean of a group)")),
    ("rollout.gen_batch_size", _int(1)),
    ("rollout.max_prompt_tokens", _int(1)),
    ("rollout.sampling.max_new_tokens", _int(1)),
    ("rollout.sampling.temperature", _real(0, open_lo=True)),
    ("rollout.sampling.top_p", _real(0, 1, open_lo=True)),
    ("rollout.sampling.top_k", _int(0)),
    ("rollout.vllm_gpu_memory", _real(0, 1, open_lo=True)),
    ("grpo.lr", _real(0)),
    ("grpo.weight_decay", _real(0)),
    ("grpo.clip_ratio_low", _real(0, 1)),
    ("grpo.clip_ratio_high", _real(0)),
    ("grpo.clip_ratio_c", _real(1)),
    ("grpo.kl_coef", _real(0)),
    ("grpo.entropy_coef", (math.isfinite, "a finite number")),
    ("grpo.sd_coef", _real(0)),  # None (the loss form's anchor value) passes
    ("grpo.sd_gate_beta", _real(0)),
    ("grpo.max_grad_norm", _real(0, open_lo=True)),
    ("grpo.mini_batch_size", _int(1)),
    ("grpo.micro_batch_tokens", _int(1)),
    ("grpo.ppo_epochs", _int(1)),
    ("grpo.max_nonfinite_steps", _int(1)),
    ("grpo.sd_is_cap", ((lambda v: v >= 1), "a number >= 1 (inf: untruncated)")),  # NaN fails
    ("teacher.oracle", _real(0, 1)),
    ("{env}.max_steps", _int(1)),
]


def validate_config(cfg) -> None:
    for name, (ok, allowed) in RULES:
        name = name.format(env=cfg.env)
        value = cfg
        for part in name.split("."):
            value = getattr(value, part)
        if value is None:  # a field left to --algo or to its form's default
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise SystemExit(f"error: --{name.replace('_', '-')} {value!r} is out of range; allowed: {allowed}")


def prepare_output_dir(out: Path, fresh: bool) -> None:
    """Before any heavy work (rank 0): the folder exists and takes a file; a fresh run refuses a folder holding
    checkpoints; stale temporary folders of a killed save are removed."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --output-dir {out} is a file; it must be a folder (new or existing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out) as f:
            f.write(b"probe")
    except OSError as e:
        raise SystemExit(f"error: --output-dir {out} is not writable ({e.strerror or e})") from None
    if fresh and (checkpoints(out) or (out / "latest").exists()):
        names = ", ".join(p.name for p in checkpoints(out)) or "a 'latest' file"
        raise SystemExit(f"error: --output-dir {out} already holds checkpoints ({names}); continue that run with "
                         f"--resume (or --resume-from one of them), or start this run in a new --output-dir")
    for stale in [*out.glob(".tmp_step_*"), *out.glob("latest.tmp")]:
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
        print(f"[checkpoint] removed {stale}, left by a save that did not finish", flush=True)
