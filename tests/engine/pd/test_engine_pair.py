"""A prefill and a decode engine (`LLM`) in one process, over the real transport: greedy tokens equal a co-located
engine's, the decode side records when each pull began and ended, the prefill side frees its held blocks once
read, or at once when the decode side aborts the request before reading; a pull that fails ends its request with the
reason and frees the decode side's blocks; a sink+window cache is refused."""

from __future__ import annotations

import json
import time

import pytest
import torch

from kvplan.endpoint.local_server import free_port
from kvplan.engine.kv_transfer.config import parse_kv_transfer_config
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.errors import UserError

OPTIONS = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_batched_tokens=64, max_model_len=320)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def config(role: str) -> object:
    return parse_kv_transfer_config(json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                                                "kv_port": free_port(),
                                                "kv_connector_extra_config": {"transfer_timeout": 5}}))


def run(llm: LLM, prompt: list[int], params: SamplingParams, kv_transfer_params: dict | None = None):
    rid = llm.add_request(prompt, params, kv_transfer_params=kv_transfer_params)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        for output in llm.step():
            if output.request_id == rid:
                return output
    raise AssertionError("no output within 20 s")


def test_a_pair_in_one_process(tiny_models):
    model = tiny_models["tiny-llama"]
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 33)]
    with LLM(model, **OPTIONS) as alone, LLM(model, kv_transfer=config("kv_producer"), **OPTIONS) as prefill, \
            LLM(model, kv_transfer=config("kv_consumer"), **OPTIONS) as decode:
        for prompt in prompts:
            first = run(prefill, prompt, SamplingParams(temperature=0, max_tokens=1),
                        {"do_remote_decode": True})
            assert prefill.holds_kv_for_remote
            out = run(decode, prompt, GREEDY, first.kv_transfer_params)
            assert out.outputs[0].token_ids == run(alone, prompt, GREEDY).outputs[0].token_ids
            m = out.metrics
            assert m.arrival_s <= m.kv_load_start_s <= m.kv_load_end_s <= m.first_token_s
            end = time.monotonic() + 20
            while prefill.holds_kv_for_remote and time.monotonic() < end:  # the read acknowledgement lands
                prefill.release_read_kv()
            assert prefill.scheduler.kv.num_free_blocks == 64

        # aborted on the decode side while still queued (before its pull): the prefill side frees at once
        first = run(prefill, prompts[1], SamplingParams(temperature=0, max_tokens=1), {"do_remote_decode": True})
        decode.abort(decode.add_request(prompts[1], GREEDY, kv_transfer_params=first.kv_transfer_params))
        end = time.monotonic() + 20
        while prefill.holds_kv_for_remote and time.monotonic() < end:  # the release lands (lease: 30 s)
            prefill.release_read_kv()
        assert prefill.scheduler.kv.num_free_blocks == 64 and not decode.has_unfinished_requests()

        bogus = {**first.kv_transfer_params, "remote_request_id": "never-exported"}
        failed = run(decode, prompts[0], GREEDY, bogus)
        assert failed.outputs[0].finish_reason == "error" and failed.outputs[0].token_ids == []
        assert failed.error.startswith("KV transfer failed: KV pull of 'never-exported'")
        assert "no KV exported under transfer id 'never-exported'" in failed.error
        assert not decode.has_unfinished_requests() and decode.scheduler.kv.num_free_blocks == 64


def test_a_windowed_cache_cannot_take_part(tiny_models):
    with pytest.raises(UserError, match="sink\\+window cache: the window releases blocks a decode instance would"):
        LLM(tiny_models["tiny-llama"], kv_transfer=config("kv_both"), window_tokens=32, **OPTIONS)
