"""The docs site's reference pages, generated from the code's own tables when the site is built.

Each page is a function of the declarations it describes (the settings registry, the argument parsers, the
experiment schema, the summary keys and result columns, the built-in models and GPUs), read when it is called,
so a setting, flag, key, metric, model or GPU added in code is on the next build's page; the pages are never
committed: mkdocs builds them through `mkdocs_hook` (named in mkdocs.yml's `hooks:`), and
`python -m kvplan.reference OUTDIR` writes them to a folder to read. Nothing here imports mkdocs except the hook
module (the light install has no mkdocs).
"""

from __future__ import annotations

from collections.abc import Callable

from kvplan.reference.cli_page import cli_page
from kvplan.reference.metrics_page import metrics_page
from kvplan.reference.schema_page import schema_page
from kvplan.reference.settings_page import settings_page
from kvplan.reference.specs_page import hardware_page, models_page

# The docs path of each page (mkdocs.yml's nav names these) -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_page,
    "reference/cli.md": cli_page,
    "reference/schema.md": schema_page,
    "reference/metrics.md": metrics_page,
    "reference/models.md": models_page,
    "reference/hardware.md": hardware_page,
}


def pages() -> dict[str, str]:
    """Docs path -> markdown, for every reference page, as the code stands now."""
    return {path: write() for path, write in PAGES.items()}
