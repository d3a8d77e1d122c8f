"""The text and markdown reports of `kvplan validate`: one list of parts per configuration (sentences and
tables), printed as text or written as markdown, so that both say the same."""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.output import format_table, json_text, print_json

# The simulations a timing validation compares beside the profile as calibrated: the profile scaled by a machine
# speed factor measured independently around the live runs (the speed probe; for an endpoint, the drift probe),
# and by the speed the live runs' own steps show against the profile (in-process only: an oracle for the
# machine's speed, not a prediction). (label, timing key, target key, column, title)
ADJUSTED = (("speed-adjusted", "timing_speed_adjusted", "targets_speed_adjusted", "probe_adj",
             "profile scaled by the speed probe"),
            ("in-run-speed", "timing_in_run_speed", "targets_in_run_speed", "in_run_adj",
             "profile scaled by the live runs' own step speed"))


def policy_sentence(p: dict) -> str:
    verdict = "identical" if p["identical"] else "DIFFERENT: " + "; ".join(p["differences"])
    counts = {side: ", ".join(f"{k}={v}" for k, v in p[f"{side}_counters"].items()) for side in ("live", "sim")}
    return (f"{p['sequences']} sequences, token times {verdict} (max diff {p['max_token_diff_s']:.2g} s); "
            f"counters live {counts['live']}, simulated {counts['sim']}")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def timing_table(c: dict, key: str = "timing") -> tuple[tuple[str, ...], list[list[str]]]:
    """Per metric: live (median of runs), noise band, simulated and error; then the speed-adjusted pairs (cold
    repeats only: `timing_warm` has none)."""
    headers = ("metric", "live", "band_%", "simulated", "error_%")
    rows = [[m["metric"], _fmt(m["live"]), f"±{m['band_pct']:.1f}", _fmt(m["simulated"]), f"{m['error_pct']:+.1f}"]
            for m in c[key]]
    for _, adjusted, _, column, _ in ADJUSTED if key == "timing" else ():
        if adjusted in c:
            headers += (column, f"{column}_err_%")
            for row, m in zip(rows, c[adjusted], strict=True):
                row += [_fmt(m["simulated"]), f"{m['error_pct']:+.1f}"]
    return headers, rows


def counter_table(c: dict) -> tuple[tuple[str, ...], list[list[object]]]:
    """Live runs (with their cold/warm label) and the simulation; `cached_tokens_reported` is, live, the
    per-request cached-token counts the server returned, summed, and, simulated, its prefix hits."""
    keys = list(c["sim_counters"])
    runs = c.get("runs") or [{} for _ in c["live_counters"]]
    rows = [[f"live {i + 1}" + (f" ({run['state']})" if run.get("state") else ""), *(lc.get(k) for k in keys)]
            for i, (lc, run) in enumerate(zip(c["live_counters"], runs, strict=True))]
    rows.append(["simulated", *(c["sim_counters"][k] for k in keys)])
    return ("run", *keys), rows


def target_tables(doc: dict) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    titles = {"targets": "as calibrated", **{target: title for _, _, target, _, title in ADJUSTED}}
    headers = ("metric", "median_|err|_%", "noise_band_%", "target_%", "met")
    return [(f"across configurations, {title} (median |error| %, cold repeats)", headers,
             [[t["metric"], f"{t['median_abs_error_pct']:.2f}", f"{t['median_noise_band_pct']:.2f}",
               f"{t['target_pct']:.0f}", "yes" if t["met"] else "NO"] for t in doc[key]])
            for key, title in titles.items() if key in doc]


def speed_sentence(c: dict) -> str:
    s = c["speed"]
    text = (f"machine speed vs profile (>1 = slower): speed probe {', '.join(f'{f:.3f}' for f in s['probe_factors'])}"
            f" around the live runs (probe_adj at x{s['factor']:.3f})")
    if "in_run_factors" in s:
        text += (f"; the live runs' own steps {', '.join(f'{f:.3f}' for f in s['in_run_factors'])} (in_run_adj at "
                 f"x{s['in_run_factor']:.3f})")
    return text


