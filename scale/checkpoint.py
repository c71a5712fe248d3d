"""Checkpoints: step_XXXXXX/ = save_pretrained (safetensors, loadable by from_pretrained) + tokenizer +
trainer_state.pt (optimizer, reference bank, RNG states as tensors, step: loadable with `weights_only=True`) +
smrc_config.json + checksums.sha256 (`sha256sum -c` format), written to a temporary folder and renamed, so a
run killed mid-save never leaves a half checkpoint; `latest` names the newest one. Under torchrun every rank
takes part in gathering the full weights and optimizer state (FSDP shards them); rank 0 alone writes.

What a run can rely on:
1. A checkpoint is never written with non-finite weights or optimizer state:
   the check runs before anything is written.
2. A failed write (a full disk, a read-only folder) is one `error:` line naming the path; the partial folder
   is removed and `latest` keeps naming the previous checkpoint. Stale `.tmp_step_*` folders of a killed run
   are removed on the next start.
3. Rotation (`keep_checkpoints`) orders checkpoints by step number and deletes only ones older than the
   checkpoint just written, so `latest` always names an existing, complete checkpoint.
4. A fresh run (no --resume) refuses an output folder that holds checkpoints (scale/preflight.py): continue it
   with --resume, or pick a new --output-dir, so two runs' steps never mix in one folder. On a resume from
   step S, checkpoints after S (another timeline, e.g. after --resume-from an older one) are set aside as
   step_XXXXXX.after_step_S, never deleted.
5. Every reader of a checkpoint (--resume, --resume-from, evaluate.py, the intervention) goes through
   `verify`: a checksum file that is missing, empty, malformed or does not list every file of the checkpoint
   fails, as does a missing, unreadable or corrupt file. The failure is one `error:` line naming the file and
   the newest intact checkpoint (`intact_hint`); an empty or garbled `latest` file is named as such.
6. Guard counters (the non-finite streak) are part of the trainer state, so a resume continues them (a
   checkpoint written before they were saved restores 0).
7. A resume never overwrites the run's config.json: the flags that differ from the resumed checkpoint's are
   appended to config.resumes.jsonl (`record_config`), once the resume has started (`record_resume`).
8. A resume runs on as many ranks as the run before it (`saved_world_size`; else one error line naming both).
"""

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from scale import lora
from scale.distributed import (World, full_optimizer_state_dict, full_state_dict,
                               load_full_optimizer_state_dict, unwrap)
from scale.safe_io import append_line, out_of_space, stop_on_io_error

CHECKSUMS = "checksums.sha256"
RESUMES = "config.resumes.jsonl"  # one row per resume: the flags that differ from the checkpoint's config
_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *]([^/\\]+)")  # sha256sum's format: digest, ' ' or '*', file name


def step_of(path: Path) -> int | None:
    m = re.fullmatch(r"step_(\d{6,})", path.name)
    return int(m.group(1)) if m else None


def checkpoints(out: Path) -> list[Path]:
    """The checkpoint folders step_XXXXXX of `out`, oldest step first (by number, not by name)."""
    found = [p for p in out.glob("step_*") if step_of(p) is not None and p.is_dir()] if out.is_dir() else []
    return sorted(found, key=step_of)


