"""What an answer costs: the deployment's dollars per hour, per million input and output tokens, and goodput per
dollar, from a run's summary and GPU time and a price table (`sim.specs.prices`).

The rules (docs/cost.md quotes them):
- `cost_per_hour` = the $/GPU-hour of the table's kind x GPUs, where GPUs = replicas x tensor x pipeline parallel
  size, all of one kind. The deployment is paid for every hour it runs, busy or idle.
- The hour's cost is split between input and output tokens by the GPU time each kind of work took: the prefill
  share of the replicas' busy time (`sim.replica`: each step's time split by its prefill rows against its decode
  rows) goes to input tokens, the rest to output tokens; idle time is split in the same proportion.
- `usd_per_m_input_tokens` = input share x cost_per_hour / (input tokens per hour / 1e6), at the sustained rate:
  the run's completed requests' prompt tokens per second of its window (a search answer: at the found rate or
  replicas). `usd_per_m_output_tokens` likewise with the output share and output tokens. So input tokens x
  their price + output tokens x theirs = the hour's cost, exactly up to rounding.
- A disaggregated deployment (`pools_cost_fields`) pays for each pool's GPUs at its hardware's price; each pool's
  hour is split by its own prefill share (a prefill pool's work is nearly all prefill), `prefill_share` is the
  share of the whole hour that went to input tokens, and `price_per_gpu_hour` the hour over all the GPUs.
- `goodput_per_usd` = requests meeting the SLO per dollar: request_goodput x 3600 / cost_per_hour; without an
  SLO (no goodput), completed requests per dollar (request_throughput x 3600 / cost_per_hour), and
  `goodput_basis` says which ("slo" or "completed").
- A steady-state probe measures its rates over its window but its GPU time over the whole run (warm-up and
  cool-down included): the split's proportion is the run's.
A GPU the table does not price (cpu-local, a calibrated profile's device) gets no cost: every dollar field null,
and `cost_note` says why; that is not an error.
"""

from __future__ import annotations

from kvplan.errors import UserError
from kvplan.sim.specs.prices import PriceTable

COST_KEYS = ("cost_per_hour", "usd_per_m_input_tokens", "usd_per_m_output_tokens", "goodput_per_usd",
             "goodput_basis", "prefill_share", "billed_gpus", "price_kind", "price_per_gpu_hour", "price_source",
             "price_date", "cost_note")
MEANINGS = {
    "cost_per_hour": "$ per hour of the deployment: $/GPU-hour x GPUs (replicas x TP x PP)",
    "usd_per_m_input_tokens": "$ per million input (prompt) tokens at the sustained rate: the prefill share of "
                              "the hour's cost over the input tokens served in an hour",
    "usd_per_m_output_tokens": "$ per million output tokens at the sustained rate: the decode share of the "
                               "hour's cost over the output tokens served in an hour",
    "goodput_per_usd": "requests meeting the SLO per dollar (goodput_basis 'completed': completed requests per "
                       "dollar, where there is no SLO)",
    "goodput_basis": "what goodput_per_usd counts: slo (requests meeting every per-request SLO bound) or "
                     "completed (no SLO given)",
    "prefill_share": "the prefill share of the replicas' busy GPU time, which splits the cost between input and "
                     "output tokens",
    "billed_gpus": "GPUs the deployment pays for: replicas x tensor x pipeline parallel size",
    "price_kind": "the price column used: on_demand or reserved",
    "price_per_gpu_hour": "$ per GPU-hour of that kind",
    "price_source": "where the price comes from (URL and offer, or the user's prices: entry)",
    "price_date": "the ISO day the price was published or read ('' for a user's price without one)",
    "cost_note": "why the dollar fields are null, when they are ('' otherwise)",
}
SECONDS_PER_HOUR = 3600.0


def cost_fields(table: PriceTable, hardware: str, gpus: int, summary: dict, info: dict) -> dict:
    """The cost keys (COST_KEYS) of one run: `summary` its throughputs (request_throughput, output_throughput,
    total_token_throughput, request_goodput), `info` its GPU time (busy_s, prefill_busy_s)."""
    if "busy_s" not in info:
        return pools_cost_fields(table, [(hardware, gpus, None, None)], summary)
    return pools_cost_fields(table, [(hardware, gpus, float(info.get("busy_s") or 0.0),
                                      float(info.get("prefill_busy_s") or 0.0))], summary)


Pool = tuple[str, int, float | None, float | None]  # (hardware, GPUs, busy_s, prefill_busy_s; None: not recorded)


