"""How far `kvplan run` is: searches (or points) done of the total, runs made and reused, elapsed, and an ETA.

On a terminal a live bar (rich) is redrawn every second; on a pipe or a file one line goes to stderr when a
search ends and, between those, a heartbeat line at least every `heartbeat_s` (10 s) - also while one long run
is simulating, since a thread writes it - so a log shows the run is alive:

    searches 6/14, runs 43 + 0 reused, 96 s, ETA 110 s

The estimator (`Progress.eta`): the work is counted in runs, and its speed only from the runs this process
made, so runs reused by `--resume` (read back in milliseconds) count as done but never make the rate look
faster than the simulator is:

    rate        = runs made here / seconds since this process started    (the workers in parallel included)
    per search  = runs of the searches done / searches done               (the plan's expected runs per
                                                                            search until one has ended)
    remaining   = max(total x per search - (runs made + reused), searches not done)   (each needs >= 1 run)
    ETA         = remaining / rate; 0 once every search is done; unknown ("ETA ?") until a run is made here

It is never negative. The total is known up front: the searches of every point plus the model-range edge
searches `search.model_range` will add (`recommended`: the recommended point's, counted from the start);
when the recommendation turns out to need fewer, the total shrinks to what runs, and `done` never exceeds it.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

HEARTBEAT_S = 10.0  # a piped line at least this often
REDRAW_S = 1.0  # the terminal bar's redraw period


@dataclass(slots=True)
class Progress:
    """Counters and their one-line rendering; `start()` opens the bar or the heartbeat, `close()` ends them."""

    total: int
    noun: str = "points"
    runs_per_item: float = 1.0  # the plan's expected runs per search (or point) until one has ended
    enabled: bool = True
    stream: TextIO | None = None  # default: sys.stderr (read when the run starts, so a test's capture applies)
    clock: Callable[[], float] = time.monotonic
    heartbeat_s: float = HEARTBEAT_S
    live: bool | None = None  # a redrawn bar; None: when the stream is a terminal
    started: float = math.nan
    runs: int = 0  # runs made (simulated) by this process
    reused: int = 0  # finished runs read back (--resume) or shared with another search
    done: int = 0  # searches (points) ended
    done_runs: int = 0  # the runs those searches made or reused
    last_line: float = math.nan  # when the last piped line was written
    lock: threading.Lock = field(default_factory=threading.Lock)
    halt: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    bar: Any = None  # rich.progress.Progress while a terminal bar is shown
    bar_task: Any = None

    def __post_init__(self) -> None:
        if self.stream is None:
            self.stream = sys.stderr
        if self.live is None:
            self.live = self.stream.isatty()
        self.started = self.last_line = self.clock()

    # -- the counters -----------------------------------------------------------------------------------------
    def update(self, *, run: bool = False, reused: bool = False) -> None:
        """A run made, or a run reused."""
        with self.lock:
            self.runs += run
            self.reused += reused

    def ended(self, runs: int) -> None:
        """A search (point) ended after `runs` runs, made or reused: a line on a pipe."""
        with self.lock:
            self.done += 1
            self.done_runs += runs
            self.total = max(self.total, self.done)
            self._show()

    def set_total(self, total: int) -> None:
        """The final count once it is known (the recommended point's edge searches: as many as it has)."""
        with self.lock:
            self.total = max(total, self.done)

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left (module docstring); None before this process has made a run."""
        if self.done >= self.total:
            return 0.0
        if self.runs == 0:
            return None
        elapsed = (self.clock() if now is None else now) - self.started
        finished = self.runs + self.reused
        per_item = self.done_runs / self.done if self.done else self.runs_per_item
        remaining = max(self.total * per_item - finished, self.total - self.done)
        return max(remaining * elapsed / self.runs, 0.0)

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        eta = self.eta(now)
        return (f"{self.noun} {self.done}/{self.total}, runs {self.runs} + {self.reused} reused, "
                f"{now - self.started:.0f} s, ETA {'?' if eta is None else f'{eta:.0f} s'}")

    # -- the output -------------------------------------------------------------------------------------------
    def beat(self) -> None:
        """The heartbeat: redraw the bar, or write a line when none was written for `heartbeat_s`."""
        with self.lock:
            if self.live or self.clock() - self.last_line >= self.heartbeat_s:
                self._show()

    def _show(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.bar is not None:
            self.bar.update(self.bar_task, completed=self.done, total=self.total, info=self.line(now))
            self.bar.refresh()
        elif not self.live:
            print(self.line(now), file=self.stream, flush=True)
            self.last_line = now

    def start(self) -> Progress:
        """Open the terminal bar and the heartbeat thread (nothing when disabled)."""
        if not self.enabled:
            return self
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(BarColumn(), TextColumn("{task.fields[info]}"), auto_refresh=False,
                           console=Console(file=self.stream), transient=False)
            self.bar_task = self.bar.add_task("", total=self.total, info=self.line())
            self.bar.start()
        self.thread = threading.Thread(target=self._beats, name="kvplan-progress", daemon=True)
        self.thread.start()
        return self

    def _beats(self) -> None:
        while not self.halt.wait(REDRAW_S if self.live else self.heartbeat_s / 10):
            self.beat()

    def close(self) -> None:
        self.halt.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.bar is not None:
            with self.lock:
                self._show()
            self.bar.stop()
            self.bar = None
