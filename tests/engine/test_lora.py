"""Multi-LoRA on the live engine: greedy tokens of one mixed batch (base requests and four adapters, more than the
device slots and the CPU cache hold, so adapters are swapped and re-read mid-run) equal those of an independent
reference - HF `generate` on the model with each adapter merged into its weights, W + scaling * B @ A - and bad
adapters or adapter names are refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kvplan.engine.llm import LLM
from kvplan.engine.lora import write_peft_adapter
from kvplan.engine.sampling import SamplingParams
from kvplan.errors import UserError

MAX_NEW = 10
# name -> (rank, alpha, rslora, the modules of every layer it targets)
ADAPTERS = {"sql": (4, 8.0, False, ("q_proj", "v_proj")),
            "chat": (8, 16.0, True, ("o_proj", "down_proj", "up_proj")),
            "code": (16, 4.0, False, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj")),
            "math": (1, 2.0, False, ("down_proj",))}


def _adapter(model_path: str, root, name: str, seed: int) -> str:
    from transformers import AutoModelForCausalLM

    rank, alpha, rslora, targets = ADAPTERS[name]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for path, module in model.named_modules():
        if path.rsplit(".", 1)[-1] in targets:
            out_f, in_f = module.weight.shape
            # large enough that every adapter changes the greedy tokens of the tiny random model
            weights[path] = (torch.randn(rank, in_f, generator=g) * 0.3, torch.randn(out_f, rank, generator=g) * 0.3)
    return str(write_peft_adapter(root / name, weights, rank=rank, alpha=alpha, use_rslora=rslora))


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: _adapter(tiny_models["tiny-llama"], root, name, seed) for seed, name in enumerate(ADAPTERS)}


def _merged_greedy(model_path: str, adapter: str | None, prompts: list[list[int]]) -> list[list[int]]:
    """The reference: the adapter's files read here and merged into HF's weights, then HF greedy generate."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if adapter is not None:
        config = json.loads(Path(adapter, "adapter_config.json").read_text())
        rank = config["r"]
        scaling = config["lora_alpha"] / (math.sqrt(rank) if config["use_rslora"] else rank)
        tensors = load_file(f"{adapter}/adapter_model.safetensors")
        modules = dict(model.named_modules())
        with torch.no_grad():
            for key, a in tensors.items():
                if key.endswith("lora_A.weight"):
                    path = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                    b = tensors[key.replace("lora_A", "lora_B")]
                    modules[path].weight += scaling * b @ a
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                                 min_new_tokens=MAX_NEW, pad_token_id=0)
            out.append(gen[0, len(prompt):].tolist())
    return out


def test_a_mixed_batch_of_adapters_equals_the_merged_models(tiny_models, adapters, tmp_path):
    path = tiny_models["tiny-llama"]
    g = torch.Generator().manual_seed(3)
    names = [None, "sql", "chat", None, "code", "math", "sql", "chat", "math", "code", None, "sql"]
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 40, (len(names),), generator=g)]
    # two device slots, three adapters in CPU memory: four adapters interleaved force swaps and re-reads
    llm = LLM(path, dtype="float32", block_size=8, kv_cache_memory=4 << 20, max_model_len=96, enable_lora=True,
              max_loras=2, max_cpu_loras=3, max_lora_rank=16, max_num_batched_tokens=48, max_num_seqs=3,
              lora_modules=adapters, profile_path=tmp_path / "steps.jsonl")
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True), lora=names)
    got = [o.outputs[0].token_ids for o in outputs]
    references = {}
    for name in [None, *ADAPTERS]:
        chosen = [i for i, n in enumerate(names) if n == name]
        references.update(zip(chosen, _merged_greedy(path, adapters.get(name), [prompts[i] for i in chosen]),
                              strict=True))
    assert got == [references[i] for i in range(len(names))]
    base = _merged_greedy(path, None, prompts)
    assert all(got[i] != base[i] for i, n in enumerate(names) if n is not None), "an adapter changed nothing"
    assert llm.lora.loads["gpu"] > len(ADAPTERS) and llm.lora.loads["disk"] > len(ADAPTERS), llm.lora.loads
    assert llm.scheduler.kv.pool.num_used == 0
    llm.close()  # the step records: each step's adapter moves, beside their time
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    records = [r for r in records if "times_s" in r]
    assert sum(r["lora_gpu_loads"] for r in records) == llm.lora.loads["gpu"]
    assert sum(r["lora_disk_loads"] for r in records) == llm.lora.loads["disk"]
    assert all("lora" in r["times_s"] for r in records)


