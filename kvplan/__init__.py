"""kvplan: KV-cache capacity planning for LLM serving.

Every module is a plain submodule of this package, at the path its name says: `kvplan.engine` (the live engine
and, in `kvplan.engine.core`, the scheduler both sides run), `kvplan.sim`, `kvplan.results` (what serving a trace
produced, whoever served it), `kvplan.traces`, `kvplan.kernels`, and the application (CLI, experiments,
calibration, endpoint replay). What is not code - sample traces, profiles, the example experiments, the C++ kernel
source - lives in the repository's top-level folders (`kvplan.shipped`).
"""

__version__ = "0.1.0"
