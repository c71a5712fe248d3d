"""Set λ (`--grpo.sd-coef`) from a short pilot run, before the long one.

λ sets how hard the SD term pushes beside GRPO, and the right value depends on the model, the teacher's
sharpness and how many turns are distilled, so no number carries over between setups. What carries over
is the strength: the SD term's gradient norm as a share of GRPO's. The SD gradient is exactly λ times a
gradient that does not depend on λ, so a short run at a small λ₀ measures the push per unit λ,

    u = median over steps of  (‖∇(λ₀·L_SD)‖ / ‖∇L_GRPO‖) / λ₀

(smrc.py logs the ratio as actor/sd_grpo_grad_ratio, on one mini-batch a step)

and the λ whose SD gradient is `--target` times GRPO's is target / u. A small λ₀ keeps the pilot on GRPO's
path, so the reading is that of the policy the real run starts from. The pilot also prints how sharp the
teacher is (KL(student ‖ teacher) per distilled turn) and how often the student already samples the
matched candidate. The default target and the evidence for it: README, "Setting λ".

    python analysis/lambda_pilot.py RUN_DIR       # read a run's metrics.jsonl (even while it runs)
    python analysis/lambda_pilot.py --out runs/pilot -- --env alfworld --model Qwen/Qwen3-1.7B \\
        --algo smrc-sd                                         # run the pilot with smrc.py, then read it
    python analysis/lambda_pilot.py --launcher "torchrun --nproc_per_node 8" -- ...

Writes RUN_DIR/lambda_pilot.json with the numbers it prints.
"""
import argparse
import json
import math
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

TARGET_RATIO = 0.1  # SD gradient = 0.1 × GRPO's; the evidence: README, "Setting λ"
PILOT_SD_COEF = 0.01
PILOT_STEPS = 10  # a whole run's share / its first 10 steps': 0.90–1.30 (10–90%) over the v21 sweep's 45
                  # runs with an SD term, 0.89–1.85 from 5 steps (learn_sweep_v21/results.md, last lines)
MIN_MEASURED = 3  # steps with both terms measured, below which the pilot suggests no λ
PILOT_OWNS = ("--steps", "--grpo.sd-coef", "--output-dir", "--save-every", "--eval-every", "--resume",
              "--grpo.term-grad-norms")


def run_strength(rows: list[dict]) -> tuple[float, float, float]:
    """How hard and how sharp one run's SD term was: the median SD / GRPO gradient-norm ratio over the
    steps that distilled a turn and where it is finite (NaN: not measured, e.g. no GRPO signal, every group
    all-fail or all-win; inf in rows logged before that was NaN), KL(student ‖ teacher) summed over a
    distilled turn's tokens averaged over the run's distilled turns, and the share of matched turns with a
    candidate whose sampled action is the candidate. NaN where the run has no such step or turn."""
    ratios = finite_ratios(rows)
    turns = sum(m.get("sd/distilled_turns", 0) for m in rows)
    gap = sum(m["sd/teacher_minus_student_logp"] * m["sd/distilled_tokens"] for m in rows
              if m.get("sd/distilled_tokens"))
    counts = [_candidate_counts(m) for m in rows]
    routed = sum(n for n, _ in counts)
    return (float(np.median(ratios)) if ratios else math.nan, -gap / turns if turns else math.nan,
            sum(k for _, k in counts) / routed if routed else math.nan)


def _candidate_counts(m: dict) -> tuple[float, float]:
    """(distilled turns with a candidate, of them those whose sampled action is the candidate) of one step.
    Rows logged before the counts were (the v21 sweep's, code at 12a3ca6) carry only the share; there the
    count is sd/distilled_turns, exact in that sweep: every turn SMRC-SD or FullPath-SD distils is matched to
    a reference, so it has a candidate (FullPath-SD's: the reference's action at the same index). Under
    restricted decoding a candidate can be sampled only where it is admissible: on 99% of SMRC-SD's distilled
    turns there, 31–33% of FullPath-SD's (sd/candidate_turns; bench/sweep_runs.py prints the share over
    those)."""
    if "sd/candidate_routed_turns" in m:
        return m["sd/candidate_routed_turns"], m.get("sd/candidate_sampled_turns", 0)
    share, n = m.get("sd/candidate_sampled_share"), m.get("sd/distilled_turns", 0)
    if share is None or not n or not math.isfinite(share):
        return 0, 0
    return n, share * n


