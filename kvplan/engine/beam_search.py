"""Beam search decisions, step for step as HF `generate(num_beams=k)` makes them (deterministic, one prompt).

Each step takes the k running beams' next-token log-probabilities [k, vocab] and:

1. adds each beam's running score and keeps the top K = max(2, 1 + #eos) * k continuations over all beams;
2. continuations that end in EOS or reach the length limit are candidates for the k finished hypotheses (only
   those among the top k, with score / generated_len ** length_penalty), the rest compete for the k beams;
3. stops when every hypothesis slot is filled and the running beams can no longer beat the worst of them
   (`early_stopping=False`: judged at the current length; `"never"`: at the best length the penalty allows), at
   once when all are filled under `early_stopping=True`, or when every continuation hit the limit.

The same torch ops on the same float32 values as HF, so ties break the same way. Beams are numbered as HF
numbers them; `slot_of` says which engine sequence (group member) holds each, and a step returns a plan that
keeps a parent's sequence in place and moves the pruned members' slots onto the extra children.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NEG = -1.0e9  # HF's "impossible" score


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # generated tokens (EOS included when it ended on one)
    score: float  # cumulative log-probability / generated length ** length_penalty (HF's sequences_scores)
    cumulative_logprob: float
    finished_on_eos: bool


@dataclass(slots=True)
class BeamSearch:
    width: int
    max_tokens: int
    eos_token_ids: list[int]
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    generated: int = 0  # tokens each running beam has generated
    running_scores: torch.Tensor = field(init=False)  # [k] cumulative log-probabilities of the running beams
    running_tokens: list[list[int]] = field(init=False)  # generated tokens per running beam
    slot_of: list[int] = field(init=False)  # beam i lives in group member slot_of[i]
    finished: list[Hypothesis | None] = field(init=False)  # k slots, best first
    finished_scores: torch.Tensor = field(init=False)
    can_improve: bool = True  # HF's is_early_stop_heuristic_unsatisfied
    done: bool = False
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # member slot -> its latest log-probabilities

    def __post_init__(self) -> None:
        k = self.width
        self.running_scores = torch.full((k,), NEG)
        self.running_scores[0] = 0.0  # the beams start identical: only beam 0's continuations count
        self.running_tokens = [[] for _ in range(k)]
        self.slot_of = [0] * k  # before the first step every beam is the prompt's one sequence
        self.finished = [None] * k
        self.finished_scores = torch.full((k,), NEG)

    def step(self) -> list[tuple[int, int]] | None:
        """Decide one step from each member slot's log-probabilities (`rows`, then cleared). Returns the plan -
        for member slot j, (the slot whose sequence it continues, the token it appends) - or None when the search
        is over."""
        k = self.width
        log_probs = torch.stack([self.rows[self.slot_of[i]] for i in range(k)])
        self.rows.clear()
        vocab = log_probs.shape[1]
        scores = (log_probs + self.running_scores[:, None]).reshape(-1)
        keep = max(2, 1 + len(self.eos_token_ids)) * k
        top_scores, top_index = torch.topk(scores, keep)
        parents, tokens = (top_index // vocab).tolist(), (top_index % vocab).tolist()
        at_limit = self.generated + 1 >= self.max_tokens
        ends = torch.tensor([at_limit or t in self.eos_token_ids for t in tokens])
        running = top_scores + ends.to(torch.float32) * NEG
        chosen = torch.topk(running, k).indices.tolist()
        self._update_finished(top_scores, ends, parents, tokens)
        next_scores = running[chosen]
        self.generated += 1
        self._update_can_improve(next_scores)
        if not (self.can_improve and not (self._all_finished() and self.early_stopping is True)
                and not bool(ends.all())):
            self.done = True
            return None
        plan = self._plan([parents[c] for c in chosen], [tokens[c] for c in chosen])
        self.running_scores = next_scores
        return plan

    def _update_finished(self, top_scores: torch.Tensor, ends: torch.Tensor, parents: list[int],
                         tokens: list[int]) -> None:
        k = self.width
        top_k = torch.zeros(len(tokens), dtype=torch.bool)
        top_k[:k] = True
        just_finished = ends & top_k
        candidate = top_scores / ((self.generated + 1) ** self.length_penalty)
        candidate += float(self._all_finished() and self.early_stopping is True) * NEG
        candidate += float(not self.can_improve) * NEG
        candidate += (~just_finished).to(torch.float32) * NEG
        merged = torch.cat((self.finished_scores, candidate))
        best = torch.topk(merged, k).indices.tolist()
        pool = list(self.finished)
        for i, (parent, token) in enumerate(zip(parents, tokens, strict=True)):
            pool.append(Hypothesis([*self.running_tokens[parent], token], float(candidate[i]),
                                   float(top_scores[i]), token in self.eos_token_ids)
                        if bool(just_finished[i]) else None)
        self.finished = [pool[b] for b in best]
        self.finished_scores = merged[best]

    def _update_can_improve(self, next_scores: torch.Tensor) -> None:
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_tokens
        else:
            best_length = self.generated
        best_possible = next_scores[:1] / (best_length ** self.length_penalty)
        finished = torch.tensor([h is not None for h in self.finished])
        worst = torch.where(finished, torch.min(self.finished_scores), torch.tensor(NEG))
        self.can_improve = self.can_improve and bool(torch.any(best_possible > worst))

    def _all_finished(self) -> bool:
        return all(h is not None for h in self.finished)

    def _plan(self, parents: list[int], tokens: list[int]) -> list[tuple[int, int]]:
        """Seat the new beams on member slots: a parent's first child keeps the parent's slot, the others take
        the slots of beams nobody continues. Updates `slot_of` and the running tokens."""
        k = self.width
        parent_slots = [self.slot_of[p] for p in parents]
        if self.generated == 1:  # first step: one sequence, forked k ways; member j is fork j
            seat = list(range(k))
        else:
            seat, taken = [], set()
            for slot in parent_slots:
                seat.append(-1 if slot in taken else slot)
                taken.add(slot)
            free = iter(sorted(set(range(k)) - taken))
            seat = [s if s >= 0 else next(free) for s in seat]
        plan: list[tuple[int, int]] = [(0, 0)] * k
        for i in range(k):
            plan[seat[i]] = (parent_slots[i], tokens[i])
        self.running_tokens = [[*self.running_tokens[p], t] for p, t in zip(parents, tokens, strict=True)]
        self.slot_of = seat
        return plan

    def hypotheses(self) -> list[Hypothesis]:
        """The k finished hypotheses, best first (HF's returned sequences and sequences_scores)."""
        return [h for h in self.finished if h is not None]
