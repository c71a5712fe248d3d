"""A run's output folder for its life (split from scale/preflight.py, which checks the settings and inputs):

- `open_run(cfg, world)`: locked (`lock_run`: a second run into it is refused naming the holder's PID; the
  kernel drops the lock of a dead run), prepared (`prepare_output_dir`: a fresh run refuses a folder that
  holds checkpoints; stale `.tmp_step_*` folders are removed), the resumed checkpoint verified and trained on
  this world size (`check_world_size`), and only then the config recorded (scale/checkpoint.record_config);
  the resume's row of config.resumes.jsonl is written once the resume has started (`record_resume`).
"""
import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from scale.checkpoint import checkpoints, record_config, record_resume, resume_checkpoint, saved_world_size

LOCK = "run.lock"




@contextmanager
def open_run(cfg, world, describe_init=lambda: None):
    """The output folder for the run's life: locked and prepared (rank 0), the checkpoint to resume verified
    (every rank), then the config recorded with `describe_init()`, the weights the run starts from (rank 0).
    Yields the verified checkpoint (None: a run from step 0)."""
    out = Path(cfg.output_dir)
    lock = lock_run(out) if world.is_main else None
    try:
        if world.is_main:
            prepare_output_dir(out, fresh=not (cfg.resume or cfg.resume_from))
        ckpt = resume_checkpoint(out, cfg.resume_from) if cfg.resume or cfg.resume_from else None
        if ckpt is not None:
            check_world_size(ckpt, world.world_size, say=world.is_main)
        row = None
        if world.is_main:
            init = describe_init()
            note = check_resume_record(out, cfg, ckpt, init) if ckpt is not None else None
            row = record_config(out, cfg, ckpt, init, note)
        yield ckpt, (lambda: record_resume(out, row)) if row is not None else (lambda: None)
    finally:
        if lock is not None:
            lock.release()


def check_world_size(ckpt: Path, now: int, say: bool = True) -> None:
    """A resume runs on the world size its checkpoint was trained on (every rank checks; one error line).
    Refused rather than re-laid: each rank's task shard, sampling streams and env workers follow the world
    size, so a resume on another one would not continue the run it claims to continue. A checkpoint written
    before the world size was saved is not checked, and (`say`: rank 0) one line says so."""
    before = saved_world_size(ckpt)
    if before is None and say:
        print(f"[resume] {ckpt} does not record how many ranks trained it (written before checkpoints "
              f"saved it): not checked; resume it on as many ranks as it was trained on", flush=True)
    if before is not None and before != now:
        def launch(n):
            return "one process (python smrc.py)" if n == 1 else f"{n} ranks (torchrun --nproc_per_node {n})"
        raise SystemExit(f"error: --resume: {ckpt} was trained on {launch(before)}, this launch has "
                         f"{launch(now)}; a resume keeps the world size (the task shards and each rank's "
                         f"sampling streams follow it): relaunch on {launch(before)}, or start a new "
                         f"--output-dir")


