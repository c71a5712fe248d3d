"""A preemption-safe stop. A scheduler sends SIGTERM some seconds before SIGKILL; Ctrl-C sends SIGINT. Either
one asks the trainer to stop at the next safe point, the end of the step in flight (a save in flight
finishes first). It then saves a checkpoint if the newest one is older than that step and the save fits in
the grace period counted from the signal (`--preempt-grace-s`, as a scheduler's SIGTERM -> SIGKILL window;
the estimate is the run's last save time). The trainer prints the newest checkpoint and the exact command
that continues the run, releases its lock and exits 128 + the signal (143 for SIGTERM, 130 for SIGINT). A
second signal stops at once, also without a traceback; the newest checkpoint stays. A second one within
`SAME_REQUEST_S` of the first is the launcher's copy of the same request, not a second one: Slurm signals
every process of the job step and torchrun's agent forwards its own SIGTERM to each rank (after a Ctrl-C on
torchrun too: the terminal's SIGINT, then the agent's SIGTERM), so a rank gets two at once. Env workers and
the planner ignore both signals (they end with the trainer), so a signal sent to the whole process group
stops the run cleanly too.

- `StopSignals(grace_s)`: a context that installs the handlers (main thread) and restores the old ones.
- `Preempted`: raised by the trainer's loop once it has stopped; smrc.main turns it into the line and exit.
"""
import os
import signal
import sys
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT)
SAME_REQUEST_S = 1.0  # a second signal sooner than this after the first: the launcher's copy (docstring)


class Preempted(Exception):
    """The run stopped on a signal after `step` steps; `saved`: whether the stop wrote a checkpoint."""

    def __init__(self, signum: int, step: int, saved: bool, note: str = ""):
        super().__init__(f"{signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.saved, self.note = signum, step, saved, note


class StopSignals:
    def __init__(self, grace_s: float):
        self.grace_s, self.signum, self.t_signal, self._old = grace_s, None, None, {}

    def __enter__(self):
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, kind, *exc) -> None:
        # Under torchrun a run that ends on an error (a lost rank, say) keeps signals off while it closes: the
        # agent SIGTERMs every rank once one has failed, and the default handler would kill this one before
        # it prints the line saying what happened.
        ending = kind is not None and "TORCHELASTIC_RUN_ID" in os.environ
        for s, handler in self._old.items():
            signal.signal(s, signal.SIG_IGN if ending else handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None and time.monotonic() - self.t_signal < SAME_REQUEST_S:
            print(f"[smrc] {name} again within {SAME_REQUEST_S:g} s: the same stop request (a launcher's "
                  f"copy: Slurm, torchrun); a signal after that stops at once", flush=True)
            return
        if self.signum is not None:
            print(f"[smrc] a second {name}: stopping now, without a checkpoint (the newest one stays)",
                  file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum, self.t_signal = signum, time.monotonic()
        print(f"[smrc] {name}: stopping at the end of this step (a second {name} stops at once)", flush=True)

    def requested(self, world) -> bool:
        """Whether any rank got a signal (every rank takes the same decision)."""
        return bool(world.all_max(int(self.signum is not None)))

    def fits(self, seconds: float) -> bool:
        """Whether `seconds` more still end within the grace period counted from the signal."""
        return self.t_signal is None or time.monotonic() + seconds <= self.t_signal + self.grace_s
