"""Multi-LoRA serving in the core: the max_loras admission rule and the adapter slots (vLLM's, both).

A request names its adapter by `Request.lora_id` (0: the base model) and `Request.lora_name` (what the prefix
cache keys it by: `request.adapter_root`). Two policies, shared by the live engine and the simulator:

* Admission (`Admission.schedule_waiting`, vLLM's scheduler): the adapters of the running requests, plus those
  admitted earlier in the step, may number at most `max_loras`. A waiting request whose adapter is not among them
  when they already number `max_loras` is skipped - taken out of the queue for the rest of the step and put back
  at its place after it (vLLM's `skipped_waiting_requests`) - and the requests behind it are still tried. A base
  request is never skipped for it.
* Slots (`LoraSlots`, vLLM's `LRUCacheWorkerLoRAManager` over `LRUCacheLoRAModelManager`): `max_loras` device
  slots and a CPU cache of `max_cpu_loras` adapters, both least recently used first out. Every step the
  adapters of its batch are made resident in batch order of first use: one not in CPU memory is read from disk
  (the CPU cache dropping its oldest adapter first when full, which also leaves its device slot); then one not
  in a device slot takes the first free slot (the oldest resident leaving first when none is free). `LoraStep`
  says what the step moved, so the engine copies those weights and the simulator prices the copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from kvplan.engine.core.outputs import SchedulerOutput
from kvplan.engine.core.request import Request, adapter_root  # noqa: F401 (adapter_root: the sides')
from kvplan.engine.core.settings import lora_rank_problem
from kvplan.errors import ConfigError

BASE: Final = 0  # lora_id of the base model: no adapter


def running_loras(running: list[Request]) -> set[int]:
    """The adapters (not the base model) of the running requests: what admission counts against max_loras."""
    return {r.lora_id for r in running if r.lora_id != BASE}


def lora_skipped(lora_id: int, loras: set[int], max_loras: int) -> bool:
    """Whether a waiting request of adapter `lora_id` is skipped this step (vLLM's check): its adapter is not
    among `loras` and they already fill max_loras. A base request (`BASE`) never is."""
    return lora_id != BASE and lora_id not in loras and len(loras) >= max_loras


def max_cpu_loras_of(max_loras: int, max_cpu_loras: int | None) -> int:
    """vLLM's LoRAConfig rule: None means max_loras; fewer CPU than device adapters is refused."""
    if max_cpu_loras is None:
        return max_loras
    if max_cpu_loras < max_loras:
        raise ConfigError(f"max_cpu_loras: {max_cpu_loras} is below max_loras {max_loras}; allowed: at least "
                          "max_loras (every adapter in a device slot is also kept in CPU memory), or leave it out")
    return max_cpu_loras


def check_max_lora_rank(rank: int) -> None:
    """vLLM accepts only the ranks its kernels are built for (`LORA_RANKS`)."""
    problem = lora_rank_problem(rank)
    if problem is not None:
        raise ConfigError(f"max_lora_rank: {problem}")


def step_loras(out: SchedulerOutput) -> list[int]:
    """The adapters a step's batch uses, in order of first use (in running order)."""
    seen: dict[int, None] = {}
    for entry in out.in_running_order():
        request = entry if isinstance(entry, Request) else entry.request
        if request.lora_id != BASE:
            seen[request.lora_id] = None
    return list(seen)


@dataclass(slots=True)
class LoraStep:
    """What making one step's adapters resident did. Invariant: every adapter of the step is in `slots`, and
    `gpu_loads` are exactly those that were not in their slot before (each of `disk_loads` among them)."""

    slots: dict[int, int] = field(default_factory=dict)  # adapter -> its device slot, for every adapter of the step
    disk_loads: list[int] = field(default_factory=list)  # read from disk into CPU memory
    gpu_loads: list[int] = field(default_factory=list)  # copied from CPU memory into their slot
    gpu_evicted: list[int] = field(default_factory=list)  # left their slot (to make room, or dropped from the CPU)
    cpu_evicted: list[int] = field(default_factory=list)  # dropped from CPU memory

    @property
    def moved(self) -> bool:
        return bool(self.disk_loads or self.gpu_loads)


class LoraSlots:
    """`max_loras` device slots and `max_cpu_loras` adapters of CPU memory, each an LRU (see the module).
    Invariants: a slot's adapter is in CPU memory; `lru_gpu` and `lru_cpu` list the residents oldest first."""

    __slots__ = ("lru_cpu", "lru_gpu", "max_cpu_loras", "slot_of", "slots")

    def __init__(self, max_loras: int, max_cpu_loras: int) -> None:
        if not 1 <= max_loras <= max_cpu_loras:
            raise ConfigError(f"max_cpu_loras: {max_cpu_loras} with max_loras {max_loras}; allowed: "
                              "1 <= max_loras <= max_cpu_loras")
        self.slots: list[int] = [BASE] * max_loras  # slot -> adapter (BASE: free)
        self.max_cpu_loras = max_cpu_loras
        self.slot_of: dict[int, int] = {}
        self.lru_gpu: dict[int, None] = {}  # insertion order = least recently used first
        self.lru_cpu: dict[int, None] = {}

    @property
    def max_loras(self) -> int:
        return len(self.slots)

    def step(self, out: SchedulerOutput) -> LoraStep:
        """Make the step's adapters resident (`activate`); an empty `LoraStep` for a batch of base requests."""
        return self.activate(step_loras(out))

    def activate(self, lora_ids: list[int]) -> LoraStep:
        """Make `lora_ids` (distinct adapters, in order of use) resident, as vLLM's worker does each step."""
        if len(lora_ids) > len(self.slots):  # admission keeps the running adapters within max_loras
            raise RuntimeError(f"{len(lora_ids)} adapters in one step exceed the {len(self.slots)} device slots")
        result = LoraStep()
        for lora_id in lora_ids:
            if lora_id in self.lru_cpu:
                _touch(self.lru_cpu, lora_id)
            else:
                if len(self.lru_cpu) >= self.max_cpu_loras:
                    oldest = next(iter(self.lru_cpu))
                    del self.lru_cpu[oldest]
                    result.cpu_evicted.append(oldest)
                    self._leave_slot(oldest, result)
                self.lru_cpu[lora_id] = None
                result.disk_loads.append(lora_id)
            if lora_id not in self.lru_gpu:
                if len(self.lru_gpu) >= len(self.slots):
                    self._leave_slot(next(iter(self.lru_gpu)), result)
                slot = self.slots.index(BASE)
                self.slots[slot] = lora_id
                self.slot_of[lora_id] = slot
                result.gpu_loads.append(lora_id)
            _touch(self.lru_gpu, lora_id)
        for lora_id in lora_ids:
            result.slots[lora_id] = self.slot_of[lora_id]
        return result

    def _leave_slot(self, lora_id: int, result: LoraStep) -> None:
        slot = self.slot_of.pop(lora_id, -1)
        if slot >= 0:
            self.slots[slot] = BASE
            del self.lru_gpu[lora_id]
            result.gpu_evicted.append(lora_id)


def _touch(lru: dict[int, None], key: int) -> None:
    """Move `key` to the most recently used end (adding it when absent)."""
    lru.pop(key, None)
    lru[key] = None
