"""Azure LLM inference traces, 2023 and 2024: `TIMESTAMP,ContextTokens,GeneratedTokens`.

2023 writes wall-clock strings with 7 fractional digits (`2023-11-16 18:17:03.9799600`); 2024 writes ISO 8601
with a zone and drops the fraction on whole seconds (`2024-05-10 00:00:00+00:00`). Both parse the same way.
"""

from traces.loaders.spec import Field, csv_format

AZURE = csv_format(
    "azure",
    (Field("arrival_s", "TIMESTAMP", kind="datetime"),
     Field("prompt_tokens", "ContextTokens", minimum=1),
     Field("output_tokens", "GeneratedTokens")),
    "Azure LLM inference trace 2023/2024 CSV",
)
