"""LoRA through peft (`--lora.rank R`, R > 0; 0 = full fine-tuning, the default). Optional, like the trackers:
`pip install -r requirements-lora.txt`.

The method is unchanged under adapters:
- the student is the base model plus the adapters, and so is the teacher (the same weights, another context);
- the KL reference is the same model with its adapters off (`AdaptersOff`: a view, no second copy in memory);
- the optimizer holds the adapters only (`trainable`).

Around the loop:
- a checkpoint holds the adapters in peft's format (adapter_config.json + adapter_model.safetensors,
  `PeftModel.from_pretrained` loads them); --lora.save-merged also writes output_dir/merged/, the newest
  checkpoint's weights merged into the base, a plain `from_pretrained` folder;
- --resume rebuilds the base from --model (whose sha256 the initial-weights check compares with the run's
  start) and loads the adapters (`load_adapters`), bit for bit; a resume that would change the adapters
  (turn them on or off, another rank, alpha, dropout or target modules) is one error line (`check_resume`);
- the frozen base takes --grpo.ref-dtype (it is the KL reference: bf16 on CUDA with --grpo.bf16, float32 on
  CPU), the adapters stay float32 (smrc.setup);
- `evaluate.py eval --checkpoint` merges the adapters into the checkpoint's base (`load_merged`);
- vLLM gets the merged weights after each update (`merged_weights`, streamed through the engine's ordinary
  weight reload, scale/vllm_engine.py): one code path for full fine-tuning and LoRA, and the sampler runs the
  weights the trainer scores (vLLM's own LoRA loading would add a second model path in the sampler, with its
  punica kernels and max rank, to keep equal to the trainer's).
"""

import json
from pathlib import Path

import torch

from config import LoraConfig, check_lora as check  # noqa: F401  (the flags and their checks)

INSTALL = "pip install -r requirements-lora.txt"
ADAPTER_CONFIG = "adapter_config.json"  # peft's file: a checkpoint folder holding it holds adapters
MERGED = "merged"                       # output_dir/merged/: --lora.save-merged's from_pretrained folder


def peft_module():
    """peft, or one error line naming the install command."""
    try:
        import peft
    except ImportError:
        raise SystemExit(f"error: --lora.rank needs peft, which is not installed: {INSTALL}") from None
    return peft


def _targets(cfg: LoraConfig):
    return "all-linear" if tuple(cfg.target_modules) == ("all-linear",) else list(cfg.target_modules)


def add_adapters(model, cfg: LoraConfig):
    """The base model wrapped with fresh adapters (B = 0: the policy starts as the base); a target that
    matches no layer of the model is one error line."""
    peft = peft_module()
    spec = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=_targets(cfg), task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, spec)
    except ValueError as e:
        said = (str(e).splitlines() or ["no match"])[0]
        raise SystemExit(f"error: --lora.target-modules {list(cfg.target_modules)} match no layer of the "
                         f"model ({said}); name its linear layers (e.g. q_proj v_proj) or all-linear"
                         ) from None


def load_adapters(model, ckpt: Path, trainable: bool = True):
    """The base model with a checkpoint's adapters (peft's format), exactly as saved."""
    peft = peft_module()
    return peft.PeftModel.from_pretrained(model, str(ckpt), is_trainable=trainable)


def has_adapters(path: Path | str) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def check_resume(cfg: LoraConfig, ckpt: Path | None) -> None:
    """A resume keeps the checkpoint's adapters as they are: --lora.* on a checkpoint without adapters,
    --lora.rank 0 on one with them, or another rank, alpha, dropout or target modules than the checkpoint's:
    one error line."""
    if ckpt is None:
        return
    if not has_adapters(ckpt):
        if cfg.rank > 0:
            raise SystemExit(f"error: --lora.rank {cfg.rank} on a resume of {ckpt}, a run trained without "
                             f"adapters (full fine-tuning): drop --lora.*, or start a LoRA run in a new "
                             f"--output-dir")
        return
    saved = json.loads((Path(ckpt) / ADAPTER_CONFIG).read_text())
    said = {"rank": saved.get("r"), "alpha": saved.get("lora_alpha"), "dropout": saved.get("lora_dropout"),
            "target-modules": _saved_targets(Path(ckpt), saved, cfg)}
    given = {"rank": cfg.rank, "alpha": cfg.alpha, "dropout": cfg.dropout,
             "target-modules": sorted(cfg.target_modules)}
    if cfg.rank == 0 or any(said[k] != given[k] for k in said):
        shown = lambda d: ", ".join(f"--lora.{k} {d[k]}" for k in d)  # noqa: E731
        raise SystemExit(f"error: {ckpt} holds LoRA adapters ({shown(said)}); resume it with the same "
                         f"--lora.* flags (given: {shown(given)})")


