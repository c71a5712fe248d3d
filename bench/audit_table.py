"""The generic signature's audit table (docs/results.md, issue 58) from the audit.json of each setup:

    python bench/audit_table.py bench/results/observation_audit/final
    python bench/audit_table.py bench/results/observation_audit/v1_2238c70     # read from its archive

Columns: archived turns; coverage of the structured (S) and observation (O) matchers (matches); the share of
S's matches that O also makes and of O's that S makes; the same candidate where both match; replays won /
replayed of S, O and the windowed history matcher (H).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.audits import pct as _pct  # noqa: E402
from analysis import archives  # noqa: E402

SETUPS = (("alfworld_gen", "ALFWorld generated"), ("alfworld_official", "ALFWorld official"),
          ("webshop", "WebShop (embedded)"), ("textworld", "TextWorld"))
HEADER = ("| setup | turns | cov. S | cov. O | O makes S's | S makes O's | same cand. | replay S | replay O "
          "| replay H |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")


def row(name: str, audit: dict) -> str:
    c, r, pct = audit["comparison"], audit["replay"], lambda x: _pct(x, "–")
    return (f"| {name} | {c['turns']:,} | {pct(c['coverage_structured'])} ({c['structured_matches']}) | "
            f"{pct(c['coverage_observation'])} ({c['observation_matches']}) | "
            f"{pct(c['structured_matches_reproduced_by_observation'])} | "
            f"{pct(c['observation_matches_reproduced_by_structured'])} | "
            f"{pct(c['candidate_agreement_observation_structured'])} | {r['structured']['summary']} | "
            f"{r['observation']['summary']} | {r['history']['summary']} |")


def table(folder: Path) -> str:
    rows = [row(name, json.loads(archives.read_text(folder / setup / "audit.json")))
            for setup, name in SETUPS if archives.exists(folder / setup / "audit.json")]
    return "\n".join([HEADER, *rows])


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
