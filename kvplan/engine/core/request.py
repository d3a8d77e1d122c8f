"""Request state as the scheduler and KV manager see it.

A request either carries its token ids (the live engine: `token_ids` holds prompt + generated tokens) or runs
count-only (the simulator: `token_ids is None`, only lengths and prefix block keys exist). The core never needs
the tokens themselves, only their count and the block keys.

Lifecycle::

    WAITING ──admit──► RUNNING ──finish──► FINISHED
       ▲                 │  │
       │   recompute     │  └──swap──► SWAPPED ──swap in──► RUNNING
       └── PREEMPTED ◄───┘
    any non-final state ──abort / reject──► ABORTED

A request with `kv_transfer_params` takes part in prefill/decode disaggregation (vLLM's P/D; `remote_kv`): on
the decode side (`do_remote_prefill`) it waits in WAITING_FOR_REMOTE_KVS, holding the blocks of its prompt, until
its KV has been received; on the prefill side (`do_remote_decode`) it finishes holding its blocks until the
decode side has read them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from kvplan.engine.core.block_keys import PUBLIC, ROOT_KEY, BlockKeys, HashBlockKeys, TokenBlockKeys, chain_hash
from kvplan.engine.core.timing import SequenceTiming
from kvplan.errors import UserError

if TYPE_CHECKING:
    from mypy_extensions import i64  # native 64-bit fields in the compiled build (no tag checks); int when interpreted

    from kvplan.engine.core.block_pool import KVBlock


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    PREEMPTED = 3  # freed by recompute preemption, waiting to be re-admitted
    FINISHED = 4
    ABORTED = 5
    # Decode side of P/D (vLLM's name): blocks for the prompt held, its KV being received (`remote_kv`)
    WAITING_FOR_REMOTE_KVS = 6

    @property
    def is_final(self) -> bool:
        return self is RequestStatus.FINISHED or self is RequestStatus.ABORTED


# The status the schedulers' loops test most. Final: a compiled module reads it as a C constant, not from its
# module's dict on every test; typed, not Literal, so a test of it does not narrow a status across calls that
# change it.
RUNNING: Final[RequestStatus] = RequestStatus.RUNNING


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_len: i64
    max_tokens: i64
    arrival_s: float = 0.0
    priority: int = 0  # smaller is more important (vLLM convention)
    n: i64 = 1  # parallel samples or beams: the prompt is computed once, then forked into n sequences
    beam: bool = False  # a beam-search sequence: its group advances in lockstep (`Scheduler.advance_beams`)
    token_ids: list[int] | None = None
    prefix_hashes: tuple[int, ...] | None = None  # a trace's prefix hashes, one per `hash_granularity` tokens
    hash_granularity: int = 0
    hash_ids_named: bool = False  # each prefix hash names its whole prefix (`block_keys`: then it is the key)
    block_keys: BlockKeys | None = None  # attached by the scheduler when prefix caching is on
    stop_token_ids: frozenset[int] = frozenset()
    status: RequestStatus = RequestStatus.WAITING
    num_output_tokens: i64 = 0
    num_computed_tokens: i64 = 0
    num_cached_tokens: int = 0  # prefix-cache hit (tokens) at the first admission
    num_hashed_blocks: i64 = 0  # blocks of this request already registered in the prefix cache
    num_preemptions: int = 0
    seq: int = 0  # admission order of add_request, a stable tie-breaker
    # order of its latest start in the running set: its place in vLLM's running list (a fork takes its parent's)
    started: int = 0
    parent_id: str | None = None
    group_id: str | None = None  # the sequence group (n > 1 samples, beams) it belongs to; None: its own
    children_ids: list[str] = field(default_factory=list)
    forked: bool = False  # n > 1 requests: True once the children exist
    finish_reason: str | None = None
    # vLLM's per-request P/D parameters, as its proxy sends them (`remote_kv`: `do_remote_prefill` marks the
    # decode side's request, `do_remote_decode` the prefill side's; the other keys are the connector's); None: none
    kv_transfer_params: dict[str, Any] | None = None
    # speculative decoding: drafts proposed for its next step (`Scheduler.set_drafts`; placeholder ids in
    # count-only runs), scheduled after its verified tokens and cleared once a step schedules it (vLLM's)
    spec_token_ids: list[int] = field(default_factory=list)
    # its LoRA adapter (`lora`): an id for the max_loras rule and the slots, 0 the base model; the name keys its
    # prefix blocks apart from other adapters' (vLLM's block-hash extra keys)
    lora_id: int = 0
    lora_name: str = ""
    # where a runner records its timeline (the simulator's replica reads it every step, instead of looking its
    # id up); the core never reads it, and a fork starts without one
    timing: SequenceTiming | None = None
    # its block table in a one-group paged cache: the list `KVCacheManager.tables` holds under its id (None while
    # it holds none, and in a hybrid cache's groups), kept here so that the decode fast paths, which visit every
    # running request per step or stretch, read it without a lookup by id
    kv_table: list[KVBlock | None] | None = None
    # where its decode steps stop being quiet - where one opens a block, fills one to key, or always (0) for a
    # forked one - as the bulk decode path last found it (`DecodeSteps.schedule_leading`), so that `update` can tell
    # which of the leading run's next steps need checking
    quiet_until: i64 = 0
    # its first block keyed by its own run of keys, which no other request can ask for (`block_keys`): those are
    # private blocks until it may look them up again (`block_pool`); PUBLIC: none (a sequence group's members hit
    # each other's runs, and token contents have none)
    private_from: i64 = PUBLIC

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what a recompute must cover."""
        return self.prompt_len + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        """Verified tokens plus the drafts waiting to be verified (vLLM's name)."""
        return self.prompt_len + self.num_output_tokens + len(self.spec_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return self.prompt_len + self.num_output_tokens - self.num_computed_tokens

    @property
    def final_len(self) -> int:
        """Length the request reaches if it runs to its output budget."""
        return self.prompt_len + self.max_tokens

    @property
    def group(self) -> str:
        """Key of its sequence group: the id of the request the group was forked from."""
        return self.group_id or self.request_id

    @property
    def grouped(self) -> bool:
        """Whether it shares a sequence group with others (forked from, or has forked, siblings)."""
        return self.group_id is not None or bool(self.children_ids)

    @property
    def seq_slots(self) -> int:
        """Sequences it counts for under `max_num_seqs`: n until an n > 1 request has forked its samples."""
        return self.n if not self.forked else 1

    @property
    def output_token_ids(self) -> list[int]:
        return [] if self.token_ids is None else self.token_ids[self.prompt_len:]

    def append_token(self, token: int | None) -> None:
        self.num_output_tokens += 1
        if self.token_ids is not None:
            self.token_ids.append(token if token is not None else 0)

    def spawn(self, child_id: str) -> Request:
        """A sibling sharing this request's whole history (fork for n > 1 or beam search)."""
        child = Request(
            request_id=child_id, prompt_len=self.prompt_len, max_tokens=self.max_tokens,
            arrival_s=self.arrival_s, priority=self.priority, n=1, beam=self.beam, prefix_hashes=self.prefix_hashes,
            hash_granularity=self.hash_granularity, hash_ids_named=self.hash_ids_named,
            stop_token_ids=self.stop_token_ids, status=self.status,
            num_cached_tokens=self.num_cached_tokens, seq=self.seq, started=self.started, parent_id=self.request_id,
            group_id=self.group, forked=True, lora_id=self.lora_id, lora_name=self.lora_name,
        )
        child.continue_from(self)
        return child

    def continue_from(self, other: Request) -> None:
        """Take over `other`'s history: its tokens, computed count and block keys (a fork; or, in beam search, a
        pruned beam's sequence continuing a surviving one). The KV blocks are the KV manager's to share."""
        self.token_ids = None if other.token_ids is None else list(other.token_ids)
        self.num_output_tokens = other.num_output_tokens
        self.num_computed_tokens = other.num_computed_tokens
        self.num_hashed_blocks = other.num_hashed_blocks
        self.block_keys = None
        if other.block_keys is not None:
            keep = other.num_computed_tokens // other.block_keys.block_size
            # Token keys are only ever attached to a request with token ids (attach_block_keys), so for them
            # token_ids is a list; no check on this path (beam search calls it every step).
            self.block_keys = other.block_keys.fork(self.token_ids, self.request_id, keep)  # type: ignore[arg-type]


# A parallel-sampling child is its parent's id, "#" and its sample index (vLLM names them the same way): the one
# format, made and read here.
CHILD_SEPARATOR: Final = "#"


def child_id(parent_id: str, sample: int) -> str:
    return f"{parent_id}{CHILD_SEPARATOR}{sample}"


def sample_index(request_id: str) -> int:
    """The sample index of a child's id (`child_id`); 0 for a request that is no child."""
    _, sep, tail = request_id.rpartition(CHILD_SEPARATOR)
    return int(tail) if sep and tail.isdigit() else 0


def make_request(request_id: str, *, max_tokens: int, prompt_len: int | None = None,
                 prompt_token_ids: list[int] | None = None, prefix_hashes: list[int] | None = None,
                 hash_granularity: int = 0, hash_ids_named: bool = False, arrival_s: float = 0.0,
                 priority: int = 0, n: int = 1,
                 beam: bool = False, stop_token_ids: frozenset[int] | set[int] = frozenset(),
                 kv_transfer_params: dict[str, Any] | None = None, lora_id: int = 0,
                 lora_name: str = "") -> Request:
    """Build a request from token ids (engine) or from lengths plus optional trace prefix hashes (simulator);
    `hash_ids_named`: the caller has checked that its trace's hashes name their prefixes (`block_keys`)."""
    tokens = list(prompt_token_ids) if prompt_token_ids is not None else None
    if tokens is not None:
        prompt_len = len(tokens)
    if prompt_len is None or prompt_len < 1:
        raise UserError(f"request {request_id}: prompt must have at least one token, got {prompt_len}")
    if max_tokens < 1:
        raise UserError(f"request {request_id}: max_tokens must be >= 1, got {max_tokens}")
    if n < 1:
        raise UserError(f"request {request_id}: n must be >= 1, got {n}")
    if prefix_hashes and hash_granularity < 1:
        raise UserError(f"request {request_id}: prefix_hashes need a hash_granularity >= 1")
    return Request(request_id=request_id, prompt_len=prompt_len, max_tokens=max_tokens, arrival_s=arrival_s,
                   priority=priority, n=n, beam=beam, token_ids=tokens,
                   prefix_hashes=tuple(prefix_hashes) if prefix_hashes else None,
                   hash_granularity=hash_granularity, hash_ids_named=hash_ids_named and bool(prefix_hashes),
                   stop_token_ids=frozenset(stop_token_ids),
                   kv_transfer_params=dict(kv_transfer_params) if kv_transfer_params is not None else None,
                   lora_id=lora_id, lora_name=lora_name)


def attach_block_keys(request: Request, block_size: int) -> None:
    """Give the request the block-key source matching its content and the cache's block size."""
    root = adapter_root(request.lora_name)  # (the plain root for a base request)
    if request.token_ids is not None:
        request.block_keys = TokenBlockKeys(request.token_ids, block_size, root)
    else:
        keys = request.block_keys = HashBlockKeys(request.prefix_hashes or (), request.hash_granularity or block_size,
                                                  block_size, request.prompt_len, request.request_id, root,
                                                  request.hash_ids_named)
        if request.n == 1 and not request.beam and request.parent_id is None:
            request.private_from = keys.own_from


def adapter_root(lora_name: str) -> int:
    """The parent key of a request's block 0: vLLM puts the adapter's name in every block hash's extra keys, so
    requests of different adapters never share a cached block, and base requests keep the plain root."""
    return chain_hash(ROOT_KEY, b"lora:" + lora_name.encode()) if lora_name else ROOT_KEY
