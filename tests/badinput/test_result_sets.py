"""A result set is never half old, half new: `kvplan simulate --out DIR` killed with SIGKILL at random moments
into a directory holding an earlier run leaves either the old complete set, the new complete set, or no set at
DIR (between the two renames); every set that is there matches its manifest file for file. And output
locations are checked before any work starts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.output import MANIFEST, verify_result_set

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "traces" / "samples" / "chat.jsonl")
KILLS = 20


def _simulate(out: Path, *blocks: str) -> list[str]:
    return [sys.executable, "-m", "kvplan", "simulate", "--trace", SAMPLE, "--block-size", *blocks, "--out", str(out),
            "--json"]


def _block_sizes(manifest: dict) -> list[int]:
    return manifest["config"]["options"]["block_size"]


@pytest.mark.slow
def test_a_killed_simulate_never_leaves_a_mixed_set(tmp_path):
    out = tmp_path / "result"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(_simulate(out, "16"), check=True, capture_output=True, env=env, cwd=ROOT)
    assert _block_sizes(verify_result_set(out)) == [16]
    start = time.perf_counter()  # how long a whole new run takes: the kills are spread over it
    subprocess.run(_simulate(tmp_path / "timing", "4", "8"), check=True, capture_output=True, env=env, cwd=ROOT)
    duration = time.perf_counter() - start
    rng = random.Random(11)
    seen = {"old": 0, "new": 0, "none": 0}
    for _ in range(KILLS):
        proc = subprocess.Popen(_simulate(out, "4", "8"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, cwd=ROOT)
        time.sleep(rng.uniform(0.3, 1.1) * duration)  # most kills land late: while the tables are written
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not out.exists():
            seen["none"] += 1
            continue
        sizes = _block_sizes(verify_result_set(out))  # raises if files and manifest disagree
        seen["old" if sizes == [16] else "new"] += 1
        assert sizes in ([16], [4, 8])
        if sizes == [4, 8]:
            assert {p.name for p in out.iterdir()} == {"block4", "block8", MANIFEST}
            subprocess.run(_simulate(out, "16"), check=True, capture_output=True, env=env, cwd=ROOT)  # old again
    assert sum(seen.values()) == KILLS


def test_a_finished_set_lists_every_file(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["simulate", "--trace", SAMPLE, "--block-size", "16", "8", "--out", str(out), "--json"]) == 0
    manifest = verify_result_set(out)
    assert {f["path"] for f in manifest["files"]} == {
        f"block{b}/{name}" for b in (16, 8) for name in ("requests.parquet", "series.parquet", "summary.json")}
    assert manifest["config"]["command"] == "simulate" and len(manifest["config_sha256"]) == 64
    (out / "block16" / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match=r"block16/summary\.json does not match manifest\.json"):
        verify_result_set(out)
    (out / MANIFEST).unlink()
    with pytest.raises(ValueError, match="not a complete result set"):
        verify_result_set(out)
    json.loads(capsys.readouterr().out)  # the --json output is one strict object


@pytest.mark.parametrize(("target", "fragment"), [
    ("file", "exists and is not a directory; allowed: a directory path"),
    ("/dev/null", "/dev/null exists and is not a directory"),
    ("under-a-file", "is not a directory; allowed: a path under a directory"),
    ("", "argument --out: empty path"),
])
def test_output_locations_are_checked_before_any_work(tmp_path, capsys, monkeypatch, target, fragment):
    from kvplan import sim
    def no_work(*args, **kwargs):
        raise AssertionError("simulated before checking --out")

    monkeypatch.setattr(sim.run, "simulate", no_work)
    (tmp_path / "file").write_text("x")
    where = {"file": str(tmp_path / "file"), "under-a-file": str(tmp_path / "file" / "out")}.get(target, target)
    assert main(["simulate", "--trace", SAMPLE, "--out", where]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
