"""Speculative decoding in the live engine: proposers (`ngram`, `draft_model`) and the verifier (`rejection`).

The scheduler core schedules the drafts (`engine.core.spec_steps`); the runner computes logits at every verified
position of a request (its last verified token and each draft); `rejection.verify` turns those rows into the
tokens the step emits, exactly as the target model alone would sample them.
"""
