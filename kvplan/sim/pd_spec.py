"""What a disaggregated (prefill/decode) deployment is: `Disaggregation`, its options declared once in `PD_OPTIONS`
(the `kvplan simulate` flags, and the checks every other entry runs, come from that table), and the pools' own
`SimSpec`s.

A deployment is `prefill_replicas` prefill instances and `decode_replicas` decode instances of one model, each
pool on its own hardware and tensor-parallel degree (the run's when unset), each behind its own router (vLLM's
toy P/D proxy picks each pool round robin), joined by a KV link (`sim.pd_transfer`).

Each pool may also set its own value of the serving settings in `POOL_SETTINGS` (`prefill_max_num_seqs`, flag
`--prefill-max-num-seqs`, ...; the run's value when unset): its pipeline stages, its scheduler's limits, chunking
and prefix caching, and its share of GPU memory. Their options are generated from that tuple and each setting's
declaration (`engine.core.settings`: kind, range, help). `block_size` and `kv_cache_dtype` are not among them:
the transfer moves whole blocks of one layout, so the two pools must agree on both (vLLM's NIXL connector refuses
a mismatch), and they stay the run's.

The TP rule: a decode TP that is a multiple of the prefill TP (each decode rank reads the prefill rank holding
its heads, vLLM's NIXL connector); a decode TP smaller than the prefill TP is refused - the issue's rule, which
is vLLM <= 0.12's NIXL rule ("Decode TP cannot be smaller than prefill TP"; vLLM 0.34 accepts either direction
when one divides the other).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from kvplan.engine.core.settings import SETTINGS, Field, describe_range
from kvplan.errors import UserError, listed, short_repr
from kvplan.limits import MAX_REPLICAS

if TYPE_CHECKING:
    from kvplan.sim.spec import SimSpec

KV_LINKS = ("rdma", "nvlink")
POOL_ROUTERS = ("round_robin", "least_outstanding", "least_kv_usage", "prefix_aware")  # sim.routers.ROUTERS


@dataclass(frozen=True, slots=True)
class PDOption:
    """One option: its `Disaggregation` field, kind ('int', 'float', 'str', 'choice'), bounds and help - or a
    pool's value of a serving setting (`declared`: the setting's own field, which then checks and parses it). The
    flag is `--` + the name with dashes."""

    name: str
    kind: str
    help: str
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    declared: Field | None = None  # a pool's setting (`POOL_SETTINGS`): its field as the simulator takes it

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def allowed(self) -> str:
        if self.declared is not None:
            return self.declared.allowed()
        if self.kind == "choice":
            return listed(self.choices)
        if self.kind == "str":
            return "a name"
        noun = "an integer" if self.kind == "int" else "a finite number"
        return describe_range(noun, self.minimum, self.maximum, self.above)

    def problem(self, value: object) -> str | None:
        """What is wrong with `value` (None: nothing); None values mean unset and are always allowed."""
        if value is None:
            return None
        if self.declared is not None:
            return self.declared.parse(value)[1]
        if self.kind == "choice":
            return None if value in self.choices else "not one of them"
        if self.kind == "str":
            return None if isinstance(value, str) and value else "not a name"
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                self.kind == "int" and not isinstance(value, int)) or not math.isfinite(value):
            return "wrong kind"
        if (self.minimum is not None and value < self.minimum) or (self.above is not None and value <= self.above) \
                or (self.maximum is not None and value > self.maximum):
            return "out of range"
        return None

    def check(self, value: object, where: str) -> None:
        if self.problem(value) is not None:
            raise UserError(f"{where}: {short_repr(value)}; allowed: {self.allowed}")

    def parse(self, text: str) -> object:
        """The argparse type: a value of the kind, checked (argparse names the flag and exits 2)."""
        if self.declared is not None:
            parsed, problem = self.declared.parse_text(text)
            if problem is not None:
                raise argparse.ArgumentTypeError(f"{short_repr(text)}; allowed: {self.allowed}")
            return parsed
        try:
            value: object = int(text) if self.kind == "int" else float(text) if self.kind == "float" else text
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_repr(text)}; allowed: {self.allowed}") from None
        if self.problem(value) is not None:
            raise argparse.ArgumentTypeError(f"{short_repr(text)}; allowed: {self.allowed}")
        return value


# The serving settings a pool may set for itself (module docstring); each must be a `sim` setting.
POOL_SETTINGS = ("pipeline_parallel_size", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                 "long_prefill_token_threshold", "enable_prefix_caching", "gpu_memory_utilization")
# Settings both pools must share, and why (a pool's own value is refused with this reason)
SHARED_SETTINGS = {"block_size": "the transfer moves whole blocks, so both pools use one block size",
                   "kv_cache_dtype": "the transfer copies the KV bytes as they are, so both pools use one KV dtype"}
ROLES = ("prefill", "decode")


def pool_option(role: str, setting: str) -> PDOption:
    """The option of `role`'s pool's own value of `setting`, from the setting's declaration."""
    declared = SETTINGS[setting]
    assert "sim" in declared.sides, setting
    return PDOption(f"{role}_{setting}", declared.kind, f"the {role} pool's {setting}: {declared.help} (default: "
                    f"{declared.flag})", declared=declared.side_field("sim"))