def check_resume_record(out: Path, cfg, ckpt: Path, init: dict) -> dict:
    """On --resume, before the initial model becomes the KL reference again: the run's record holds.
    - config.json missing or unparsable: one line; it is rewritten from the checkpoint's own smrc_config.json
      (the run's flags) with what they resolve to now, the damaged file kept beside it (chosen over refusing:
      the checkpoint holds the whole config, only the initial-weights record is lost, and the line says so).
    - the initial weights' sha256 differ from config.json's `resolved.initial_weights`: one error line naming
      the model and both hashes, unless --accept-new-initial-weights (then recorded in config.resumes.jsonl).
    Returns what goes into the resume's row of config.resumes.jsonl."""
    path = out / "config.json"
    try:
        recorded = json.loads(path.read_text())
        assert isinstance(recorded, dict) and isinstance(recorded.get("resolved", {}), dict)
    except (OSError, ValueError, AssertionError) as e:
        saved = json.loads((ckpt / "smrc_config.json").read_text())
        damaged = path.with_name("config.json.damaged")
        if path.exists():
            os.replace(path, damaged)
        record = {**saved, "resolved": {**cfg.resolved(), "initial_weights": init}}
        path.write_text(json.dumps(record, indent=1))
        print(f"[resume] {path} was {'missing' if isinstance(e, OSError) else 'not a run record'} "
              f"({type(e).__name__}); rewritten from {ckpt / 'smrc_config.json'}"
              + (f", the damaged one kept as {damaged}" if damaged.exists() else "")
              + "; the initial weights' record is lost, so the KL reference is not checked against it",
              flush=True)
        return {"config_json": f"restored from {ckpt / 'smrc_config.json'}"}
    if cfg.grpo.kl_coef <= 0:
        print("[resume] --grpo.kl-coef 0: no KL reference is loaded, so the initial weights are not checked "
              "against config.json's record", flush=True)
        return {}
    was = (recorded.get("resolved") or {}).get("initial_weights") or {}
    if was.get("model") != cfg.model:  # another model: check_same_run refuses that resume, naming the flag
        return {}
    before, now = was.get("sha256") or {}, init.get("sha256") or {}
    if not before or not now or before == now:
        return {}
    said = "; ".join(f"{f}: {before.get(f, 'none')[:16]} -> {now.get(f, 'none')[:16]}"
                     for f in sorted(set(before) | set(now)) if before.get(f) != now.get(f))
    if not cfg.accept_new_initial_weights:
        raise SystemExit(f"error: --resume would anchor the KL term to other weights: --model {cfg.model} "
                         f"({init.get('path')}) is not what this run started from (sha256 {said}); restore "
                         f"those weights, or accept these knowingly with --accept-new-initial-weights")
    print(f"[resume] the KL reference is --model {cfg.model} as it is now (sha256 {said}): accepted with "
          f"--accept-new-initial-weights, recorded in config.resumes.jsonl", flush=True)
    return {"initial_weights_accepted": {"recorded": before, "now": now}}


class RunLock:
    """An exclusive flock on out/run.lock (the file holds the holder's PID) until `release`, which removes the
    file while still holding the lock (a run that takes it meanwhile sees the file gone and retries,
    `lock_run`)."""

    def __init__(self, path: Path, file):
        self.path, self.file = path, file

    def release(self) -> None:
        if not self.file.closed:
            self.path.unlink(missing_ok=True)
            self.file.close()  # drops the flock


def lock_run(out: Path) -> RunLock:
    """The run lock of `out`, held for the run's life. A second run into the folder is refused naming the
    holder's PID; the kernel drops the lock when its holder dies (SIGKILL included), so a dead run's stale
    file blocks nothing (a later run or --resume takes it)."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --output-dir {out} is a file; it must be a folder (new or existing)")
    path = out / LOCK
    while True:
        try:
            out.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")
        except OSError as e:
            raise SystemExit(f"error: --output-dir {out} is not writable ({e.strerror or e})") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise SystemExit(f"error: --output-dir {out} is in use by another run (PID {holder} holds "
                             f"{path}); wait for it to end, or start this run in a new --output-dir"
                             ) from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # the holder released (and removed) the file after we opened it: lock the current one
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return RunLock(path, f)


def prepare_output_dir(out: Path, fresh: bool) -> None:
    """Before any heavy work (rank 0): the folder exists and takes a file; a fresh run refuses a folder
    holding checkpoints; stale temporary folders of a killed save are removed."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --output-dir {out} is a file; it must be a folder (new or existing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out) as f:
            f.write(b"probe")
    except OSError as e:
        raise SystemExit(f"error: --output-dir {out} is not writable ({e.strerror or e})") from None
    if fresh and (checkpoints(out) or (out / "latest").exists()):
        names = ", ".join(p.name for p in checkpoints(out)) or "a 'latest' file"
        raise SystemExit(f"error: --output-dir {out} already holds checkpoints ({names}); "
                         f"continue that run with --resume (or --resume-from one of them), "
                         f"or start this run in a new --output-dir")
    for stale in [*out.glob(".tmp_step_*"), *out.glob("latest.tmp")]:
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
        print(f"[checkpoint] removed {stale}, left by a save that did not finish", flush=True)
