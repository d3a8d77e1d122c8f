"""Compare the analytic per-op times with Vidur's measured A100 profiles (sim.cost.vidur).

    python scripts/vidur_compare.py --fixtures   # copy the few rows the tests need from ../shared into tests/sim/data
    python scripts/vidur_compare.py              # print the error tables (docs/parallel_validation.md)

The fixture rows are a fixed, log-spaced subset of Vidur's profiles (microsoft/vidur, MIT; the source and the
license are in tests/sim/data/VIDUR_SOURCE.txt); the tables are computed from the fixtures so that the test
recomputes exactly what the docs print. With ../shared present, `--full` also prints the tables over every row.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import pandas as pd

from kvplan.sim.cost.vidur import collective_predictions, compute_predictions, error_table, markdown

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "vidur-profiles"
DATA = ROOT / "tests" / "sim" / "data"
MODELS = {"meta-llama/Meta-Llama-3-8B": "llama-3-8b", "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
          "meta-llama/Llama-2-7b-hf": "llama-2-7b"}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SHAPE = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers"]


def read_mlp(root: Path, models=MODELS) -> pd.DataFrame:
    frames = []
    for path, name in models.items():
        frame = pd.read_csv(root / "compute" / "a100" / path / "mlp.csv")
        frames.append(frame.assign(model=name))
    return pd.concat(frames, ignore_index=True)


def read_network(root: Path) -> pd.DataFrame:
    reduce = pd.read_csv(root / "network" / "a100_dgx" / "all_reduce.csv")
    reduce = reduce[reduce["devices_per_node"] == reduce["num_workers"]]  # one node
    send = pd.read_csv(root / "network" / "a100_dgx" / "send_recv.csv")
    return pd.concat([reduce, send], ignore_index=True)


def subset(mlp: pd.DataFrame, net: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    medians = [c for c in mlp.columns if c.endswith(".median")]
    mlp = mlp[mlp["num_tokens"].isin(TOKENS)].drop_duplicates(["model", "num_tokens", "num_tensor_parallel_workers"])
    mlp = mlp[["model", *SHAPE, *medians]].sort_values(["model", "num_tensor_parallel_workers", "num_tokens"])
    sizes = sorted(net["size"].unique())
    keep = set(sizes[:: max(len(sizes) // 24, 1)]) | {sizes[-1]}
    net = net[net["size"].isin(keep)].drop_duplicates(["collective", "num_workers", "devices_per_node", "size"])
    cols = ["collective", "num_workers", "devices_per_node", "size", "time_stats.all_reduce.median",
            "time_stats.send_recv.median"]
    net = net[cols].sort_values(["collective", "devices_per_node", "num_workers", "size"])
    return mlp, net


def tables(mlp: pd.DataFrame, net: pd.DataFrame) -> str:
    compute = error_table(compute_predictions(mlp))
    network = error_table(collective_predictions(net))
    return (markdown(compute, "TP degree") + "\n\n" + markdown(network, "GPUs"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", action="store_true", help="write tests/sim/data/vidur_*.csv from ../shared")
    parser.add_argument("--full", action="store_true", help="also print the tables over every row of ../shared")
    args = parser.parse_args(argv)
    if (args.fixtures or args.full) and not SHARED.is_dir():
        print(f"{SHARED}: not found (the shared Vidur profiles)", file=sys.stderr)
        return 2
    if args.fixtures:
        mlp, net = subset(read_mlp(SHARED), read_network(SHARED))
        mlp.to_csv(DATA / "vidur_mlp.csv", index=False)
        net.to_csv(DATA / "vidur_network.csv", index=False)
        shutil.copyfile(SHARED / "LICENSE", DATA / "VIDUR_LICENSE")
    mlp, net = pd.read_csv(DATA / "vidur_mlp.csv"), pd.read_csv(DATA / "vidur_network.csv")
    print(tables(mlp, net))
    if args.full:
        print("\nEvery row of the shared profiles:\n")
        print(tables(read_mlp(SHARED), read_network(SHARED)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
