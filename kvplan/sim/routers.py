"""Routers: which replica gets an arriving request. Each sees the replicas' live scheduler state.

* `round_robin`        - in turn.
* `least_outstanding`  - fewest unfinished requests (running + waiting + swapped); ties to the lowest index.
* `least_kv_usage`     - lowest fraction of KV blocks in use; ties by outstanding requests, then index.
* `prefix_aware`       - cache-aware routing as SGLang's router does it: while the load is balanced, the replica
                         holding the longest cached prefix of the request (when it covers at least
                         `cache_threshold` of the prompt; GPU, local tiers and the cluster-shared store alike;
                         of equal ones the least loaded), else the least loaded; once the load is imbalanced
                         (max - min outstanding > `balance_abs` and max > `balance_rel` x min), least loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvplan.engine.core.request import Request, attach_block_keys
from kvplan.errors import UserError

if TYPE_CHECKING:
    from kvplan.sim.replica import Replica


class Router(Protocol):
    def pick(self, request: Request, replicas: list[Replica]) -> Replica: ...


@dataclass(slots=True)
class RoundRobin:
    next_index: int = 0

    def pick(self, request: Request, replicas: list[Replica]) -> Replica:
        replica = replicas[self.next_index % len(replicas)]
        self.next_index += 1
        return replica

    def arrivals_before(self, index: int, num_replicas: int) -> int:
        """How many arrivals go elsewhere before the next one reaches replica `index`."""
        return (index - self.next_index) % num_replicas


def least_loaded(replicas: list[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.outstanding, r.index))


@dataclass(slots=True)
class LeastOutstanding:
    def pick(self, request: Request, replicas: list[Replica]) -> Replica:
        return least_loaded(replicas)


@dataclass(slots=True)
class LeastKvUsage:
    def pick(self, request: Request, replicas: list[Replica]) -> Replica:
        return min(replicas, key=lambda r: (r.sched.kv.usage(), r.outstanding, r.index))


@dataclass(slots=True)
class PrefixAware:
    cache_threshold: float = 0.5
    balance_abs: int = 32
    balance_rel: float = 1.5

    def pick(self, request: Request, replicas: list[Replica]) -> Replica:
        loads = [r.outstanding for r in replicas]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            return least_loaded(replicas)
        best, best_tokens, best_load = None, 0, 0
        for replica in replicas:
            tokens = self.cached_tokens(request, replica)
            # an equal prefix goes to the less loaded replica: a cluster-shared store gives every replica the
            # same cached prefix, and the lowest index would take every request until the imbalance trips
            if tokens > best_tokens or (best is not None and tokens == best_tokens and replica.outstanding < best_load):
                best, best_tokens, best_load = replica, tokens, replica.outstanding
        if best is not None and best_tokens >= self.cache_threshold * int(request.prompt_len):
            return best
        return least_loaded(replicas)

    @staticmethod
    def cached_tokens(request: Request, replica: Replica) -> int:
        sched = replica.sched
        if request.block_keys is None and sched.cache_config.enable_prefix_caching:
            attach_block_keys(request, sched.block_size)  # same block size on every replica: keys are shared
        # a paged manager counts its lower tiers too; the probe moves nothing
        return sched.kv.cached_prefix_blocks(request) * sched.block_size


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "least_kv_usage": LeastKvUsage,
           "prefix_aware": PrefixAware}


def make_router(name: str) -> Router:
    if name not in ROUTERS:
        from kvplan.engine.core.names import did_you_mean

        raise UserError(f"--router: unknown router {name!r}; {did_you_mean(name, ROUTERS)}allowed: "
                        f"{', '.join(ROUTERS)}")
    return ROUTERS[name]()
