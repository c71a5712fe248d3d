"""Issue 36 item 3: the tiny-agent build's *real* batches against warmstart_batch_time.py's 16 x 512
benchmark batch.

warmstart_batch_time.py times a full-length 16 x 512 batch with the LM head on every position; the build's
batches are packed by length (8,192 padded tokens counting each example's copies) and score the response
tokens only.
This times every 60th batch of the build's own plan (seed 0) and the benchmark batch, interleaved, in one
process, and prints their ratio: the idle time of a real batch is that ratio times batch_time_avx2.txt's
idle float32 time. Float32 (as on a CPU without native bf16), 2 threads. Output:
bench/results/warmstart_v21/batch_time_real_avx2.txt.

    python bench/probes/warmstart_real_batches.py [PLAN.json]   # PLAN.json: a cache of the plan
"""
import json, sys, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from embedded import tiny, warmstart as w
from models import load_model

torch.set_num_threads(2)
_, tok = load_model(tiny.model_dir())
cache = Path(sys.argv[1]) if len(sys.argv) > 1 else None
if cache and cache.exists():
    d = json.loads(cache.read_text())
else:  # the build's own training set (warmstart.training_set): ~4-8 min of planner references
    data, _, plan, _ = w.training_set(tok, w.RECIPES[w.TINY_AGENT], seed=0)
    d = {"data": data, "plan": plan}
    if cache:
        cache.write_text(json.dumps(d))
data, plan = d["data"], d["plan"]
model = tiny.new_model(tok, layers=3, hidden=128, seed=0)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
bench_ids = torch.randint(3, len(tok) - 1, (16, 512), generator=torch.Generator().manual_seed(0))


def real(idx):
    logp, mask = w.response_logprobs(model, [data[i] for i in idx], tok.pad_token_id)
    loss = -(logp * mask).sum() / mask.sum()
    opt.zero_grad(); loss.backward(); opt.step()


def benchmark():
    out = model(input_ids=bench_ids, labels=bench_ids)
    opt.zero_grad(); out.loss.backward(); opt.step()


sample = plan[::60]
real(sample[0]); benchmark()  # warm-up
t_real = t_bench = 0.0
for idx in sample:
    t = time.perf_counter(); real(idx); t_real += time.perf_counter() - t
    t = time.perf_counter(); benchmark(); t_bench += time.perf_counter() - t
padded = [len(idx) * max(len(data[i][0]) + len(data[i][1]) for i in idx) for idx in plan]
print(f"plan: {len(plan)} batches, {sum(map(len, plan)) / len(plan):.1f} rows and "
      f"{sum(padded) / len(plan):.0f} padded tokens a batch (mean); timed {len(sample)} of them")
print(f"real / benchmark batch time: {t_real / t_bench:.3f} (here: {t_real / len(sample):.3f} s vs "
      f"{t_bench / len(sample):.3f} s a batch)")
