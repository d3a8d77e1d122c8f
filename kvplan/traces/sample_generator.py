"""Regenerate the sample traces (`traces/samples/`) from their specs:
`python -m kvplan.traces.sample_generator [OUT_DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path

from kvplan.traces.io import render, render_layout
from kvplan.traces.samples import SAMPLES_DIR
from kvplan.traces.synth import synthesize_file

# sample file -> (spec, layout): our JSONL, or a public layout that its own loader reads.
SAMPLES = {
    "chat.jsonl": ("chat.yaml", "jsonl"),
    "mooncake_style.jsonl": ("mooncake_style.yaml", "mooncake"),
    "azure_style.csv": ("azure_style.yaml", "azure"),
}


def generate(out_dir: Path = SAMPLES_DIR) -> list[Path]:
    written = []
    for name, (spec, layout) in SAMPLES.items():
        trace = synthesize_file(SAMPLES_DIR / spec)
        data = render(trace, layout) if layout == "jsonl" else render_layout(trace, layout)
        (out_dir / name).write_bytes(data)
        written.append(out_dir / name)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLES_DIR):
        print(f"{path} ({path.stat().st_size} bytes)")