def finite_ratios(rows: list[dict]) -> list[float]:
    """actor/sd_grpo_grad_ratio of the steps that distilled a turn, where it is finite."""
    ratios = [(m.get("actor/sd_grpo_grad_ratio"), m.get("sd/distilled_turns")) for m in rows]
    return [r for r, turns in ratios if turns and r is not None and math.isfinite(r)]


@dataclass
class Pilot:
    """What a pilot run measured (see the module's text)."""
    sd_coef: float         # λ₀, the λ the pilot ran at
    steps: int             # training steps read
    measured: int          # of them, steps with a distilled turn and a finite gradient ratio
    ratio: float           # median SD / GRPO gradient-norm ratio at λ₀
    unit_ratio: float      # u = ratio / λ₀, the ratio per unit λ
    unit_quartiles: tuple[float, float]  # the 25% and 75% quantiles of the per-step ratio / λ₀
    kl_per_turn: float     # KL(student ‖ teacher) per distilled turn, nat
    candidate_share: float  # matched turns whose sampled action is the candidate
    distilled_share: float  # distilled turns / all turns, mean over steps


def measure(run_dir: Path) -> Pilot:
    """Read a run's config.json (λ₀) and metrics.jsonl (its training rows) into a Pilot."""
    config, metrics = run_dir / "config.json", run_dir / "metrics.jsonl"
    if not config.is_file() or not metrics.is_file():
        raise SystemExit(f"error: {run_dir} is not a smrc.py run folder "
                         "(needs config.json and metrics.jsonl)")
    sd_coef = json.loads(config.read_text())["grpo"]["sd_coef"]
    if not sd_coef or sd_coef <= 0:
        raise SystemExit(f"error: {run_dir} ran at --grpo.sd-coef {sd_coef}: "
                         "a pilot needs λ > 0 (an SD term)")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [m for m in rows if "actor/sd_grpo_grad_ratio" in m]  # training rows (not the validation ones)
    unit = [r / sd_coef for r in finite_ratios(rows)]
    ratio, kl, share = run_strength(rows)
    q = (float(np.quantile(unit, 0.25)), float(np.quantile(unit, 0.75))) if unit else (math.nan, math.nan)
    return Pilot(sd_coef=sd_coef, steps=len(rows), measured=len(unit), ratio=ratio,
                 unit_ratio=ratio / sd_coef, unit_quartiles=q, kl_per_turn=kl,
                 candidate_share=share, distilled_share=float(np.mean([m.get("sd/distilled_share", 0.0)
                                                                       for m in rows])) if rows else math.nan)


def recommend(p: Pilot, target: float) -> float:
    """The λ whose SD gradient norm is `target` times GRPO's: target / u."""
    return target / p.unit_ratio


def report(p: Pilot, target: float) -> list[str]:
    """The printed lines: what was measured, and the λ to use (or why there is none)."""
    if p.measured < MIN_MEASURED:
        return [f"error: {p.measured} of the {p.steps} steps measured both terms (a distilled turn and a "
                f"GRPO signal: groups with both successes and failures); a λ needs at least {MIN_MEASURED}: "
                "run a longer pilot (--steps), or check that the router matches turns (router/match_rate) "
                "and that some groups succeed"]
    lo, hi = (target / x for x in p.unit_quartiles[::-1])
    lines = [f"pilot: {p.measured} of {p.steps} steps measured at λ₀ = {p.sd_coef:g}; SD / GRPO gradient "
             f"ratio {p.ratio:.3g}, i.e. {p.unit_ratio:.3g} per unit λ (quartiles {p.unit_quartiles[0]:.3g}–"
             f"{p.unit_quartiles[1]:.3g})",
             f"teacher: KL(student ‖ teacher) {p.kl_per_turn:.2f} nat per distilled turn; "
             f"candidate sampled on {p.candidate_share:.0%} of matched turns; "
             f"{p.distilled_share:.0%} of turns distilled",
             f"λ for an SD gradient {target:g} × GRPO's: --grpo.sd-coef {recommend(p, target):.3g} "
             f"(steps' quartiles give {lo:.3g}–{hi:.3g})"]
    return lines


PILOT_LENGTHS = (5, 10)  # the pilot lengths (steps) whose reading of a run's strength a sweep's report checks


