"""Prefill/decode disaggregation on the live engine: the `--kv-transfer-config` setting (vLLM 0.34's names), the
KV transport between a prefill and a decode process, and the proxy that routes a request through both.

`config` imports only the standard library (the simulator may read the same setting); the transport imports torch.
"""
