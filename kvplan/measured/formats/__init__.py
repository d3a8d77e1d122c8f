"""The result-file formats `kvplan validate --from-results` reads: one module each, named here once.

Each module has `TOOL` (the tool's name as the output prints it), `detect(document) -> bool` (whether a parsed
file is this format: used when `--format` is not given; the document is what `load_document` returned) and
`read(document, source) -> list[MeasuredRun]` (every run the file holds, in the file's order; a bad or partial
file raises `UserError` naming the file and the missing field). Modules are imported when used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# --format value -> module under kvplan.measured.formats
FORMATS = {
    "vllm-bench": "vllm_bench",
    "guidellm": "guidellm",
    "aiperf": "aiperf",
    "inference-perf": "inference_perf",
}


def format_module(name: str) -> ModuleType:
    """The module reading format `name` (a key of `FORMATS`)."""
    return importlib.import_module(f"{__name__}.{FORMATS[name]}")
