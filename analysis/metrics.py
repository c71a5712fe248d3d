"""The paper's success metrics, pure functions tested against hand-computed values (tests/test_evaluate.py):
Avg@k, Pass@k, the repeated 4-gram ratio, and one model's row of `evaluate.py eval`'s table from its
episodes (`panel_metrics`). evaluate.py re-exports them.
"""
from collections import Counter

import numpy as np


def avg_at_k(outcomes: list[list[float]]) -> float:
    """Avg@k: mean success over the k attempts of every task (outcomes[task][attempt] in {0, 1})."""
    return float(np.mean([np.mean(row) for row in outcomes])) if outcomes else float("nan")


def pass_at_k(outcomes: list[list[float]]) -> float:
    """Pass@k: share of tasks solved in at least one of their k attempts."""
    return float(np.mean([any(v > 0 for v in row) for row in outcomes])) if outcomes else float("nan")


def repeated_ngram_ratio(texts: list[str], n: int = 4) -> float:
    """Repeated n-gram ratio of responses (n = 4 in the paper's table).

    Each response is lowercased and split on whitespace into words; its n-grams are the len(words) - n + 1
    windows of n consecutive words. An n-gram occurrence is *repeated* if the same n-gram already occurred
    earlier in the same response. The ratio pools all responses: (sum of repeated occurrences) / (sum of
    n-gram occurrences). Responses shorter than n words contribute nothing; with no n-gram at all the ratio is
    0. Example: "a b c d a b c d" has the five 4-grams abcd, bcda, cdab, dabc, abcd, of which the last repeats
    the first: 1/5 = 0.2.
    """
    total = repeated = 0
    for text in texts:
        words = text.lower().split()
        grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
        total += len(grams)
        repeated += len(grams) - len(set(grams))
    return repeated / total if total else 0.0


def panel_metrics(episodes: list, k: int) -> dict:
    """The table's numbers for one model from its episodes (k consecutive attempts per task, panel order)."""
    by_task: dict[str, list] = {}
    for ep in episodes:
        by_task.setdefault(ep.task.task_id, []).append(ep)
    assert all(len(v) == k for v in by_task.values()), "every task must have exactly k attempts"
    outcomes = [[float(e.won) for e in eps] for eps in by_task.values()]
    turns = [t for e in episodes for t in e.turns]
    per_task = [np.mean(row) for row in outcomes]
    m = {"tasks": len(by_task), "episodes": len(episodes), f"avg@{k}": avg_at_k(outcomes),
         f"avg@{k}_se": float(np.std(per_task, ddof=1) / np.sqrt(len(per_task)))
         if len(per_task) > 1 else 0.0,
         f"pass@{k}": pass_at_k(outcomes),
         "score": float(np.mean([e.score for e in episodes])),
         "accuracy": float(np.mean([e.score == 1.0 for e in episodes])),
         "response_tokens": float(np.mean([len(t.response_ids) for t in turns])) if turns else 0.0,
         "repeated_4gram_ratio": repeated_ngram_ratio([t.response for t in turns]),
         "turns": float(np.mean([len(e.turns) for e in episodes])),
         "valid_action_ratio": float(np.mean([t.valid for t in turns])) if turns else float("nan"),
         "stop_reasons": dict(sorted(Counter(e.stop_reason for e in episodes).items()))}
    for tt in sorted({e.task.task_type for e in episodes}):
        m[f"success/{tt}"] = float(np.mean([e.won for e in episodes if e.task.task_type == tt]))
    return m
