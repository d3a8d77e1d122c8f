"""How a simulated cluster (co-located `sim.cluster.Cluster`, disaggregated `sim.disagg.DisaggCluster`) runs to its
end, to a horizon, or to a `stop()`: one mechanism for both.

Invariant: `stopped` triggers at most once, and `stop_reason` is the first reason given ("" when every request
finished); every replica knows the horizon (`stop_at_s`), so no decode stretch runs past it."""

from __future__ import annotations

from kvplan.sim.collector import simulation_collector


class Stoppable:
    """Mixed into a cluster that has `env` (a SimPy environment), `replicas`, `stopped` (an event shared with its
    replicas) and `stop_reason`."""

    def run_to(self, until_s: float | None) -> None:
        """Run to the end (every request finished), to `until_s`, or to a `stop()` - with the collector's thresholds
        raised (`sim.collector`)."""
        with simulation_collector():
            if until_s is None:
                self.env.run()  # type: ignore[attr-defined]
                return
            for replica in self.replicas:  # type: ignore[attr-defined]
                replica.stop_at_s = until_s
            self.env.process(self._horizon(until_s))  # type: ignore[attr-defined]
            self.env.run(until=self.stopped)  # type: ignore[attr-defined]

    def _horizon(self, until_s: float):
        yield self.env.timeout(until_s)  # type: ignore[attr-defined]
        self.stop(f"horizon {until_s:g} s")

    def stop(self, reason: str) -> None:
        if not self.stopped.triggered:  # type: ignore[attr-defined]
            self.stop_reason = reason
            self.stopped.succeed()  # type: ignore[attr-defined]
