"""The progress meter's arithmetic and output on a fake clock (no sleeps): the ETA counts reused runs as done
but takes its rate from the runs made in this process, never goes negative, and done never passes the total;
piped, a line per ended search plus a heartbeat when none was written for `heartbeat_s`."""

from __future__ import annotations

import io
import re

import pytest

from kvplan.experiments.progress import Progress

LINE = re.compile(r"^(\w+) (\d+)/(\d+), runs (\d+) \+ (\d+) reused, (\d+) s, ETA (\?|\d+ s)$")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def meter(total: int, clock: Clock, **kw) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    return Progress(total, "searches", stream=out, clock=clock, live=False, **kw), out


def lines(out: io.StringIO) -> list[tuple]:
    found = [LINE.match(line) for line in out.getvalue().splitlines()]
    assert all(found), out.getvalue()
    return [m.groups() for m in found]


def test_the_eta_after_a_resume_takes_its_rate_from_fresh_runs_only():
    """10 searches of 4 runs each; 5 of them reused whole in no time, then 4 fresh runs take 40 s: the rate is
    0.1 run/s, and the 20 runs left take 200 s - not the 40 s that 5 searches done in 40 s would suggest."""
    clock = Clock()
    p, _ = meter(10, clock)
    for _ in range(5):
        for _ in range(4):
            p.update(reused=True)
        p.ended(4)
    assert p.eta() is None  # no run made here yet: no rate to give
    for _ in range(4):
        clock.now += 10
        p.update(run=True)
    p.ended(4)
    assert p.eta() == pytest.approx((10 * 4 - 24) * 40 / 4)  # 16 runs left of 40, at 10 s each
    assert p.done == 6


def test_before_any_search_ends_the_plans_runs_per_search_are_used():
    clock = Clock()
    p, _ = meter(4, clock, runs_per_item=5.0)
    clock.now += 30
    p.update(run=True)
    p.update(run=True)  # 2 runs in 30 s; 20 expected in all
    assert p.eta() == pytest.approx(18 * 15)


def test_the_eta_is_never_negative_and_done_never_passes_the_total():
    clock = Clock()
    p, out = meter(3, clock, runs_per_item=1.0)
    for _ in range(3):
        clock.now += 5
        for _ in range(6):  # far more runs than the plan expected
            p.update(run=True)
        p.ended(6)
        assert p.eta() >= 0
    p.set_total(2)  # the recommended point had fewer edge searches than counted: never below done
    assert p.total == 3 and p.eta() == 0.0
    p.ended(1)  # a search ending past the total raises it with it
    assert (p.done, p.total) == (4, 4)
    for noun, done, total, _runs, _reused, _elapsed, eta in lines(out):
        assert noun == "searches" and int(done) <= int(total) and not eta.startswith("-")


def test_runs_per_search_come_from_the_searches_done_and_each_left_needs_one():
    """Runs of searches still going do not inflate the runs per search; however many were made, each search
    not done still has at least one run left."""
    clock = Clock()
    p, _ = meter(4, clock)
    p.update(reused=True)
    p.ended(1)  # 1 run per search so far
    clock.now += 10
    for _ in range(5):
        p.update(run=True)  # 6 runs done > 4 x 1 expected: the three searches going take more than one each
    assert p.eta() == pytest.approx(3 * 10 / 5)
    p.ended(4)
    assert p.eta() == pytest.approx((4 * 2.5 - 6) * 10 / 5)


def test_a_heartbeat_line_comes_when_none_was_written_for_heartbeat_s():
    clock = Clock()
    p, out = meter(2, clock, heartbeat_s=10.0)
    clock.now += 9.9
    p.beat()
    assert out.getvalue() == ""  # not yet
    clock.now += 0.1
    p.update(run=True)
    p.beat()
    clock.now += 4
    p.ended(1)  # a search's line resets the interval
    clock.now += 9
    p.beat()
    clock.now += 1
    p.beat()
    got = lines(out)
    assert [(g[1], g[2], g[5], g[6]) for g in got] == [("0", "2", "10", "20 s"), ("1", "2", "14", "14 s"),
                                                       ("1", "2", "24", "24 s")]


def test_the_heartbeat_thread_writes_while_nothing_else_happens():
    """The thread polls at a tenth of heartbeat_s; with a 0.05 s heartbeat a few lines come within a bound."""
    out = io.StringIO()
    p = Progress(3, "points", stream=out, live=False, heartbeat_s=0.05).start()
    try:
        import time

        deadline = time.monotonic() + 10
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            p.halt.wait(0.01)
    finally:
        p.close()
    assert out.getvalue().count("\n") >= 2 and lines(out)[0][:3] == ("points", "0", "3")


def test_disabled_writes_nothing():
    clock = Clock()
    p, out = meter(1, clock, enabled=False)
    clock.now += 60
    p.update(run=True)
    p.beat()
    p.ended(1)
    assert out.getvalue() == ""


def test_the_terminal_bar_shows_the_same_line():
    """The live bar (rich) carries the counters' line; closing it leaves the final state."""
    out = io.StringIO()
    p = Progress(2, "searches", stream=out, live=True).start()
    p.update(run=True)
    p.ended(1)
    p.ended(1)
    p.close()
    assert "searches 2/2, runs 1 + 0 reused" in out.getvalue() and "ETA 0 s" in out.getvalue()
