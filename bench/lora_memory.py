"""Peak memory of LoRA beside full fine-tuning on the same smrc.py flags (issue 67): each mode runs
bench/memory.py (the trainer's own phases, each phase's peak: VmHWM reset as the phase starts, on CPU) in a
fresh process, the LoRA run with `--lora.rank R` added and nothing else changed; then one table: each phase's
peak at step 1 (whose rollouts are the same in both: B = 0 and the step's seed; the line below the table
counts the equal responses) and over all steps, the ratio LoRA / full, and the memory plan
(scale/memory_plan.py) of each on the same flags. (The child's getrusage peak is not shown: resetting VmHWM
resets it too.) A mode whose JSON already holds every step's update is not rerun. Checkpoint weights are
deleted after each run (the record keeps metrics, config, rollouts and logs).

    python bench/lora_memory.py bench/results/lora_smollm2 --rank 8 -- --model models/smollm2-135m \\
        --algo smrc-sd --steps 2 --rollout.tasks-per-step 2 --rollout.group-size 2 --alfworld.max-steps 4 \\
        --rollout.sampling.max-new-tokens 128 --save-every 1 --device cpu
"""
import argparse
import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from analysis import archives  # noqa: E402


def mode_flags(flags: list[str], mode: str, rank: int, record: Path) -> list[str]:
    extra = ["--lora.rank", str(rank)] if mode == "lora" else []
    return [*flags, *extra, "--output-dir", str(record / f"{mode}-run")]


def steps_of(flags: list[str]) -> int:
    from config import parse_config
    return parse_config(flags).steps


def finished(record: Path, mode: str, steps: int) -> bool:
    path = record / f"{mode}.json"
    if not archives.exists(path):
        return False
    rows = json.loads(archives.read_text(path)).get("phases", [])
    return sum(r["phase"] == "update" for r in rows) >= steps


def run_mode(record: Path, mode: str, flags: list[str]) -> None:
    """bench/memory.py in a child process; its wall time added to its JSON."""
    out = record / f"{mode}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "memory.py"), "--output", str(out), "--", *flags]
    t0 = time.time()
    with open(record / f"{mode}.log", "w") as log:
        log.write("# " + " ".join(cmd[1:]) + "\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"error: the {mode} run exited {rc}; see {record / f'{mode}.log'}")
    result = json.loads(out.read_text())
    result.update(wall_s=time.time() - t0, plan_gib=planned(flags))  # the plan kept: its model may go
    out.write_text(json.dumps(result, indent=1))
    for ckpt in (record / f"{mode}-run").glob("step_*"):
        shutil.rmtree(ckpt)


def same_responses(record: Path, step: int) -> str:
    """How many of a step's turns sampled the same response in both runs (their rollout archives)."""
    def responses(mode: str) -> list:
        path = record / f"{mode}-run" / "rollouts.jsonl.gz"
        if not archives.exists(path):
            return []
        rows = [json.loads(line) for line in gzip.decompress(archives.read_bytes(path)).splitlines()]
        return [(r["traj_id"], r["turn"], r["response"]) for r in rows if r["step"] == step]
    full, lo = responses("full"), responses("lora")
    return f"step {step}: {sum(a == b for a, b in zip(full, lo))} of {len(full)} turns' responses equal"


def planned(flags: list[str]) -> dict:
    from config import parse_config
    from scale.memory_plan import load_arch, plan
    cfg = parse_config(flags)
    result = plan(cfg, load_arch(cfg.model), cuda=False, gpu_gib=80.0, nproc=1)
    return {name: sum(parts.values()) for name, parts in result["phases"].items()}


def table(record: Path, flags_of: dict[str, list[str]]) -> list[str]:
    step1, peaks, wall, plans = {}, {}, {}, {}
    for mode, flags in flags_of.items():
        rows = json.loads(archives.read_text(record / f"{mode}.json"))
        wall[mode], plans[mode] = rows["wall_s"], rows.get("plan_gib") or planned(flags)
        step1[mode], peaks[mode] = {}, {}
        for r in rows["phases"]:
            peaks[mode][r["phase"]] = max(peaks[mode].get(r["phase"], 0.0), r["peak_gib"])
            if r["step"] == 1:
                step1[mode][r["phase"]] = max(step1[mode].get(r["phase"], 0.0), r["peak_gib"])
    head = ("phase", "step 1: full", "LoRA", "LoRA/full", "all: full", "LoRA", "LoRA/full", "plan: full",
            "LoRA")
    lines = ["peak GiB of each phase (bench/memory.py); plan: scale/memory_plan.py on the same flags",
             f"{head[0]:<16}" + "".join(f"{h:>12}" for h in head[1:])]
    for name in peaks["full"]:
        cells = []
        for got in (step1, peaks):
            f, lo = got["full"].get(name, float("nan")), got["lora"].get(name, float("nan"))
            cells += [f"{f:>12.2f}", f"{lo:>12.2f}", f"{lo / f:>12.2f}"]
        pf, pl = plans["full"].get(name), plans["lora"].get(name)
        known = pf is not None and pl is not None
        cells += [f"{pf:>12.2f}", f"{pl:>12.2f}"] if known else [f"{'–':>12}"] * 2
        lines.append(f"{name:<16}" + "".join(cells))
    return lines + [same_responses(record, 1),
                    "wall time: " + ", ".join(f"{m} {wall[m] / 60:.1f} min" for m in wall)]


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
