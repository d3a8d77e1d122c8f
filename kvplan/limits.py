"""Sizes one run may take on a machine of this kind (24 GiB): past them a run would exhaust memory after minutes
instead of failing at once. The core holds one Python object per KV block (~110 bytes: 110 MB per million
blocks), and every simulated replica is a whole engine. A leaf module: the core, traces, the simulator and the
command line all bound their inputs with these."""

MAX_TOKENS = 10_000_000  # a prompt, an output or a context: longer than any model's
MAX_BLOCKS = 50_000_000  # GPU + CPU blocks over all replicas: ~5.5 GB of block objects
MAX_REPLICAS = 10_000
MAX_SAMPLES = 10_000  # time-series samples of one run (100x the default): each one is a step off the fast path

# --- issue 44, bounds of an experiment's sizes and search ends (kvplan.experiments.schema) ---
REPLICAS_WHY = "one simulated engine each"  # MAX_REPLICAS: a replica is a whole scheduler and KV manager
# Closed-loop users of one probe: each is a live session of the loop, and 100x vLLM's largest max_num_seqs
# default (1024, sim.vllm_defaults) is past any engine's running slots: more users only queue.
MAX_USERS = 100_000
USERS_WHY = "closed-loop users: each is a live session; more than 100 engines' running slots only queue"
