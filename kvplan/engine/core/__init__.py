"""The serving core shared by the live engine and the simulator: pure Python, no torch.

Layout (one concept per module):

* `settings`      - every serving setting, declared once (name, kind, default, range, help, sides)
* `setting_classes` - config and option classes whose fields come from the settings
* `config`        - validated cache and scheduler settings
* `block_keys`    - process-stable chained block hashes (token ids or trace prefix hashes)
* `request`       - request state and lifecycle
* `block_pool`    - blocks, ref counts, prefix-cache map, empty/cached free lists
* `eviction/`     - pluggable eviction policies for cached free blocks (lru, fifo, lfu, s3fifo)
* `kv_interface`  - the KV manager protocol every manager implements (what the scheduler, metrics and sim ask)
* `kv_manager`    - paged block tables: prefix hits, copy-on-write forks, swap, sink+window
* `kv_groups`     - the hybrid allocator: one pool under sliding-window and full-attention groups
* `reservation`   - contiguous reservation baselines (max, pow2, oracle) behind the same interface
* `victims`, `request_queue` - preemption victim policies and waiting queues
* `scheduler`     - continuous batching (mixed or prefill-first) with chunked prefill, preemption and the
                    admission rule that keeps it live; one class owning its components:
* `admission`     - the waiting queue's head entering the running set
* `preemption`    - preempting and swapping sequence groups all or nothing
* `beam_group`    - beam-search groups advancing in lockstep
* `step_update`   - applying a step's results
* `remote_kv`     - prefill/decode disaggregation: requests receiving their prompt's KV, or holding it for a
                    remote decode (vLLM's P/D with a pull connector; the API the engine and simulator drive)
* `decode_steps`  - one decode step applied to one or k steps at once (the simulator's fast paths)
* `metrics`       - counters, gauges and the memory breakdown
"""

from kvplan.engine.core.config import CacheConfig, ConfigError, SchedulerConfig
from kvplan.engine.core.metrics import MemoryBreakdown, SchedulerStats, block_sharing, kv_snapshot, memory_breakdown
from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput, UpdateOutput
from kvplan.engine.core.remote_kv import KVLoad, wants_remote_decode, wants_remote_prefill
from kvplan.engine.core.request import Request, RequestStatus, make_request
from kvplan.engine.core.scheduler import Scheduler

__all__ = [
    "CacheConfig", "ConfigError", "KVLoad", "MemoryBreakdown", "Request", "RequestStatus", "ScheduledRequest",
    "Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulerStats", "UpdateOutput", "block_sharing", "kv_snapshot",
    "make_request", "memory_breakdown", "wants_remote_decode", "wants_remote_prefill",
]
