"""Issue 36 item 3: seconds per optimizer step of the tiny-agent build's model (3 layers, width 128) on
16 x 512 tokens (the recipe's 8,192 padded tokens a batch) in float32 and under CPU bf16 autocast. Output:
bench/results/warmstart_v21/batch_time_avx2.txt."""
import sys, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from embedded import tiny, warmstart
from models import load_model
torch.set_num_threads(2)
_, tok = load_model(tiny.model_dir())
model = tiny.new_model(tok, layers=3, hidden=128, seed=0); model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
for bf16 in (False, True, False):
    times = []
    for i in range(6):
        ids = torch.randint(3, len(tok) - 1, (16, 512), generator=g)
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, labels=ids)
        opt.zero_grad(); out.loss.backward(); opt.step()
        times.append(time.perf_counter() - t)
    print(f"bf16={bf16} s/batch (16x512 tokens), last 5 of 6: {sorted(times[1:])}", flush=True)
print("native bf16:", warmstart.native_bf16(), torch.backends.cpu.get_cpu_capability(), "vocab", len(tok))
