"""Sizes one run may take on a machine of this kind (24 GiB): past them a run would exhaust memory after minutes
instead of failing at once. The core holds one Python object per KV block (~110 bytes: 110 MB per million
blocks), and every simulated replica is a whole engine. A leaf module: the core, traces, the simulator and the
command line all bound their inputs with these."""

MAX_TOKENS = 10_000_000  # a prompt, an output or a context: longer than any model's
MAX_BLOCKS = 50_000_000  # GPU + CPU blocks over all replicas: ~5.5 GB of block objects
MAX_REPLICAS = 10_000
MAX_SAMPLES = 10_000  # time-series samples of one run (100x the default): each one is a step off the fast path

# Trace files, enforced while the (decompressed) content streams in, for every codec and the plain file alike
# (traces.compression.open_binary): a few KB of gzip, bz2 or xz can inflate to gigabytes, and only a limit checked
# during the read refuses it before memory is spent. Loading keeps every field of every row as a Python object:
# measured, a 1.5M-row Vidur CSV (30 MB) peaks at 0.96 GB RSS, ~640 bytes a row and ~30 bytes per byte of text.
MAX_TRACE_LINES = 20_000_000  # ~13 GB of peak memory at ~640 bytes a row: what the 24 GiB machine holds
MAX_TRACE_BYTES = 2 * 2**30  # decompressed content; rows of long hash lists take ~1 byte of memory a byte
# One line (one row): the longest a row can legitimately be is a hash list for a MAX_TOKENS prompt in 16-token
# blocks (Qwen-Bailian): 625,000 ids of up to 19 digits and a separator, ~13 MB. 4x that leaves room for finer
# blocks; a longer line is a bomb or not a trace (one 2 GB line would otherwise be held whole, several times).
MAX_TRACE_LINE_BYTES = 64 * 2**20
# Distinct fields (CSV columns, JSONL keys over all rows, Parquet columns): a layout has at most 9, a real file a few
# more. One 64 MB line of distinct names would otherwise become millions of columns, each padded for every row.
MAX_TRACE_FIELDS = 1_000
# Memory an xz decoder may take: `xz -9` needs 65 MiB to decompress; a header asking for a 1.5 GiB dictionary (a file
# of a few bytes can) is refused instead of allocated.
MAX_XZ_MEMORY = 256 * 2**20
# Values in all (rows x fields, as read: a JSONL key missing from a row still holds a None, a CSV row carries 8 spare
# fields): the measured ~640 bytes a row was for 11 values a row (~58 bytes a value), so 12 values a row for
# MAX_TRACE_LINES rows is the same ~14 GB. Without it, 1000 keys on the first line and 20M lines of `{}` after it
# would be 20 billion values.
MAX_TRACE_CELLS = 12 * MAX_TRACE_LINES

# YAML documents (experiments, specs, profiles, --retime), checked while the document is composed, before anything
# reads it (traces.specs): PyYAML composes ~20,000 nodes a second here (measured: a 0.7 MB document of 120,000
# nodes takes 5.6 s), and an alias bomb of a few lines expands to billions of nodes, each one built and walked.
MAX_YAML_BYTES = 1 * 2**20  # ~8 s to compose at most; a spec or a profile is a few KB
MAX_YAML_NODES = 200_000  # values in one document with every alias expanded: ~10 s at worst to build and check
MAX_YAML_ALIASES = 1_000  # `*name` references in one document (a spec uses a handful: `<<: *base`)
MAX_YAML_DEPTH = 100  # nesting of mappings and sequences (a spec nests ~5 deep; deeper recursion runs out of stack)

# --- issue 44, bounds of an experiment's sizes and search ends (kvplan.experiments.schema) ---
REPLICAS_WHY = "one simulated engine each"  # MAX_REPLICAS: a replica is a whole scheduler and KV manager
# Closed-loop users of one probe: each is a live session of the loop, and 100x vLLM's largest max_num_seqs
# default (1024, sim.vllm_defaults) is past any engine's running slots: more users only queue.
MAX_USERS = 100_000
USERS_WHY = "closed-loop users: each is a live session; more than 100 engines' running slots only queue"
