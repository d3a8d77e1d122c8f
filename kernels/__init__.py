"""Triton kernels for paged KV and their torch reference implementations."""
