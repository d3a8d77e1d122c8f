"""Users' own benchmark files as ground truth: `kvplan validate --from-results FILE`.

A benchmark tool's result file (`vllm bench serve --save-result`, GuideLLM's report, AIPerf's export,
inference-perf's report) is read into one `MeasuredRun` (`record`): the workload it ran (per-request lengths and
send times where recorded, else the dataset's lengths and the rate or concurrency), the model and settings where
recorded, and what it measured (TTFT/TPOT/ITL/E2E percentiles, throughput). Each format is one module under
`formats/`, registered in `formats.FORMATS`; the comparison simulates the same workload and prints both.
"""
