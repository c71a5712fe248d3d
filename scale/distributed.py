"""Distributed set-up in one place: the same smrc.py runs under `python` and under `torchrun`.

- `init_distributed(device)` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE, starts the process group (NCCL
  on GPU, gloo on CPU) and returns a `World` with the rank, world size and device. Without torchrun it is a
  no-op (world 1). `close(world)` destroys the process group it started (also a one-process torchrun group, so
  NCCL leaks nothing).
- Task groups are sharded across ranks (`shard`), so GRPO statistics stay inside one rank's group.
- `all_sum` / `gather` reduce what the loss and the logged metrics need, so the numbers mean the same as in a
  single process: the token-mean normaliser is the global token count, and metrics are computed over every
  rank's episodes.
- `wrap` puts the model under DDP or FSDP2 (`fully_shard`), `wrap_frozen` the frozen KL reference (sharded
  like the policy under FSDP, plain under DDP: it has no gradients to all-reduce); `full_state_dict` gathers
  full weights for checkpoints, `stream_weights` yields them one parameter at a time for the vLLM weight sync.
- Every collective of a step is issued by every rank, whatever its matched turns, episodes or tokens:
  - DDP's forward is itself a collective (it broadcasts module buffers, e.g. rotary `inv_freq`, from rank 0),
    so a forward that one rank runs alone (the teacher scoring its matched turns, a diagnostic, generation)
    goes through `unwrap(model)`, which runs none; only the update's aligned passes call the DDP module.
    (Chosen over `broadcast_buffers=False`: the plain module depends on no DDP internals, e.g. a join or a
    static-graph pre-forward collective, and the buffers, rotary tables, never change anyway.)
  - Under FSDP every forward (policy and sharded reference) is a collective, so ranks must run the same
    number of forwards: the update aligns its micro-batch counts across ranks (zero-loss passes), and
    rollouts and teacher scoring run on vLLM (`--rollout.engine vllm --teacher.backend vllm`), whose per-rank
    engine needs no collectives.
- A bound on every collective (`--dist.timeout-s`): on gloo a collective that waits longer raises, and
  `OneErrorLine` turns that into one line naming the rank, the phase it waited in (`World.at`) and the newest
  checkpoint. (On NCCL torch's own watchdog ends the process at the same bound, with its message.)
- `OneErrorLine`: the settings and data are checked on every rank, so an `error:` line raised before the
  training loop is printed by rank 0 alone (the other ranks exit with status 1); inside the loop a rank > 0
  prints its own error prefixed with its rank (it may be its alone: an env crash, an out-of-memory).
Only rank 0 logs, shows progress bars and writes checkpoints; every rank loads the checkpoint when resuming.
"""

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as td
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from models import resolve_device


@dataclass
class World:
    """This process's place among the torchrun ranks (world size 1 without torchrun)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_process_group: bool = False  # init_distributed started a process group, which close() must destroy
    timeout_s: float = 0.0        # the bound on every collective (--dist.timeout-s)
    phase: str = "set-up"         # what this rank does now (`at`), named if a collective times out

    def at(self, phase: str) -> None:
        """Name what this rank does next: a collective that times out says where it waited."""
        self.phase = phase

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, x: float) -> float:
        if not self.enabled:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self._comm_device())
        td.all_reduce(t)
        return float(t.item())

    def all_max(self, x: int) -> int:
        if not self.enabled:
            return x
        t = torch.tensor([x], dtype=torch.int64, device=self._comm_device())
        td.all_reduce(t, op=td.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank (small Python objects: trajectories,
        metric rows)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        td.all_gather_object(out, obj)
        return out

    def shard(self, items: list) -> list:
        """Rank r's items r, r + N, ... (whole task groups; uneven where N does not divide them)."""
        return items[self.rank::self.world_size]

    def barrier(self) -> None:
        if self.enabled:
            td.barrier()

    def _comm_device(self):
        return self.device if td.get_backend() == "nccl" else torch.device("cpu")


def uneven_shard(groups: int, ranks: int) -> str:
    """The note for `groups` task groups a step over `ranks` ranks that do not divide them. Allowed: GRPO's
    statistics stay within a group and the loss is a token mean over every rank's tokens, so the update is
    the one-process update of the same groups; a rank with fewer groups only waits (with none, it still joins
    every collective, the update's included, with zero-loss passes)."""
    idle = f"; ranks {groups}..{ranks - 1} hold none and idle in the rollout" if ranks > groups else ""
    return (f"[smrc] --rollout.tasks-per-step {groups} over {ranks} ranks: a rank holds {groups // ranks} or "
            f"{-(-groups // ranks)} task groups{idle} (a multiple of {ranks} uses every rank)")


def print0(world: World, *args) -> None:
    if world.is_main:
        print(*args, flush=True)


def rank0_stdout():
    """Before the process group exists: what this block prints, on rank 0 only (lines every torchrun rank
    would print alike, such as the tasks loaded); errors are exceptions and stay every rank's."""
    if os.environ.get("RANK", "0") == "0":
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(io.StringIO())


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> World:
    """This process's World; under torchrun the process group (NCCL on GPU, gloo on CPU) with every
    collective bounded by `timeout_s`."""
    if "RANK" not in os.environ:  # plain `python smrc.py`
        return World(device=resolve_device(device))
    cuda = torch.cuda.is_available() and device != "cpu"
    rank, size, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    td.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return World(rank, size, local, torch.device(f"cuda:{local}") if cuda else torch.device("cpu"),
                 owns_process_group=True, timeout_s=timeout_s)