def pilot_agreement(runs: list[list[dict]], steps: tuple[int, ...] = PILOT_LENGTHS) -> dict[int, dict]:
    """How far a short pilot's reading of the SD term's strength is from what a whole run measured (a sweep's
    report checks PILOT_STEPS with it: bench/learn_report.py): per run (its metrics rows) with an SD term,
    the median SD / GRPO gradient share over all its steps over the median over its first K steps, then
    their median, 10% and 90% quantiles and how many are within 1.5×. The first steps run at the run's own λ:
    a stand-in for a pilot at λ₀, exact where the share is λ times a constant (share_per_unit_lambda checks
    that)."""
    training = [[m for m in rows if "actor/sd_grpo_grad_ratio" in m] for rows in runs]
    whole = [np.median(r) if (r := finite_ratios(rows)) else None for rows in training]  # once per run
    out = {}
    for k in steps:
        heads = [(w, finite_ratios(rows[:k])) for w, rows in zip(whole, training)]
        ratios = [float(w / np.median(head)) for w, head in heads if head]
        if ratios:
            q10, q50, q90 = np.quantile(ratios, [0.1, 0.5, 0.9])
            out[k] = {"runs": len(ratios), "median": float(q50), "q10": float(q10), "q90": float(q90),
                      "within_1.5x": sum(1 / 1.5 <= x <= 1.5 for x in ratios)}
    return out


def share_per_unit_lambda(rows: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """The SD / GRPO gradient share per unit λ, u = share / λ (mean ± SE over seeds), of the rows whose names
    differ only in their -lam<λ>: the pilot's premise is that u does not depend on λ."""
    groups: dict[str, dict[str, tuple[float, float]]] = {}
    for r in rows:
        if "sd/grpo" in r and "-lam" in r["name"]:
            base, lam = r["name"].rsplit("-lam", 1)
            groups.setdefault(base, {})[lam] = tuple(x / float(lam) for x in r["sd/grpo"])
    return {base: us for base, us in groups.items() if len(us) > 1}


def run_pilot(steps: int, out: Path, launcher: str, flags: list[str]) -> None:
    """smrc.py with the user's flags for `steps` steps at λ₀ = PILOT_SD_COEF into `out`, no validation,
    one checkpoint at the end; stops with smrc.py's exit code if it fails."""
    owned = [f.split("=")[0] for f in flags if f.split("=")[0] in PILOT_OWNS]
    if owned:
        raise SystemExit(f"error: the pilot sets {', '.join(owned)} itself; "
                         "leave it out of the smrc.py flags")
    cmd = [*shlex.split(launcher), "smrc.py", *flags, "--steps", str(steps), "--grpo.sd-coef",
           str(PILOT_SD_COEF), "--output-dir", str(out), "--save-every", str(steps), "--eval-every", "0",
           "--grpo.term-grad-norms", "on"]  # what it reads (auto is off from 100M parameters)
    print("[pilot] " + shlex.join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent).returncode
    if rc:
        raise SystemExit(f"error: the pilot run stopped with exit code {rc}; its output is above")


def main(argv: list[str]) -> None:
    ours, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", help="a smrc.py run folder to read (without: run a pilot first)")
    ap.add_argument("--target", type=float, default=TARGET_RATIO,
                    help=f"the SD / GRPO gradient-norm ratio to aim at (default: {TARGET_RATIO})")
    ap.add_argument("--steps", type=int, default=PILOT_STEPS, help=f"pilot steps (default: {PILOT_STEPS})")
    ap.add_argument("--out", default="runs/lambda_pilot", help="the pilot's run folder")
    ap.add_argument("--launcher", default=f"{shlex.quote(sys.executable)}",
                    help='how to start smrc.py, e.g. "torchrun --nproc_per_node 8" (default: this python)')
    args = ap.parse_args(ours)
    if args.target <= 0 or args.steps < 1:
        ap.error("--target must be > 0 and --steps ≥ 1")
    if args.run_dir is None:
        if not flags:
            ap.error("give a run folder, or the smrc.py flags of the run to pilot after --")
        run_pilot(args.steps, Path(args.out), args.launcher, flags)
    run_dir = Path(args.run_dir or args.out)
    pilot = measure(run_dir)
    lines = report(pilot, args.target)
    print("\n".join(lines))
    if pilot.measured < MIN_MEASURED:
        raise SystemExit(1)
    (run_dir / "lambda_pilot.json").write_text(json.dumps(
        {**asdict(pilot), "target": args.target, "recommended_sd_coef": recommend(pilot, args.target)},
        indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
