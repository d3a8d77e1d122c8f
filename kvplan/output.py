"""Printing results: one JSON object for `--json`, aligned text tables otherwise; atomic file writes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path


def strict(obj: object) -> object:
    """`obj` with every non-finite float (NaN, ±inf: a latency with no samples, an error over a zero) as None,
    so that the JSON written is strict (RFC 8259 has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(v) for v in obj]
    return obj


def json_text(obj: object) -> str:
    return json.dumps(strict(obj), indent=2, allow_nan=False)


def json_line(obj: object) -> str:
    """One compact strict-JSON line (JSON Lines files)."""
    return json.dumps(strict(obj), separators=(",", ":"), allow_nan=False)


def print_json(obj: object) -> None:
    print(json_text(obj))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in text]
    return "\n".join(lines)


def current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: a crash never leaves a half-written result. The
    file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


MANIFEST = "manifest.json"


@contextlib.contextmanager
def atomic_dir(out: str | Path, config: object = None) -> Iterator[Path]:
    """Build a result directory in a temporary sibling and swap it in whole on success: a crash leaves the old
    result set (or none), never a mix of old and new files.

    The last file written is `manifest.json` (every file with its size and SHA-256, the configuration and its
    hash, the kvplan version): a directory without one is not a complete result set. Between the two renames
    there is, for an instant, no set at OUT at all; never a mixed one.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_siblings(out)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp"))
    tmp.chmod(0o777 & ~current_umask())  # as mkdir would make it, not mkdtemp's private 0700
    try:
        yield tmp
        write_manifest(tmp, config)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(tmp, out)


def publish(staging: Path, out: Path) -> None:
    """Swap a finished staging directory in as `out`, replacing whatever was there."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(folder: Path, config: object = None) -> dict:
    """`manifest.json` in `folder`: what a reader checks to know the set is complete and whose it is."""
    from kvplan import __version__

    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    config_text = json.dumps(strict(config), sort_keys=True, default=str)
    manifest = {
        "kvplan_version": __version__, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config_sha256": hashlib.sha256(config_text.encode()).hexdigest(), "config": strict(config),
        "files": [{"path": str(p.relative_to(folder)), "bytes": p.stat().st_size,
                   "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in files],
    }
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2, default=str, allow_nan=False))
    return manifest


def verify_result_set(folder: str | Path) -> dict:
    """The manifest of a complete result set, after checking that every file it lists is there with its size and
    hash and that nothing else is; raises ValueError naming what is wrong (no manifest: an incomplete set)."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"{folder}: no {MANIFEST}: not a complete result set") from None
    listed = {f["path"]: f for f in manifest["files"]}
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
    if present != set(listed):
        raise ValueError(f"{folder}: files differ from {MANIFEST}: {sorted(present ^ set(listed))[:5]}")
    for name, entry in listed.items():
        data = (folder / name).read_bytes()
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"{folder}: {name} does not match {MANIFEST}")
    return manifest


def _remove_stale_siblings(out: Path) -> None:
    """Staging and old directories that a killed process left beside `out` (their pid no longer runs)."""
    for sibling in out.parent.glob(f".{out.name}.*"):
        parts = sibling.name[len(out.name) + 2:].split(".")
        if sibling.is_dir() and parts[0].isdigit() and not _alive(int(parts[0])):
            shutil.rmtree(sibling, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Before any work: `path` can become a result directory (it is not a file, and its parent can be made)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag}: {path} exists and is not a directory; allowed: a directory path (a result set "
                         "is replaced whole)")
    _check_parent(path, flag)


def check_out_file(path: str | Path, flag: str = "--out") -> None:
    """Before any work: `path` can be written as a regular file (not a directory, a device or /dev/null)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ValueError(f"{flag}: {path} is {kind}; allowed: a regular file path")
    _check_parent(path, flag)


def _check_parent(path: Path, flag: str) -> None:
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag}: {path}: {parent} is not a directory; allowed: a path under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: {path}: {parent} is not writable; allowed: a path you may write")