def _saved_targets(ckpt: Path, adapter_config: dict, cfg: LoraConfig) -> list[str]:
    """The checkpoint's --lora.target-modules as the run gave them (its smrc_config.json); without that file,
    peft's list (all-linear is saved there resolved into layer names: compared only when the resume names
    layers too)."""
    try:
        return sorted(json.loads((ckpt / "smrc_config.json").read_text())["lora"]["target_modules"])
    except (OSError, ValueError, KeyError, TypeError):
        targets = adapter_config.get("target_modules")
        if not isinstance(targets, list) or tuple(cfg.target_modules) == ("all-linear",):
            return sorted(cfg.target_modules)  # not comparable: taken as given
        return sorted(targets)


class AdaptersOff(torch.nn.Module):
    """The KL reference under LoRA: the policy's own module called with its adapters disabled (the base's
    weights: the initial model), not a copy. Holds no parameter of its own; `module` is the policy (as DDP's
    `.module`, so models.token_logprobs finds the LM head), called without DDP's wrapper (no collective)."""

    def __init__(self, policy):
        super().__init__()
        object.__setattr__(self, "module", policy)  # not registered: .parameters() of the view is empty

    def forward(self, *args, **kwargs):
        with torch.no_grad(), self.module.disable_adapter():
            return self.module(*args, **kwargs)


def describe(model, cfg: LoraConfig) -> str:
    """The banner's line: the adapters' size beside the base's."""
    n = sum(p.numel() for p in trainable(model))
    total = sum(p.numel() for p in model.parameters())
    base = next((p.dtype for p in model.parameters() if not p.requires_grad), torch.float32)
    return (f"[lora] rank {cfg.rank}, alpha {cfg.alpha:g}, dropout {cfg.dropout:g}, targets "
            f"{list(cfg.target_modules)}: {n / 1e6:.3f}M adapter parameters trained of {total / 1e6:.2f}M; "
            f"the base frozen in {str(base).removeprefix('torch.')}; the KL reference is the base (adapters "
            f"off)")


def trainable(model) -> list[torch.nn.Parameter]:
    """The parameters the optimizer holds: the adapters under LoRA, every parameter otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_weights(model) -> dict:
    """The adapters' tensors (peft's state-dict names), on CPU: what a checkpoint saves under LoRA."""
    sd = getattr(model, "module", model).state_dict()
    return {k: v.detach().cpu() for k, v in sd.items() if "lora_" in k}


@torch.no_grad()
def merged_weights(model, dtype: torch.dtype):
    """(name, tensor in `dtype`) of the base with the adapters merged in (W + α/r·B·A), under the base
    model's own names, one tensor at a time and the policy left as it is: the weight sync's source and the
    merged folder's contents."""
    from peft.tuners.lora import LoraLayer
    inner = getattr(model, "module", model).get_base_model()
    layers = {f"{name}.base_layer.weight": (f"{name}.weight", m) for name, m in inner.named_modules()
              if isinstance(m, LoraLayer)}
    for key, t in inner.state_dict().items():
        if "lora_" in key:
            continue
        if key in layers:
            name, layer = layers[key]
            delta = sum(layer.get_delta_weight(a) for a in layer.active_adapters)
            yield name, (t + delta).to(dtype)
        else:
            yield key.replace(".base_layer.", "."), t.detach().to(dtype)


def save_merged(model, tokenizer, folder: Path) -> None:
    """A plain from_pretrained folder of the merged weights (fp32), written beside and renamed into place."""
    import shutil
    tmp = folder.with_name(f".tmp_{folder.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    inner = getattr(model, "module", model).get_base_model()
    weights = dict(merged_weights(model, torch.float32))
    inner.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def load_for_eval(name: str, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a model name or folder (models.load_model), a LoRA checkpoint merged."""
    if has_adapters(name):
        return load_merged(name, device)
    from embedded.warmstart import resolve
    from models import load_model
    return load_model(resolve(name), device=device)


def merged_folder(ckpt: Path | str) -> str:
    """A LoRA checkpoint as a plain from_pretrained folder (merged, in a temporary folder): what vLLM starts
    from in `evaluate.py eval --engine vllm`."""
    import tempfile
    model, tokenizer = load_merged(ckpt)
    folder = Path(tempfile.mkdtemp(prefix="smrc-merged-"))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return str(folder)


def load_merged(ckpt: Path | str, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a LoRA checkpoint for evaluation: its run's base (the checkpoint's
    smrc_config.json names --model) with the adapters merged in."""
    from embedded.warmstart import resolve
    from models import load_model, load_tokenizer
    ckpt = Path(ckpt)
    try:
        name = json.loads((ckpt / "smrc_config.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        name = json.loads((ckpt / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    base, _ = load_model(resolve(name), device=device)
    model = load_adapters(base, ckpt, trainable=False).merge_and_unload()
    return model.eval(), load_tokenizer(str(ckpt))
