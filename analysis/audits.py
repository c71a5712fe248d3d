"""Matching-quality audits on a run's rollout archive (output_dir/rollouts.jsonl.gz), and the archive's rows.

The archive's rows (scale/run_logs.archive_rows) hold every turn with its routing decision and both audited
matchers' matches, made by the trainer's routing stage on the step's own bank (router.audited_matches).

- `matcher_comparison(rows)`: on the same archived turns, coverage of the `structured` and `history` matchers,
  the share of each one's matches that the other reproduces (matches the same turn), and, on the common
  matches, how often both pick the same candidate action (the paper's 20.2% / 98.8% / 75.4% / 99.4% table).
- `replay_audit(rows, ...)`: for sampled matched turns of each matcher, restore the environment by replaying
  the student's actual action prefix (the earlier turns of the same traj_id, from the archive) from reset;
  check the state signature then equals the archived one (else the case is "restore failed", not a match
  failure); then execute the matched candidate and the rest of the reference's suffix (archived as
  match.ref_suffix, whose first action is the candidate's position). Success = the episode is won by the end
  (the paper's 781/781 and 792/800).

Run through `python evaluate.py audit --run DIR`.

Choices (numbered):
1. The audit env is the run's env config with the step limit lifted (max_steps = 10_000): the audit asks
   whether the matched suffix is valid from the restored state, not whether it fits the training step budget.
2. A sampled turn whose earlier turns are not all in the archive (the archive cap was reached mid-trajectory)
   is counted as "prefix_missing" and not replayed.
3. Samples are drawn with random.Random(seed) from the matched turns sorted by (step, traj_id, turn), and
   replayed in task order so loaded games are reused.
"""
import copy
import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

import envs
import rollout
from router import as_signature
from scale.run_logs import read_archive

MATCH_KEYS = {"structured": "structured", "history": "history_match", "observation": "observation_match",
              "routed": "match"}  # matcher -> archive column
AUDIT_MAX_STEPS = 10_000  # choice 1: the step limit lifted


@dataclass
class AuditArgs:
    """Matcher comparison and replay audit on a run's rollout archive."""
    run: str = "runs/tiny"
    """run directory holding rollouts.jsonl.gz and config.json"""
    samples: int = 100
    """matched turns audited per matcher (sampled with --seed; all if fewer)"""
    matchers: tuple[str, ...] = ("structured", "history", "observation", "routed")
    """which archived matches to replay: structured, history, observation (the generic signature), routed
    (the run's own matcher)"""
    seed: int = 0
    """sampling seed"""
    output: str = ""
    """JSON output (default: RUN/audit.json)"""


# ------------------------------------------------------------------------------------------------------------
# The audits


def _share(a: int, b: int) -> float | None:
    return a / b if b else None  # None (JSON null) rather than a made-up 0 when there is nothing to divide


def matcher_comparison(rows: list[dict]) -> dict:
    """Coverage and overlap of the structured and history matchers on the same turns."""
    s = {i for i, r in enumerate(rows) if r.get("structured")}
    h = {i for i, r in enumerate(rows) if r.get("history_match")}
    common = sorted(s & h)
    same_cand = sum(rows[i]["structured"]["candidate"] == rows[i]["history_match"]["candidate"]
                    for i in common)
    same_pos = sum((rows[i]["structured"]["ref"], rows[i]["structured"]["position"])
                   == (rows[i]["history_match"]["ref"], rows[i]["history_match"]["position"]) for i in common)
    routed = sum(bool(r.get("match")) for r in rows)
    return {
        "turns": len(rows),
        "structured_matches": len(s), "history_matches": len(h), "common_matches": len(common),
        "coverage_structured": _share(len(s), len(rows)), "coverage_history": _share(len(h), len(rows)),
        "coverage_routed": _share(routed, len(rows)),
        "history_matches_reproduced_by_structured": _share(len(common), len(h)),
        "structured_matches_reproduced_by_history": _share(len(common), len(s)),
        "candidate_agreement_on_common": _share(same_cand, len(common)),
        "same_reference_position_on_common": _share(same_pos, len(common)),
        **_against_structured(rows, "observation", "observation_match"),
    }


