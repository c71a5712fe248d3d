"""Memory: the peak of each phase of a step, and a stop with one line before memory runs out.

- `Memory.phase(name)`: a block of the training step (rollout, teacher, update). Its peak is this process's
  resident memory (VmHWM, reset when the phase starts) on CPU, or torch's peak allocated memory on CUDA; the
  step's row logs `mem/<name>_peak_gb` (`Memory.metrics`). A CUDA out-of-memory error inside a phase becomes
  one `error:` line naming the phase and the flag that sets its memory (`FLAGS`).
- A watchdog thread (CPU memory, also on a GPU machine): when the memory left to this process (MemAvailable,
  or the cgroup's limit minus its usage where that is smaller) falls below `floor_bytes` while this process
  holds at least half of the memory in use (the one the kernel's OOM killer would pick), it prints the same
  line and ends the process, before the OOM killer would kill it without a word. Checkpoints already written
  stay; the run lock (an flock) is dropped by the kernel.
- `return_freed_memory()`: glibc keeps freed blocks below its dynamic mmap threshold (up to 32 MiB) in its
  heap, so the resident size of a step grows with the largest working set seen, not with the live tensors.
  A fixed threshold (`MMAP_THRESHOLD`) hands every larger block back to the kernel when torch frees it: the
  peak then follows what the micro-batch budget bounds (bench/memory.py measures both).

This module imports nothing from the project (a leaf).
"""

import ctypes
import os
import resource
import sys
import threading
from contextlib import contextmanager

import torch

GIB = 2 ** 30
MMAP_THRESHOLD = 1 << 20  # bytes: blocks from 1 MiB up are mmap'd, so freeing them returns them at once
FLAGS = {  # what sets each phase's memory, named in the out-of-memory line
    "rollout": "--rollout.gen-batch-size (rows generated together) or --rollout.max-prompt-tokens",
    "teacher": "--teacher.micro-batch-tokens (or --teacher.max-prompt-tokens)",
    "update": "--grpo.micro-batch-tokens (and --grpo.grad-checkpointing on)",
}


def return_freed_memory() -> bool:
    """A fixed glibc mmap threshold for this process and the processes it forks later (see the module
    docstring); False where the C library is not glibc (nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def available_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, capped by a cgroup v2 limit (None: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit != "max":
            avail = min(avail, int(limit) - int(open("/sys/fs/cgroup/memory.current").read()))
    except (OSError, ValueError):
        pass
    return avail


def total_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_floor() -> int:
    """The watchdog's floor: 3% of the machine's memory, at least 0.5 GiB."""
    return max(GIB // 2, total_bytes() * 3 // 100)


def oom_line(phase: str, where: str, detail: str) -> str:
    flag = FLAGS.get(phase, "the batch sizes")
    return (f"error: out of {where} memory in the {phase} phase ({detail}); lower {flag} and resume with "
            f"--resume (the checkpoints written so far are kept)")


class Memory:
    """Per-phase peaks of one process (`phase`, `metrics`) and the out-of-memory watchdog (`start`)."""

    def __init__(self, device: torch.device, floor_bytes: int | None = None, poll_s: float = 0.05,
                 share: float = 0.5):
        self.device, self.poll_s, self.share = device, poll_s, share
        self.floor = default_floor() if floor_bytes is None else floor_bytes
        self.current, self.peaks, self.open = "setup", {}, []
        self._stop = threading.Event()

    def start(self) -> "Memory":
        if available_bytes() is not None:
            threading.Thread(target=self._watch, name="memory-watchdog", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            left = available_bytes()
            if left is None or left >= self.floor:
                continue
            rss = _status_kib("VmRSS") / 2 ** 20
            # this process holds most of what is used, so the kernel's OOM killer would pick it (another
            # process's growth is that process's watchdog's)
            if rss * GIB >= self.share * (total_bytes() - left):
                print(oom_line(self.current, "CPU", f"{left / GIB:.2f} GiB left on the machine, this process "
                               f"holds {rss:.1f} GiB"), file=sys.stderr, flush=True)
                os._exit(1)

    @contextmanager
    def phase(self, name: str):
        """A block whose peak is kept under `name`. Phases nest: an inner phase's peak also counts for the
        phases around it."""
        self._fold()  # the outer phases' peak so far, before the counter is reset
        self.open.append(name)
        self.current = name
        self._reset()
        try:
            yield
        except torch.OutOfMemoryError as e:
            raise SystemExit(oom_line(name, "GPU", str(e).split("\n")[0][:200])) from None
        finally:
            self._fold()
            self.open.pop()
            self.current = self.open[-1] if self.open else "between phases"

    def _fold(self) -> None:
        if not self.open:
            return
        peak = peak_bytes(self.device)
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0), peak)

    def _reset(self) -> None:
        reset_peak(self.device)

    def metrics(self) -> dict:
        """{mem/<phase>_peak_gb} of the phases since the last call (then cleared)."""
        out = {f"mem/{k}_peak_gb": v / GIB for k, v in self.peaks.items()}
        self.peaks = {}
        return out


def reset_peak(device: torch.device) -> None:
    """Start a new peak: torch's peak allocated memory on CUDA; on CPU VmHWM := VmRSS (Linux `clear_refs` 5;
    elsewhere the peak stays the process's peak so far)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_bytes(device: torch.device) -> int:
    """The peak since `reset_peak`: allocated memory on CUDA, resident memory (VmHWM) on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        return _status_kib("VmHWM") * 1024
    except OSError:  # no /proc: the process's peak so far (KiB on Linux)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