def test_bad_adapters_and_names_are_refused_in_one_line(tiny_models, adapters, tmp_path):
    path = tiny_models["tiny-llama"]
    kw = dict(dtype="float32", kv_cache_memory=4 << 20, max_model_len=96)
    with pytest.raises(UserError, match=r"--lora-modules code=.*: rank 16 exceeds --max-lora-rank 8; allowed"):
        LLM(path, enable_lora=True, max_lora_rank=8, lora_modules={"code": adapters["code"]}, **kw)
    with pytest.raises(UserError, match=r"--lora-modules: needs LoRA on; allowed: --enable-lora"):
        LLM(path, lora_modules={"sql": adapters["sql"]}, **kw)
    with pytest.raises(UserError, match=r"max_lora_rank: 12 is not a rank vLLM serves"):
        LLM(path, enable_lora=True, max_lora_rank=12, **kw)
    with pytest.raises(UserError, match=r"max_cpu_loras: 1 is below max_loras 2"):
        LLM(path, enable_lora=True, max_loras=2, max_cpu_loras=1, **kw)
    bad = write_peft_adapter(tmp_path / "bad", {"model.layers.0.self_attn.q_proj": (torch.zeros(2, 7),
                                                                                      torch.zeros(7, 2))},
                             rank=2, alpha=2)
    with pytest.raises(UserError, match=r"q_proj.lora_A has shape \(2, 7\), the model's layer needs"):
        LLM(path, enable_lora=True, lora_modules={"bad": str(bad)}, **kw)
    wrong = write_peft_adapter(tmp_path / "wrong", {"model.layers.0.self_attn.nope": (torch.zeros(2, 7),
                                                                                    torch.zeros(7, 2))},
                               rank=2, alpha=2)
    with pytest.raises(UserError, match=r"target module 'model.layers.0.self_attn.nope' is not a linear layer"):
        LLM(path, enable_lora=True, lora_modules={"wrong": str(wrong)}, **kw)
    llm = LLM(path, enable_lora=True, lora_modules={"sql": adapters["sql"]}, **kw)
    with pytest.raises(UserError, match=r"lora 'chat': no such adapter; allowed: sql"):
        llm.add_request([1, 2, 3], lora="chat")
    with pytest.raises(UserError, match=r"lora 'sql': LoRA is off"):
        LLM(path, **kw).add_request([1, 2, 3], lora="sql")


def test_the_server_takes_the_adapter_in_model_and_lists_adapters(tiny_models, adapters):
    import httpx

    from tests.engine.serving.servers import thread_server

    path = tiny_models["tiny-llama"]
    llm = LLM(path, dtype="float32", kv_cache_memory=4 << 20, max_model_len=96, enable_lora=True, max_loras=1,
              lora_modules={"sql": adapters["sql"], "chat": adapters["chat"]})
    prompt = [5, 9, 2, 7]
    want = {name: _merged_greedy(path, adapters.get(name), [prompt])[0] for name in (None, "sql", "chat")}
    with thread_server(llm, "tiny") as (url, _):
        listed = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in listed] == ["tiny", "chat", "sql"] or [m["id"] for m in listed] == [
            "tiny", "sql", "chat"]
        assert {m.get("parent") for m in listed[1:]} == {"tiny"}
        for model, name in (("tiny", None), ("sql", "sql"), ("chat", "chat")):
            body = {"model": model, "prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True}
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
            assert reply["model"] == model and reply["choices"][0]["token_ids"] == want[name], reply
        missing = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": prompt}, timeout=30)
        assert missing.status_code == 404 and "`sql`" in missing.json()["error"]["message"]


def test_a_replayed_trace_runs_each_row_with_its_adapter(tiny_models, adapters, tmp_path):
    from kvplan import traces
    from kvplan.engine.options import EngineOptions
    from kvplan.live import replay, replay_requests

    rows = [{"request_id": i, "arrival_s": 0.01 * i, "prompt_tokens": 6, "output_tokens": 3,
             **({"lora": name} if name else {})} for i, name in enumerate([None, "sql", "chat", "sql", None])]
    trace_path = tmp_path / "t.jsonl"
    trace_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = traces.load(str(trace_path))
    assert [r.lora for r in replay_requests(trace, 256, 96, 0)] == [None, "sql", "chat", "sql", None]
    options = EngineOptions(dtype="float32", kv_cache_memory=4 << 20, max_model_len=96, enable_lora=True,
                            max_loras=1)
    result, _ = replay(tiny_models["tiny-llama"], trace, options, lora_modules={"sql": adapters["sql"],
                                                                                 "chat": adapters["chat"]})
    assert len(result.requests) == 5 and result.info["rejected"] == 0
    with pytest.raises(UserError, match=r"--trace: request_id 2 \(t.jsonl:3\): lora 'chat': no such adapter; "
                                        r"allowed: sql"):
        replay(tiny_models["tiny-llama"], trace, options, lora_modules={"sql": adapters["sql"]})
