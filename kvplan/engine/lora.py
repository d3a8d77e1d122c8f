"""LoRA adapters on the live engine: PEFT-format adapters read from disk, held in device slots, applied batched.

An adapter is a PEFT directory: `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, optionally
`use_rslora`) and `adapter_model.safetensors` (`base_model.model.<module>.lora_A.weight` [r, in] and
`.lora_B.weight` [out, r] per targeted linear layer). Every adapter is checked when the engine starts (rank, target
modules and shapes against the model); its weights are read only when the core's slot manager
(`engine.core.lora.LoraSlots`, vLLM's LRU policy) says so, and copied into a device slot when it says so.

The forward pass: every targeted linear layer is wrapped (`LoraLinear`) with per-slot buffers A [slots, R, in]
and B [slots, out, R] (R = max_lora_rank, an adapter of lower rank zero-padded: the padding adds nothing). For a
step, each packed token row carries its request's slot; the layer adds scaling[s] * (x @ A[s]^T) @ B[s]^T to the
rows of each slot s of the step, for all of them at once per slot (plain torch: a gather of the rows, two small
GEMMs, an index_add), so one batch mixes any adapters and base requests (no slot: nothing added).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kvplan.engine.core.lora import LoraSlots, LoraStep, check_max_lora_rank, max_cpu_loras_of
from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput
from kvplan.errors import UserError

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."


@dataclass(slots=True)
class Adapter:
    """One adapter as its files declare it (checked against the model); `weights` is read on demand."""

    name: str
    lora_id: int  # 1.. in the order given (0 is the base model)
    path: Path
    rank: int
    scaling: float  # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT's rule)
    modules: tuple[str, ...]  # the model's module paths it changes


def read_adapter(name: str, lora_id: int, path: str | Path, model: nn.Module, max_lora_rank: int) -> Adapter:
    """The adapter at `path`, checked: its files exist, its rank is within max_lora_rank, every target module is a
    linear layer of the model and every weight has that layer's shape (one line naming the problem otherwise)."""
    from safetensors import safe_open

    where = f"--lora-modules {name}={path}"
    root = Path(path)
    if not (root / CONFIG_FILE).is_file() or not (root / WEIGHTS_FILE).is_file():
        raise UserError(f"{where}: no PEFT adapter there; allowed: a directory with {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads((root / CONFIG_FILE).read_text())
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{where}: {CONFIG_FILE} is not a LoRA config ({exc}); allowed: a PEFT LoRA config with r "
                        "and lora_alpha") from None
    if not 1 <= rank <= max_lora_rank:
        raise UserError(f"{where}: rank {rank} exceeds --max-lora-rank {max_lora_rank}; allowed: an adapter of rank "
                        f"<= {max_lora_rank}, or a larger --max-lora-rank")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    linears = dict(model.named_modules())
    shapes: dict[str, tuple[int, ...]] = {}
    with safe_open(str(root / WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (a safetensors handle has keys(), no __iter__)
            shapes[key] = tuple(f.get_slice(key).get_shape())
    modules = sorted({key.removeprefix(PREFIX).rsplit(".lora_", 1)[0] for key in shapes if ".lora_" in key})
    if not modules:
        raise UserError(f"{where}: {WEIGHTS_FILE} holds no lora_A / lora_B weights; allowed: a PEFT LoRA adapter")
    for module in modules:
        layer = linears.get(module)
        if layer is None or not hasattr(layer, "in_features"):
            raise UserError(f"{where}: target module {module!r} is not a linear layer of this model; allowed: the "
                            "model's linear layers (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")
        want = {"lora_A": (rank, layer.in_features), "lora_B": (layer.out_features, rank)}
        for part, shape in want.items():
            got = shapes.get(f"{PREFIX}{module}.{part}.weight")
            if got != shape:
                raise UserError(f"{where}: {module}.{part} has shape {got}, the model's layer needs {shape}; "
                                "allowed: an adapter trained for this model")
    return Adapter(name, lora_id, root, rank, scaling, tuple(modules))


def read_weights(adapter: Adapter) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (A [r, in], B [out, r]) on the CPU: what the CPU cache holds."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter.path / WEIGHTS_FILE))
    return {m: (tensors[f"{PREFIX}{m}.lora_A.weight"], tensors[f"{PREFIX}{m}.lora_B.weight"])
            for m in adapter.modules}


class LoraBatch:
    """The current step's rows per slot, shared by every wrapped layer: (slot, row indices) for each slot in use;
    empty for a batch of base requests, which then costs nothing."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: list[tuple[int, torch.Tensor]] = []


class LoraLinear(nn.Module):
    """`base(x)` plus, for the rows of each slot in the batch, that slot's low-rank update (see the module)."""

    def __init__(self, base: nn.Module, batch: LoraBatch, slots: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.base = base
        self.batch = batch
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_buffer("lora_a", torch.zeros(slots, max_rank, self.in_features, device=device, dtype=dtype),
                             persistent=False)
        self.register_buffer("lora_b", torch.zeros(slots, self.out_features, max_rank, device=device, dtype=dtype),
                             persistent=False)

    def set_slot(self, slot: int, weights: tuple[torch.Tensor, torch.Tensor] | None, scaling: float) -> None:
        """Fill `slot` with (A, B), B scaled once here; None: the adapter leaves this layer alone (zeros)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        if weights is not None:
            a, b = weights
            self.lora_a[slot, :a.shape[0]].copy_(a)
            self.lora_b[slot, :, :b.shape[1]].copy_(b * scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if not self.batch.groups:
            return y
        flat_x, flat_y = x.reshape(-1, self.in_features), y.view(-1, self.out_features)
        for slot, rows in self.batch.groups:
            xs = flat_x.index_select(0, rows)
            flat_y.index_add_(0, rows, (xs @ self.lora_a[slot].T) @ self.lora_b[slot].T)
        return y


class LoraRuntime:
    """The engine's adapters: names, the CPU cache and the device slots, moved as the core's `LoraSlots` says."""

    def __init__(self, model: nn.Module, modules: dict[str, str], max_loras: int, max_lora_rank: int,
                 max_cpu_loras: int | None, device: torch.device, dtype: torch.dtype) -> None:
        check_max_lora_rank(max_lora_rank)  # (a ConfigError: a UserError naming the setting)
        cpu = max_cpu_loras_of(max_loras, max_cpu_loras)
        self.adapters = {name: read_adapter(name, i + 1, path, model, max_lora_rank)
                         for i, (name, path) in enumerate(modules.items())}
        self.by_id = {a.lora_id: a for a in self.adapters.values()}
        self.slots = LoraSlots(max_loras, cpu)
        self.cpu_cache: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.batch = LoraBatch()
        self.device = device
        self.layers: dict[str, LoraLinear] = {}
        targets = sorted({m for a in self.adapters.values() for m in a.modules})
        for path in targets:
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            layer = LoraLinear(getattr(parent, child), self.batch, max_loras, max_lora_rank, device, dtype)
            setattr(parent, child, layer)
            self.layers[path] = layer
        self.loads = {"disk": 0, "gpu": 0}  # adapters read from disk, copied into a slot (a run's totals)
        self._slot_of: dict[int, int] = {}  # adapter -> its slot in the current step
        self.last = LoraStep()  # what the last step moved

    def lora_id(self, name: str | None) -> int:
        """The id of adapter `name` (None: the base model, 0)."""
        if name is None:
            return 0
        adapter = self.adapters.get(name)
        if adapter is None:
            allowed = ", ".join(self.adapters) or "none (--lora-modules gives them)"
            raise UserError(f"lora {name!r}: no such adapter; allowed: {allowed}")
        return adapter.lora_id

    def load(self, step: SchedulerOutput) -> None:
        """Make the step's adapters resident as the core decides: read from disk into the CPU cache, dropped from
        it, copied into their slots."""
        moves = self.slots.step(step)
        for lora_id in moves.cpu_evicted:
            self.cpu_cache.pop(lora_id, None)
        for lora_id in moves.disk_loads:
            self.cpu_cache[lora_id] = read_weights(self.by_id[lora_id])
        for lora_id in moves.gpu_loads:
            adapter, weights = self.by_id[lora_id], self.cpu_cache[lora_id]
            for path, layer in self.layers.items():
                layer.set_slot(moves.slots[lora_id], weights.get(path), adapter.scaling)
        self.loads["disk"] += len(moves.disk_loads)
        self.loads["gpu"] += len(moves.gpu_loads)
        self._slot_of = moves.slots
        self.last = moves

    def step_loads(self) -> dict[str, float]:
        """The adapter moves since the last call (a step's, read once for its profile record beside its `lora`
        time; none for a step that ran nothing)."""
        moves, self.last = self.last, LoraStep()
        return {"lora_disk_loads": float(len(moves.disk_loads)), "lora_gpu_loads": float(len(moves.gpu_loads))}

    def bind(self, packed: list[ScheduledRequest]) -> None:
        """The rows of each slot for the packed batch (`packed`: the scheduled items in row order)."""
        rows: dict[int, list[int]] = {}
        offset = 0
        for item in packed:
            lora_id = item.request.lora_id
            if lora_id:
                rows.setdefault(self._slot_of[lora_id], []).extend(range(offset, offset + item.num_new_tokens))
            offset += item.num_new_tokens
        self.batch.groups = [(slot, torch.tensor(r, dtype=torch.long, device=self.device)) for slot, r in rows.items()]


def write_peft_adapter(path: str | Path, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], *, rank: int,
                       alpha: float, use_rslora: bool = False) -> Path:
    """Write a PEFT-format adapter (module -> (A [r, in], B [out, r])): what `save_pretrained` writes, without
    needing peft."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    targets = sorted({m.rsplit(".", 1)[-1] for m in weights})
    (root / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": alpha,
                                                "target_modules": targets, "use_rslora": use_rslora,
                                                "bias": "none", "task_type": "CAUSAL_LM"}))
    save_file({f"{PREFIX}{m}.{part}.weight": t.contiguous() for m, (a, b) in weights.items()
               for part, t in (("lora_A", a), ("lora_B", b))}, str(root / WEIGHTS_FILE))
    return root


def lora_runtime(model: nn.Module, options, modules: dict[str, str], device: torch.device,
                 dtype: torch.dtype) -> LoraRuntime | None:
    """The engine's adapters under `options` (`EngineOptions`), or None with LoRA off (adapters then refused)."""
    if not options.enable_lora:
        if modules:
            raise UserError("--lora-modules: needs LoRA on; allowed: --enable-lora (enable_lora=True), or leave it "
                            "out")
        return None
    return LoraRuntime(model, modules, options.max_loras, options.max_lora_rank, options.max_cpu_loras, device,
                       dtype)


def lora_id_of(runtime: LoraRuntime | None, name: str | None) -> int:
    """A request's adapter id from its name (None: the base model, 0); a name the engine does not serve is
    refused, naming the ones it does."""
    if name is None:
        return 0
    if runtime is None:
        raise UserError(f"lora {name!r}: LoRA is off; allowed: no adapter, or --enable-lora with --lora-modules")
    return runtime.lora_id(name)
