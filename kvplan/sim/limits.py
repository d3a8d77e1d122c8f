"""Sizes one simulation may take on a machine of this kind (24 GiB): past them a run would exhaust memory after
minutes instead of failing at once. The core holds one Python object per KV block (~110 bytes: 110 MB per
million blocks), and every replica is a whole engine."""

from kvplan.traces.schema import MAX_TOKENS  # noqa: F401 -- one token limit for traces, the simulator and the CLI

MAX_BLOCKS = 50_000_000  # GPU + CPU blocks over all replicas: ~5.5 GB of block objects
MAX_REPLICAS = 10_000
MAX_SAMPLES = 10_000  # time-series samples of one run (100x the default): each one is a step off the fast path
