"""`kvplan run` with stdout and stderr to files: the progress lines on stderr carry done/total (the total known
from the first line: the model-range edge searches counted up front, done never past it) and an ETA that is
never negative - on a first run killed midway and on its `--resume`, which reuses the finished runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

LINE = re.compile(r"^(\w+) (\d+)/(\d+), runs (\d+) \+ (\d+) reused, (\d+) s, ETA (\?|\d+ s)$")
# One point, two seeds (a search and one guided by it), the model range's two edge searches, each meeting the SLOs
# at `high` (the A100 serves ~25 req/s of these): two short probes a search.
DOC = {"name": "piped", "model": "llama-3-8b", "hardware": "a100-40gb",
       "workload": {"synthetic": {"seed": 4, "requests": 120, "arrivals": {"process": "poisson", "rate": 4},
                                  "lengths": {"prompt": {"dist": "lognormal", "median": 300, "sigma": 0.6,
                                                         "max": 2000},
                                              "output": {"dist": "lognormal", "median": 60, "sigma": 0.5,
                                                         "max": 400}}}},
       "probe": {"duration_s": 60, "min_requests": 50},
       "search": {"target": "max_rate", "low": 0.5, "high": 8, "tolerance": 0.3},
       "slo": {"p99_ttft_ms": 2000}, "seeds": [0, 1], "outputs": {"plots": False, "report": False}}


def progress_lines(path: Path) -> list[tuple[str, ...]]:
    return [m.groups() for line in path.read_text().splitlines() if (m := LINE.match(line))]


def check(lines: list[tuple[str, ...]], total: int | None = None) -> int:
    """Every line: done <= total, one total throughout, no negative ETA; >= 2 lines with an ETA. The total."""
    totals = {int(t) for _, _, t, *_ in lines}
    assert len(totals) == 1 and (total is None or totals == {total}), lines
    assert all(int(done) <= int(t) for _, done, t, *_ in lines), lines
    assert all(eta == "?" or int(eta.split()[0]) >= 0 for *_, eta in lines), lines
    assert sum(eta != "?" for *_, eta in lines) >= 2, lines
    return totals.pop()


def test_piped_progress_lines_on_a_run_killed_midway_and_on_its_resume(tmp_path):
    path = tmp_path / "piped.yaml"
    path.write_text(yaml.safe_dump(DOC))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "kvplan", "run", str(path), "--out", str(out)]
    first_err = tmp_path / "first.err"
    with open(tmp_path / "first.out", "w") as stdout, open(first_err, "w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + 120
        # killed once two searches have ended (two lines), before the last
        while len(progress_lines(first_err)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = progress_lines(first_err)
    total = check(first)
    assert total == 4 and int(first[-1][1]) < total  # 2 searches + the recommended point's 2 edge searches
    resumed_err = tmp_path / "resumed.err"
    with open(tmp_path / "resumed.out", "w") as stdout, open(resumed_err, "w") as stderr:
        assert subprocess.run([*command, "--resume"], stdout=stdout, stderr=stderr, timeout=300).returncode == 0
    resumed = progress_lines(resumed_err)
    check(resumed, total)
    noun, done, _, made, reused, _, eta = resumed[-1]
    assert (noun, done, eta) == ("searches", str(total), "0 s") and int(reused) > 0 and int(made) > 0
