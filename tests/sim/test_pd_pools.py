"""Each pool's own serving settings (sim.pd_spec.POOL_SETTINGS): the options are generated from the settings'
declarations, a pool's value changes that pool's behaviour and not the other's, a pool's pipeline stages change
its step times, GPUs and KV bytes per rank, and bad values are refused in one line naming the flag or key."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.cli import main
from kvplan.engine.core.settings import SETTINGS
from kvplan.errors import UserError
from kvplan.sim.pd_spec import OPTIONS, POOL_SETTINGS, Disaggregation, disaggregation_from_mapping
from kvplan.sim.pd_transfer import rank_bytes_per_token
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.models import get_model
from kvplan.traces import Trace

BURST = Trace.build(np.zeros(16), np.full(16, 800), np.full(16, 50))  # 16 requests at once: the pools queue


def pd_run(**options):
    # the engines' own times (no API servers, whose queue would stagger the burst before the prefill engine)
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", entry_point="llm",
                   disaggregation=Disaggregation.of({"prefill_replicas": 1, "decode_replicas": 1, **options}))
    return simulate(BURST, spec)


def test_every_pool_setting_is_an_option_with_the_settings_own_range():
    for role in ("prefill", "decode"):
        for name in POOL_SETTINGS:
            option = OPTIONS[f"{role}_{name}"]
            assert option.flag == f"--{role}-{name.replace('_', '-')}" and option.kind == SETTINGS[name].kind
            assert option.allowed == SETTINGS[name].side_field("sim").allowed()
    pd = Disaggregation.of({"prefill_replicas": 1, "decode_replicas": 2, "decode_max_num_seqs": 8.0,
                            "prefill_pipeline_parallel_size": None})
    assert pd.pool("decode") == {"max_num_seqs": 8} and pd.pool("prefill") == {}  # canonical, unset left out
    assert Disaggregation.of(pd.options()) == pd
    prefill, decode = pd.pool_specs(SimSpec(max_num_seqs=64))
    assert (prefill.max_num_seqs, decode.max_num_seqs) == (64, 8)


def test_a_decode_pools_max_num_seqs_queues_its_decodes_and_leaves_the_prefill_pool_alone():
    base, narrow = pd_run(), pd_run(decode_max_num_seqs=1)
    assert narrow.info["max_num_seqs"] == 1 and base.info["max_num_seqs"] > 1  # (the decode pool's)
    # one decode at a time: each request waits for the ones before it
    assert narrow.summary["mean_decode_admission_wait_ms"] > 20 * base.summary["mean_decode_admission_wait_ms"]
    assert narrow.requests["prefill_ttft_ms"].tolist() == base.requests["prefill_ttft_ms"].tolist()


def test_a_prefill_pools_limits_change_its_steps_and_not_the_decode_pools():
    base = pd_run()
    one = pd_run(prefill_max_num_seqs=1)  # one prompt per step: every request is handed off at its own time
    assert one.requests["prefill_ttft_ms"].nunique() == len(BURST) > base.requests["prefill_ttft_ms"].nunique()
    small = pd_run(prefill_max_num_batched_tokens=256)  # 800-token prompts in 256-token chunks
    assert small.requests["prefill_ttft_ms"].tolist() != base.requests["prefill_ttft_ms"].tolist()
    for run in (one, small):
        assert (run.info["max_num_seqs"], run.info["max_num_batched_tokens"]) == \
            (base.info["max_num_seqs"], base.info["max_num_batched_tokens"])  # the decode pool's, unchanged


def test_a_pools_pipeline_stages_change_its_step_times_gpus_and_bytes_per_rank():
    base = pd_run()
    decode_pp = pd_run(decode_pipeline_parallel_size=2)
    pools = decode_pp.info["disaggregation"]["pools"]
    assert [p["gpus"] for p in pools] == [1, 2]
    assert decode_pp.info["disaggregation"]["kv_bytes_per_token_per_decode_rank"] * 2 == \
        base.info["disaggregation"]["kv_bytes_per_token_per_decode_rank"]  # each decode rank: half the layers
    assert decode_pp.summary["mean_tpot_ms"] != base.summary["mean_tpot_ms"]
    assert decode_pp.requests["prefill_ttft_ms"].tolist() == base.requests["prefill_ttft_ms"].tolist()
    prefill_pp = pd_run(prefill_pipeline_parallel_size=2)
    assert [p["gpus"] for p in prefill_pp.info["disaggregation"]["pools"]] == [2, 1]
    assert prefill_pp.summary["mean_prefill_ttft_ms"] != base.summary["mean_prefill_ttft_ms"]


def test_the_busiest_rank_of_pools_with_different_stages():
    gqa = get_model("llama-3-8b")  # 8 KV heads x 128 x 32 layers x 2 bytes x (K, V): 131,072 B per token
    assert rank_bytes_per_token(gqa, None, 1, 1, 2, 2) == (65536, 65536)
    # a prefill rank holds half the layers and sends them; the one decode rank reads them all: it is the busiest
    assert rank_bytes_per_token(gqa, None, 1, 1, 2, 1) == (131072, 131072)
    # the decode ranks hold half the layers each; the one prefill rank sends all of them
    assert rank_bytes_per_token(gqa, None, 1, 1, 1, 2) == (65536, 131072)


@pytest.mark.parametrize(("flags", "message"), [
    (["--prefill-max-num-seqs", "0"], "argument --prefill-max-num-seqs: '0'; allowed: an integer >= 1"),
    (["--decode-pipeline-parallel-size", "65"], "argument --decode-pipeline-parallel-size: '65'; allowed: an "
                                                "integer >= 1 and <= 64"),
    (["--decode-enable-chunked-prefill", "maybe"], "argument --decode-enable-chunked-prefill: 'maybe'; allowed: "
                                                   "true or false"),
    (["--prefill-gpu-memory-utilization", "1.5"], "argument --prefill-gpu-memory-utilization: '1.5'; allowed: a "
                                                  "finite number > 0 and <= 1"),
])
def test_bad_pool_flags_are_refused_in_one_line(flags, message, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n')
    assert main(["simulate", "--trace", str(path), "--prefill-replicas", "1", "--decode-replicas", "1",
                 *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err


def test_a_pool_setting_alone_is_refused_and_a_good_one_runs(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5}\n')
    assert main(["simulate", "--trace", str(path), "--decode-max-num-seqs", "4"]) == 2
    assert "--prefill-replicas: missing; --decode-max-num-seqs describe" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(path), "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--decode-pipeline-parallel-size", "2", "--prefill-enable-prefix-caching", "false"]) == 0
    assert "1 decode (h100-sxm, TP 1 x PP 2)" in capsys.readouterr().out


@pytest.mark.parametrize(("block", "message"), [
    ({"decode_max_num_seqs": 0}, "disaggregation.decode_max_num_seqs: 0; allowed: an integer >= 1"),
    ({"prefill_enable_prefix_caching": "yes"}, "disaggregation.prefill_enable_prefix_caching: 'yes'; allowed: "
                                               "true or false"),
    ({"prefill_block_size": 32}, "disaggregation.prefill_block_size: the transfer moves whole blocks, so both pools "
                                 "use one block size (vLLM's NIXL connector refuses a mismatch); allowed: "
                                 "engine.block_size for both pools"),
    ({"decode_kv_cache_dtype": "fp8"}, "disaggregation.decode_kv_cache_dtype: the transfer copies the KV bytes"),
])
def test_bad_pool_keys_name_the_key_path(block, message):
    with pytest.raises(UserError) as info:
        disaggregation_from_mapping({"prefill_replicas": 1, "decode_replicas": 1, **block})
    assert message in str(info.value) and "\n" not in str(info.value)
