"""How steady is this machine? A fixed workload timed back to back, no engine and no simulator involved.

The workload is a decode step's worth of small bf16 GEMMs (8 rows through 576 x 1536 x 576 layers, 60 times),
the shape of SmolLM2-135M's MLP. Every run is the same arithmetic on the same tensors (seeded), so a change in
its time is a change in the machine's speed. Prints one JSON object: the median time, the spread of single runs
(p10 and p90 over the median) and the median of each 10-second window over the overall median - the speed a
validation run would see from one stretch of its minutes to the next.

    .venv/bin/python scripts/machine_speed.py --seconds 180
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def workload(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    return draw(8, 576), draw(576, 1536), draw(1536, 576)


def run_once(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
    for _ in range(60):
        x = torch.relu(x @ up) @ down


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window (default 10)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tensors = workload(torch.Generator().manual_seed(0))
    for _ in range(20):  # warm-up: oneDNN picks its kernels
        run_once(*tensors)
    starts, durations = [], []
    origin = time.perf_counter()
    while time.perf_counter() - origin < args.seconds:
        begin = time.perf_counter()
        run_once(*tensors)
        starts.append(begin - origin)
        durations.append(time.perf_counter() - begin)
    at, took = np.array(starts), np.array(durations)
    median = float(np.median(took))
    windows = [float(np.median(took[(at >= w) & (at < w + args.window)]) / median)
               for w in np.arange(0.0, args.seconds, args.window) if ((at >= w) & (at < w + args.window)).any()]
    print(json.dumps({"runs": len(took), "median_ms": round(median * 1e3, 3),
                      "p10_over_median": round(float(np.percentile(took, 10)) / median, 3),
                      "p90_over_median": round(float(np.percentile(took, 90)) / median, 3),
                      "window_seconds": args.window, "window_medians": [round(w, 3) for w in windows],
                      "window_range": [round(min(windows), 3), round(max(windows), 3)]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
