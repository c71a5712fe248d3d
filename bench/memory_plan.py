"""Memory plan of a run: each phase's peak on one rank and its parts, from the model's config.json alone (no
weights) and the run's settings (the model: scale/memory_plan.py).

    python bench/memory_plan.py --config configs/alfworld/smrc_sd_qwen3_1.7b.yaml --gpu-gib 80
    python bench/memory_plan.py --gpu-gib 80 --nproc 8 --config configs/alfworld/smrc_sd_qwen2.5_3b.yaml \
        --dist.strategy fsdp
    python bench/memory_plan.py --device cpu -- --model models/smollm2-135m --preset tiny
    python bench/memory_plan.py --gpu-gib 24 --config configs/alfworld/smrc_sd_lora_qwen3_1.7b_24gb.yaml

Any flag this script does not know (or any after `--`) is smrc.py's; `--config` is passed on too. The last
line reads `peak P GiB of G GiB (PHASE)`; the line before it names the flag that moves the largest part.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale.memory_plan import GIB, adapter_params, load_arch, plan, report  # noqa: E402


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Other flags (or those after --) are smrc.py's, --config too.")
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="the device's memory (GiB)")
    ap.add_argument("--nproc", type=int, default=1, help="ranks (torchrun --nproc_per_node)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="what the plan is for")
    ap.add_argument("--json", help="also write the plan here")
    ours, flags = ap.parse_known_args([a for a in argv if a != "--"])
    from config import parse_config
    cfg = parse_config(flags)
    arch = load_arch(cfg.model)
    shards = ours.nproc if cfg.dist.strategy == "fsdp" and ours.nproc > 1 else 1
    weights = 4 * arch.params / shards / GIB
    if ours.device == "cuda" and ours.gpu_gib <= weights:
        raise SystemExit(f"error: --gpu-gib {ours.gpu_gib:g} holds no more than the fp32 weights alone "
                         f"({weights:.1f} GiB of {arch.params / 1e9:.2f}B parameters per rank)")
    result = plan(cfg, arch, ours.device == "cuda", ours.gpu_gib, ours.nproc)
    if ours.json:
        Path(ours.json).write_text(json.dumps(result, indent=1))
    print("\n".join(report(result, arch, ours.gpu_gib, ours.device)))
    if cfg.lora.rank > 0:  # scale/lora.py: the plan counted the adapters, and no reference copy
        q = adapter_params(arch, cfg.lora.rank, tuple(cfg.lora.target_modules))
        print(f"LoRA rank {cfg.lora.rank} on {list(cfg.lora.target_modules)}: {q / 1e6:.1f}M adapter "
              f"parameters trained (weights, gradients, AdamW: 16 B each); the base frozen in "
              f"{ {2: 'bfloat16', 4: 'float32'}[result['choices']['frozen_bytes']] }; the KL "
              f"reference = the base (adapters off), no copy")


if __name__ == "__main__":
    main(sys.argv[1:])
