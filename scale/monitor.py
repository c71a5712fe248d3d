"""What a training run reports: one metrics row per step, reduced over every rank (`log_step`), and the
in-loop validation on a fixed panel every `--eval-every` steps (`validate`), whose best row keeps a copy of
its weights (`save_best`).

Validation (the anchors' `_validate`, verl-agent / SDAR: every 5 steps, temperature 0.4): the panel is fixed
for the whole run (`envs.stratified_subset` of the eval split, seeded by the run's seed), one attempt per task
at `--eval-temperature`, under a torch seed derived from (seed, step), through rollout.collect_rollouts
(ordinary prompts only). Its row goes to metrics.jsonl as {"step", "val/success_rate", "val/score",
"val/success/<type>", ...}, so "best during training" and "final" can both be reported from the same file; the
weights of the best row so far are kept in output_dir/best/ (loadable with from_pretrained, with
checksums.sha256 so that evaluate.py verifies it, and best.json naming its step and numbers).

A failed write here (metrics.jsonl, the rollout archive, best/) is one `error:` line naming the file and the
cause; the rows and checkpoints written before stay, and the run stops cleanly (scale/safe_io.py).
"""

import dataclasses
import json
from dataclasses import dataclass
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

import envs
import rollout
from scale.checkpoint import write_checksums, write_folder
from scale.distributed import full_state_dict, unwrap
from scale.run_logs import write_archive
from scale.safe_io import append_line, stop_on_io_error
from scale.seeds import derived_seed

VALIDATION_STREAM = 7  # validation samples under its own torch seed stream (derived_seed),
                       # apart from the step's


@dataclass
class Validation:
    """The run's in-loop validation: a fixed panel played once per task at `temperature` with the run's
    rollout and environment settings; rows go to out/metrics.jsonl."""
    panel: list[envs.Task]
    rollout: rollout.RolloutConfig
    env_cfg: envs.EpisodeConfig
    temperature: float
    seed: int
    out: Path
    steps: int  # the run's last step (for the printed line)


def log_step(out: Path, step: int, steps: int, everyone: list[dict], actor: dict, bank,
             archive_cap: int) -> dict:
    """Reduce every rank's numbers to one metrics row (the same meaning as a single-process run), write it
    with the gathered archive rows (up to `archive_cap` turns in all), print it; returns the row."""
    def total(key, sub):
        return sum(r[key][sub] for r in everyone)
    stats = [st for r in everyone for st in r["rollout"]]
    n_turns = sum(len(st.turns) for st in stats)
    counters = {k: total("counters", k) for k in everyone[0]["counters"]}
    dt = max(r["times"]["step_s"] for r in everyone)
    with stop_on_io_error(out / "rollouts.jsonl.gz"):
        dropped = write_archive(out / "rollouts.jsonl.gz", [x for r in everyone for x in r["rows"]],
                                archive_cap) if archive_cap else 0
    m = {"step": step, **rollout.rollout_metrics(stats, counters),
         "router/match_rate": total("route", "router/matched_turns") / max(n_turns, 1),
         **{k: total("route", k) for k in everyone[0]["route"]}, **bank.metrics(),
         "sd/distilled_turns": total("sd", "sd/distilled_turns"),
         "sd/distilled_share": total("sd", "sd/distilled_turns") / max(n_turns, 1),
         "sd/distilled_tokens": total("sd", "sd/distilled_tokens"),
         "sd/over_length_turns": total("sd", "sd/over_length_turns"),
         "sd/teacher_tokens": total("sd", "sd/teacher_tokens"),
         "sd/teacher_time_s": max(r["sd"]["sd/teacher_time_s"] for r in everyone),
         "sd/teacher_minus_student_logp": (total("sd", "sd/gap_sum") / total("sd", "sd/distilled_tokens")
                                           if total("sd", "sd/distilled_tokens") else float("nan")),
         **sd_diagnostics(everyone),
         **actor, "time/step_s": dt, "time/generate_s": max(r["counters"]["gen_s"] for r in everyone),
         "time/env_s": max(r["counters"]["env_s"] for r in everyone),
         "time/env_share": max(r["counters"]["env_s"] for r in everyone) / dt,
         "time/update_s": max(r["times"]["update_s"] for r in everyone),
         "time/peak_gpu_mem_gb": max(r["times"]["peak_gpu_mem_gb"] for r in everyone),
         **{k: max(r["mem"].get(k, 0.0) for r in everyone) for k in everyone[0]["mem"]},  # the largest rank's
         **({f"mem/rank{i}/{k[4:]}": v for i, r in enumerate(everyone) for k, v in r["mem"].items()}
            if len(everyone) > 1 else {}),  # and each rank's own: mem/rank<r>/<phase>_peak_gb
         "time/tokens_per_s": sum(r["tokens"] for r in everyone) / dt, "archive/dropped_turns": dropped,
         **{k: total("env", k) for k in everyone[0].get("env", {})}}
    append_line(out / "metrics.jsonl", json.dumps(m))
    print(f"step {step}/{steps} | success {m['rollout/success_rate']:.3f} | "
          f"reward {m['rollout/reward']:.2f} | "
          f"valid {measured(m, 'rollout/valid_action_ratio')} | match {m['router/match_rate']:.2f} | "
          f"{_sd_text(m)} | {dt:.1f}s "
          f"(env {m['time/env_share']:.0%})"
          + (f" | peak mem {max(v for k, v in m.items() if k.startswith('mem/')):.1f} GiB"
             if any(k.startswith("mem/") for k in m) else "")
          + (f" | {actor['actor/nonfinite_skips']} non-finite steps skipped"
             if actor["actor/nonfinite_skips"] else ""),
          flush=True)
    return m


