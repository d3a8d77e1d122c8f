"""Regenerate every command output quoted in README.md and docs/**/*.md, so that no quoted figure is hand-copied.

A page marks a quoted output with a pair of HTML comments; everything between them is replaced by what the named
output's command prints now:

    <!-- output: quickstart -->
    ...                                  (written by this script: the command and its stdout, a ```text block)
    <!-- /output -->

The same name may appear on several pages (the quickstart is on the README and the max_rate page); its command runs
once. `<!-- experiments-table -->` ... `<!-- /experiments-table -->` is the table of experiments/*.yaml, from each
file's `name` and `description` (tests/docs_site checks that every experiment is listed).

    PYTHONPATH=. python scripts/docs_outputs.py                  # run every output, rewrite the pages
    PYTHONPATH=. python scripts/docs_outputs.py --only quickstart
    PYTHONPATH=. python scripts/docs_outputs.py --check          # exit 1 when a page differs from what runs print now
    PYTHONPATH=. python scripts/docs_outputs.py --list           # the outputs, their commands and pages

The experiment runs take minutes on a loaded 2-core machine, so --check is not part of CI: whoever changes what a
command prints reruns this script (the integrator does after a merge). Runs are deterministic (every random draw is
seeded), so a rerun on unchanged code rewrites the pages unchanged except for wall times a command prints.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The width a rich table is drawn at when stdout is a file: the terminal answer is meant to fit 100 columns.
COLUMNS = "100"
MARK = re.compile(r"(<!-- output: (?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /output -->)", re.S)
# Wall-clock figures a command prints (simulate's "wall 0.23 s, 0.15 s"): they differ on every run, so --check
# compares pages with them masked; the pages keep what the last run printed.
VOLATILE = re.compile(r"wall [0-9.]+ s(, [0-9.]+ s)*")
TABLE = re.compile(r"(<!-- experiments-table -->\n)(?P<body>.*?)(<!-- /experiments-table -->)", re.S)


@dataclass(slots=True, frozen=True)
class Output:
    """One quoted output: the command as the reader types it (`kvplan ...`, run as `python -m kvplan ...` on this
    checkout) and, for `kvplan run`, the result directory it writes (a temporary one here, shown as `results/NAME`,
    the default). `summary` names sections of the run's summary.md to quote after the terminal answer; `keep` a
    folder under docs/ that holds the run's result set for the site to link (its report, summary, result and plots;
    not the parquet tables and per-run folders: large, and the report shows them)."""

    command: str
    summary: tuple[str, ...] = ()
    keep: str | None = None
    # the --out a command names (`kvplan validate`): it runs with a temporary one instead, shown as this path
    out_dir: str | None = None

    def is_run(self) -> bool:
        return self.command.startswith("kvplan run ") and "--explain" not in self.command


# The cheapest honest experiment per page (timed with `time kvplan run ...` on the 2-core development machine).
OUTPUTS: dict[str, Output] = {
    "help": Output("kvplan --help"),
    "quickstart-explain": Output("kvplan run experiments/quickstart.yaml --explain"),
    "quickstart": Output("kvplan run experiments/quickstart.yaml --workers 2"),
    "max-goodput": Output("kvplan run docs/examples/max_goodput.yaml --workers 2"),
    "max-concurrency": Output("kvplan run docs/examples/max_concurrency.yaml --workers 2"),
    "max-burst-scale": Output("kvplan run experiments/burst_absorption.yaml --workers 2"),
    "min-replicas": Output("kvplan run docs/examples/min_replicas.yaml --workers 2"),
    "sweep": Output("kvplan run experiments/paged_vs_reservation.yaml --workers 2", summary=("Points",),
                    keep="docs/examples/paged_vs_reservation"),
    "simulate": Output("kvplan simulate --trace traces/samples/mooncake_style.jsonl --model llama-3-8b "
                       "--hardware a100-40gb --block-size 16 64 256"),
    "gpus-needed-70b": Output("kvplan run experiments/gpus_needed_70b.yaml --workers 2"),
    "cheapest-deployment": Output("kvplan run experiments/cheapest_deployment.yaml --workers 2",
                                  summary=("Cheapest deployment",), keep="docs/examples/cheapest_deployment"),
    **{f"quantization-{q}": Output("kvplan simulate --trace traces/samples/chat.jsonl --rate 20 --model llama-3-70b "
                                   f"--hardware h100-sxm --tensor-parallel-size 4 --quantization {q}")
       for q in ("none", "fp8", "awq")},
    # one GPU for prefill and one for decode against two co-located replicas: the same two GPUs, the same load
    **{f"pd-{name}": Output("kvplan simulate --trace traces/samples/chat.jsonl --model llama-3-8b --hardware h100-sxm "
                            f"--rate 10 {flags}")
       for name, flags in (("split", "--prefill-replicas 1 --decode-replicas 1"), ("colocated", "--replicas 2"))},
    "pd-ratio": Output("kvplan run experiments/pd_ratio.yaml --workers 2"),
    "cache-aware-admission": Output("kvplan run experiments/cache_aware_admission.yaml --workers 2",
                                    summary=("Points",)),
    "trace-samples": Output("kvplan trace samples"),
    "trace-stats": Output("kvplan trace stats traces/samples/chat.jsonl"),
    # a script, not a kvplan command: it builds an environment per vLLM release (minutes the first time)
    "vllm-parity": Output("bash scripts/vllm_parity.sh --all --scenarios 350"),
    "from-results-rate": Output("kvplan validate --from-results tests/measured/data/vllm-bench-rate2-detailed.json "
                                "--hardware cpu-local"),
    "from-results-concurrency": Output("kvplan validate --from-results tests/measured/data/vllm-bench-conc4.json "
                                       "--hardware cpu-local"),
    # the live prefill/decode pair (two SmolLM2 processes on this machine) against the P/D simulator
    "pd-validate": Output("kvplan validate --trace docs/validation/pd-trace.jsonl --model smollm2-135m "
                          "--max-model-len 1024 --prefill-replicas 1 --decode-replicas 1 --repeats 2 "
                          "--out results/pd-validate",
                          out_dir="results/pd-validate"),
    # speculative decoding and multi-LoRA (docs/speculative-decoding.md, docs/lora.md)
    "spec-tpot": Output(".venv/bin/python scripts/spec_decode_tpot.py"),
    "spec-decode": Output("kvplan run experiments/spec_decode.yaml --workers 2"),
    "spec-validate": Output("kvplan validate --trace docs/validation/spec-trace.jsonl --model smollm2-135m "
                            "--max-model-len 1024 --temperature 0 --speculative-config '{\"method\": \"ngram\", "
                            "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' "
                            "--repeats 2 --out results/spec-validate", out_dir="results/spec-validate"),
    "multi-lora": Output("kvplan run experiments/multi_lora.yaml --workers 2"),
    "lora-validate": Output(".venv/bin/python scripts/lora_validation.py --out results/lora-validate",
                            out_dir="results/lora-validate"),
    # the 70B replica search against every replica count probed (docs/experiments/gpus-needed-70b.md): ~30 min
    "gpus-needed-70b-exhaustive": Output(".venv/bin/python scripts/exhaustive_min_replicas.py "
                                         "experiments/gpus_needed_70b.yaml --out results/gpus-70b-exhaustive "
                                         "--workers 2", out_dir="results/gpus-70b-exhaustive"),
}


def run(name: str, out: Output, workdir: Path) -> tuple[str, float]:
    """The block that replaces the marker's body: the command, its stdout (stderr carries progress, not quoted),
    then the summary.md sections asked for. A failing command stops the script, naming the output."""
    argv = shlex.split(out.command)
    result_dir = workdir / name
    if out.is_run():
        argv += ["--out", str(result_dir)]
    if out.out_dir is not None:
        argv[argv.index("--out") + 1] = str(result_dir)
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1", "TERM": "dumb",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    start = time.perf_counter()
    command = [sys.executable, "-m", "kvplan", *argv[1:]] if argv[0] == "kvplan" else argv
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"docs_outputs: {name}: `{out.command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    shown_dir = out.out_dir or f"results/{experiment_name(argv)}"
    shown = proc.stdout.replace(str(result_dir), shown_dir).replace(f"{ROOT}/", "")
    lines = ["```text", f"$ {out.command}", shown.rstrip("\n"), "```"]
    if out.keep is not None:
        keep_result_set(result_dir, ROOT / out.keep)
    if out.summary:
        summary = (result_dir / "summary.md").read_text()
        for heading in out.summary:
            lines += ["", f"From `summary.md`, {heading}:", "", section(summary, heading, name)]
    return "\n".join(lines) + "\n", wall


KEPT = ("summary.md", "report.html", "result.json", "experiment.yaml", "plots")


def keep_result_set(result_dir: Path, folder: Path) -> None:
    """Replace `folder`'s copy of a result set by the one just written (only the files in KEPT)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        old, new = folder / name, result_dir / name
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
        if new.is_dir():
            shutil.copytree(new, old)
        elif new.exists():
            shutil.copy2(new, old)


