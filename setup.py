"""The package layout on install (everything else is in pyproject.toml).

The repository keeps its subsystems as top-level folders - `engine/`, `kernels/`, `sim/`, `traces/` beside the
`kvplan/` application package - but a wheel adds exactly one top-level name: each folder is installed as a
subpackage of `kvplan` (`kvplan.engine`, ...). In a source checkout `kvplan/__init__.py` finds the folders beside it.
"""

from setuptools import find_packages, setup

SUBSYSTEMS = ("engine", "kernels", "sim", "traces")  # as kvplan.SUBSYSTEMS (not imported: setup runs before install)

packages = find_packages(include=["kvplan", "kvplan.*"])
for name in SUBSYSTEMS:
    packages += [f"kvplan.{p}" for p in find_packages(include=[name, f"{name}.*"])]

setup(packages=packages, package_dir={"kvplan": "kvplan", **{f"kvplan.{name}": name for name in SUBSYSTEMS}})
