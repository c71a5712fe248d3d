"""The probe behind docs/notes.md's issue-40 table: peak resident memory of one SmolLM2-135M forward
(+ backward) over a random batch, in a fresh process.
Usage: python bench/probes/smollm2_update_memory.py train|score B L CKPT(0/1) [MMAP_THRESHOLD]
(B rows of L tokens, 20 of them response; MMAP_THRESHOLD: glibc mallopt(M_MMAP_THRESHOLD) before the pass).
The model folder: $SMOLLM2_DIR (default models/smollm2-135m), embedded/smollm2.py's export."""
import sys, time, torch, os
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from models import load_model, collate, token_logprobs
torch.set_num_threads(2)
def hwm():
    for l in open('/proc/self/status'):
        if l.startswith('VmHWM'): return int(l.split()[1]) / 2**20
def rss():
    for l in open('/proc/self/status'):
        if l.startswith('VmRSS'): return int(l.split()[1]) / 2**20
def reset(): open('/proc/self/clear_refs','w').write('5')
model, tok = load_model(os.environ.get('SMOLLM2_DIR', 'models/smollm2-135m'))
mode, B, L, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1'
if ckpt: model.gradient_checkpointing_enable()
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(100, 40000, (L - 20,), generator=g).tolist() for _ in range(B)]
resp = [torch.randint(100, 40000, (20,), generator=g).tolist() for _ in range(B)]
batch = collate(prompts, resp, tok.pad_token_id)
import ctypes
if len(sys.argv) > 5: print("mallopt", ctypes.CDLL("libc.so.6").mallopt(-3, int(sys.argv[5])))
base = rss(); reset(); t = time.time()
if mode == 'train':
    model.train()
    lp, ent = token_logprobs(model, batch, with_entropy=True)
    lp.sum().backward()
else:
    model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch)
print(f"{mode} B={B} L={L} ckpt={ckpt} tokens={B*L} base={base:.2f}GB peak={hwm():.2f}GB "
      f"delta={hwm()-base:.2f}GB {time.time()-t:.1f}s attn={model.config._attn_implementation}", flush=True)