def experiment_name(argv: list[str]) -> str:
    """The `name:` of the experiment file a `kvplan run` command names (its default result directory)."""
    paths = [a for a in argv[2:] if a.endswith(".yaml")]
    if not paths:
        return "NAME"
    return str(yaml.safe_load((ROOT / paths[0]).read_text())["name"])


def section(markdown: str, heading: str, name: str) -> str:
    """The `## heading` section of a summary.md, without its heading line."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    if match is None:
        raise SystemExit(f"docs_outputs: {name}: summary.md has no section '## {heading}'")
    return match.group(1).strip("\n")


def experiments_table() -> str:
    """A markdown table of experiments/*.yaml: file and what it asks (its description, else its first comment)."""
    rows = ["| experiment | the question |", "|---|---|"]
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        text = path.read_text()
        doc = yaml.safe_load(text)
        about = doc.get("description") or next(
            (line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")
        about = " ".join(str(about).split()).replace("|", "\\|")
        rows.append(f"| `experiments/{path.name}` | {about} |")
    return "\n".join(rows) + "\n"


def rewrite(page: Path, outputs: dict[str, str]) -> str:
    """The page with every marked block of the given outputs, and the experiments table (cheap: always), replaced."""
    text = page.read_text()

    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in OUTPUTS:
            raise SystemExit(f"docs_outputs: {page.relative_to(ROOT)}: unknown output '{name}'; "
                             f"allowed: {', '.join(OUTPUTS)}")
        new = outputs.get(name)
        return match.group(0) if new is None else match.group(1) + new + match.group(4)

    text = MARK.sub(body, text)
    return TABLE.sub(lambda m: m.group(1) + experiments_table() + m.group(3), text)


def used_names() -> dict[str, list[Path]]:
    """Each output name and the pages that quote it."""
    found: dict[str, list[Path]] = {}
    for page in PAGES:
        for match in MARK.finditer(page.read_text()):
            found.setdefault(match.group("name"), []).append(page)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(OUTPUTS), help="regenerate only this output")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page would change")
    parser.add_argument("--list", action="store_true", help="print the outputs, their commands and pages")
    args = parser.parse_args()
    used = used_names()
    if args.list:
        for name, out in OUTPUTS.items():
            pages = ", ".join(str(p.relative_to(ROOT)) for p in used.get(name, [])) or "(on no page)"
            print(f"{name}: {out.command}  ->  {pages}")
        return 0
    names = args.only or [n for n in OUTPUTS if n in used]
    outputs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvplan-docs-") as tmp:
        for name in names:
            outputs[name], wall = run(name, OUTPUTS[name], Path(tmp))
            print(f"{name}: {wall:.1f} s  ({OUTPUTS[name].command})", file=sys.stderr)
    changed = []
    for page in PAGES:
        new, old = rewrite(page, outputs), page.read_text()
        if VOLATILE.sub("wall ...", new) != VOLATILE.sub("wall ...", old):
            changed.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    for path in changed:
        print(f"{'differs' if args.check else 'wrote'}: {path}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
