"""What a GPU-hour costs: the dated price table every cost on an answer is computed from.

Each built-in entry is one public offer, quoted as its page gives it and converted only by arithmetic written here
(per second x 3600, or an instance's price / its GPUs): `source` names the page and the offer, `date` the day the
figure was published or read. Prices move by the month and differ about twofold between providers for the same
chip, so a `prices:` YAML block or a file (`--prices FILE`) replaces any of them; the built-ins are a dated
starting point, not a quote.

Where the figures come from:
- RunPod Serverless (docs.runpod.io/serverless/pricing): one page that lists, per GPU class, a "flex" rate (billed
  per second while a worker runs, no commitment: our `on_demand`) and an "active" rate (an always-on worker,
  billed 24/7 whether busy or not, which the page says is 20-30% cheaper: our `reserved`). It covers H100, H200,
  B200, A100 80GB, L40S, L4, A40 and RTX 4090. The page carries no date; `date` is the day it was read.
- AWS EC2 on-demand (us-east-1, Linux) for the three GPUs that page does not list: A100 40GB (p4d.24xlarge,
  8 GPUs), A10G (g5.xlarge, 1 GPU) and RTX PRO 6000 Blackwell Server Edition (g7e, per GPU). No 1-year AWS figure
  for them was found, so their `reserved` is derived with the one published rule at hand: on-demand x (1 - 0.20),
  the smallest always-on discount the RunPod page states; each such entry says so in its `source`.
`price_rows()` renders this table for docs/cost.md, so the page quotes the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from kvplan.errors import UserError, listed, short_repr

KINDS = ("on_demand", "reserved")
ENTRY_KEYS = ("on_demand", "reserved", "source", "date")
SECONDS_PER_HOUR = 3600.0
# the smallest always-on discount docs.runpod.io/serverless/pricing states ("20-30% discount"); used only where
# no reserved figure was found, and named in that entry's source
DERIVED_RESERVED_DISCOUNT = 0.20


@dataclass(slots=True, frozen=True)
class GpuPrice:
    """$ per GPU-hour of one GPU, on demand and reserved, with where the figure comes from and its date."""
    hardware: str
    on_demand: float
    reserved: float
    source: str  # URL and the offer (provider, instance, region, GPUs per instance)
    date: str  # ISO day the figure was published or read


@dataclass(slots=True, frozen=True)
class PriceTable:
    """The prices one answer uses: `kind` picks the on-demand or the reserved column of `entries`."""
    entries: dict[str, GpuPrice]
    kind: str = "on_demand"

    def price(self, hardware: str) -> GpuPrice:
        entry = self.entries.get(hardware)
        if entry is None:
            raise UserError(f"prices: no price for GPU {short_repr(hardware)}; the table prices "
                            f"{listed(sorted(self.entries))} (add `prices: {{{hardware}: DOLLARS_PER_GPU_HOUR}}`)")
        return entry

    def gpu_hour(self, hardware: str) -> float:
        """$ per GPU-hour of `hardware` at this table's kind."""
        entry = self.price(hardware)
        return entry.reserved if self.kind == "reserved" else entry.on_demand

    def deployment_hour(self, hardware: str, gpus: int) -> float:
        """$ per hour of `gpus` GPUs of `hardware` (replicas x tensor x pipeline parallel size)."""
        return self.gpu_hour(hardware) * gpus


_RUNPOD = "https://docs.runpod.io/serverless/pricing"
_RUNPOD_READ = "2026-12-04"


def _runpod(hardware: str, gpu_class: str, flex_per_s: float, active_per_s: float) -> GpuPrice:
    """A RunPod Serverless GPU class: its per-second flex (on demand) and active (always on) rates, per hour."""
    return GpuPrice(hardware, flex_per_s * SECONDS_PER_HOUR, active_per_s * SECONDS_PER_HOUR,
                    f"{_RUNPOD}: RunPod Serverless {gpu_class}, flex ${flex_per_s}/s on demand, active "
                    f"${active_per_s}/s always on (the page carries no date: read on the date given)", _RUNPOD_READ)