def unique_path(path: Path) -> Path:
    """`path`, or the first free `name.2`, `name.3`, ... beside it: set-aside files never overwrite each
    other."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}.{n}")
    return free


# ------------------------------------------------------------------------------------------------------------
# Writing


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, bank, cfg, world: World,
                    guards: dict | None = None) -> Path | None:
    """Collective under torchrun (every rank calls it); rank 0 checks and writes. Returns the checkpoint path
    on rank 0. A failure on rank 0 (non-finite values, a failed write) ends every rank with the same error.
    `guards`: the run's guard counters (e.g. {"nonfinite_streak": 2}), saved so that a resume continues
    them."""
    weights = lora.adapter_weights(model) if lora.is_peft(unwrap(model)) else full_state_dict(model)
    optim = full_optimizer_state_dict(model, optimizer)
    final, tmp = out / f"step_{step:06d}", out / f".tmp_step_{step:06d}"
    problem = None
    if world.is_main:
        problem = nonfinite(weights, optim)
        if problem is None:
            state = {"step": step, "optimizer": optim, "bank": bank.state_dict(), "rng": rng_state(),
                     "guards": dict(guards or {}), "world_size": world.world_size}
            problem = write_folder(tmp, lambda: _write_files(tmp, model, weights, tokenizer, state, cfg))
        if problem is not None:
            latest = (out / "latest").read_text().strip() if (out / "latest").is_file() else ""
            problem = (f"error: checkpoint of step {step} not written ({out / 'latest'} still names "
                       f"{latest or 'no checkpoint'}): {problem}")
    if world.all_max(int(problem is not None)):
        raise SystemExit(problem or 1)  # rank 0 says why
    if world.is_main:
        _publish(out, tmp, final, cfg.keep_checkpoints)
        if getattr(getattr(cfg, "lora", None), "save_merged", False):  # LoRA: + a from_pretrained folder
            with stop_on_io_error(out / lora.MERGED):
                lora.save_merged(model, tokenizer, out / lora.MERGED)
    world.barrier()
    return final if world.is_main else None


def nonfinite(weights: dict, optim: dict) -> str | None:
    """What holds a NaN or an infinity in the weights or the optimizer state, or None."""
    def bad(tree, where):
        if isinstance(tree, torch.Tensor):
            return where if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else None
        items = (tree.items() if isinstance(tree, dict)
                 else enumerate(tree) if isinstance(tree, (list, tuple)) else ())
        return next((b for k, v in items if (b := bad(v, f"{where}.{k}")) is not None), None)
    found = bad(weights, "weights") or bad(optim, "optimizer")
    return None if found is None else f"non-finite values in {found}"


def _write_files(tmp: Path, model, weights: dict, tokenizer, state: dict, cfg) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    with open(tmp / "trainer_state.pt", "wb") as f:  # a file object: a write error keeps its errno (ENOSPC)
        torch.save(state, f)
    (tmp / "smrc_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    write_checksums(tmp)


def write_folder(tmp: Path, write) -> str | None:
    """Run `write` (it fills the folder `tmp`); on failure remove the partial folder and say what failed,
    naming the path and a full disk."""
    try:
        write()
        return None
    except Exception as e:  # safetensors, torch and tokenizers each raise their own types for an I/O error
        full = out_of_space(e, tmp.parent)  # before the partial folder is removed (which frees its space)
        shutil.rmtree(tmp, ignore_errors=True)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        if full:
            return f"no space left on device while writing {tmp} ({first}); free space there, then --resume"
        return f"could not write {tmp}: {type(e).__name__}: {first}"


def _publish(out: Path, tmp: Path, final: Path, keep: int) -> None:
    """Rename the complete folder into place, point `latest` at it, then delete checkpoints older than the
    newest `keep` (never the one just written, never a newer one). A failed rename or write is one error
    line."""
    with stop_on_io_error(out / "latest"):
        _publish_files(out, tmp, final, keep)


def _publish_files(out: Path, tmp: Path, final: Path, keep: int) -> None:
    if final.exists():  # only a checkpoint of another timeline can sit here: set it aside, never delete it
        aside = unique_path(out / f"{final.name}.replaced")
        os.replace(final, aside)
        print(f"[checkpoint] {final} existed (another run's); moved to {aside}", flush=True)
    os.replace(tmp, final)
    (out / "latest.tmp").write_text(final.name)
    os.replace(out / "latest.tmp", out / "latest")
    older = [c for c in checkpoints(out) if step_of(c) < step_of(final)]
    for old in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old)


def write_checksums(folder: Path) -> None:
    lines = [f"{sha256(p)}  {p.name}\n" for p in sorted(folder.iterdir())
             if p.is_file() and p.name != CHECKSUMS]
    (folder / CHECKSUMS).write_text("".join(lines))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as tensors and plain numbers (loadable with weights_only=True)."""
    version, key, gauss = random.getstate()
    _, np_key, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {"python": torch.tensor(key, dtype=torch.int64), "python_version": version, "python_gauss": gauss,
            "numpy": torch.from_numpy(np_key.astype(np.int64)), "numpy_pos": int(np_pos),
            "numpy_has_gauss": int(np_has_gauss), "numpy_gauss": float(np_gauss),
            "torch": torch.get_rng_state()}


def set_rng_state(s: dict) -> None:
    random.setstate((s["python_version"], tuple(s["python"].tolist()), s["python_gauss"]))
    np.random.set_state(("MT19937", s["numpy"].numpy().astype(np.uint32), s["numpy_pos"],
                         s["numpy_has_gauss"], s["numpy_gauss"]))
    torch.set_rng_state(s["torch"])


# ------------------------------------------------------------------------------------------------------------
# Starting and resuming


