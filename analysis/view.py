"""The run viewer (`python evaluate.py view --run RUN_DIR`): one self-contained HTML file that shows, turn by
turn, what the router matched and what the teacher pushed.

It reads the run folder (config.json, metrics.jsonl, rollouts.jsonl.gz) and writes RUN_DIR/view.html (or
--output): the page's data as one JSON block, its script and styles inline (analysis/view.html), the curves
as an embedded PNG (analysis/plots.curves_png); it opens from disk, offline, in any browser.

What the page shows:
- the run: the resolved settings that decide routing and distillation, and the curves of success, match rate,
  distilled share, KL per distilled turn and SD / GRPO gradient share;
- a step × task table (each group's successes, matched and distilled turns) with filters by task type, won or
  lost, and matched or not; the filters live in the URL's hash (#type=...&won=lost&matched=yes&step=2), so a
  filtered view is a link;
- each episode, turn by turn: observation, the student's whole response, the action with its validity and
  reward; on matched turns the reference, its position, the candidate and the state summary (and, on the
  turns the archive kept tokens for, the teacher's user message, folded); on those distilled turns the
  response's tokens coloured by Δ = log π_T − log π_θ (value on hover); on unmatched turns the nearest
  reference state and the signature fields that differ.

An archive of version 1 (before issue 65) has no responses, tokens or nearest states: the page says so in
place of those panels. `--steps`, `--tasks` and `--limit` bound what goes in.
"""
import base64
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import tyro

import router
from analysis import plots
from analysis import archives
from scale.run_logs import read_archive

TEMPLATE = Path(__file__).with_name("view.html")
SETTINGS = (("env", "env"), ("model", "model"), ("algo", "algo"), ("steps", "steps"), ("seed", "seed"),
            ("λ (sd_coef)", "resolved.sd_coef"), ("L_SD form", "resolved.sd_loss"),
            ("matcher", "resolved.matcher"), ("context", "resolved.context"),
            ("references", "router.references"), ("archive_size", "router.archive_size"),
            ("seed_with_planner", "router.seed_with_planner"), ("tasks_per_step", "rollout.tasks_per_step"),
            ("group_size", "rollout.group_size"), ("action_space", "rollout.action_space"),
            ("archive_token_turns", "archive_token_turns"))


@dataclass
class ViewArgs:
    """A self-contained HTML view of a run, turn by turn (open it from disk in any browser)."""
    run: str = "runs/tiny"
    """run folder (config.json, metrics.jsonl, rollouts.jsonl.gz)"""
    output: str = ""
    """the HTML file (default: RUN/view.html)"""
    steps: tyro.conf.UseAppendAction[tuple[int, ...]] = ()
    """keep these steps only (repeat the flag; default: every step)"""
    tasks: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    """keep these tasks only: a task id or a task type (repeat the flag; default: every task)"""
    limit: int = 1000
    """keep at most N episodes, the first in (step, task, trajectory) order (0 = all; the page and the
    printed line say when episodes were left out)"""


def _get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def episodes_of(rows: list[dict], args: ViewArgs) -> list[dict]:
    """The archive's turns as episodes (step, task, trajectory; turns in order) of --steps and --tasks."""
    by_traj: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if (not args.steps or r["step"] in args.steps) and \
                (not args.tasks or r["task_id"] in args.tasks or r["task_type"] in args.tasks):
            by_traj[(r["step"], r["task_id"], r["traj_id"])].append(r)
    eps = []
    for (step, task_id, traj_id), turns in sorted(by_traj.items()):
        turns.sort(key=lambda r: r["turn"])
        eps.append({"step": step, "task_id": task_id, "task_type": turns[0]["task_type"], "traj_id": traj_id,
                    "won": bool(turns[0]["episode_won"]), "ret": turns[0]["episode_return"],
                    "turns": [_turn(r) for r in turns]})
    return eps


def _turn(r: dict) -> dict:
    """One turn as the page reads it: short keys, absent values as null (the page says why)."""
    m = r.get("match")
    t = {"i": r["turn"], "obs": r["observation"], "resp": r.get("response"), "action": r["action"],
         "valid": r["valid"], "parse": r.get("parse_reason"), "reward": r["reward"],
         "adv": r.get("advantage"),
         "distilled": r.get("distilled"), "nearest": None, "tok": None, "teacher": r.get("teacher_user_text")}
    if m is not None:
        t["match"] = {"ref": m["ref"], "pos": m["position"], "cand": m["candidate"],
                      "summary": router.state_summary(router.as_signature(r["signature"]))}
    else:
        t["match"] = None
        near = r.get("nearest")
        if near is not None:
            mine, theirs = dict(router.as_signature(r["signature"])), dict(router.as_signature(
                near["ref_signature"] or ()))
            t["nearest"] = {"ref": near["ref"], "pos": near["position"],
                            "differ": [[k, _text(mine, k), _text(theirs, k)] for k in near["differ"]]}
    if r.get("tokens") is not None:
        t["tok"] = [[p, round(a - b, 3), a, b] for p, a, b in
                    zip(r["tokens"], r["teacher_logprobs"], r["student_logprobs"])]
    return t