def drift_sentence(c: dict) -> str:
    d = c["drift"]
    seconds = ", ".join("failed" if v is None else f"{v:.3f}" for v in d["probe_s"])
    reference = f"{d['reference_probe_s']:.3f} s at calibration" if d["reference_probe_s"] else "no reference"
    note = f"; {d['note']}" if "note" in d else ""
    return f"drift probe before and after each repeat: {seconds} s ({reference}){note}"


def link_sentence(c: dict) -> str:
    k = c["link"]
    return (f"KV link declared from this run's {k['pulls']} pulls ({k['how']}): latency {k['latency_s'] * 1e3:.3g} ms, "
            f"{k['seconds_per_block'] * 1e3:.3g} ms per {k['live_block_bytes']}-byte block "
            f"({k['bandwidth_bytes_per_s'] / 1e6:.3g} MB/s per pull), {k['concurrency']} pulls at once; mean pull "
            f"{(k['mean_pull_s'] or 0) * 1e3:.3g} ms")


def pair_parts(c: dict) -> list:
    """A P/D validation's own sentences: each instance's busy time, the link, the per-instance policy and the
    timeline of every request's TTFT parts."""
    parts: list = [f"live run {i + 1}: prefill instance busy {_pct(b['prefill'])}, decode instance busy "
                   f"{_pct(b['decode'])}" for i, b in enumerate(c["instances_busy_fraction"])]
    parts.append(link_sentence(c))
    if "speed" in c:
        runs = "; ".join(f"run {i + 1}: prefill {f['prefill']:.3f}, decode {f['decode']:.3f}"
                         for i, f in enumerate(c["speed"]["instances"]))
        parts.append(f"the instances' own steps vs the profile (>1 = slower): {runs} (in_run_adj at "
                     f"x{c['speed']['factor']:.3f})")
    parts += [f"policy (live run {p['repeat']}, {p['instance']} instance): {policy_sentence(p)}"
              for p in c.get("policy", [])]
    for t in c.get("timeline", []):
        verdict = "identical" if t["identical"] else "DIFFERENT: " + "; ".join(t["differences"])
        parts.append(f"timeline (live run {t['repeat']}): every request's TTFT parts (prefill_ttft, "
                     f"decode_admission_wait, transfer, first_decode_step) {verdict} (max diff "
                     f"{t['max_diff_ms']:.2g} ms)")
    return parts


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def config_parts(c: dict) -> list:
    """A configuration's report: sentences (str) and tables ((title, headers, rows))."""
    if "link" in c:  # a live P/D pair (kvplan.commands.validate_pd)
        parts = pair_parts(c)
        if "timing" in c:
            parts.append(("timing, cold repeats (the verdict; the TTFT parts in ms)", *timing_table(c)))
        return parts
    parts: list = []
    if "server" in c:
        s = c["server"]
        kv = ", ".join(f"{k}={v}" for k, v in s["kv_config"].items() if v is not None and k != "source")
        source = s["kv_config"]["source"] or "nowhere"
        parts.append(f"server {s['kind']} ({s['chosen']}); KV configuration from {source}: {kv or 'none'}; not "
                     f"exposed: {', '.join(s['not_exposed'])}")
    for run in c.get("runs", []):
        parts.append(f"repeat {run['repeat']}: {run['state']} ({run['why']})")
    if any(c.get("approximate_gap_requests", [])):
        parts.append(f"per-token gaps approximate for {', '.join(map(str, c['approximate_gap_requests']))} requests "
                     "per repeat (the server streamed text without token ids and the chunks did not add up to its "
                     "token count; give --tokenizer to count them): left out of the ITL rows, TTFT/TPOT/E2E exact")
    if c.get("stopped"):
        parts.append(f"STOPPED EARLY: {c['stopped']}")
    parts += [f"policy (live run {i + 1}): {policy_sentence(p)}" for i, p in enumerate(c.get("policy", []))]
    if "drift" in c:
        parts.append(drift_sentence(c))
    if "speed" in c:
        parts.append(speed_sentence(c))
    if "timing" in c:
        parts.append(("timing, cold repeats (the verdict)", *timing_table(c)))
    if "timing_warm" in c:
        parts.append(("timing, warm repeats (reported, not in the band or the verdict)",
                      *timing_table(c, "timing_warm")))
    if "sim_counters" in c:
        parts.append(("counters", *counter_table(c)))
    return parts