RESUME_USE = "continue from it with --resume-from"


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint `latest` names; None without a `latest` file. A `latest` that is empty, unreadable or
    names no step_XXXXXX folder is a ValueError saying so (never read as the run folder itself)."""
    p = out / "latest"
    if not p.exists():
        return None
    try:
        name = p.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{p} is unreadable ({e})") from None
    if step_of(Path(name)) is None or Path(name).name != name:
        said = "is empty" if not name else f"names {name[:80]!r}, not a step_XXXXXX checkpoint"
        raise ValueError(f"{p} {said}")
    return out / name


def verify(ckpt: Path) -> str | None:
    """None when checksums.sha256 lists every file of the checkpoint and each is present with its recorded
    hash; else what is wrong, naming the file. A checksum file that is missing, empty, malformed or incomplete
    fails: a checkpoint is never taken on trust."""
    sums = ckpt / CHECKSUMS
    if not ckpt.is_dir():
        return f"{ckpt} is missing (or not a folder)"
    try:
        lines = sums.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        if isinstance(e, FileNotFoundError):
            return f"{sums} is missing (the checkpoint is incomplete or was written by an older version)"
        return f"{sums} is unreadable ({getattr(e, 'strerror', None) or e})"
    listed = {}
    for n, line in enumerate(lines, 1):
        m = _SUM_LINE.fullmatch(line)
        if m is None or m.group(2) in (".", "..", CHECKSUMS):
            return f"{sums} is malformed (line {n} is not '<sha256>  <file name>')"
        listed[m.group(2)] = m.group(1)
    if not listed:
        return f"{sums} is empty (it lists no file)"
    unlisted = sorted(p.name for p in ckpt.iterdir() if p.name != CHECKSUMS and p.name not in listed)
    if unlisted:
        return f"{ckpt / unlisted[0]} is not listed in {sums} (it does not cover the whole checkpoint)"
    for name, digest in listed.items():
        path = ckpt / name
        try:
            actual = sha256(path)
        except OSError as e:
            return (f"{path} is {'missing' if isinstance(e, FileNotFoundError) else 'unreadable'} "
                    f"({e.strerror})")
        if actual != digest:
            return f"{path} is corrupt (its sha256 differs from the one recorded in {sums})"
    return None


def intact_hint(folder: Path, use: str, before: int | None = None, skip: Path | None = None) -> str:
    """Where to go from a bad checkpoint: the newest checkpoint of `folder` (older than step `before` when
    given, never `skip`) that verifies, with the flag that uses it (`use`), or that there is none."""
    found = [c for c in checkpoints(folder) if c != skip and (before is None or step_of(c) < before)]
    intact = next((c for c in reversed(found) if verify(c) is None), None)
    kind = "intact older checkpoint" if before is not None else "intact checkpoint"
    return f"the newest {kind} is {intact}: {use} {intact}" if intact else f"no {kind} in {folder}"


def resume_checkpoint(out: Path, resume_from: str = "") -> Path | None:
    """The checkpoint to resume from: --resume-from's (a folder, or a name inside `out`), else the one
    `latest` names (None when there is none). Verified: a bad one (or a bad `latest`) is one error line naming
    the file and the newest intact (older) checkpoint, with the flag that resumes from it."""
    if resume_from:
        ckpt = Path(resume_from) if Path(resume_from).exists() else out / resume_from
    else:
        try:
            ckpt = latest_checkpoint(out)
        except ValueError as e:
            hint = intact_hint(out, RESUME_USE)
            raise SystemExit(f"error: cannot resume from {out}: {e}; {hint}") from None
    if ckpt is None:
        return None
    problem = verify(ckpt)
    if problem is None:
        return ckpt
    hint = intact_hint(ckpt.parent, RESUME_USE, before=step_of(ckpt), skip=ckpt)
    raise SystemExit(f"error: cannot resume from {ckpt}: {problem}; {hint}")


def initial_weights(name: str, path: str) -> dict:
    """Which weights a run starts from: --model, the folder it resolved to, and the sha256 of each of its
    *.safetensors files (`sha256sum` digests; none for a hub id not on disk)."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return {"model": name, "path": path, "sha256": {f.name: sha256(f) for f in files}}