def _aws(hardware: str, offer: str, instance_per_hour: float, gpus: int, url: str, date: str) -> GpuPrice:
    """An AWS on-demand instance price split over its GPUs; reserved derived by DERIVED_RESERVED_DISCOUNT."""
    per_gpu = instance_per_hour / gpus
    return GpuPrice(hardware, per_gpu, per_gpu * (1 - DERIVED_RESERVED_DISCOUNT),
                    f"{url}: AWS {offer}, ${instance_per_hour}/h on demand for {gpus} GPU(s), us-east-1; reserved "
                    f"derived as on-demand x {1 - DERIVED_RESERVED_DISCOUNT:g} (the smallest always-on discount "
                    f"{_RUNPOD} states; no 1-year AWS figure found)", date)


PRICES: dict[str, GpuPrice] = {p.hardware: p for p in (
    _runpod("h100-sxm", "H100 PRO (80 GB)", 0.00116, 0.00093),
    _runpod("h200", "H200 PRO (141 GB)", 0.00155, 0.00124),
    _runpod("b200", "B200 (180 GB)", 0.00240, 0.00190),
    _runpod("a100-80gb", "A100 (80 GB)", 0.00076, 0.00060),
    _runpod("l40s", "L40/L40S/6000 Ada PRO (48 GB)", 0.00053, 0.00037),
    _runpod("l4", "L4/A5000/3090 (24 GB)", 0.00019, 0.00013),
    _runpod("a40", "A6000/A40 (48 GB)", 0.00034, 0.00024),
    _runpod("rtx-4090", "4090 PRO (24 GB)", 0.00031, 0.00021),
    # datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json, retrieved from the AWS price list 2026-11-09
    _aws("a100-40gb", "p4d.24xlarge (8x A100 SXM 40GB)", 21.957642, 8,
         "https://raw.githubusercontent.com/datareceipts/data-receipts/main/109-gpu-pricing/hyperscalers.json",
         "2026-11-09"),
    _aws("a10g", "g5.xlarge (1x A10G)", 1.006, 1,
         "https://www.factualminds.com/blog/amazon-ec2-on-demand-pricing-instance-families-2026/", "2026-06-17"),
    # `dstack offer -b aws --gpu RTXPRO6000` in dstack PR 3752: $/GPU 0.5245..4.143 (spot .. on demand)
    _aws("rtx-pro-6000", "g7e (RTX PRO 6000 Blackwell Server Edition), per GPU", 4.143, 1,
         "https://github.com/dstackai/dstack/pull/3752", "2026-04-07"),
)}


def price_rows(table: PriceTable | None = None) -> list[tuple[str, str, str, str, str]]:
    """(GPU, on-demand $/GPU-h, reserved $/GPU-h, date, source) per entry: the table docs/cost.md shows."""
    entries = (table or PriceTable(PRICES)).entries
    return [(p.hardware, f"{p.on_demand:.3f}", f"{p.reserved:.3f}", p.date, p.source)
            for p in sorted(entries.values(), key=lambda p: p.hardware)]


def _number(value: object, where: str) -> float:
    """A price: a finite number above 0 (bool is not a number here, though Python says it is an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where}: {short_repr(value)} is not a price; allowed: a number of dollars per GPU-hour "
                        "above 0")
    return float(value)


def _entry(hardware: str, value: object, base: GpuPrice | None, where: str) -> GpuPrice:
    """One GPU's override: a number (its on-demand price) or a mapping of ENTRY_KEYS over the built-in entry. A
    price given without its reserved figure is also its reserved one: no discount is assumed for a user's price."""
    if not isinstance(value, dict):
        value = {"on_demand": value}
    unknown = [k for k in value if k not in ENTRY_KEYS]
    if unknown:
        raise UserError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(ENTRY_KEYS)}")
    for key in ("source", "date"):
        if key in value and not isinstance(value[key], str):
            raise UserError(f"{where}.{key}: {short_repr(value[key])} is not text; allowed: a string")
    if "on_demand" in value:
        on_demand = _number(value["on_demand"], f"{where}.on_demand")
    elif base is not None:
        on_demand = base.on_demand
    else:
        raise UserError(f"{where}.on_demand: missing; allowed: a number of dollars per GPU-hour above 0 (a GPU "
                        "the built-in table lacks needs its on-demand price)")
    if "reserved" in value:
        reserved = _number(value["reserved"], f"{where}.reserved")
    else:
        reserved = on_demand if "on_demand" in value or base is None else base.reserved
    return GpuPrice(hardware, on_demand, reserved, str(value.get("source", f"user price ({where})")),
                    str(value.get("date", "")))