def close(world: World) -> None:
    """Destroy the process group `init_distributed` started (after any vLLM engine has shut down)."""
    if world.owns_process_group and td.is_initialized():
        td.destroy_process_group()


def wrap(model, world: World, strategy: str, bf16: bool = True):
    """DDP (each rank holds the full model) or FSDP (parameters sharded across ranks); identity on one
    process. As verl: DDP's gradients are views into its buckets (no second gradient-sized buffer); FSDP2 on
    CUDA with `bf16` gathers bf16 parameters and reduces gradients in float32 (MixedPrecisionPolicy)."""
    if not world.enabled:
        return model
    if strategy == "fsdp":  # FSDP2: each decoder layer, then the root, shards its parameters across ranks
        mixed = (dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
                 if bf16 and world.device.type == "cuda" else {})
        for layer in getattr(getattr(model, "model", model), "layers", []):
            fully_shard(layer, **mixed)
        fully_shard(model, **mixed)
        return model
    return DDP(model, device_ids=[world.local_rank] if world.device.type == "cuda" else None,
               gradient_as_bucket_view=True)


def wrap_frozen(model, world: World, strategy: str):
    """The frozen KL reference: sharded like the policy under FSDP (each rank holds 1/N of it; its forwards
    are then collectives, aligned as the policy's), as it is under DDP (no gradients, nothing to sync)."""
    if world.enabled and strategy == "fsdp":
        return wrap(model, world, strategy)
    return model


def _multi_process() -> bool:
    """From torchrun's WORLD_SIZE, not td.is_initialized():
    vLLM starts its own world-1 group in a single process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and td.is_initialized()


def unwrap(model):
    return getattr(model, "module", model)


def full_state_dict(model, cpu: bool = True) -> dict:
    """Full (unsharded) weights, on CPU or where they are, from a plain, DDP or FSDP2 model. Sharded
    (FSDP2 DTensor) parameters are gathered: a collective, so every rank calls it."""
    if not any(type(p).__name__ == "DTensor" for p in model.parameters()):
        sd = {k: v.detach() for k, v in unwrap(model).state_dict().items()}  # DDP wraps the model in .module
        return {k: v.cpu() for k, v in sd.items()} if cpu else sd
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))
    return {k.removeprefix("module."): v for k, v in sd.items()}


def stream_weights(model, dtype: torch.dtype):
    """(name, full tensor in `dtype`) one parameter or buffer at a time, where the model lives: the weight
    sync's source. An FSDP2 shard is gathered for that one tensor only (a collective: every rank iterates
    the same names in the same order), so the device never holds a full fp32 copy of the model, only one
    tensor of it in the engine's dtype."""
    for name, t in unwrap(model).state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        yield name.removeprefix("module."), full.detach().to(dtype)


def full_optimizer_state_dict(model, optimizer) -> dict:
    """The optimizer state with full (unsharded) tensors; a plain state_dict without a process group."""
    if not _multi_process():
        return optimizer.state_dict()
    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state_dict(model, optimizer, state: dict) -> None:
    if not _multi_process():
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


class RankError(SystemExit):
    """An error this rank alone may have seen: printed by the rank that raised it."""


def collective_failed(e: BaseException) -> bool:
    """Whether `e` is a collective that gave up: a timeout, or a peer that is gone (gloo's RuntimeErrors)."""
    signs = ("Timed out", "timed out", "timeout", "Connection closed by peer", "Connection reset")
    return isinstance(e, RuntimeError) and (isinstance(e, getattr(td, "DistError", ()))
                                            or any(k in str(e) for k in signs))


def peer_lost(e: BaseException) -> bool:
    """Whether a failed collective lost its peer (gloo: the connection closed or reset) rather than timed
    out."""
    return any(k in str(e) for k in ("Connection closed by peer", "Connection reset", "Broken pipe"))


class OneErrorLine:
    """Around a run under torchrun: an `error:` line once, and a collective that gave up as one line (module
    docstring). `world` is set once the process group exists; `newest()` names the newest checkpoint."""

    def __init__(self, newest=lambda: None):
        self.world: World | None = None
        self.newest = newest

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        rank = int(os.environ.get("RANK", "0"))
        w = self.world
        if w is not None and w.enabled and e is not None and collective_failed(e):
            cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            what = (f"lost another rank in {w.phase}: its connection closed, so that rank died or was killed"
                    if peer_lost(e) else f"waited more than {w.timeout_s:g} s (--dist.timeout-s) for another "
                    f"rank in {w.phase}: a rank stalled")
            raise RankError(f"error: rank {rank} {what} ({cause}); newest checkpoint {self.newest()}; "
                            f"continue with --resume") from None
        quiet = isinstance(e, SystemExit) and not isinstance(e, RankError) and isinstance(e.code, str)
        if rank == 0 or not quiet:
            return False
        if w is not None and w.phase != "set-up":  # in the training loop: possibly this rank's alone
            print(f"[rank {rank}] {e.code}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
