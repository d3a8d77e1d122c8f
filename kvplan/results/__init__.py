"""What serving a trace produced, the same whoever served it - the simulator, the live engine or an endpoint -
and the statistics every side computes from it. Beside `kvplan.sim` and `kvplan.engine`, below both and the
application: it imports leaves, `kvplan.traces` and the core's tier-counter names, never the reverse.

* `request_table`  - the per-request table, recorded sequence by sequence, and its latency columns
* `itl`            - inter-token gaps as a multiset counted per microsecond
* `summary`        - the vLLM-style summary: latency percentiles, throughput, KV keys
* `goodput`        - per-request latency bounds and the requests that meet them
* `rejected`       - never-served requests as report lines and table rows
* `serving_result` - `ServingResult` and writing it as a result set's tables
"""
