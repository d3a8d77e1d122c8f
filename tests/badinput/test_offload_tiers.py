"""The live engine's prefix tiers refuse bad input in one line: the disk tier, the shared store and write-through
are simulator-only (flag, --configs entry), a CPU tier size must be positive and agree with a block count given
beside it, and only the native backend is modelled."""

from __future__ import annotations

import pytest

from tests.badinput.contract import SAMPLE, refused

REPLAY = ["replay", "--model", "tiny-llama", "--trace", SAMPLE, "--out", "o"]


@pytest.mark.parametrize(("extra", "where", "says"), [
    (["--kv-disk-blocks", "4"], "--kv-disk-blocks", "simulator-only"),
    (["--kv-shared-blocks", "4"], "--kv-shared-blocks", "simulator-only"),
    (["--kv-offloading-blocks", "4", "--kv-offloading-write-through"], "--kv-offloading-write-through",
     "simulator-only"),
    (["--kv-offloading-size", "-1"], "--kv-offloading-size", "> 0"),
    pytest.param(["--kv-offloading-size", "0.01", "--kv-offloading-blocks", "3"], "kv_offloading_size",
                 "kv_offloading_blocks is 3", marks=pytest.mark.engine),
    (["--kv-offloading-backend", "lmcache"], "--kv-offloading-backend", "not modelled"),
], ids=["disk-tier", "shared-tier", "write-through", "negative-size", "size-vs-blocks", "lmcache"])
def test_replay_refuses_a_tier_it_cannot_run(capsys, tmp_path, monkeypatch, extra, where, says):
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, [*REPLAY, *extra], where)
    assert says in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("entry", ["kv_disk_blocks: 8", "kv_shared_blocks: 8", "kv_offloading_write_through: true"])
def test_a_configs_entry_with_a_simulator_only_tier_is_refused(capsys, tmp_path, entry):
    configs = tmp_path / "c.yaml"
    configs.write_text(f"- {{name: a, {entry}}}\n")
    key = entry.split(":")[0]
    line = refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE, "--configs",
                            str(configs), "--out", str(tmp_path / "v")], f"[0].{key}")
    assert "simulator-only" in line and not (tmp_path / "v").exists()
