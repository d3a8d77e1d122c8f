"""Errors by class: a `UserError` raised where input is checked is one line and exit 2; any other exception, a
plain `ValueError` included, is a bug in kvplan and keeps its traceback (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.errors import UserError

SAMPLE = str(Path(__file__).parents[2] / "traces" / "samples" / "mooncake_style.jsonl")


@pytest.mark.parametrize("error", [ValueError, KeyError, TypeError, ZeroDivisionError])
def test_an_internal_error_keeps_its_traceback(monkeypatch, capsys, error):
    import kvplan.sim.run

    def broken(*args, **kwargs):
        raise error("an internal call went wrong")

    monkeypatch.setattr(kvplan.sim.run, "check_trace", broken)
    assert main(["simulate", "--trace", SAMPLE, "--num-blocks", "4000"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "an internal call went wrong" in err
    assert "internal error (a bug in kvplan" in err.splitlines()[-1]


def test_a_user_error_is_one_line(monkeypatch, capsys):
    import kvplan.sim.run

    def refuses(*args, **kwargs):
        raise UserError("--trace: a reason; allowed: what is allowed")

    monkeypatch.setattr(kvplan.sim.run, "check_trace", refuses)
    assert main(["simulate", "--trace", SAMPLE, "--num-blocks", "4000"]) == 2
    assert capsys.readouterr().err == "kvplan simulate: error: --trace: a reason; allowed: what is allowed\n"
