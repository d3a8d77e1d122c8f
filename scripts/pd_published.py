"""Regenerate the kvplan figures docs/pd-published.md sets beside DistServe's and Splitwise's published results.

The page quotes no hand-copied figure: every kvplan number on it is written here, into the page's marked blocks

    <!-- pd-published: NAME -->
    ...                      (the command, its terminal answer, and the comparison table computed from its points)
    <!-- /pd-published -->

from a run of docs/examples/pd_published/NAME.yaml. The runs read ../shared/data (never committed, never read by
tests): this script first writes the two DistServe length tables the DistServe experiments read
(results/pd_published/data/, ignored by git) and computes Splitwise's SLO from an uncontended DGX-A100 run of each
Azure trace, refusing to run an experiment whose `slo:` block differs from it (`--write-slo` rewrites the blocks).

    PYTHONPATH=. python scripts/pd_published.py                        # everything (minutes: see the page)
    PYTHONPATH=. python scripts/pd_published.py --only splitwise_code  # one experiment
    PYTHONPATH=. python scripts/pd_published.py --write-slo            # the Splitwise YAMLs' slo blocks, then run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
EXAMPLES = ROOT / "docs" / "examples" / "pd_published"
OUT = ROOT / "results" / "pd_published"
PAGE = ROOT / "docs" / "pd-published.md"
POOL_COLUMNS = ["disaggregation.prefill_replicas", "disaggregation.decode_replicas", "disaggregation.decode_hardware"]
BLOCK = re.compile(r"(<!-- pd-published: (?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /pd-published -->)", re.S)
COLUMNS = "100"  # the terminal answer is drawn for 100 columns, as scripts/docs_outputs.py draws it

# DistServe's client is adapted from vLLM's serving benchmark, which keeps a ShareGPT pair only when the prompt has
# at most 1024 tokens and prompt + output at most 2048 (OPT's context). The arXiv table's prompts (mean ~2600
# tokens) are longer than OPT's context: a summary keeps its answer (at most 1024 tokens) and its prompt is cut to
# fit beside it, as LongBench's own evaluation cuts long inputs.
OPT_CONTEXT = 2048
LENGTHS = DATA / "llama2-length-dists"
AZURE = DATA / "azure-llm-2023"

# Splitwise Table 6: the SLO as a slowdown of (p50, p90, p99) over a request on an uncontended DGX-A100.
SPLITWISE_SLOWDOWN = {"ttft": (2.0, 3.0, 6.0), "itl": (1.25, 1.5, 5.0), "e2el": (1.25, 1.5, 5.0)}
PERCENTILES = (("p50", "median"), ("p90", "p90"), ("p99", "p99"))
REFERENCE_RATE = 0.01  # req/s: a request almost never meets another (an answer takes seconds)
REFERENCE_SAMPLE = 0.1  # of the trace's requests: ~1900 conversation, ~900 coding requests
# Splitwise's iso-cost clusters (splitwise-sim configs/cluster/isocost_{a100,h100}.yaml): 86 DGX-A100 cost what
# 40 DGX-H100 cost, so one DGX-H100 is priced as 2.15 DGX-A100 there.
SPLITWISE_H100_COST = 86 / 40


def kvplan(*args: str) -> str:
    """`python -m kvplan ARGS` from the repository root, its stdout; a failure stops the script with its stderr."""
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1", "TERM": "dumb",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-m", "kvplan", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"pd_published: `kvplan {' '.join(args)}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stdout


def write_lengths() -> None:
    """The DistServe experiments' length tables (format `lengths`), from the etalon ShareGPT and arXiv tables."""
    (OUT / "data").mkdir(parents=True, exist_ok=True)
    cols = ["num_prefill_tokens", "num_decode_tokens"]
    chat = pd.read_csv(LENGTHS / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")[cols]
    chat = chat[(chat.num_prefill_tokens <= 1024) & (chat.sum(axis=1) <= OPT_CONTEXT)]
    chat.to_csv(OUT / "data" / "sharegpt_opt.csv", index=False)
    summary = pd.read_csv(LENGTHS / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv")[cols]
    summary = summary[summary.num_decode_tokens <= 1024].copy()
    summary["num_prefill_tokens"] = summary.num_prefill_tokens.clip(upper=OPT_CONTEXT - summary.num_decode_tokens)
    summary.to_csv(OUT / "data" / "arxiv_opt.csv", index=False)


def splitwise_slo(trace: str) -> dict[str, float]:
    """Table 6's nine bounds for an Azure trace: each percentile of TTFT, ITL (Splitwise's TBT) and E2E of one
    uncontended DGX-A100 (BLOOM-176B at TP 8, a sample of the trace at REFERENCE_RATE) times its slowdown."""
    sample = OUT / "data" / f"reference_{trace}.jsonl"
    sample.parent.mkdir(parents=True, exist_ok=True)
    kvplan("trace", "convert", str(AZURE / f"AzureLLMInferenceTrace_{trace}.csv"), str(sample), "--sample",
           str(REFERENCE_SAMPLE), "--retime", f"{{process: poisson, rate: {REFERENCE_RATE}}}", "--seed", "0")
    answer = json.loads(kvplan("simulate", "--trace", str(sample), "--model", "bloom-176b", "--hardware",
                               "a100-80gb", "--tensor-parallel-size", "8", "--entry-point", "llm", "--json"))
    summary = answer["summary"][0] if isinstance(answer["summary"], list) else answer["summary"]
    return {f"{p}_{metric}_ms": round(factors[i] * summary[f"{name}_{metric}_ms"], 1)
            for metric, factors in SPLITWISE_SLOWDOWN.items() for i, (p, name) in enumerate(PERCENTILES)}


def slo_block(slo: dict[str, float]) -> str:
    return "slo:\n" + "".join(f"  {key}: {value:g}\n" for key, value in slo.items())


def check_slo(path: Path, slo: dict[str, float], write: bool) -> None:
    """The YAML's trailing `slo:` block must be `slo`: rewritten with --write-slo, else a stale one stops here."""
    text = path.read_text()
    head, found, _ = text.rpartition("slo:\n")
    if not found:
        raise SystemExit(f"pd_published: {path.relative_to(ROOT)} has no trailing slo: block")
    if text == head + slo_block(slo):
        return
    if not write:
        raise SystemExit(f"pd_published: {path.relative_to(ROOT)}'s slo: block differs from the uncontended "
                         f"reference run's; rerun with --write-slo to write:\n{slo_block(slo)}")
    path.write_text(head + slo_block(slo))


@dataclass(slots=True, frozen=True)
class Experiment:
    name: str
    table: Callable[[pd.DataFrame], tuple[str, dict[str, str]]]  # the points' table and its headline figures
    slo_trace: str | None = None  # the Azure trace whose uncontended run sets the SLO (Splitwise)


def run(exp: Experiment, resume: bool) -> tuple[str, dict[str, str], float]:
    """The page block of one experiment (the command, its terminal answer, then the comparison table), its headline
    figures and its wall time."""
    yaml_path = EXAMPLES / f"{exp.name}.yaml"
    out = OUT / exp.name
    start = time.perf_counter()
    stdout = kvplan("run", str(yaml_path), "--workers", "2", "--quiet", "--out", str(out),
                    *(["--resume"] if resume else []))
    wall = time.perf_counter() - start
    shown = stdout.replace(str(out), f"results/pd_{exp.name}").replace(f"{ROOT}/", "")
    command = f"kvplan run {yaml_path.relative_to(ROOT)} --workers 2"
    points = pd.read_parquet(out / "points.parquet")
    pools = pd.read_parquet(out / "runs.parquet").groupby("point")[POOL_COLUMNS].first()
    points = points.join(pools, on="point")
    table, figures = exp.table(points)
    return "\n".join(["```text", f"$ {command}", shown.rstrip("\n"), "```", "", table]) + "\n", figures, wall


def _fmt(value: float) -> str:
    return "none" if math.isnan(value) else f"{value:.3g}"


def _ratio(a: float, b: float) -> str:
    """a / b as `1.41x`, or n/a when either is missing (a point that found no rate)."""
    return "n/a" if math.isnan(a) or math.isnan(b) or b == 0 else f"{a / b:.2f}x"


def distserve_table(points: pd.DataFrame) -> tuple[str, dict[str, str]]:
    """Each deployment's goodput and goodput per GPU, then the best P:D shape against each co-located kind."""
    p = points.assign(per_gpu=points.answer / points.gpus)
    split = p.disaggregation != "co-located"
    v0 = p.label.str.contains("prefill_first")
    rows = ["| deployment | GPUs | goodput (req/s) | per GPU | what bound it |", "|---|---|---|---|---|"]
    for i in p.index:
        r = p.loc[i]
        kind = r.disaggregation if split.loc[i] else ("co-located, vLLM V0 steps" if v0.loc[i]
                                                       else "co-located, vLLM 0.34 steps")
        replicas = "" if split.loc[i] else f" x{r['cluster.replicas']}"
        rows.append(f"| {kind}{replicas} | {r.gpus:g} | {_fmt(r.answer)} | {_fmt(r.per_gpu)} | "
                    f"{r.binding_limit} |")
    best = p[split].per_gpu.max()
    figures = {"vs_v1": _ratio(best, p[~split & ~v0].per_gpu.max()),
               "vs_v0": _ratio(best, p[~split & v0].per_gpu.max())}
    lines = ["", f"Best P:D per GPU over the best co-located per GPU: {figures['vs_v1']} against vLLM 0.34's steps, "
             f"{figures['vs_v0']} against vLLM V0's."]
    return "\n".join(rows + lines), figures


def _machines(row: pd.Series) -> tuple[str, float, str, float]:
    """(prompt hardware, prompt machines, token hardware, token machines) of a point; a co-located point's
    machines are all of the first kind (8-GPU machines: TP 8)."""
    if row.disaggregation == "co-located":
        return row.hardware, row.gpus / 8, row.hardware, 0.0
    token = row["disaggregation.decode_hardware"]
    token = token if isinstance(token, str) else row.hardware  # unset: the run's hardware (NaN in the frame)
    return (row.hardware, float(row["disaggregation.prefill_replicas"]), token,
            float(row["disaggregation.decode_replicas"]))


def _design(row: pd.Series) -> str:
    """Splitwise's name for a point: Baseline-A100/H100 (co-located), Splitwise-XY (X prompt, Y token machines)."""
    letter = {"a100-80gb": "A", "h100-sxm": "H"}
    prompt, _, token, _ = _machines(row)
    if row.disaggregation == "co-located":
        return f"Baseline-{letter[prompt]}100"
    return f"Splitwise-{letter[prompt]}{letter[token]} {row.disaggregation.rstrip('+')}"


def _cost(row: pd.Series, h100: float) -> float:
    """A point's price in A100 machines when an H100 machine costs `h100` of them."""
    prompt, n_prompt, token, n_token = _machines(row)
    return sum(n * (h100 if hw == "h100-sxm" else 1.0) for hw, n in ((prompt, n_prompt), (token, n_token)))


def splitwise_table(points: pd.DataFrame) -> tuple[str, dict[str, str]]:
    """Each design's sustained rate per machine and per $/h, then Splitwise's headline ratios asked of kvplan."""
    p = points.assign(design=points.apply(_design, axis=1), machines=points.gpus / 8)
    p["per_machine"] = p.answer / p.machines
    p["per_usd"] = 100 * p.answer / p.cost_per_hour
    # Splitwise's own price ratio: an A100 machine costs 1, an H100 machine SPLITWISE_H100_COST
    p["per_splitwise_cost"] = p.answer / p.apply(_cost, axis=1, h100=SPLITWISE_H100_COST)
    rows = ["| design | machines | req/s | per machine | $/h (kvplan prices) | req/s per $100/h | what bound it |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| {r.design} | {r.machines:g} | {_fmt(r.answer)} | {_fmt(r.per_machine)} | {r.cost_per_hour:.1f} | "
             f"{_fmt(r.per_usd)} | {r.binding_limit} |" for _, r in p.iterrows()]

    def best(prefix: str, column: str) -> float:
        return p[p.design.str.startswith(prefix)][column].max()

    figures = {"aa_ba": _ratio(best("Splitwise-AA", "per_machine"), best("Baseline-A100", "per_machine")),
               "ha_ba": _ratio(best("Splitwise-HA", "per_machine"), best("Baseline-A100", "per_machine")),
               "ha_ba_usd": _ratio(best("Splitwise-HA", "per_usd"), best("Baseline-A100", "per_usd")),
               "hh_bh": _ratio(best("Splitwise-HH", "per_machine"), best("Baseline-H100", "per_machine")),
               "aa_bh_kvplan": _ratio(best("Splitwise-AA", "per_usd"), best("Baseline-H100", "per_usd")),
               "aa_bh_splitwise": _ratio(best("Splitwise-AA", "per_splitwise_cost"),
                                         best("Baseline-H100", "per_splitwise_cost"))}
    lines = ["", "| ratio (best of each design) | kvplan |", "|---|---|",
             f"| Splitwise-AA / Baseline-A100, per machine (same power and cost per machine) | {figures['aa_ba']} |",
             f"| Splitwise-HA / Baseline-A100, per machine | {figures['ha_ba']} |",
             f"| Splitwise-HA / Baseline-A100, per $ at kvplan's prices | {figures['ha_ba_usd']} |",
             f"| Splitwise-HH / Baseline-H100, per machine | {figures['hh_bh']} |",
             f"| Splitwise-AA / Baseline-H100, per $ at kvplan's prices (H100 machine = {_h100_price_ratio(p):.2f} "
             f"A100 machines) | {figures['aa_bh_kvplan']} |",
             f"| Splitwise-AA / Baseline-H100, per $ at Splitwise's iso-cost ratio (H100 machine = "
             f"{SPLITWISE_H100_COST:.2f} A100 machines) | {figures['aa_bh_splitwise']} |"]
    return "\n".join(rows + lines), figures


def _h100_price_ratio(p: pd.DataFrame) -> float:
    """kvplan's $/h of an H100 machine over an A100 machine's, from two co-located points of the run."""
    per = {hw: (g.cost_per_hour / g.machines).iloc[0] for hw, g in p[p.disaggregation == "co-located"].groupby(
        "hardware")}
    return per["h100-sxm"] / per["a100-80gb"]


# One replay each, quoted whole: where a split's TTFT goes at a load both deployments carry (the chatbot table, 5
# req/s): one prefill + two decode instances, and two co-located replicas.
SPLIT_POOLS = ["--prefill-replicas", "1", "--decode-replicas", "2", "--kv-link", "nvlink"]
TTFT_PARTS = [["simulate", "--trace", "results/pd_published/data/sharegpt_opt.csv", "--trace-format", "lengths",
               "--retime", "{process: poisson, rate: 5}", "--model", "opt-13b", "--hardware", "a100-80gb",
               "--entry-point", "llm", *pools] for pools in (SPLIT_POOLS, ["--replicas", "2"])]


def ttft_parts() -> str:
    """The page block of the TTFT-parts replays: each command and its answer."""
    blocks = []
    for argv in TTFT_PARTS:
        command = "kvplan " + " ".join(f"'{a}'" if " " in a else a for a in argv)
        blocks += ["```text", f"$ {command}", kvplan(*argv).replace(f"{ROOT}/", "").rstrip("\n"), "```"]
    return "\n".join(blocks) + "\n"


# The published figures the page sets kvplan's beside: (paper, question, published figure and where it is stated,
# the experiment and figure key that answers it in kvplan). Only figures read in the papers' text are here.
PUBLISHED = (
    ("DistServe", "chatbot (ShareGPT), per-GPU goodput at 90% attainment, DistServe vs vLLM",
     "2.0x-4.6x over OPT-13B/66B/175B (§6.2, Figure 8)", "distserve_chatbot", "vs_v0"),
    ("DistServe", "the same, against co-located vLLM 0.34 (mixed steps, chunked prefill)",
     "1.6x-7.4x against DeepSpeed-MII (chunked prefill; §6.2)", "distserve_chatbot", "vs_v1"),
    ("DistServe", "summarisation (LongBench), OPT-66B, DistServe vs vLLM",
     "4.3x (§6.2, Figure 9b)", "distserve_summary", "vs_v0"),
    ("DistServe", "the same, against co-located vLLM 0.34", "1.8x against DeepSpeed-MII (§6.2)",
     "distserve_summary", "vs_v1"),
    ("Splitwise", "Splitwise-AA vs Baseline-A100, same machines (iso-power and iso-cost), conversation",
     "2.15x (§6.2, Figure 18a)", "splitwise_conversation", "aa_ba"),
    ("Splitwise", "Splitwise-HA vs Baseline-A100 per $ (kvplan's prices), conversation",
     "1.18x the throughput at 10% lower cost, same power (§6.2): 1.31x per $", "splitwise_conversation",
     "ha_ba_usd"),
    ("Splitwise", "Splitwise-AA vs Baseline-H100 at the same cost (kvplan's prices)",
     "1.4x at 25% more power, 2x the space (§6.3, Figure 18b)", "splitwise_conversation", "aa_bh_kvplan"),
    ("Splitwise", "the same at Splitwise's cost ratio (one DGX-H100 = 2.15 DGX-A100)",
     "1.4x (§6.3, Figure 18b)", "splitwise_conversation", "aa_bh_splitwise"),
    ("Splitwise", "the same, coding trace, kvplan's prices", "1.4x (§6.3; the text does not name Figure 18b's "
     "trace)", "splitwise_code", "aa_bh_kvplan"),
    ("Splitwise", "the same, coding trace, Splitwise's cost ratio", "1.4x (§6.3)", "splitwise_code",
     "aa_bh_splitwise"),
    ("Splitwise", "Splitwise-AA vs Baseline-A100, same machines, coding", "not stated in the text (Figure 16a "
     "plots it)", "splitwise_code", "aa_ba"),
)


def side_by_side(figures: dict[str, dict[str, str]]) -> str:
    """The page's summary table: each published figure beside kvplan's answer to the same question."""
    rows = ["| paper | question | published | kvplan |", "|---|---|---|---|"]
    rows += [f"| {paper} | {question} | {published} | {figures[name][key]} |"
             for paper, question, published, name, key in PUBLISHED]
    return "\n".join(rows) + "\n"


EXPERIMENTS = {e.name: e for e in (
    Experiment("distserve_chatbot", distserve_table),
    Experiment("distserve_summary", distserve_table),
    Experiment("splitwise_conversation", splitwise_table, "conv"),
    Experiment("splitwise_code", splitwise_table, "code"),
)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(EXPERIMENTS), help="run only this experiment")
    parser.add_argument("--write-slo", action="store_true", help="rewrite the Splitwise YAMLs' slo blocks from the "
                        "uncontended reference runs instead of stopping when they differ")
    parser.add_argument("--resume", action="store_true", help="reuse the finished runs of an earlier regeneration "
                        "(results/pd_published): redraws the tables without simulating again")
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"pd_published: {DATA} is not here: the public traces are read from ../shared/data")
    start = time.perf_counter()
    write_lengths()
    blocks: dict[str, str] = {}
    figures: dict[str, dict[str, str]] = {}
    for name in args.only or list(EXPERIMENTS):
        exp = EXPERIMENTS[name]
        if exp.slo_trace is not None:
            check_slo(EXAMPLES / f"{name}.yaml", splitwise_slo(exp.slo_trace), args.write_slo)
        blocks[name], figures[name], wall = run(exp, args.resume)
        print(f"{name}: {wall:.0f} s", file=sys.stderr)
    if not args.only:  # the blocks that need every experiment's answer
        blocks["side_by_side"] = side_by_side(figures)
        blocks["distserve_ttft_parts"] = ttft_parts()
    text = PAGE.read_text()
    PAGE.write_text(BLOCK.sub(lambda m: m.group(0) if m.group("name") not in blocks else
                              m.group(1) + blocks[m.group("name")] + m.group(4), text))
    print(f"pd_published: {time.perf_counter() - start:.0f} s in all; wrote {PAGE.relative_to(ROOT)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
