"""`--kv-transfer-config` (vLLM 0.34's KVTransferConfig fields and checks) and the `kvplan serve` P/D flags: good
configs parse to the documented defaults; each bad input is one line naming the key and what is allowed, exit 2."""

from __future__ import annotations

import json
import socket

import pytest

from kvplan.cli import main
from kvplan.engine.kv_transfer.config import (
    DEFAULT_KV_PORT,
    LEASE_DEFAULT_S,
    check_tp_pair,
    parse_kv_transfer_config,
)
from kvplan.errors import UserError


def test_the_documented_nixl_example_parses_with_vllms_defaults():
    config = parse_kv_transfer_config('{"kv_connector":"NixlConnector","kv_role":"kv_both",'
                                      '"kv_load_failure_policy":"fail"}')
    assert (config.kv_connector, config.kv_role, config.semantics) == ("NixlConnector", "kv_both", "NixlPullConnector")
    assert config.is_producer and config.is_consumer
    assert (config.kv_port, config.kv_buffer_device, config.kv_lease_duration_s) == (DEFAULT_KV_PORT, "cuda",
                                                                                     LEASE_DEFAULT_S)
    assert len(config.engine_id) == 36  # a uuid4, as vLLM
    producer = parse_kv_transfer_config(json.dumps({
        "kv_connector": "NixlPullConnector", "kv_role": "kv_producer", "engine_id": "p0", "kv_port": 15000,
        "kv_buffer_device": "cpu", "kv_connector_extra_config": {"kv_lease_duration": 5, "transfer_timeout": 2.5},
        "enable_permute_local_kv": False, "kv_connector_module_path": None}))
    assert producer.is_producer and not producer.is_consumer
    assert (producer.engine_id, producer.kv_port, producer.kv_lease_duration_s, producer.transfer_timeout_s) == (
        "p0", 15000, 5.0, 2.5)


@pytest.mark.parametrize(("text", "message"), [
    ('{"kv_connector":"NixlConector","kv_role":"kv_both"}',
     "kv_connector 'NixlConector' is not a vLLM 0.34.0 connector; allowed: NixlConnector, NixlPullConnector"),
    ('{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}',
     "MooncakeConnector is a vLLM 0.34.0 connector that kvplan's live engine does not implement; allowed:"),
    ('{"kv_connector":"P2pNcclConnector","kv_role":"kv_both"}', "not registered in vLLM 0.34.0 (removed or renamed)"),
    ('{"kv_connector":"NixlConnector","kv_role":"producer"}',
     "kv_role 'producer' is not a vLLM role; allowed: kv_producer, kv_consumer, kv_both"),
    ('{"kv_connector":"NixlConnector"}', "kv_role is missing"),
    ('{"kv_role":"kv_both"}', "kv_connector is missing"),
    ('{"kv_connector":"NixlConnector", "kv_role":', "not valid JSON"),
    ('["NixlConnector"]', "is not a JSON object"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_rank":0}', "kv_rank was removed"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_conector":1}', "unknown key 'kv_conector'"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":0}', "kv_port 0; allowed: an integer port"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"xpu"}', "allowed: cuda, cpu"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}',
     "kv_load_failure_policy 'retry' is not a vLLM policy; allowed: fail"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute"}',
     "not modelled by kvplan's scheduler; allowed: fail"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","enable_permute_local_kv":true}', "allowed: false"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_module_path":"my.Conn"}', "out-of-tree"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{"backends":["UCX"]}}',
     "unknown key 'backends'; allowed: kv_lease_duration, transfer_timeout"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{"kv_lease_duration":0}}',
     "kv_lease_duration: 0; allowed: seconds in (0, 3600]"),
])
def test_bad_configs_name_the_key_and_what_is_allowed(text, message):
    with pytest.raises(UserError, match=r"^--kv-transfer-config: ") as caught:
        parse_kv_transfer_config(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_decode_tp_smaller_than_the_prefill_tp_is_refused():
    check_tp_pair(1, 1, "x")
    check_tp_pair(2, 4, "x")
    with pytest.raises(UserError, match="decode tensor_parallel_size 2 with prefill tensor_parallel_size 4; allowed"):
        check_tp_pair(4, 2, "disaggregation")
    with pytest.raises(UserError, match="a multiple of the prefill TP"):
        check_tp_pair(2, 3, "x")


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--model", "tiny-llama", "--kv-transfer-config", '{"kv_connector":"Nope","kv_role":"kv_both"}'],
     "--kv-transfer-config: kv_connector 'Nope' is not a vLLM 0.34.0 connector"),
    (["serve", "--model", "tiny-llama", "--kv-transfer-config", "{"], "--kv-transfer-config: not valid JSON"),
    (["serve", "--pd-proxy", "--decode", "http://127.0.0.1:9"], "--prefill: required with --pd-proxy"),
    (["serve", "--pd-proxy", "--prefill", "127.0.0.1:8000", "--decode", "http://127.0.0.1:9"],
     "--prefill: '127.0.0.1:8000' is not a server URL"),
    (["serve", "--pd-proxy", "--model", "tiny-llama", "--prefill", "http://a:1", "--decode", "http://b:2"],
     "--model: the proxy loads no model"),
    (["serve", "--model", "tiny-llama", "--decode", "http://b:2"], "--decode: only with --pd-proxy"),
    (["serve"], "--model: required"),
    (["serve", "--model", "tiny-llama", "--port", "{free}", "--kv-transfer-config",
      '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_port":{taken}}'],
     "--kv-transfer-config: kv_port: cannot listen on '127.0.0.1':{taken} (Address already in use)"),
])
def test_serve_refuses_bad_pd_flags_in_one_line(argv, message, capsys):
    from kvplan.endpoint.local_server import free_port

    with socket.socket() as taken:  # a port another process listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"{taken}": str(taken.getsockname()[1]), "{free}": str(free_port())}
        for name, port in ports.items():
            argv, message = [a.replace(name, port) for a in argv], message.replace(name, port)
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
