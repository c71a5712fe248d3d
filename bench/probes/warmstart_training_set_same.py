"""Stop 46's refactor check: `warmstart.training_set` gives the same training set as the lines it replaced.

Hashes (data, weights, plan, context stats) of a recipe's build, either through `training_set` or, with
--old, through a copy of build_tiny_agent's lines before the refactor (commit 52327c2). Output:
bench/results/warmstart_v21/training_set_same.txt (2026-12-04: the same sha256 both ways for
tiny-agent-quick and tiny-agent).

    python bench/probes/warmstart_training_set_same.py tiny-agent [--old]   # ~4 min on 2 cores
"""
import hashlib, json, random, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import envs
from embedded import tiny, warmstart as w
from models import chat_ids, load_model

name = sys.argv[1]
recipe = w.RECIPES[name]
_, tok = load_model(tiny.model_dir())
if "--old" not in sys.argv:
    data, weights, plan, stats = w.training_set(tok, recipe, 0)
    how = "training_set"
else:  # build_tiny_agent at 52327c2, up to its plan
    examples = w.demonstrations(recipe)
    stats = w.context_stats(examples)
    examples, weights = w.weighted(examples, recipe.differing_repeats)
    data = [(chat_ids(tok, e.user_text),
             tok(envs.action_response(e.action))["input_ids"] + [tok.eos_token_id]) for e in examples]
    ce = recipe.epochs if recipe.context_epochs is None else recipe.context_epochs
    plan = w.training_plan([len(p) + len(r) for p, r in data], weights,
                           [ce if e.format else recipe.epochs for e in examples], recipe.batch_tokens,
                           random.Random(0))
    how = "old lines"
blob = json.dumps([data, weights, plan, stats], sort_keys=True).encode()
print(how, name, f"{len(data)} examples, {len(plan)} batches, sha256", hashlib.sha256(blob).hexdigest())
