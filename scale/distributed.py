"""Distributed set-up in one place: the same smrc.py runs under `python` and under `torchrun`.

- `init_distributed(device)` reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE, starts the process group (NCCL
  on GPU, gloo on CPU) and returns a `World` with the rank, world size and device. Without torchrun it is a
  no-op (world 1). `close(world)` destroys the process group it started (also a one-process torchrun group, so
  NCCL leaks nothing).
- Task groups are sharded across ranks (`shard`), so GRPO statistics stay inside one rank's group.
- `all_sum` / `gather` reduce what the loss and the logged metrics need, so the numbers mean the same as in a
  single process: the token-mean normaliser is the global token count, and metrics are computed over every
  rank's episodes.
- `wrap` puts the model under DDP or FSDP2 (`fully_shard`); `full_state_dict` gathers full weights for
  checkpoints and for the vLLM weight sync.
  Under FSDP every forward is a collective, so ranks must run the same number of forwards: the update aligns
  its micro-batch counts across ranks, and rollouts and teacher scoring run on vLLM (`--rollout.engine vllm
  --teacher.backend vllm`), whose per-rank generation needs no collectives.
Only rank 0 logs, shows progress bars and writes checkpoints; every rank loads the checkpoint when resuming.
"""

import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as td
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
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
        return items[self.rank::self.world_size]

    def barrier(self) -> None:
        if self.enabled:
            td.barrier()

    def _comm_device(self):
        return self.device if td.get_backend() == "nccl" else torch.device("cpu")


def print0(world: World, *args) -> None:
    if world.is_main:
        print(*args, flush=True)


def init_distributed(device: str = "auto") -> World:
    if "RANK" not in os.environ:  # plain `python smrc.py`
        return World(device=resolve_device(device))
    cuda = torch.cuda.is_available() and device != "cpu"
    rank, size, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    td.init_process_group("nccl" if cuda else "gloo")
    return World(rank, size, local, torch.device(f"cuda:{local}") if cuda else torch.device("cpu"),
                 owns_process_group=True)


def close(world: World) -> None:
    """Destroy the process group `init_distributed` started (after any vLLM engine has shut down)."""
    if world.owns_process_group and td.is_initialized():
        td.destroy_process_group()


def wrap(model, world: World, strategy: str):
    """DDP (each rank holds the full model) or FSDP (parameters sharded across ranks);
    identity on one process."""
    if not world.enabled:
        return model
    if strategy == "fsdp":  # FSDP2: each decoder layer, then the root, shards its parameters across ranks
        for layer in getattr(getattr(model, "model", model), "layers", []):
            fully_shard(layer)
        fully_shard(model)
        return model
    return DDP(model, device_ids=[world.local_rank] if world.device.type == "cuda" else None)


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


@dataclass
class DistConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """under torchrun: ddp (full model per rank) or fsdp (parameters sharded,
    for models that do not fit one device)"""
