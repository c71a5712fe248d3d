"""Where a training step's memory goes: the peak of each phase, for any model and any smrc.py flags.

Runs smrc.py itself (`smrc.main`, the flags passed through unchanged) with finer phases inside the trainer's
own (rollout, teacher, update; scale/memory.py): generation (the engine's `generate` calls), teacher scoring
(`teacher.score_turns`), candidate gain (`candidate_gain.measure`) and reference KL (the frozen reference
model's forwards inside the update). The peak of a phase is this process's resident memory (VmHWM, reset when
the phase starts) on CPU, torch's peak allocated memory on CUDA; an outer phase's peak includes its inner
ones'. Each phase's peak is printed as the phase ends, so a run stopped by the out-of-memory watchdog still
shows every phase before it; the table of the largest peak per phase is printed at the end and written as
JSON.

    python bench/memory.py --output runs/memory.json -- --env alfworld --model DIR --algo smrc-sd --steps 2 \\
        --rollout.tasks-per-step 2 --rollout.group-size 2 --alfworld.max-steps 4 --save-every 1 --device cpu
    python bench/memory.py -- --preset tiny --steps 1   # seconds: the embedded model
"""
import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import smrc  # noqa: E402
import teacher  # noqa: E402
from measure import candidate_gain  # noqa: E402
from models import HFEngine  # noqa: E402
from scale import lifecycle  # noqa: E402
from scale.memory import GIB, Memory  # noqa: E402

ORDER = ("generation", "rollout", "teacher scoring", "candidate gain", "teacher", "reference KL", "update")


class PrintingMemory(Memory):
    """The trainer's Memory, printing each phase's peak as it ends and keeping every peak for the table."""
    current_run: "PrintingMemory | None" = None
    log: list[dict] = []
    output = ""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        PrintingMemory.current_run = self
        self.step = 1

    @contextlib.contextmanager
    def phase(self, name: str):
        with super().phase(name):
            yield
        peak = self.peaks[name] / GIB
        PrintingMemory.log.append({"step": self.step, "phase": name, "peak_gib": peak})
        if PrintingMemory.output:  # rewritten at every phase: a run the watchdog stops keeps its record
            Path(PrintingMemory.output).write_text(json.dumps({"phases": PrintingMemory.log}, indent=1))
        print(f"[memory] step {self.step} {name}: peak {peak:.2f} GiB", flush=True)
        self.step += name == "update"


def in_phase(name: str, fn):
    """`fn` run inside the current trainer's phase `name` (as is, before the trainer has one)."""
    @functools.wraps(fn)
    def run(*a, **kw):
        mem = PrintingMemory.current_run
        with mem.phase(name) if mem is not None else contextlib.nullcontext():
            return fn(*a, **kw)
    return run


def reference_hooks(model) -> None:
    """The reference model's forwards as the phase 'reference KL' (entered by a pre-hook, left by a hook)."""
    open_phases = []

    def enter(module, args, kwargs):
        cm = PrintingMemory.current_run.phase("reference KL")
        cm.__enter__()
        open_phases.append(cm)

    def leave(module, args, kwargs, out):
        open_phases.pop().__exit__(None, None, None)
    model.register_forward_pre_hook(enter, with_kwargs=True)
    model.register_forward_hook(leave, with_kwargs=True)


def patched_setup(setup):
    @functools.wraps(setup)
    def run(*a, **kw):
        cfg, s = setup(*a, **kw)
        if s.ref_model is not None:
            reference_hooks(s.ref_model)
        return cfg, s
    return run


def table(log: list[dict]) -> str:
    peaks: dict[str, float] = {}
    for row in log:
        peaks[row["phase"]] = max(peaks.get(row["phase"], 0.0), row["peak_gib"])
    names = [n for n in ORDER if n in peaks] + sorted(set(peaks) - set(ORDER))
    return "\n".join([f"{'phase':<18}{'peak GiB':>10}"] + [f"{n:<18}{peaks[n]:>10.2f}" for n in names])


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="", help="also write every phase's peak to this JSON file")
    parser.add_argument("smrc_args", nargs=argparse.REMAINDER, help="-- then smrc.py's flags")
    args = parser.parse_args(argv)
    flags = args.smrc_args[1:] if args.smrc_args[:1] == ["--"] else args.smrc_args
    lifecycle.Memory = PrintingMemory  # the run's watchdog (scale/lifecycle.py)
    smrc.setup = patched_setup(smrc.setup)
    HFEngine.generate = in_phase("generation", HFEngine.generate)
    teacher.score_turns = in_phase("teacher scoring", teacher.score_turns)
    candidate_gain.measure = in_phase("candidate gain", candidate_gain.measure)
    PrintingMemory.log.clear()
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        PrintingMemory.output = args.output
    smrc.main(smrc.parse_config(flags))
    print(table(PrintingMemory.log))
    result = {"flags": flags, "phases": PrintingMemory.log}
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
