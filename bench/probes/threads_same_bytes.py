"""Do a few build-like updates (tiny model, float32) give the same bytes on 1 and 2 torch threads?

    python bench/probes/threads_same_bytes.py THREADS   # prints the loss and the weights' sha256[:16]
"""
import hashlib, sys, torch, random
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
torch.set_num_threads(int(sys.argv[1]))
from embedded import tiny, warmstart as w
from models import load_model
_, tok = load_model(tiny.model_dir())
model = tiny.new_model(tok, layers=3, hidden=128, seed=0); model.train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
rng = random.Random(0)
for step in range(4):
    rows = []
    for _ in range(12):
        n = rng.randint(200, 600)
        rows.append(([rng.randint(3, len(tok) - 2) for _ in range(n)],
                     [rng.randint(3, len(tok) - 2) for _ in range(8)]))
    logp, mask = w.response_logprobs(model, rows, tok.pad_token_id)
    loss = -(logp * mask).sum() / mask.sum()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(sys.argv[1], "threads:", torch.get_num_threads(), f"loss {loss.item():.9f}", h[:16])
