"""Compare two runs' metrics.jsonl row by row, times and memory aside (house step 3's check, its outputs in
bench/results/house_step3/same_numbers.txt): python bench/probes/same_metrics.py RUN_A RUN_B"""
import json, sys, math
a, b = sys.argv[1], sys.argv[2]
ra = [json.loads(l) for l in open(a + "/metrics.jsonl")]
rb = [json.loads(l) for l in open(b + "/metrics.jsonl")]
assert len(ra) == len(rb), (len(ra), len(rb))
bad = 0
for x, y in zip(ra, rb):
    for k in x:
        if k.startswith(("time/", "mem/")) or k.endswith("_time_s"): continue
        if k not in y: print("missing", k); bad += 1; continue
        vx, vy = x[k], y[k]
        both_nan = isinstance(vx, float) and isinstance(vy, float) and math.isnan(vx) and math.isnan(vy)
        same = vx == vy or both_nan
        if not same: print("diff", x["step"], k, vx, vy); bad += 1
    for k in y:
        if k not in x and not k.startswith(("time/", "mem/")): print("new key", k)
print("rows", len(ra), "differences", bad)
