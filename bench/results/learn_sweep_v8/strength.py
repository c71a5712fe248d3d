"""Per run of the v8 sweep, from its metrics.jsonl: the median SD / GRPO gradient-norm ratio over the steps
where it is finite (NaN: no term measured; inf: the GRPO gradient was 0), and the KL(student ‖ teacher) per
distilled turn (Σ over steps of KL per token × distilled tokens, / distilled turns). Run from this folder:
python strength.py"""
import glob
import json
import math
import statistics

for path in sorted(glob.glob("*/metrics.jsonl")):
    rows = [r for r in map(json.loads, open(path)) if "actor/sd_grpo_grad_ratio" in r]
    ratios = [r["actor/sd_grpo_grad_ratio"] for r in rows]
    finite = [x for x in ratios if x is not None and math.isfinite(x)]
    tokens = [(r["sd/teacher_minus_student_logp"], r["sd/distilled_tokens"])
              for r in rows if r["sd/distilled_tokens"]]
    turns = sum(r["sd/distilled_turns"] for r in rows)
    kl_turn = -sum(g * n for g, n in tokens) / turns if turns else math.nan
    print(f"{path.split('/')[0]:<34} steps {len(ratios):>2}  non-finite {len(ratios) - len(finite):>2}  "
          f"median ratio {statistics.median(finite) if finite else math.nan:.2f}  KL/turn {kl_turn:.2f}")