def _text(signature: dict, field: str) -> str:
    """A signature field's value as text ("(absent)" where the signature has no such field)."""
    if field not in signature:
        return "(absent)"
    v = signature[field]
    return "(" + ", ".join(_text({0: x}, 0) for x in v) + ")" if isinstance(v, tuple) else str(v)


def groups_of(episodes: list[dict]) -> list[dict]:
    """The step × task table: each group's episodes, successes, matched and distilled turns."""
    g: dict[tuple, dict] = {}
    for e in episodes:
        row = g.setdefault((e["step"], e["task_id"]), {"step": e["step"], "task_id": e["task_id"],
                                                       "task_type": e["task_type"], "episodes": 0, "won": 0,
                                                       "turns": 0, "matched": 0, "distilled": 0})
        row["episodes"] += 1
        row["won"] += e["won"]
        row["turns"] += len(e["turns"])
        row["matched"] += sum(t["match"] is not None for t in e["turns"])
        row["distilled"] += sum(bool(t["distilled"]) for t in e["turns"])
    return list(g.values())


def notes_of(rows: list[dict]) -> dict:
    """Why a panel is empty, by panel: what the archive's version or the run's flags left out."""
    version = max((r.get("v", 1) for r in rows), default=None)
    old = (f"this archive is version {version} (before issue 65): it keeps no responses, tokens or nearest "
           f"reference states; a run of the current code does") if version == 1 else ""
    return {"version": version,
            "response": old or "the response was not archived",
            "tokens": old or "tokens and log-probs are kept on a sample of distilled turns only "
                             "(--archive-token-turns per step and rank): not this one",
            "teacher": old or "the teacher's user message is kept on the same sampled distilled turns only",
            "nearest": old or "no nearest state archived",
            "distilled": old or ""}


def _read_rows(archive: Path) -> list[dict]:
    """The rollout archive's rows, on disk or packed in a record (analysis/archives.py; [] if not)."""
    if archive.is_file() or not archives.exists(archive):
        return read_archive(archive) if archive.is_file() else []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / archive.name).write_bytes(archives.read_bytes(archive))
        return read_archive(Path(tmp) / archive.name)


def view_data(run: Path, args: ViewArgs) -> dict:
    """The page's data: the settings, the curves, the notes on what is missing, the groups and the episodes.
    A run folder packed in a record (bench/results/X.tar.gz) is read from it."""
    cfg = json.loads(archives.read_text(run / "config.json")) if archives.exists(run / "config.json") else {}
    metrics = [json.loads(line) for line in archives.read_text(run / "metrics.jsonl").splitlines()
               if line.strip()] if archives.exists(run / "metrics.jsonl") else []
    rows = _read_rows(run / "rollouts.jsonl.gz")
    every = episodes_of(rows, args)
    if rows and not every:
        steps = sorted({r["step"] for r in rows})
        raise SystemExit(f"error: --steps {list(args.steps)} --tasks {list(args.tasks)} keep none of the "
                         f"archive's turns (its steps: {steps[0]}-{steps[-1]}; tasks: a task id or type)")
    episodes = every[:args.limit] if args.limit else every
    if len(episodes) < len(every):
        print(f"[view] --limit {args.limit}: the first {args.limit} of {len(every)} episodes", flush=True)
    png = plots.curves_png(metrics) if metrics else None
    return {"run": str(run), "config": [[name, _get(cfg, key)] for name, key in SETTINGS],
            "curves": base64.b64encode(png).decode() if png else None,
            "curves_note": "" if png else ("no metrics.jsonl in the run folder" if not metrics else
                                           "the curves need matplotlib (pip install matplotlib)"),
            "archive_note": "" if rows else "no rollout archive (rollouts.jsonl.gz; --archive-max-turns 0?)",
            "bounded": {"steps": list(args.steps), "tasks": list(args.tasks), "limit": args.limit,
                        "archived_turns": len(rows), "episodes": len(every)},
            "notes": notes_of(rows), "groups": groups_of(episodes), "episodes": episodes}


def run_view(out: Path) -> Path:
    """A run folder's view with the defaults (the end of a training run: wandb and MLflow log it)."""
    return write_view(ViewArgs(run=str(out)))


def write_view(args: ViewArgs) -> Path:
    """Write the HTML file; returns its path."""
    run = Path(args.run)
    if not any(archives.exists(run / f) for f in ("metrics.jsonl", "rollouts.jsonl.gz")):
        raise SystemExit(f"error: --run {args.run} holds neither metrics.jsonl nor rollouts.jsonl.gz (on "
                         f"disk or packed in bench/results/*.tar.gz): not a run folder")
    data = json.dumps(view_data(run, args), separators=(",", ":")).replace("</", "<\\/")
    out = Path(args.output) if args.output else run / "view.html"  # a packed run: beside its record's path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(TEMPLATE.read_text().replace("/*DATA*/null", data, 1))
    print(f"[view] wrote {out} ({out.stat().st_size / 1024:.0f} KiB)", flush=True)
    return out
