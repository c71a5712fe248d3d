"""Peak memory of LoRA beside full fine-tuning on the same smrc.py flags (issue 67): each mode runs
bench/memory.py (the trainer's own phases, each phase's peak) in a fresh process, the LoRA run with
`--lora.rank R` added and nothing else changed; then one table: each phase's peak in both, the ratio
LoRA / full, the process's whole-life peak resident memory (getrusage of the child), and the memory plan
(scale/memory_plan.py) of each on the same flags. A mode whose JSON already holds every step's update is
not rerun. Checkpoint weights are deleted after each run (the record keeps metrics, config and logs).

    python bench/lora_memory.py bench/results/lora_smollm2 --rank 8 -- --model models/smollm2-135m \\
        --algo smrc-sd --steps 2 --rollout.tasks-per-step 2 --rollout.group-size 2 --alfworld.max-steps 4 \\
        --rollout.sampling.max-new-tokens 128 --save-every 1 --device cpu
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def mode_flags(flags: list[str], mode: str, rank: int, record: Path) -> list[str]:
    extra = ["--lora.rank", str(rank)] if mode == "lora" else []
    return [*flags, *extra, "--output-dir", str(record / f"{mode}-run")]


def steps_of(flags: list[str]) -> int:
    from config import parse_config
    return parse_config(flags).steps


def finished(record: Path, mode: str, steps: int) -> bool:
    path = record / f"{mode}.json"
    if not path.is_file():
        return False
    rows = json.loads(path.read_text()).get("phases", [])
    return sum(r["phase"] == "update" for r in rows) >= steps and "maxrss_gib" in json.loads(path.read_text())


def run_mode(record: Path, mode: str, flags: list[str]) -> None:
    """bench/memory.py in a child process; its whole-life peak RSS (wait4) and wall time added to its JSON."""
    out = record / f"{mode}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "memory.py"), "--output", str(out), "--", *flags]
    t0 = time.time()
    with open(record / f"{mode}.log", "w") as log:
        log.write("# " + " ".join(cmd[1:]) + "\n")
        log.flush()
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise SystemExit(f"error: the {mode} run exited {rc}; see {record / f'{mode}.log'}")
    result = json.loads(out.read_text())
    result.update(maxrss_gib=usage.ru_maxrss * 1024 / 2**30, wall_s=time.time() - t0, rc=rc)
    out.write_text(json.dumps(result, indent=1))
    for ckpt in (record / f"{mode}-run").glob("step_*"):
        shutil.rmtree(ckpt)


def planned(flags: list[str]) -> dict:
    from config import parse_config
    from scale.memory_plan import load_arch, plan
    cfg = parse_config(flags)
    result = plan(cfg, load_arch(cfg.model), cuda=False, gpu_gib=80.0, nproc=1)
    phases = {name: sum(parts.values()) for name, parts in result["phases"].items()}
    return {**phases, "whole run (RSS)": max(phases.values())}


def table(record: Path, flags_of: dict[str, list[str]]) -> list[str]:
    peaks = {}
    for mode in flags_of:
        rows = json.loads((record / f"{mode}.json").read_text())
        peaks[mode] = {"whole run (RSS)": rows["maxrss_gib"], "wall s": rows["wall_s"]}
        for r in rows["phases"]:
            peaks[mode][r["phase"]] = max(peaks[mode].get(r["phase"], 0.0), r["peak_gib"])
    plans = {mode: planned(flags) for mode, flags in flags_of.items()}
    head = ("phase", "full GiB", "LoRA GiB", "LoRA/full", "plan full", "plan LoRA")
    lines = [f"{head[0]:<18}{head[1]:>10}{head[2]:>10}" + "".join(f"{h:>11}" for h in head[3:])]
    for name in [n for n in peaks["full"] if n != "wall s"]:
        f, lo = peaks["full"][name], peaks["lora"].get(name, float("nan"))
        pf, pl = plans["full"].get(name), plans["lora"].get(name)
        known = pf is not None and pl is not None
        plan_cells = f"{pf:>11.2f}{pl:>11.2f}" if known else f"{'–':>11}{'–':>11}"
        lines.append(f"{name:<18}{f:>10.2f}{lo:>10.2f}{lo / f:>11.2f}" + plan_cells)
    return lines + ["wall time: " + ", ".join(f"{m} {peaks[m]['wall s'] / 60:.1f} min" for m in peaks)]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--no-run", action="store_true", help="summarise what finished")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, flags = ap.parse_args(argv[:cut]), argv[cut + 1:]  # after --: smrc.py's flags
    args.record.mkdir(parents=True, exist_ok=True)
    flags_of = {mode: mode_flags(flags, mode, args.rank, args.record) for mode in ("full", "lora")}
    for mode, mflags in flags_of.items():
        if not args.no_run and not finished(args.record, mode, steps_of(mflags)):
            run_mode(args.record, mode, mflags)
    lines = ["# python bench/lora_memory.py " + " ".join(argv), *table(args.record, flags_of)]
    (args.record / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