POOL_OPTIONS = tuple(pool_option(role, setting) for role in ROLES for setting in POOL_SETTINGS)
PD_OPTIONS = (
    PDOption("prefill_replicas", "int", "prefill instances (with --decode-replicas: a disaggregated deployment)",
             minimum=1, maximum=MAX_REPLICAS),
    PDOption("decode_replicas", "int", "decode instances (with --prefill-replicas)", minimum=1, maximum=MAX_REPLICAS),
    PDOption("prefill_hardware", "str", "the prefill pool's hardware (default: --hardware)"),
    PDOption("decode_hardware", "str", "the decode pool's hardware (default: --hardware)"),
    PDOption("prefill_tensor_parallel_size", "int", "the prefill pool's TP (default: --tensor-parallel-size)",
             minimum=1, maximum=64),
    PDOption("decode_tensor_parallel_size", "int", "the decode pool's TP, a multiple of the prefill TP (default: "
             "--tensor-parallel-size)", minimum=1, maximum=64),
    PDOption("prefill_router", "choice", "how the proxy picks a prefill instance", choices=POOL_ROUTERS),
    PDOption("decode_router", "choice", "how the proxy picks a decode instance", choices=POOL_ROUTERS),
    PDOption("kv_link", "choice", "the KV link: rdma (across nodes: the hardware's per-GPU network) or nvlink (in "
             "a node: its per-GPU NVLink)", choices=KV_LINKS),
    PDOption("kv_link_bandwidth", "float", "achieved bytes/s per GPU of the KV link (default: the hardware "
             "table's figure x its achieved fraction, sim.pd_transfer)", above=0),
    PDOption("kv_link_latency_ms", "float", "fixed latency per KV transfer, ms (default: sim.pd_transfer's)",
             minimum=0),
    PDOption("kv_link_concurrency", "int", "transfers a decode instance's link carries at once, each at "
             "bandwidth / concurrency (default 1: one at a time at the full bandwidth)", minimum=1, maximum=1024),
    *POOL_OPTIONS,
)
OPTIONS = {o.name: o for o in PD_OPTIONS}
POOL_NAMES = frozenset(o.name for o in POOL_OPTIONS)


