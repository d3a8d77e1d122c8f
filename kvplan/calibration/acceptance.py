"""Draft acceptance measured on a text corpus (`kvplan calibrate --speculative-config JSON --acceptance-corpus
FILE`), for the profile's `speculative` section that the simulator's `sim.spec_decode.acceptance_model` reads.

The live engine generates a continuation of every prompt of the corpus with the speculative configuration, and
every verification the engine runs is counted by (drafts verified, drafts accepted) - the scheduler's per-step
`UpdateOutput.spec`, what a replay's step records hold (`sim.spec_decode.verification_counts`). How often drafts
are accepted depends on the text (prompt lookup finds repeats in code and lists, not in prose) and on sampling,
so the corpus and the temperature are stated in the section.

Corpus: a UTF-8 text file; prompts are its paragraphs (blocks of lines separated by blank lines), each cut to its
last tokens that fit max_model_len with the generated ones. A model without a tokenizer (the tiny test models)
reads a paragraph's UTF-8 bytes, modulo its vocabulary, as token ids: repeats in the text stay repeats.
"""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import UserError

MAX_MODEL_LEN = 1024


def read_corpus(path: Path) -> list[str]:
    """The corpus's prompts: its paragraphs (see the module), in order."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--acceptance-corpus: {path}: cannot read it ({exc}); allowed: a UTF-8 text file") from None
    paragraphs = [" ".join(line.strip() for line in block.splitlines()).strip() for block in text.split("\n\n")]
    prompts = [p for p in paragraphs if p]
    if not prompts:
        raise UserError(f"--acceptance-corpus: {path}: no prompt in it; allowed: a text file of paragraphs "
                        "separated by blank lines")
    return prompts


def tokenize(llm, prompt: str) -> list[int]:
    """The prompt's token ids: the model's tokenizer, else its bytes (see the module)."""
    if llm.tokenizer is None:
        return [b % llm.loaded.vocab_size for b in prompt.encode()]
    return llm.encode(prompt)


def measure_acceptance(model: str, speculative_config: str, corpus: Path, *, dtype: str, seed: int,
                       temperature: float, max_tokens: int) -> tuple[dict, dict]:
    """Generate from every prompt of `corpus` on the live engine; returns the `speculative` section
    (`sim.spec_decode.measured_section`) and the engine's speculative counters (`LLM.spec_stats`)."""
    from kvplan.engine.llm import LLM
    from kvplan.engine.sampling import SamplingParams
    from kvplan.sim.spec_decode import measured_section, verification_counts

    prompts = read_corpus(corpus)
    llm = LLM(model, dtype=dtype, seed=seed, speculative_config=speculative_config, max_model_len=MAX_MODEL_LEN)
    try:
        config = llm.scheduler.config.speculative
        if config is None:  # (engine_options parses the JSON; a config that turns nothing on)
            raise UserError("--speculative-config: no proposer; allowed: a JSON object with method ngram or "
                            "draft_model")
        room = MAX_MODEL_LEN - max_tokens - config.num_speculative_tokens - 1
        for k, prompt in enumerate(prompts):
            tokens = tokenize(llm, prompt)[-room:]
            llm.add_request(tokens, SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                                   seed=seed + k))
        updates: list = []  # the steps' UpdateOutput
        while llm.has_unfinished_requests():
            llm.step()
            trace = llm.last_step  # (a step that ran nothing leaves the previous one there: counted once)
            if trace is not None and (not updates or trace.update is not updates[-1]):
                updates.append(trace.update)
        stats = llm.spec_stats
    finally:
        llm.close()
    counts = verification_counts(updates)
    if not counts:
        raise UserError(f"--acceptance-corpus: {corpus}: the engine verified no drafts on it; allowed: a corpus "
                        "the proposer finds drafts in (prompt lookup needs repeated n-grams)")
    label = (f"{corpus.name}: {len(prompts)} prompts, {max_tokens} tokens each, temperature {temperature:g}, "
             f"{model}")
    return measured_section(config.method, config.num_speculative_tokens, counts, label), stats