def _against_structured(rows: list[dict], name: str, key: str) -> dict:
    """A matcher's coverage beside the structured one's, the share of each one's matches the other makes, and
    how often both pick the same candidate where both match."""
    s = {i for i, r in enumerate(rows) if r.get("structured")}
    m = {i for i, r in enumerate(rows) if r.get(key)}
    common = s & m
    same = sum(rows[i]["structured"]["candidate"] == rows[i][key]["candidate"] for i in common)
    return {f"{name}_matches": len(m), f"coverage_{name}": _share(len(m), len(rows)),
            f"{name}_matches_reproduced_by_structured": _share(len(common), len(m)),
            f"structured_matches_reproduced_by_{name}": _share(len(common), len(s)),
            f"candidate_agreement_{name}_structured": _share(same, len(common))}


def audit_env_config(env_cfg):
    cfg = copy.deepcopy(env_cfg)
    cfg.max_steps = AUDIT_MAX_STEPS  # choice 1
    if hasattr(cfg, "game_cache_size"):
        cfg.game_cache_size = max(cfg.game_cache_size, 16)
    return cfg


def replay_case(env, row: dict, prefix: list[str], match: dict) -> dict:
    """Restore the state by replaying `prefix` from reset, check the signature,
    then run candidate + suffix."""
    task = envs.Task(row["task_id"], row["task_type"], row["task_id"].split("/", 1)[0], row["source"])
    ep = rollout.replay(env, task, prefix)
    if len(ep.turns) < len(prefix):
        return {"outcome": "restore_failed", "why": "episode ended inside the prefix"}
    same_key = ep.history_key == row["history_key"]
    if ep.signature != as_signature(row["signature"]) or ep.done:
        return {"outcome": "restore_failed", "why": "signature differs after the prefix",
                "history_key_equal": same_key}
    rollout.replay(env, task, [match["candidate"]] + list(match["ref_suffix"][1:]), episode=ep)
    return {"outcome": "success" if ep.won else "failure", "executed": len(ep.turns) - len(prefix),
            "history_key_equal": same_key}


def replay_audit(rows: list[dict], env_cfg, matchers=("structured", "history"), samples: int = 100,
                 seed: int = 0, show_progress: bool = True) -> dict:
    """successes / audited per matcher, with restore failures and missing prefixes counted separately."""
    by_traj: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        by_traj[r["traj_id"]][r["turn"]] = r
    env = envs.make_env(audit_env_config(env_cfg))
    out = {}
    try:
        for matcher in matchers:
            key = MATCH_KEYS[matcher]
            # a skill-context run routes reference-less turns
            matched = sorted((r for r in rows if r.get(key) and r[key]["ref"] is not None),
                             key=lambda r: (r["step"], r["traj_id"], r["turn"]))
            picked = random.Random(seed).sample(matched, min(samples, len(matched)))
            picked.sort(key=lambda r: (r["task_id"], r["traj_id"], r["turn"]))  # choice 3: reuse loaded games
            counts, failures, t0 = defaultdict(int), [], time.perf_counter()
            for r in tqdm(picked, desc=f"replay {matcher}", disable=not show_progress):
                turns = by_traj[r["traj_id"]]
                if any(i not in turns for i in range(r["turn"])):
                    counts["prefix_missing"] += 1  # choice 2
                    continue
                case = replay_case(env, r, [turns[i]["action"] for i in range(r["turn"])], r[key])
                counts[case["outcome"]] += 1
                if case["outcome"] != "success" and len(failures) < 10:
                    failures.append({"traj_id": r["traj_id"], "turn": r["turn"], "task_id": r["task_id"],
                                     "candidate": r[key]["candidate"], **case})
            audited = counts["success"] + counts["failure"]
            out[matcher] = {"matched_turns": len(matched), "sampled": len(picked), "audited": audited,
                            "successes": counts["success"], "failures": counts["failure"],
                            "restore_failed": counts["restore_failed"],
                            "prefix_missing": counts["prefix_missing"],
                            "success_rate": _share(counts["success"], audited),
                            "summary": f"{counts['success']}/{audited}", "examples_not_successful": failures,
                            "seconds": time.perf_counter() - t0}
    finally:
        env.close()
    return out


