"""How this process was launched, so that the command a stopped run prints starts the same launch again, and
what torchrun will do when the job is preempted.

- `resume_command(argv)`: `python smrc.py <argv> --resume`, or under torchrun `torchrun <its own options>
  smrc.py <argv> --resume`: the launcher's options (--nproc_per_node, --nnodes, the rendezvous) read from its
  command line (Linux: /proc/<parent>/cmdline; elsewhere rebuilt from torchrun's environment:
  --nproc_per_node LOCAL_WORLD_SIZE, --nnodes WORLD_SIZE / LOCAL_WORLD_SIZE). Following it never turns a
  2-rank run into one process.
- `torchrun_grace_s()`: the seconds torchrun's agent waits after it forwards SIGTERM (or SIGINT) to the ranks
  before it SIGKILLs them: its `--shutdown-timeout` (torch >= 2.9; also TORCH_ELASTIC_SHUTDOWN_TIMEOUT or
  PET_SHUTDOWN_TIMEOUT), 30 s by default; None outside torchrun. The ranks cannot lengthen it once launched,
  so a run whose --preempt-grace-s is longer says so at its start, with the option to launch with.
"""
import os
import shlex
import sys
from pathlib import Path

TORCHRUN_DEFAULT_GRACE_S = 30.0  # torch.distributed.elastic's shutdown timeout when none is given


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def launcher_args() -> list[str] | None:
    """torchrun's own options (between the launcher and the script) from its command line, or None where the
    parent's command line cannot be read or does not name this script."""
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except (OSError, UnicodeDecodeError):
        return None
    return options_before(parent, sys.argv[0])


def options_before(launcher: list[str], script: str) -> list[str] | None:
    """The options of a torchrun command line `launcher` before `script`: after `python -m
    torch.distributed.run`, or after `python .../bin/torchrun` (a script run by its interpreter), or after
    `torchrun`; None when `script` is not on it."""
    at = next((i for i, a in enumerate(launcher) if a == script), None)
    if at is None:
        return None
    if launcher[1:3] == ["-m", "torch.distributed.run"]:
        return launcher[3:at]
    return launcher[2:at] if len(launcher) > 1 and Path(launcher[1]).name == "torchrun" else launcher[1:at]


def torchrun_options() -> list[str]:
    """The launcher's options as given, else rebuilt from torchrun's environment."""
    given = launcher_args()
    if given is not None:
        return given
    local, world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("WORLD_SIZE", "1"))
    nodes = ["--nnodes", str(world // max(local, 1))] if world != local else ["--standalone"]
    return [*nodes, "--nproc_per_node", str(local)]


def resume_command(argv: list[str]) -> str:
    """The command that continues this run: the same launch, `--resume` added once."""
    args = [a for a in argv if a != "--resume"]
    launch = f"torchrun {shlex.join(torchrun_options())} " if under_torchrun() else "python "
    return f"{launch}smrc.py {shlex.join(args)} --resume"


def torchrun_grace_s() -> float | None:
    """Seconds from torchrun's forwarded SIGTERM to its SIGKILL of the ranks (None outside torchrun)."""
    if not under_torchrun():
        return None
    args = launcher_args() or []
    for i, a in enumerate(args):
        name, _, value = a.partition("=")
        if name in ("--shutdown-timeout", "--shutdown_timeout"):
            try:
                return float(value or args[i + 1])
            except (IndexError, ValueError):
                break
    for var in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        if os.environ.get(var, "").strip():
            try:
                return float(os.environ[var])
            except ValueError:
                pass
    return TORCHRUN_DEFAULT_GRACE_S
