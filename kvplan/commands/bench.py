"""`kvplan bench TARGET`: performance benchmarks that report ratios against a baseline from the same run."""

from __future__ import annotations

import argparse

from kvplan.output import format_table, print_json


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("bench", help="run a benchmark", description=__doc__)
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    core = targets.add_parser("core", help="serving core: memory efficiency and scheduler cycle time",
                              description="Paged allocation vs contiguous reservation (Max, Pow2, Oracle) on a "
                                          "ShareGPT-like workload, and the wall time of one schedule+update "
                                          "cycle with 256 and 1024 running decode requests.")
    core.add_argument("--requests", type=int, default=600, help="requests in the memory workload (default 600)")
    core.add_argument("--seed", type=int, default=0)
    core.add_argument("--json", action="store_true", help="print one JSON object")
    core.set_defaults(handler=_bench_core)


def _bench_core(args: argparse.Namespace) -> int:
    from kvplan.bench import core

    result = core.run(args.requests, args.seed)
    if args.json:
        print_json(result)
        return 0
    w = result["workload"]
    print(f"Memory: {w['requests']} ShareGPT-like requests (mean prompt {w['mean_prompt']:.0f}, output "
          f"{w['mean_output']:.0f}, max {w['max_len']}), {w['kv_slots']} KV token slots, averaged over steps\n")
    rows = [[name, m["kv_token_utilization"], m["utilization_vs_paged"], m["token_states"], m["reserved_unused"],
             m["internal_fragmentation"], m["external_fragmentation"], m["free"], m["mean_batch"]]
            for name, m in result["memory"].items()]
    print(format_table(["allocator", "util", "vs_paged", "tokens", "reserved", "internal", "external", "free",
                        "batch"], rows))
    c = result["cycle"]
    print(f"\nScheduler cycle (schedule+update, all decoding, block 16; budget {result['cycle_budget_ms']} ms):")
    print(format_table(["running", "ms", "vs_budget"], [
        ["256", c["decode_cycle_256_ms"], c["decode_cycle_256_vs_budget"]],
        ["256 (token ids)", c["decode_cycle_256_token_ids_ms"], c["decode_cycle_256_token_ids_vs_budget"]],
        ["1024", c["decode_cycle_1024_ms"], c["decode_cycle_1024_vs_budget"]],
    ]))
    return 0
