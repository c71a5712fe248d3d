"""smrc.py under torchrun with routing made uneven on purpose, for the rank tests (tests/test_ranks.py).

Run as torchrun's script with smrc.py's flags. On step s (1, 2, ...) the router's matches of rank (s mod 2)
are dropped after routing, so with `--algo fullpath-sd` and planner references (every turn of every task has
a reference) rank 0 distils on step 1 while rank 1 does not, and the reverse on step 2. Each rank appends
{"step", "rank", "matched"} (its matched turns after the drop) to OUT/routing.jsonl, so a test can check
that the case really happened. Nothing else changes: it is smrc.main.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import router  # noqa: E402
import smrc  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
route = router.route
steps = []


def uneven_route(turns, bank, cfg, rng):
    route(turns, bank, cfg, rng)
    steps.append(len(steps) + 1)
    if steps[-1] % 2 == RANK % 2 and RANK < 2:  # step 1: rank 1 distils nothing; step 2: rank 0
        for t in turns:
            t.match = None
    with open(Path(smrc.COMMAND_LINE[smrc.COMMAND_LINE.index("--output-dir") + 1]) / "routing.jsonl",
              "a") as f:
        f.write(json.dumps({"step": steps[-1], "rank": RANK,
                            "matched": sum(t.match is not None for t in turns)}) + "\n")


router.route = uneven_route

if __name__ == "__main__":
    smrc.main(smrc.parse_config(smrc.COMMAND_LINE, smrc.__doc__))