def _busy(c: dict) -> str:
    return ", ".join("unknown" if b is None else f"{b:.0%}" for b in c["busy_fraction"])


def pd_line(doc: dict) -> str:
    d = doc["disaggregation"]
    return (f"P/D validation: {d['prefill_replicas']} prefill + {d['decode_replicas']} decode instance(s), "
            f"{d['transport']}; the simulator: sim.disagg")


def report_text(doc: dict) -> str:
    parts = [f"{doc['trace']}: {doc['requests']} requests, {doc['model']}, {doc['repeats']} live run(s) per "
             f"configuration, mode {doc['mode']}"]
    if "disaggregation" in doc:
        parts.append(pd_line(doc))
    for c in doc["configs"]:
        release = c.get("options", {}).get("vllm_version")  # the release both sides' schedulers follow
        parts.append(f"\n== {c['name']} ({c['num_blocks']} KV blocks, engine busy {_busy(c)}"
                     + (f", as vLLM {release})" if release else ")"))
        for part in config_parts(c):
            parts.append(part if isinstance(part, str) else f"{part[0]}:\n{format_table(*part[1:])}")
    for title, headers, rows in target_tables(doc):
        parts += [f"\n{title}:", format_table(headers, rows)]
    if doc.get("partial"):
        parts.append(f"\nPARTIAL: {'; '.join(doc['partial'])}")
    return "\n".join(parts)


def markdown_table(headers, rows) -> list[str]:
    return ["| " + " | ".join(map(str, headers)) + " |", "|---" * len(headers) + "|",
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def report_markdown(doc: dict) -> str:
    lines = ["# kvplan validate report", "",
             f"Trace `{doc['trace']}` ({doc['requests']} requests), model `{doc['model']}`, {doc['repeats']} live "
             f"run(s) per configuration, mode `{doc['mode']}`, profile `{doc['profile']}`.", "",
             "Error = (simulated − live) / live, live = the median of the cold live runs; the noise band is half "
             "the cold runs' range (a warm repeat is reported apart and never widens it). Policy: the simulator "
             "priced by each live run's own step durations. probe_adj: the profile scaled by the speed probe's "
             "measure of how fast the machine (or the endpoint: the drift probe) ran around the live runs; "
             "in_run_adj: scaled by the live runs' own steps (measured ÷ profile-predicted), an oracle for the "
             "machine's speed that leaves the model's error.", ""]
    if "disaggregation" in doc:
        lines[0] = "# kvplan validate report: a live prefill/decode pair"
        lines += [pd_line(doc) + ". Policy: the P/D simulator priced by each instance's own recorded steps, the "
                  "proxy's hops, each pull's duration and each export's end taken from the live record.", ""]
    if doc.get("partial"):
        lines += [f"**Partial**: {'; '.join(doc['partial'])}", ""]
    for title, headers, rows in target_tables(doc):
        lines += [f"## {title[0].upper()}{title[1:]}", "", *markdown_table(headers, rows), ""]
    for c in doc["configs"]:
        lines += [f"## {c['name']}", "", f"Options: `{json.dumps(c['options'])}`; {c['num_blocks']} KV blocks; "
                  f"engine busy {_busy(c)}.", ""]
        for part in config_parts(c):
            lines += [f"- {part[0].upper()}{part[1:]}."] if isinstance(part, str) else \
                ["", f"{part[0][0].upper()}{part[0][1:]}:", "", *markdown_table(*part[1:]), ""]
        lines += ["", f"![CDFs]({c['name']}/cdf.png)", ""]
    return "\n".join(lines)


def write_report(out: Path, doc: dict) -> None:
    """The validation's files in its result directory: strict JSON and the markdown report."""
    (out / "validation.json").write_text(json_text(doc))
    (out / "report.md").write_text(report_markdown(doc))


def print_report(doc: dict, as_json: bool, wrote: str) -> None:
    """The validation on stdout: one JSON object, or the text report and what was written (`wrote`)."""
    if as_json:
        print_json(doc)
    else:
        print(report_text(doc))
        print(f"\n{wrote}")