def record_config(out: Path, cfg, ckpt: Path | None, init: dict | None = None,
                  note: dict | None = None) -> dict | None:
    """After preflight and the resume checks: a new run (or a resume that found no checkpoint) writes
    config.json (its flags, what they resolved to, and `init`: the weights it starts from, initial_weights).
    A resume never overwrites it: the flags that differ from the resumed checkpoint's smrc_config.json make
    the resume's row, returned for `record_resume` (config.resumes.jsonl, one row per resume that started)."""
    values = json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples as JSON lists, as saved configs hold
    dump = json.dumps({**values, "resolved": {**cfg.resolved(), "initial_weights": init}}, indent=1)
    print(dump, flush=True)
    if ckpt is None:
        with stop_on_io_error(out / "config.json"):
            (out / "config.json").write_text(dump)
        return
    try:
        saved = _flat(json.loads((ckpt / "smrc_config.json").read_text()))
    except (OSError, ValueError):  # a checkpoint from outside a run: every flag is recorded
        saved = {}
    changed = {k: [saved.get(k), v] for k, v in _flat(values).items()
               if saved.get(k) != v and k not in ("resume", "resume_from")}
    check_same_run(changed, step_of(ckpt), cfg.steps, bool(saved))
    return {"step": step_of(ckpt), "checkpoint": str(ckpt), "changed": changed, **(note or {})}


def record_resume(out: Path, row: dict) -> None:
    """A resume's row (`record_config`), appended to config.resumes.jsonl once the resume has started (its
    trainer state restored), so a resume that failed leaves no row."""
    append_line(out / RESUMES, json.dumps(row))
    changed = sorted(row["changed"])
    print(f"[resume] from {row['checkpoint']}; {len(changed)} flags differ from its config (recorded in "
          f"{out / RESUMES}, config.json unchanged): {changed}", flush=True)


def saved_world_size(ckpt: Path) -> int | None:
    """The number of ranks that trained up to `ckpt` (None: a checkpoint written before it was saved). The
    trainer state is memory-mapped, so its tensors are not read."""
    try:
        return torch.load(ckpt / "trainer_state.pt", weights_only=True, mmap=True).get("world_size")
    except Exception:  # a damaged file is named by load_trainer_state, which every resume runs
        return None


RUN_IDENTITY = ("env", "model", "algo", "grpo.sd_loss")  # what a resume may not change: another run's


def check_same_run(changed: dict, step: int | None, steps: int, known: bool) -> None:
    """A resume is the same run: the fields that define it (RUN_IDENTITY: the environment, the model and so
    the tokenizer and the KL reference, the algorithm, the form of L_SD) are the checkpoint's, and --steps
    goes beyond its step; else one error line. `known`: the checkpoint has its run's config."""
    fixed = [k for k in RUN_IDENTITY if k in changed] if known else []
    if fixed:
        said = ", ".join(f"--{k.replace('_', '-')} {changed[k][0]} -> {changed[k][1]}" for k in fixed)
        raise SystemExit(f"error: --resume continues the run in its checkpoint, which these flags would make "
                         f"another run: {said}; drop them, or start the other run in a new --output-dir")
    if step is not None and steps <= step:
        raise SystemExit(f"error: --steps {steps} is not beyond the checkpoint's step {step}: nothing to "
                         f"train; give --steps > {step} to continue the run")


def _flat(tree: dict, where: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{where}{k}.") if isinstance(v, dict) else {f"{where}{k}": v})
    return out


def set_aside_newer(out: Path, step: int) -> None:
    """Checkpoints after the resumed step belong to another timeline: rename them,
    so rotation never meets them."""
    for ckpt in (c for c in checkpoints(out) if step_of(c) > step):
        aside = unique_path(out / f"{ckpt.name}.after_step_{step}")
        os.replace(ckpt, aside)
        print(f"[resume] {ckpt} is after step {step}; moved to {aside}", flush=True)


def load_trainer_state(ckpt: Path, model, optimizer, bank, guards: dict | None = None) -> int:
    """Every rank loads the same checkpoint (weights were loaded by from_pretrained before wrapping the
    model). weights_only=True: the file holds tensors and plain data only, so loading it runs no pickled code.
    `guards` (the run's guard counters, at their defaults) is updated from the checkpoint's; an older
    checkpoint without them leaves the defaults. Returns the checkpoint's step."""
    path = ckpt / "trainer_state.pt"
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:
        raise SystemExit(f"error: {path} cannot be loaded with weights_only=True ({str(e).splitlines()[0]}); "
                         f"it is damaged or was written by an older version") from None
    load_full_optimizer_state_dict(model, optimizer, state["optimizer"])
    bank.load_state_dict(state["bank"])
    set_rng_state(state["rng"])
    if guards is not None:
        guards.update({k: v for k, v in state.get("guards", {}).items() if k in guards})
    return state["step"]