PAPER = {"coverage_structured": "20.2%", "history_matches_reproduced_by_structured": "98.8%",
         "structured_matches_reproduced_by_history": "75.4%",  # ALFWorld, 35,712 turns
         "candidate_agreement_on_common": "99.4%", "structured": "781/781", "history": "792/800"}


def pct(v: float | None, none: str = "n/a") -> str:
    """A share as a percentage with one decimal; `none` where there is no share."""
    return none if v is None else f"{100 * v:.1f}%"


def format_audit(comparison: dict, replay: dict) -> str:
    """The matcher table and the replay audit, each number beside the paper's (its history matcher is the
    prompt's view, our `history`; the archive's history column is that windowed matcher)."""
    c = comparison
    lines = [f"Matcher comparison on {c['turns']} archived turns (paper: 35,712 ALFWorld turns):",
             f"  structured covers {pct(c['coverage_structured'])} of turns ({c['structured_matches']}) "
             f"[paper {PAPER['coverage_structured']}], history {pct(c['coverage_history'])} "
             f"({c['history_matches']}), "
             f"routed {pct(c['coverage_routed'])}",
             f"  structured reproduces {pct(c['history_matches_reproduced_by_structured'])} of the history "
             f"matches [paper {PAPER['history_matches_reproduced_by_structured']}]",
             f"  history reproduces {pct(c['structured_matches_reproduced_by_history'])} of the structured "
             f"matches [paper {PAPER['structured_matches_reproduced_by_history']}]",
             f"  on the {c['common_matches']} common matches: "
             f"same candidate {pct(c['candidate_agreement_on_common'])} [paper "
             f"{PAPER['candidate_agreement_on_common']}], "
             f"same reference position {pct(c['same_reference_position_on_common'])}",
             f"  observation (generic signature) covers {pct(c.get('coverage_observation'))} "
             f"({c.get('observation_matches', 0)}); it reproduces "
             f"{pct(c.get('structured_matches_reproduced_by_observation'))} of the structured matches, "
             f"structured {pct(c.get('observation_matches_reproduced_by_structured'))} of its; same "
             f"candidate on the common ones {pct(c.get('candidate_agreement_observation_structured'))}",
             "Replay audit (successes/audited; restore failures and missing prefixes are not "
             "match failures):"]
    for m, r in replay.items():
        lines.append(f"  {m:11s} {r['summary']:>9s} ({pct(r['success_rate'])})"
                     f" | restore failed {r['restore_failed']}"
                     f" | prefix missing {r['prefix_missing']}"
                     f" | sampled {r['sampled']} of {r['matched_turns']} matched"
                     + (f" [paper {PAPER[m]}]" if m in PAPER else ""))
    return "\n".join(lines)


def run_audit(args: AuditArgs, cfg) -> dict:
    """`cfg`: the run's config.Config (evaluate.py reads it from the run directory)."""
    run = Path(args.run)
    path = run / "rollouts.jsonl.gz"
    if not path.exists():
        raise SystemExit(f"no rollout archive at {path} (train with --archive-max-turns > 0)")
    rows = read_archive(path)
    comparison = matcher_comparison(rows)
    replay = replay_audit(rows, cfg.env_cfg, args.matchers, args.samples, args.seed)
    text = format_audit(comparison, replay)
    print(text, flush=True)
    out = Path(args.output or run / "audit.json")
    out.write_text(json.dumps({"archive": str(path), "comparison": comparison, "replay": replay,
                               "text": text}, indent=1))
    print(f"[audit] wrote {out}", flush=True)
    return {"comparison": comparison, "replay": replay}
