"""The live engine's prefix tiers refuse bad input in one line: the disk tier is simulator-only (flag, --configs
entry), a CPU tier size must be positive and agree with a block count given beside it, and only the native
backend is modelled."""

from __future__ import annotations

import pytest

from tests.badinput.contract import SAMPLE, refused

REPLAY = ["replay", "--model", "tiny-llama", "--trace", SAMPLE, "--out", "o"]


@pytest.mark.parametrize(("extra", "where", "says"), [
    (["--kv-disk-blocks", "4"], "--kv-disk-blocks", "simulator-only"),
    (["--kv-offloading-size", "-1"], "--kv-offloading-size", "> 0"),
    (["--kv-offloading-size", "0.01", "--kv-offloading-blocks", "3"], "kv_offloading_size",
     "kv_offloading_blocks is 3"),
    (["--kv-offloading-backend", "lmcache"], "--kv-offloading-backend", "not modelled"),
], ids=["disk-tier", "negative-size", "size-vs-blocks", "lmcache"])
def test_replay_refuses_a_tier_it_cannot_run(capsys, tmp_path, monkeypatch, extra, where, says):
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, [*REPLAY, *extra], where)
    assert says in line
    assert not (tmp_path / "o").exists()


def test_a_configs_entry_with_the_disk_tier_is_refused(capsys, tmp_path):
    configs = tmp_path / "c.yaml"
    configs.write_text("- {name: a, kv_disk_blocks: 8}\n")
    line = refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE, "--configs",
                            str(configs), "--out", str(tmp_path / "v")], "[0].kv_disk_blocks")
    assert "simulator-only" in line and not (tmp_path / "v").exists()
