"""Small project-made sample traces (generated from the YAML specs beside them, never real traces)."""

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent
TRACE_SUFFIXES = (".jsonl", ".csv")


def bundled_traces() -> dict[str, Path]:
    """name -> path of every bundled sample trace (each generated from the spec beside it)."""
    return {p.stem: p for p in sorted(SAMPLES_DIR.iterdir()) if p.suffix in TRACE_SUFFIXES}
