"""Small project-made sample traces (generated from the YAML specs beside them, never real traces): the
repository's `traces/samples/`, installed as data files (`kvplan.shipped`)."""

from pathlib import Path

from kvplan.shipped import shipped_dir

SAMPLES_DIR = shipped_dir("traces/samples")
TRACE_SUFFIXES = (".jsonl", ".csv")


def bundled_traces() -> dict[str, Path]:
    """name -> path of every bundled sample trace (each generated from the spec beside it)."""
    return {p.stem: p for p in sorted(SAMPLES_DIR.glob("*")) if p.suffix in TRACE_SUFFIXES}
