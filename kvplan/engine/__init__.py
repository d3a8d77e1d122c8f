"""The live paged-KV inference engine.

`engine.core` (the scheduler, block pool, KV manager and eviction policies) is pure Python and is shared with
the simulator; importing this package must therefore stay free of torch. Torch-backed parts live in submodules
that are imported explicitly.
"""
