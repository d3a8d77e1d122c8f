"""The mkdocs hook (mkdocs.yml: `hooks: [kvplan/reference/mkdocs_hook.py]`) that adds the reference pages to the
site as generated files: they exist only in the built site, and a nav entry naming `reference/settings.md`
finds them. mkdocs loads this file by its path; `kvplan` must be importable (installed, or on PYTHONPATH)."""

from __future__ import annotations

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from kvplan.reference import pages


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every reference page; a file of that name in docs/ is refused (it would hide the generated one)."""
    for path, text in pages().items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path}: the reference pages are generated from the code (kvplan.reference); "
                              "remove the file")
        files.append(File.generated(config, path, content=text))
    return files