def pools_cost_fields(table: PriceTable, pools: list[Pool], summary: dict) -> dict:
    """`cost_fields` of a deployment of one or more pools (a disaggregated one: prefill and decode), each of its
    own hardware: the hour is the pools' sum, each pool's hour split between input and output tokens by its own
    prefill share of its busy time; `prefill_share` is the resulting share of the whole hour and
    `price_per_gpu_hour` the hour over the GPUs (the table's price, with one kind of GPU)."""
    gpus = sum(pool[1] for pool in pools)
    out: dict = dict.fromkeys(COST_KEYS)
    out.update(billed_gpus=gpus, price_kind=table.kind, cost_note="")
    goodput = summary.get("request_goodput")
    out["goodput_basis"] = "completed" if goodput is None else "slo"
    for hardware, *_ in pools:
        try:
            table.price(hardware)
        except UserError:
            out["cost_note"] = (f"no price for {hardware} in the price table (add prices: {{{hardware}: "
                                "$/GPU-hour} to price it)")
            return out
    hours = [table.deployment_hour(hardware, n) for hardware, n, _, _ in pools]
    hour = hours[0] if len(hours) == 1 else sum(hours)
    kinds = list(dict.fromkeys(pool[0] for pool in pools))
    prices = [table.price(k) for k in kinds]
    out.update(cost_per_hour=hour, price_per_gpu_hour=table.gpu_hour(kinds[0]) if len(kinds) == 1 else hour / gpus,
               price_source="; ".join(dict.fromkeys(p.source for p in prices)),
               price_date="; ".join(dict.fromkeys(p.date for p in prices)))
    shares = [prefill / busy if busy and prefill is not None else None for _, _, busy, prefill in pools]
    output_rate = float(summary.get("output_throughput") or 0.0)
    input_rate = float(summary.get("total_token_throughput") or 0.0) - output_rate
    known = [share for share in shares if share is not None]
    if len(known) == len(shares):
        if len(hours) == 1:  # (the one-pool expressions as they always were: the same floats)
            input_hour, output_hour, share = hours[0] * known[0], hours[0] * (1.0 - known[0]), known[0]
        else:
            input_hour = sum(h * k for h, k in zip(hours, known, strict=True))
            output_hour, share = hour - input_hour, input_hour / hour
        out["prefill_share"] = share
        out["usd_per_m_input_tokens"] = per_million(input_hour, input_rate)
        out["usd_per_m_output_tokens"] = per_million(output_hour, output_rate)
    elif any(busy is None for _, _, busy, _ in pools):
        out["cost_note"] = ("the run's summary has no GPU time to split the cost by (written before kvplan "
                            "recorded it): rerun it for per-token prices")
    else:
        out["cost_note"] = "the run computed nothing (no busy GPU time): no per-token price"
    rate = float(summary.get("request_throughput") or 0.0) if goodput is None else float(goodput)
    out["goodput_per_usd"] = rate * SECONDS_PER_HOUR / hour
    return out


def per_million(dollars_per_hour: float, tokens_per_s: float) -> float | None:
    """$ per million tokens: `dollars_per_hour` over the tokens an hour serves at `tokens_per_s` (None at none;
    0 when that work cost nothing, e.g. no prefill at all)."""
    if tokens_per_s <= 0:
        return None
    return dollars_per_hour / (tokens_per_s * SECONDS_PER_HOUR / 1e6)


def cost_line(fields: dict) -> str:
    """The cost in one line for a terminal: '$/h ..., $/Mtok in ..., out ..., N req/$ (...)', or why none."""
    if fields["cost_per_hour"] is None:
        return f"cost: none: {fields['cost_note']}"

    def money(value: float | None) -> str:
        return "n/a" if value is None else f"${value:.4g}"

    per = "req/$ meeting the SLO" if fields["goodput_basis"] == "slo" else "completed req/$ (no SLO)"
    gpus = fields['billed_gpus']
    price = f"{gpus} GPU{'' if gpus == 1 else 's'} x {money(fields['price_per_gpu_hour'])} {fields['price_kind']}"
    return (f"cost: {money(fields['cost_per_hour'])}/h ({price}, {fields['price_date'] or 'undated'}); "
            f"{money(fields['usd_per_m_input_tokens'])}/Mtok in, {money(fields['usd_per_m_output_tokens'])}/Mtok "
            f"out; {fields['goodput_per_usd']:.4g} {per}")