@dataclass(slots=True)
class Disaggregation:
    """A P/D deployment (see the module); None fields take the run's value or the link's default."""

    prefill_replicas: int
    decode_replicas: int
    prefill_hardware: str | None = None
    decode_hardware: str | None = None
    prefill_tensor_parallel_size: int | None = None
    decode_tensor_parallel_size: int | None = None
    prefill_router: str = "round_robin"
    decode_router: str = "round_robin"
    kv_link: str = "rdma"
    kv_link_bandwidth: float | None = None
    kv_link_latency_ms: float | None = None
    kv_link_concurrency: int = 1
    # the pools' own settings: `POOL_OPTIONS`' names (prefill_max_num_seqs, ...) -> their values, the set ones only
    pool_settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, options: dict[str, Any]) -> Disaggregation:
        """From options by name (the flags', a YAML block's, a point's): the pools' settings into `pool_settings`,
        in their canonical form (8.0 -> 8), unset (None) ones left out. Unchecked: `check` says what is wrong."""
        own = {name: OPTIONS[name].declared.parse(value)[0] for name, value in options.items()  # type: ignore[union-attr]
               if name in POOL_NAMES and value is not None}
        return cls(**{k: v for k, v in options.items() if k not in POOL_NAMES}, pool_settings=own)

    def options(self) -> dict[str, Any]:
        """Every option by name with its value (None: unset): how a point stores the block, `of`'s inverse."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pool_settings"}
        return out | {o.name: self.pool_settings.get(o.name) for o in POOL_OPTIONS}  # (in the options' order)

    def pool(self, role: str) -> dict[str, Any]:
        """`role`'s pool's own settings, by setting name (`POOL_SETTINGS`)."""
        return {name.removeprefix(f"{role}_"): value for name, value in self.pool_settings.items()
                if name.startswith(f"{role}_")}

    def check(self) -> None:
        """Every option against its declaration, named by its flag (a YAML block: `disaggregation_from_mapping`)."""
        for name, value in self.options().items():
            option = OPTIONS[name]
            option.check(value, option.flag)

    def tp(self, spec: SimSpec) -> tuple[int, int]:
        """(prefill TP, decode TP), checked against the TP rule (see the module)."""
        p = self.prefill_tensor_parallel_size or spec.tensor_parallel_size
        d = self.decode_tensor_parallel_size or spec.tensor_parallel_size
        if d < p or d % p:
            raise UserError(f"--decode-tensor-parallel-size: {d} with a prefill TP of {p}: each decode rank reads "
                            f"the prefill rank holding its KV heads; allowed: a multiple of {p} (vLLM's NIXL rule: "
                            "decode TP cannot be smaller than prefill TP)")
        return p, d

    def pool_specs(self, spec: SimSpec) -> tuple[SimSpec, SimSpec]:
        """The prefill pool's and the decode pool's `SimSpec`: the run's, with the pool's replicas, hardware, TP
        and own settings (`pool`); settings vLLM filled from the run's hardware are filled again from the pool's
        (unless the pool sets them)."""
        p_tp, d_tp = self.tp(spec)
        return (pool_spec(spec, self.prefill_replicas, self.prefill_hardware or spec.hardware, p_tp,
                          self.pool("prefill")),
                pool_spec(spec, self.decode_replicas, self.decode_hardware or spec.hardware, d_tp,
                          self.pool("decode")))


def pool_spec(spec: SimSpec, replicas: int, hardware: str, tp: int, own: dict[str, Any]) -> SimSpec:
    refill: dict[str, Any] = {name: None for name in spec.filled_defaults}
    return replace(spec, replicas=replicas, hardware=hardware, tensor_parallel_size=tp, disaggregation=None,
                   filled_defaults=(), **{**refill, **own})


def add_pd_flags(parser: argparse.ArgumentParser) -> None:
    """`kvplan simulate`'s P/D flags, one per option."""
    group = parser.add_argument_group("prefill/decode disaggregation")
    for option in PD_OPTIONS:
        kw: dict[str, object] = {"help": option.help, "default": None}
        if option.kind == "choice":
            kw["choices"] = option.choices
        else:
            kw["type"] = option.parse
        if option.kind == "bool":
            kw["metavar"] = "true|false"
        group.add_argument(option.flag, **kw)  # type: ignore[arg-type]


def disaggregation_from_args(args: argparse.Namespace) -> Disaggregation | None:
    """The deployment the flags describe, or None when neither replica count is given (co-located). Any other P/D
    flag alone is refused: it would be ignored."""
    # (a parser without these flags - another command's - describes a co-located run)
    given = {o.name: getattr(args, o.name) for o in PD_OPTIONS if getattr(args, o.name, None) is not None}
    if not given:
        return None
    for name in ("prefill_replicas", "decode_replicas"):
        if name not in given:
            other = sorted(set(given) - {name})
            raise UserError(f"{OPTIONS[name].flag}: missing; {', '.join(OPTIONS[n].flag for n in other)} describe "
                            "a disaggregated deployment; allowed: both --prefill-replicas and --decode-replicas, "
                            "or no P/D flag")
    pd = Disaggregation.of(given)
    pd.check()
    return pd


def disaggregation_from_mapping(mapping: object, where: str = "disaggregation") -> Disaggregation:
    """A deployment from a YAML mapping (an experiment's `disaggregation:` block): the same options by their field
    names, each checked by its option; an unknown key or a missing replica count is named with what is allowed."""
    from kvplan.engine.core.names import did_you_mean

    if not isinstance(mapping, dict):
        raise UserError(f"{where}: {short_repr(mapping)}; allowed: a mapping of {listed(OPTIONS)}")
    for key in mapping:
        own = isinstance(key, str) and key.startswith(tuple(f"{role}_" for role in ROLES))
        setting = key.split("_", 1)[1] if own else ""
        if setting in SHARED_SETTINGS:
            raise UserError(f"{where}.{key}: {SHARED_SETTINGS[setting]} (vLLM's NIXL connector refuses a "
                            f"mismatch); allowed: engine.{setting} for both pools")
        if key not in OPTIONS:
            raise UserError(f"{where}.{key}: unknown key; {did_you_mean(key, OPTIONS)}allowed: {listed(OPTIONS)}")
    for key in ("prefill_replicas", "decode_replicas"):
        if key not in mapping:
            raise UserError(f"{where}.{key}: missing; allowed: {OPTIONS[key].allowed}")
    for key, value in mapping.items():
        OPTIONS[key].check(value, f"{where}.{key}")
    return Disaggregation.of(mapping)
