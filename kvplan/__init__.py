"""kvplan: KV-cache capacity planning for LLM serving.

The subsystems are `kvplan.engine` (the live engine and, in `kvplan.engine.core`, the scheduler both sides run),
`kvplan.sim`, `kvplan.traces` and `kvplan.kernels`. Installed, they are subpackages of this one (setup.py maps
them); in a source checkout they are the folders beside this package, and the finder below maps exactly those
four names onto them, so that the same imports work from a clone, an editable install and the wheel.
"""

import sys as _sys
from importlib.util import spec_from_file_location as _spec_from_file_location
from pathlib import Path as _Path

__version__ = "0.1.0"

SUBSYSTEMS = ("engine", "kernels", "sim", "traces")


class _CheckoutFinder:
    """`kvplan.<subsystem>` -> `<checkout>/<subsystem>/` when the package is not installed with them inside."""

    root = _Path(__file__).resolve().parent.parent

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: object = None):
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in SUBSYSTEMS:
            return None
        folder = cls.root / name
        return _spec_from_file_location(fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


if not (_Path(__file__).parent / "engine").is_dir() and (_CheckoutFinder.root / "engine" / "core").is_dir():
    # first, so that a checkout's subsystems win over an editable install of another checkout (a git worktree
    # run with PYTHONPATH=<worktree> beside the main checkout's install would otherwise import the main `sim`)
    _sys.meta_path.insert(0, _CheckoutFinder)
