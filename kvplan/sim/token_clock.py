"""The token clock of one replica: each sequence's record of when it produced its first and last token and its
widest gap between tokens (its `SequenceTiming`), and the log of inter-token gaps inside the measurement window.

A step stamps every sequence it samples with the step's end. Most of a loaded replica's batch is its leading run
of bulk decodes (`SchedulerOutput.decodes`, `engine.core.decode_steps`), the same requests from one step to the
next but for those that finish and those that join at its end. Those are stamped as one *stamped run*: the first
`run_count` requests of the last step's bulk decodes, each marked with `SequenceTiming.stamped_to` (>= 0). Its
steps' ends go to `ends`, the gaps between them to a monotonic stack, and a request's own record is brought up
to date (`settle`) only when it is read: when it finishes, or when the run breaks (a stretch, a preemption, a step
whose leading decodes do not begin with the run in place). Invariant: a request in the stamped run produced a
token at every step end from ends[stamped_to + 1] to ends[-1] (one per step, none in between), and its record
holds everything up to ends[stamped_to]. So it gets the values stamping it in every step would have given: its
last token at ends[-1], its widest gap the larger of its record's and the widest of those steps' gaps, each gap
the same float (a step's end less its start, which is the previous step's end).

Runs are stamped so only where a step samples one token per sequence and token times are not kept (no
speculative decoding, no `record_tokens`).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

from kvplan.engine.core import Request, RequestStatus, SchedulerOutput
from kvplan.engine.core.timing import SequenceTiming
from kvplan.results.itl import ItlLog

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit ints in the compiled build (--sim); int when interpreted


class TokenClock:
    """The token stamps of one replica's steps and stretches (see the module). `itl_from`, `itl_until`: the
    measurement window whose gaps `itl` counts (a steady-state probe's; everything by default)."""

    __slots__ = ("common_gap", "common_gaps", "ends", "itl", "itl_from", "itl_on", "itl_until", "run", "run_count",
                 "run_finished", "run_stamps", "runs", "stepped_to", "widest_at", "widest_gap")

    def __init__(self, runs: bool) -> None:
        self.itl = ItlLog()
        self.itl_from, self.itl_until = -float("inf"), float("inf")
        self.itl_on = True  # whether the gaps ending at the current step count
        # The gaps that end at the current step after a token at its start (most of them): counted once, at
        # `flush_gaps`, as one entry of `common_gaps` copies of `common_gap`
        self.common_gaps: i64 = 0
        self.common_gap = 0.0
        self.runs = runs  # whether stamped runs apply (see the module)
        self.run: list[Request] = []  # the stamped run: its first `run_count`, as the last step's bulk decodes
        self.run_count: i64 = 0
        self.run_finished: i64 = 0  # those closed since (`settle` of a finished request)
        self.run_stamps: i64 = 0  # tokens stamped as part of a run, all runs together (how much it saves)
        self.ends: list[float] = []  # the run's step ends, from the step where its first request joined it
        # The suffix maxima of the gaps between `ends`: widest_gap[i] is the widest gap ending at or after
        # ends[widest_at[i]] (indices increasing, gaps decreasing)
        self.widest_at: list[int] = []
        self.widest_gap: list[float] = []
        # The end of the last step stamped here (not a stretch's): a run starts only at a step right after one,
        # where steps, not stretches, are likely to follow (a run that a stretch ends at once only costs)
        self.stepped_to = -1.0

    # -- one step ------------------------------------------------------------------------------------------
    def step(self, out: SchedulerOutput, clock: float, end: float) -> None:
        """Stamp the tokens the step `out`, run from `clock` to `end`, samples: the bulk decodes (all sample)
        each before the items behind them, in running order."""
        self.itl_on = self.itl_from <= end <= self.itl_until
        decodes = out.decodes
        lead: i64 = out.leading_decodes
        kept: i64 = self.run_count - self.run_finished
        if kept:
            last: i64 = self.run_count - 1
            while last >= 0 and self.run[last].status is not RequestStatus.RUNNING:  # (closed, or taken out)
                last -= 1
            # The run goes on where this step's leading decodes begin with it in place, right after its last step:
            # `running` only ever appends and drops, so a request taken out of it (preempted, aborted: not closed,
            # so still counted in `kept`) leaves its last elsewhere
            if not (last >= 0 and lead >= kept and decodes[kept - 1] is self.run[last] and clock == self.ends[-1]):
                self.settle_run()
                kept = 0
        done: i64 = kept
        common: i64 = kept  # the run's requests: each a token at `clock` before this one
        if kept:
            self.run_stamps += kept
            gap = end - clock
            at: i64 = len(self.ends)
            self.ends.append(end)
            widest_at, widest_gap = self.widest_at, self.widest_gap
            while widest_gap and widest_gap[-1] <= gap:
                widest_gap.pop()
                widest_at.pop()
            widest_at.append(at)
            widest_gap.append(gap)
        for item in out.scheduled:
            if item.samples:
                if item.decodes_before > done:
                    common += self._tokens(decodes, done, item.decodes_before, clock, end)
                    done = item.decodes_before
                common += self._tokens([item.request], 0, 1, clock, end)
        if done < len(decodes):
            common += self._tokens(decodes, done, len(decodes), clock, end)
        if common:
            self.common_gaps += common
            self.common_gap = end - clock
        self.flush_gaps()
        # The leading decodes are the run from here on: those that joined it now were stamped above
        stepped_to, self.stepped_to = self.stepped_to, end
        if not self.runs or not lead:
            return
        if not kept:
            if clock != stepped_to:  # (after a stretch, or idle)
                return
            self.ends.clear()
            self.ends.append(end)
            self.widest_at.clear()
            self.widest_gap.clear()
        to: i64 = len(self.ends) - 1
        for i in range(kept, lead):
            track = decodes[i].timing
            assert track is not None  # every submitted request carries its track
            track.stamped_to = to
        self.run, self.run_count, self.run_finished = decodes, lead, 0

    def _tokens(self, requests: list[Request], start: i64, stop: i64, clock: float, end: float) -> int:
        """Each of requests[start:stop] emits a token at `end` (the step began at `clock`); returns how many emitted
        their previous one at `clock`, whose gap `step` counts once."""
        gap, common = end - clock, 0
        for i in range(start, stop):
            track = requests[i].timing
            assert track is not None  # every submitted request carries its track
            if track.last_token_s == clock and track.token_times_s is None:
                common += 1  # `token` and `_gap`, inlined for the common case: a token in every step
                if gap > track.itl_max_s:
                    track.itl_max_s = gap
                track.last_token_s = end
            else:
                self.token(track, end, clock)
        return common

    def token(self, track: SequenceTiming, now: float, clock: float) -> None:
        """One token of `track` at `now`, in the step that began at `clock`."""
        if track.token_times_s is not None:
            track.token_times_s.append(now)
        if track.last_token_s != track.last_token_s:  # NaN: the first token
            track.first_token_s = now
        else:
            self._gap(track, now, clock)
        track.last_token_s = now

    def _gap(self, track: SequenceTiming, now: float, clock: float) -> None:
        """Record the gap since the sequence's last token; gaps from the step that began at `clock` (the common
        case) are counted and added to the log once by `flush_gaps`."""
        last = track.last_token_s
        gap = now - last
        if last == clock:
            self.common_gaps += 1
            self.common_gap = gap
        elif self.itl_on:
            self.itl.add(gap)
        if gap > track.itl_max_s:
            track.itl_max_s = gap

    def flush_gaps(self) -> None:
        if self.common_gaps:
            if self.itl_on:
                self.itl.add(self.common_gap, self.common_gaps)
            self.common_gaps = 0

    # -- reading a record ----------------------------------------------------------------------------------
    def settle(self, track: SequenceTiming) -> None:
        """Bring a record of the stamped run up to date (a finished request's, before it is read)."""
        since: i64 = track.stamped_to
        if since < 0:
            return
        self.run_finished += 1
        self._settle(track, since)

    def _settle(self, track: SequenceTiming, since: i64) -> None:
        if since < len(self.ends) - 1:
            track.last_token_s = self.ends[-1]
            widest = self.widest_gap[self._widest_from(since + 1)]
            if widest > track.itl_max_s:
                track.itl_max_s = widest
        track.stamped_to = -1

    def _widest_from(self, first: i64) -> i64:
        """The place on the stack of the widest gap ending at ends[first] or later (first at most the last
        step's index, whose gap is always on top)."""
        at = self.widest_at
        lo: i64 = 0
        hi: i64 = len(at) - 1
        while lo < hi:  # (by hand: `bisect` compares each probe through the generic protocol)
            mid: i64 = (lo + hi) >> 1
            if at[mid] < first:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def settle_run(self) -> None:
        """Bring the whole stamped run up to date and end it (its requests are stamped one by one again)."""
        run, widest_at, widest_gap = self.run, self.widest_at, self.widest_gap
        count: i64 = self.run_count
        self.run, self.run_count, self.run_finished = [], 0, 0
        if not count:
            return
        last: i64 = len(self.ends) - 1
        end = self.ends[last]
        # The widest gap since the last request's `since` (at `place` on the stack, which holds the gaps from
        # step `at` on): requests join the run in step order and keep their order in it, so their `since` does
        # not decrease along it, nor does that place
        place: i64 = -1
        at: i64 = -1
        widest = 0.0
        before: i64 = 0
        for i in range(count):
            track = run[i].timing
            assert track is not None  # every submitted request carries its track
            since: i64 = track.stamped_to
            if since < 0:  # closed
                continue
            assert since >= before
            before = since
            if since < last:
                while at <= since:
                    place += 1
                    at = widest_at[place]
                    widest = widest_gap[place]
                track.last_token_s = end
                if widest > track.itl_max_s:
                    track.itl_max_s = widest
            track.stamped_to = -1

    # -- a stretch of decode steps -------------------------------------------------------------------------
    def stretch(self, running: list[Request], remaining: list[int], ends: list[float], alive: list[int],
                clock: float) -> None:
        """Token times of a stretch begun at `clock`: request i samples at the end of each of its
        min(remaining[i], k) steps; alive[j] requests sample in step j."""
        self.settle_run()
        k = len(ends)
        gaps = [b - a for a, b in pairwise(ends)]  # gaps[j - 1]: step j-1 end -> step j end
        lo, hi = self.itl_from, self.itl_until
        if lo <= ends[0] and ends[-1] <= hi:
            self.itl.add_many(gaps, alive[1:k])
        else:  # a stretch across a measurement-window edge: only the gaps of steps ending inside it
            inside = [j for j in range(1, k) if lo <= ends[j] <= hi]
            self.itl.add_many([gaps[j - 1] for j in inside], [alive[j] for j in inside])
        self.itl_on = lo <= ends[0] <= hi  # the first step's gaps
        # The widest of a request's gaps inside the stretch: of all of them for one that runs to its end (nearly
        # every request), of the first `last` for one that finishes at its step `last`.
        widest = max([0.0, *gaps])
        first = ends[0]
        common_gap, common = first - clock, 0
        assert len(running) == len(remaining)
        for i in range(len(running)):  # (by index: a compiled build runs zip() as a Python iterator)
            steps = remaining[i]
            last = k - 1 if steps >= k else steps - 1
            track = running[i].timing
            assert track is not None  # every submitted request carries its track
            if track.last_token_s == clock:  # `_gap`, inlined for the common case: a token in the step before
                common += 1
                gap = common_gap
            else:
                gap = first - track.last_token_s
                if self.itl_on:
                    self.itl.add(gap)
            if gap > track.itl_max_s:
                track.itl_max_s = gap
            track.last_token_s = ends[last]
            widest_here = widest if last == k - 1 else max([0.0, *gaps[:last]])
            if widest_here > track.itl_max_s:
                track.itl_max_s = widest_here
        if common:
            self.common_gaps += common
            self.common_gap = common_gap
        self.flush_gaps()
