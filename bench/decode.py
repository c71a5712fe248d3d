"""Milliseconds per decode step of the generation variants, on a random model of a public architecture
(no download): (time of N new tokens − time of 1) / (N − 1), each the least of `--repeats` timings after a
warm-up at both lengths (a static cache compiles per shape). Variants: HFEngine (log-probs on the device) in
float32 and under bf16 autocast (CUDA only: on CPU both are float32), HFEngine with the static cache (float32:
models.generation_autocast), and a plain `model.generate` that keeps no logits.

    python bench/decode.py                    # Qwen3-1.7B, batch 16, 1000-token prompts, 64 new tokens
    python bench/decode.py --arch tiny --device cpu --batch 2 --prompt 16 --new 4 --repeats 1
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.step import ARCHS, _sync, build_model  # noqa: E402
from embedded import tiny  # noqa: E402
from models import HFEngine, SamplingConfig, generation_autocast  # noqa: E402
from scale.distributed import init_distributed  # noqa: E402


def profile(args, tok, device: torch.device) -> dict[str, float]:
    """{variant: ms per decode step}."""
    model = build_model(args.arch, tok, device, args.seed).eval()
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, len(tok), (args.prompt,), generator=g).tolist() for _ in range(args.batch)]

    def engine(bf16: bool, static: bool):
        def run(n):
            sampling = SamplingConfig(max_new_tokens=n, static_cache=static)
            HFEngine(model, tok, sampling, batch_size=len(prompts), bf16=bf16).generate(prompts)
        return run

    def plain(n):
        ids = torch.tensor(prompts, device=device)
        with generation_autocast(device, True, static_cache=False), torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)

    def seconds(run, n):
        _sync(device)
        t = time.perf_counter()
        run(n)
        _sync(device)
        return time.perf_counter() - t
    variants = {"engine float32": engine(False, False), "engine bf16": engine(True, False),
                "engine static cache (float32)": engine(True, True), "plain generate (bf16 on CUDA)": plain}
    out, n = {}, args.new
    for name, run in variants.items():
        run(n), run(1)  # warm-up at both shapes
        best = [min(seconds(run, k) for _ in range(args.repeats)) for k in (n, 1)]  # least disturbed
        out[name] = 1000 * (best[0] - best[1]) / (n - 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-1.7b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16, help="prompts decoded at once")
    ap.add_argument("--prompt", type=int, default=1000, help="tokens per prompt")
    ap.add_argument("--new", type=int, default=64, help="new tokens (N >= 2)")
    ap.add_argument("--repeats", type=int, default=3, help="timings per variant and length (the least kept)")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args(argv)
    if args.new < 2:
        raise SystemExit("error: --new must be >= 2")
    device = init_distributed(args.device).device
    out = profile(args, AutoTokenizer.from_pretrained(tiny.model_dir()), device)
    print(f"\ndecode profile: batch {args.batch}, {args.prompt}-token prompts, {args.new} new tokens, "
          f"{device}")
    for name, ms in out.items():
        print(f"  {name:<32} {ms:8.1f} ms per decode step")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
