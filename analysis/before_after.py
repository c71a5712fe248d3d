"""Before and after (`python evaluate.py before-after --run runs/tiny`): a run's warm start against its newest
checkpoint, on the run's training games and on held-out games, labelled, with the counts behind every rate.

It is `evaluate.py eval` twice (split train, then split eval), each with the warm start (the run's --model)
as the baseline row and the run folder's newest verified checkpoint as the other, the same k, seed and
settings (the run's); the two tables become one (`table`), written to RUN/before_after.md and .json.

What the tiny preset can show (issue 68): its 10 steps train on 8 generated games, and that is where the
change is visible; its 6 held-out games stay near 0 for both rows. Held-out generalisation is what
`--preset learn` / bench/learn.py measure (hours on 2 cores; docs/results.md).
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SPLITS = (("train", "training games"), ("eval", "held-out games"))


@dataclass
class BeforeAfterArgs:
    """The warm start against the trained checkpoint, on the training games and on held-out games."""
    run: str = "runs/tiny"
    """run folder (its config.json names the warm start; its newest verified checkpoint is the trained row)"""
    k: int = 4
    """sampled attempts per game"""
    limit: int = 0
    """keep N games of each split, type-stratified, drawn with --seed (0 = every game of both splits)"""
    seed: int = 0
    """panel seed (as evaluate.py eval's)"""


def counts(row: dict) -> tuple[int, int, int, int]:
    """(episodes won, episodes, games solved at least once, games) of one eval row."""
    eps = row["episodes"]
    solved = {e["task_id"] for e in eps if e["won"]}
    return sum(bool(e["won"]) for e in eps), len(eps), len(solved), len({e["task_id"] for e in eps})


def table(results: dict[str, dict], k: int) -> str:
    """One markdown table: a row per model (warm start, trained), per split avg@k and pass@k with their
    counts."""
    head = "| model | " + " | ".join(f"{name}: avg@{k} | {name}: pass@{k}" for _, name in SPLITS) + " |"
    lines = [head, "|---|" + "---|---|" * len(SPLITS)]
    for i, label in enumerate(("warm start", "trained")):
        rows = [results[split]["rows"][i] for split, _ in SPLITS]
        cells = []
        for row in rows:
            won, n, solved, games = counts(row)
            m = row["metrics"]
            cells += [f"{m[f'avg@{k}']:.3f} ({won}/{n} episodes)",
                      f"{m[f'pass@{k}']:.3f} ({solved}/{games} games)"]
        lines.append(f"| {label} ({rows[0]['label'].removeprefix('baseline (').rstrip(')')}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_before_after(args: BeforeAfterArgs, evaluate: Callable[..., dict]) -> str:
    """Evaluate both rows on both splits (`evaluate`: evaluate.py's run_eval over EvalArgs' fields)."""
    run = Path(args.run)
    if not (run / "config.json").is_file():
        raise SystemExit(f"error: --run {args.run} holds no config.json: not a run folder")
    cfg = json.loads((run / "config.json").read_text())
    results = {}
    for split, name in SPLITS:
        print(f"[before-after] {name} (split {split}): the warm start {cfg['model']} and {run}'s newest "
              f"checkpoint", flush=True)
        results[split] = evaluate(checkpoint=(str(run),), baseline=cfg["model"], split=split, k=args.k,
                                  limit=args.limit, seed=args.seed, output=str(run / f"before_after_{split}"))
    text = table(results, args.k)
    games = ", ".join(f"{name}: {len(results[split]['tasks'])}" for split, name in SPLITS)
    text = (f"Before / after training ({run}; k = {args.k} sampled attempts per game; {games}):\n\n{text}\n"
            + (TINY_NOTE if cfg.get("preset") == "tiny" else ""))
    (run / "before_after.md").write_text(text)
    (run / "before_after.json").write_text(json.dumps({"k": args.k, "table": text, "results": {
        s: {"tasks": r["tasks"], "rows": r["rows"]} for s, r in results.items()}}, indent=1))
    print("\n" + text, flush=True)
    print(f"[before-after] wrote {run / 'before_after.md'} and .json", flush=True)
    return text


TINY_NOTE = ("\nThe tiny preset trains on its 8 training games for 10 steps: that is where a change shows. "
             "Its "
             "held-out games measure generalisation, which it is too small to show: see --preset learn / "
             "bench/learn.py (hours on 2 cores).\n")