def _at(where: str, key: object) -> str:
    """A key's path under `where`: `prices.h100-sxm` in a block, `FILE: h100-sxm` in a file (`where` 'FILE:')."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def _known_gpus() -> list[str]:
    """Every --hardware name: the built-in GPUs and the calibrated devices (cpu-local has no built-in price, but
    a user may give it one)."""
    from kvplan.sim.specs.hardware import hardware_names

    return hardware_names()


def price_table(block: dict | str | None, where: str = "prices") -> PriceTable:
    """The table a run uses. None: the built-ins, on demand. A str: a file of the same shape as the block. A dict:
    the YAML `prices:` block, `kind: on_demand|reserved`, `file: PATH` (its entries first), then per-GPU overrides
    `GPU: DOLLARS` (its on-demand price, and its reserved one too: no discount is assumed) or
    `GPU: {on_demand, reserved, source, date}` (over the built-in entry). Every bad value is a UserError naming
    its key path."""
    if block is None:
        return PriceTable(dict(PRICES))
    if isinstance(block, (str, Path)):
        entries, kind = _from_file(str(block), where)
        return PriceTable(entries, kind)
    if not isinstance(block, dict):
        raise UserError(f"{where.rstrip(':')}: {short_repr(block)} is not a mapping; allowed: kind, file and GPU: "
                        "price entries")
    entries = dict(PRICES)
    kind = "on_demand"
    if "file" in block:
        entries, kind = _from_file(block["file"], _at(where, "file"))
    if "kind" in block:
        kind = block["kind"]
        if kind not in KINDS:
            raise UserError(f"{_at(where, 'kind')}: {short_repr(kind)}; allowed: {', '.join(KINDS)}")
    known = _known_gpus()
    for key, value in block.items():
        if key in ("kind", "file"):
            continue
        if not isinstance(key, str) or key not in known:
            raise UserError(f"{_at(where, key)}: unknown GPU; allowed: kind, file, or a GPU of {listed(known)}")
        entries[key] = _entry(key, value, entries.get(key), _at(where, key))
    return PriceTable(entries, kind)


def _from_file(path: object, where: str) -> tuple[dict[str, GpuPrice], str]:
    """The entries and kind of a price file (YAML or JSON, the `prices:` block's shape; no nested `file:`)."""
    from kvplan.traces.specs import read_yaml

    if not isinstance(path, str) or not path:
        raise UserError(f"{where}: {short_repr(path)} is not a path; allowed: a YAML or JSON price file")
    doc = read_yaml(path, where)
    if isinstance(doc, dict) and "prices" in doc and len(doc) == 1:
        doc = doc["prices"]  # a whole experiment-style document with one `prices:` key
    if not isinstance(doc, dict):
        raise UserError(f"{path}: {short_repr(doc)} is not a mapping; allowed: kind and GPU: price entries")
    if "file" in doc:
        raise UserError(f"{path}: file: a price file cannot name another; allowed: kind and GPU: price entries")
    table = price_table(doc, where=f"{path}:")
    return table.entries, table.kind


def with_kind(table: PriceTable, kind: str, where: str = "--price-kind") -> PriceTable:
    """`table` at another kind (the CLI's --price-kind over a file's or block's)."""
    if kind not in KINDS:
        raise UserError(f"{where}: {short_repr(kind)}; allowed: {', '.join(KINDS)}")
    return replace(table, kind=kind)