def _sd_text(m: dict) -> str:
    """The SD part of the progress line: 'no turn distilled' on a step without an SD term (GRPO, or no
    reference yet); a number not measured prints as '–' (NaN or absent: the SD/GRPO gradient ratio without a
    GRPO signal, the measurement off or under FSDP; the candidate gain with the diagnostic off or auto-off
    above 100M parameters; a share over no candidate turn), one rendering everywhere."""
    if not m["sd/distilled_turns"]:
        return "no turn distilled"
    return (f"gap {measured(m, 'sd/teacher_minus_student_logp', 3)} | "
            f"KL/turn {measured(m, 'sd/kl_per_turn')} | "
            f"cand share {measured(m, 'sd/candidate_sampled_share')} | "
            f"cand gain {measured(m, 'sd/candidate_gain', 3)} | "
            f"grad sd/grpo {measured(m, 'actor/sd_grpo_grad_ratio', 3)}")


def measured(m: dict, key: str, digits: int = 2) -> str:
    """m[key] with `digits` decimals, or '–' where it was not measured (absent, or NaN)."""
    v = m.get(key, math.nan)
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def sd_diagnostics(everyone: list[dict]) -> dict:
    """sd/kl_student_teacher: the k1 estimate of KL(π_student ‖ π_teacher) on the distilled tokens, the mean
    over them of log π_student − log π_teacher (the student's sampling log-probs: unbiased on the student's
    own samples; = −sd/teacher_minus_student_logp); sd/kl_per_turn: the same sum per distilled turn (most
    tokens of a turn may be forced, with a gap of exactly 0, which the per-token mean hides). On the distilled
    turns with a candidate (measure/candidate_share.py): sd/candidate_sampled_share, the share whose sampled
    action is the candidate, and the mean turn gap Σ_t log π_T − log π_student over those turns
    (sd/gap_on_candidate) and the others (sd/gap_off_candidate); NaN where a count is 0. sd/candidate_gain:
    the mean over distilled turns with a candidate of log π_T(c) − log π_θ(c), the candidate's response scored
    under both prompts (measure/candidate_gain.py; absent with --teacher.candidate-gain off)."""
    def total(key):
        return sum(r["sd"].get(key, 0) for r in everyone)

    def ratio(a, b):
        return a / b if b else math.nan
    n_tok, n_turns, gap = total("sd/distilled_tokens"), total("sd/distilled_turns"), total("sd/gap_sum")
    n_cand, n_on = total("sd/candidate_routed_turns"), total("sd/candidate_sampled_turns")
    out = {"sd/kl_student_teacher": ratio(-gap, n_tok), "sd/kl_per_turn": ratio(-gap, n_turns),
           "sd/candidate_sampled_share": ratio(n_on, n_cand),
           "sd/candidate_routed_turns": n_cand, "sd/candidate_sampled_turns": n_on,
           "sd/gap_on_candidate": ratio(total("sd/gap_on_candidate_sum"), n_on),
           "sd/gap_off_candidate": ratio(total("sd/gap_off_candidate_sum"), n_cand - n_on)}
    if "sd/candidate_turns" in everyone[0]["sd"]:
        n = sum(r["sd"]["sd/candidate_turns"] for r in everyone)
        out.update({"sd/candidate_gain": (sum(r["sd"]["sd/candidate_gain_sum"] for r in everyone) / n
                                          if n else math.nan),
                    "sd/candidate_turns": n,
                    "sd/candidate_gain_time_s": max(r["sd"]["sd/candidate_gain_time_s"] for r in everyone)})
    return out


