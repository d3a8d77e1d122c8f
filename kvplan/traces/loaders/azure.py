"""Azure LLM inference traces, 2023 and 2024: `TIMESTAMP,ContextTokens,GeneratedTokens`; and the 2025
multimodal (LMM) trace: `TIMESTAMP,NumImages,ContextTokens,GeneratedTokens`, shipped as `.csv.gz`.

2023 writes wall-clock strings with 7 fractional digits (`2023-11-16 18:17:03.9799600`); 2024 writes ISO 8601
with a zone and drops the fraction on whole seconds (`2024-05-10 00:00:00+00:00`); 2025 writes ISO 8601 in UTC
with milliseconds (`2024-10-15T12:00:00.269Z`). All parse the same way.
"""

from __future__ import annotations

import numpy as np

from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.loaders.spec import Field, csv_format
from kvplan.traces.schema import LoadReport

_FIELDS = (Field("arrival_s", "TIMESTAMP", kind="datetime"),
           Field("prompt_tokens", "ContextTokens", minimum=1),
           Field("output_tokens", "GeneratedTokens"))

AZURE = csv_format("azure", _FIELDS, "Azure LLM inference trace 2023/2024 CSV")


def _images(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> None:
    """Images are not modelled: say how many requests carried them, so the replay's text-only load is explicit."""
    images = columns.pop("_images")
    with_images = rows.ok() & (images > 0)
    if with_images.any():
        report.notes.append(f"NumImages is not modelled: {int(with_images.sum())} requests carry "
                            f"{int(images[with_images].sum())} images; their ContextTokens are replayed as text")


AZURE_MULTIMODAL = csv_format(
    "azure-multimodal", (*_FIELDS, Field("_images", "NumImages")),
    "Azure LMM (multimodal) inference trace 2025 CSV (NumImages noted, not modelled)", adjust=_images,
)
