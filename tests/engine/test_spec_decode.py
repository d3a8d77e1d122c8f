"""Speculative decoding in the live engine (engine.spec_decode): greedy output equals plain greedy output token
for token, sampled output follows the target's distribution, `kvplan generate --speculative-config` prints what
the command without it prints, and bad input is refused in one line."""

from __future__ import annotations

import json
import random

import pytest
import torch

from kvplan.cli import main
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams, probabilities
from kvplan.engine.spec_decode.ngram import propose_ngram
from kvplan.engine.spec_decode.rejection import verify


def ngram(k: int, high: int = 4, low: int = 1) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": high,
                       "prompt_lookup_min": low})


def prompts(count: int = 10, seed: int = 0) -> list[list[int]]:
    """Prompts with repeats (so prompt lookup finds matches) and without."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        base = [rng.randrange(1, 500) for _ in range(rng.randrange(2, 12))]
        out.append(base * rng.randrange(1, 4) if i % 2 else base + [rng.randrange(1, 500) for _ in range(20)])
    return out


@pytest.fixture(scope="module")
def draft_dir(tiny_models, tmp_path_factory) -> str:
    """A different tiny random model with the target's vocabulary, as a draft model."""
    from kvplan.engine.models import build_random_model

    return str(build_random_model("llama", tmp_path_factory.mktemp("draft") / "draft", seed=7))


def generate(path: str, batch: list[list[int]], params: SamplingParams, **settings) -> tuple[list, LLM]:
    llm = LLM(path, dtype="float32", block_size=8, **{"max_model_len": 256, **settings})
    return [o.outputs[0].token_ids for o in llm.generate(batch, params)], llm


def chisquare_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square p-value of `observed` counts against `expected` ones (the same total)."""
    observed, expected = observed.double(), expected.double() * observed.sum() / expected.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_ngram_proposes_as_vllm():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3], 3, 1, 3) == [8, 1, 2]  # longest n, rightmost match
    assert propose_ngram([1, 2, 5, 1, 2], 3, 1, 2) == [5, 1, 2]
    assert propose_ngram([4, 5, 6], 2, 1, 2) == [6, 6]  # no match: the last token
    assert propose_ngram([7, 1, 7], 3, 1, 2) == [1, 7, 7]  # too close to the end: filled with the last token


@pytest.mark.parametrize("spec", [ngram(1), ngram(2, 2, 2), ngram(4), "draft_self", "draft_other"])
@pytest.mark.parametrize("pressure", [False, True])
def test_greedy_output_equals_plain_greedy(tiny_models, draft_dir, spec, pressure):
    target = tiny_models["tiny-llama"]
    if spec.startswith("draft"):
        model = target if spec == "draft_self" else draft_dir
        spec = json.dumps({"method": "draft_model", "model": model, "num_speculative_tokens": 3})
    batch = prompts()
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    # pressure: chunked prefill (a 16-token budget) and preemption (a cache for about two requests)
    settings = dict(num_blocks=18, max_num_batched_tokens=16, max_model_len=72) if pressure else \
        dict(num_blocks=400)
    plain, _ = generate(target, batch, params, **settings)
    spec_out, llm = generate(target, batch, params, speculative_config=spec, **settings)
    assert spec_out == plain
    stats = llm.spec_stats
    assert stats["num_draft_tokens"] > 0
    if "draft_model" in spec and target in spec:  # the target as its own draft: every draft is its argmax
        assert stats["acceptance_rate"] == 1.0
    if pressure:
        assert llm.scheduler.stats.num_preemptions > 0


def test_verify_is_exact_rejection_sampling():
    """The first emitted token follows p_0 and, given the first draft was accepted, the second follows p_1,
    whatever the drafts and their proposal distributions (chi-square at a fixed seed)."""
    torch.manual_seed(0)
    vocab, draws = 6, 6000
    logits = torch.randn(3, vocab) * 1.5
    params = SamplingParams(temperature=0.8, top_k=0)
    p = torch.stack([probabilities(row, params) for row in logits])
    q = torch.softmax(torch.randn(2, vocab), dim=-1)
    for proposal in (None, q):
        generator = torch.Generator().manual_seed(1)
        first, second = torch.zeros(vocab), torch.zeros(vocab)
        for _ in range(draws):
            drafts = [2, 4] if proposal is None else [int(torch.multinomial(q[0], 1, generator=generator)), 4]
            out = verify(logits, drafts, params, generator, proposal)
            first[out[0]] += 1
            if len(out) > 1 and out[0] == drafts[0]:
                second[out[1]] += 1
        assert chisquare_p(first, p[0]) > 1e-3
        if proposal is None:  # the second token's row: accepted draft 2 first
            assert chisquare_p(second, p[1]) > 1e-3


def test_sampled_spec_output_follows_the_target(tmp_path):
    """The second generated token (the first one verified against drafts) of many seeded requests: its
    distribution matches the plain sampler's exact probabilities, with n-gram drafts and a draft model."""
    from transformers import AutoModelForCausalLM

    from kvplan.engine.models import build_random_model

    path = str(build_random_model("llama", tmp_path / "small", seed=3, vocab_size=8))
    prompt = [1, 2, 3, 1, 2]
    params = [SamplingParams(temperature=1.0, max_tokens=3, seed=s, ignore_eos=True) for s in range(500)]
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        p1 = torch.softmax(reference(torch.tensor([prompt])).logits[0, -1], -1)
        p2 = sum(p1[t] * torch.softmax(reference(torch.tensor([[*prompt, t]])).logits[0, -1], -1) for t in range(8))
    for spec in (ngram(2, 2), json.dumps({"method": "draft_model", "model": path, "num_speculative_tokens": 2})):
        llm = LLM(path, dtype="float32", block_size=8, max_model_len=64, speculative_config=spec)
        outs = llm.generate([prompt] * len(params), params)
        counts = torch.bincount(torch.tensor([o.outputs[0].token_ids[1] for o in outs]), minlength=8).double()
        assert llm.spec_stats["num_draft_tokens"] > 0
        keep = p2 > 0.01  # chi-square needs expected counts of a few at least
        observed, expected = counts[keep], p2[keep]
        if not keep.all():  # the rare tokens pooled in one bin
            observed = torch.cat([observed, counts[~keep].sum().reshape(1)])
            expected = torch.cat([expected, p2[~keep].sum().reshape(1)])
        assert chisquare_p(observed, expected) > 1e-3


