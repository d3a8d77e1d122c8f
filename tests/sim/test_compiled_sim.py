"""Whole simulations on a compiled build (scripts/build_compiled_core.sh OUT kvplan/sim/replica.py
kvplan/sim/shared_store.py: the core and the simulator's step loop as mypyc extensions) are bit-identical to the
pure-Python modules': the random traces and serving configurations of tests/sim/test_fast_plain_equivalence.py
(preemption by recompute and swap, prefix hits and evictions, the prefix tiers, cache-aware admission, 1-3 replicas
behind each router, the probes' harness knobs) run here and in a subprocess on the build (tests/compiled_sides.py,
KVPLAN_COMPILED_CORE=OUT; skipped without it), on the fast path and on the plain one, and every finished
sequence's raw log row, the per-request table, the KV series, the summary, the inter-token gaps and each replica's
counters, KV metrics and busy time must be equal."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.compiled_sides import compiled_side, serve
from tests.sim.test_fast_plain_equivalence import Case, build, cases, covering_case, raw_log, strict


def fingerprint(case: Case, fast_path: bool) -> str:
    """Everything `assert_same_run` compares, as one exact text (floats by repr); 'refused' when the configuration
    check refuses the draw."""
    from kvplan.sim.run import collect

    cluster = build(case, fast_path)
    if cluster is None:
        return "refused"
    cluster.run(until_s=case.harness.until_s)
    result = collect(cluster, cluster.replicas[0].sched.cache_config.num_blocks)
    replicas = [[repr(r.sched.stats), strict(r.sched.kv_metrics()), r.marks, r.usage_seconds, r.peak_usage, r.clock,
                 r.busy_seconds, r.prefill_seconds, r.num_fast_steps] for r in cluster.replicas]
    return strict([raw_log(cluster.log).to_csv(), result.requests.to_csv(), result.series.to_csv(),
                   strict(result.summary), sorted(cluster.itl().counts.items()), cluster.rejected(), replicas])


@pytest.fixture(scope="module")
def compiled():
    yield from compiled_side("tests.sim.test_compiled_sim")


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(case=cases())
@example(case=covering_case())
def test_a_compiled_simulation_equals_the_pure_one(compiled, case: Case) -> None:
    line = base64.b64encode(pickle.dumps(case)).decode()
    assert json.loads(compiled(line)) == json.loads(answer(line))


def answer(line: str) -> str:
    case = pickle.loads(base64.b64decode(line))
    return json.dumps([fingerprint(case, True), fingerprint(case, False)])


if __name__ == "__main__":
    serve(answer, ("kvplan.engine.core.scheduler", "kvplan.engine.core.decode_steps", "kvplan.sim.replica",
                   "kvplan.sim.shared_store"))