def validate(v: Validation, engine, pool, tokenizer, step: int, world) -> dict | None:
    """One attempt per panel task (each rank plays its shard) at v.temperature; the row on rank 0 (else None),
    also appended to metrics.jsonl there."""
    t0 = time.perf_counter()
    saved = engine.cfg
    engine.cfg = dataclasses.replace(saved, temperature=v.temperature)
    torch.manual_seed(derived_seed(v.seed, step, world.rank, VALIDATION_STREAM))
    try:
        eps, _ = rollout.collect_rollouts(engine, pool, tokenizer, world.shard(v.panel),
                                          dataclasses.replace(v.rollout, group_size=1), v.env_cfg,
                                          tag=f"val{step}r{world.rank}", show_progress=False)
    finally:
        engine.cfg = saved
    done = [(e.task.task_type, float(e.won), e.score, len(e.turns)) for e in eps]
    done = [d for part in world.gather(done) for d in part]
    if not world.is_main:
        return None
    row = {"step": step, "val/success_rate": float(np.mean([d[1] for d in done])),
           "val/score": float(np.mean([d[2] for d in done])),
           "val/turns": float(np.mean([d[3] for d in done])),
           "val/tasks": len(done), "val/temperature": v.temperature, "time/val_s": time.perf_counter() - t0}
    for tt in sorted({d[0] for d in done}):
        row[f"val/success/{tt}"] = float(np.mean([d[1] for d in done if d[0] == tt]))
    append_line(v.out / "metrics.jsonl", json.dumps(row))
    print(f"val {step}/{v.steps} | success {row['val/success_rate']:.3f} | score {row['val/score']:.3f} on "
          f"{len(done)} tasks at T={v.temperature}", flush=True)
    return row


def save_best(out: Path, model, tokenizer, cfg, row: dict | None, world) -> bool:
    """If `row` beats best.json's (success rate, then score; ties keep the earlier step), write the weights to
    out/best/ (a temporary folder renamed into place, with the run's config `cfg` as smrc_config.json) and
    best.json. Collective under torchrun (the full weights are gathered on every rank); rank 0 decides and
    writes. Returns whether it was written."""
    best = out / "best.json"
    better = False
    if world.is_main:
        old = json.loads(best.read_text()) if best.exists() else None
        key = (lambda r: (r["val/success_rate"], r["val/score"]))
        better = old is None or key(row) > key(old)
    better = bool(world.gather(better)[0])
    if not better:
        return False
    weights = full_state_dict(model)
    if world.is_main:
        tmp, final = out / ".tmp_best", out / "best"

        def write():
            shutil.rmtree(tmp, ignore_errors=True)
            unwrap(model).save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            (tmp / "smrc_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
            write_checksums(tmp)
        problem = write_folder(tmp, write)
        if problem is not None:
            raise SystemExit(f"error: the best weights of step {row['step']} not written ({final} keeps the "
                             f"previous best): {problem}")
        with stop_on_io_error(final):
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            best.write_text(json.dumps(row, indent=1))
    return True