def _text_lines(out: str) -> list[str]:
    """What generate prints, less the per-request metrics lines (their times differ from run to run)."""
    return [line for line in out.splitlines() if not line.startswith("  ")]


def assert_prints_the_same_with_ngram(argv: list[str], capsys) -> None:
    """`kvplan generate ARGV` prints the same text with the issue's n-gram option, and the acceptance rate on
    stderr."""
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, '
                                                 '"prompt_lookup_max": 4}']) == 0
    captured = capsys.readouterr()
    assert _text_lines(captured.out) == _text_lines(plain)
    assert "speculative decoding: acceptance rate" in captured.err


def test_generate_prints_the_same_with_speculation_and_reports_acceptance(tiny_models, capsys):
    for batch in (prompts(4, seed=1), prompts(4, seed=2)):
        argv = ["generate", "--model", tiny_models["tiny-llama"], "--max-tokens", "48"]
        for prompt in batch:
            argv += ["--prompt-ids", " ".join(map(str, prompt))]
        assert_prints_the_same_with_ngram(argv, capsys)


@pytest.mark.parametrize(("spec", "why"), [
    ('{"method": "ngram", "num_speculative_tokens": 0}', "'num_speculative_tokens' must be an integer >= 1"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "allowed: ngram, draft_model"),
    ("vocab", "a vocabulary of 256 tokens, the target model 512"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_models, tmp_path, capsys, spec, why):
    if spec == "vocab":
        from kvplan.engine.models import build_random_model

        other = build_random_model("llama", tmp_path / "v256", seed=1, vocab_size=256)
        spec = json.dumps({"method": "draft_model", "model": str(other), "num_speculative_tokens": 2})
    assert main(["generate", "--model", tiny_models["tiny-llama"], "--prompt-ids", "1 2 3", "--max-tokens", "4",
                 "--speculative-config", spec]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (progress bars of the model's save come before it)
    assert why in last and "speculative" in last, last


def test_replay_records_drafts_per_step(tiny_models):
    from kvplan.engine.core.settings import SETTINGS  # noqa: F401 (the engine takes the setting by name)

    llm = LLM(tiny_models["tiny-llama"], dtype="float32", block_size=8, max_model_len=128,
              speculative_config=ngram(3))
    llm.add_request([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    seen = {}
    while llm.has_unfinished_requests():
        llm.step()
        for item in llm.last_step.output.scheduled:
            if item.spec_token_ids:
                seen[llm.last_step.output.step_id] = llm.last_step.update.spec[item.request_id]
    assert seen and all(verified == 3 and 0 <= accepted <= 3 for verified, accepted in seen.values())


@pytest.mark.slow
def test_smollm2_generate_with_ngram_prints_the_plain_output(capsys):
    from kvplan.engine.models import SMOLLM2

    questions = ["What is the capital of France?", "List the days of the week.", "Repeat: red green blue red green"]
    argv = ["generate", "--model", SMOLLM2, "--max-tokens", "48"]
    for question in questions:
        argv += ["--prompt", question]
    assert_prints_the_same_with_ngram(argv, capsys)
