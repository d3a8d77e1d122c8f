"""Printing results: one JSON object for `--json`, aligned text tables otherwise; atomic file writes."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from kvplan import strict_json
from kvplan.errors import UserError
from kvplan.errors import short_repr as short
from kvplan.ownership import (
    MANIFEST,
    MARKER,
    check_paths,
    discard,
    drop_marker,
    entries_under,
    kvplans_own,
    owned_files,
    read_manifest,
    remove_stale_siblings,
    resolve_out,
    write_marker,
)

__all__ = ["MANIFEST", "MARKER", "atomic_dir", "check_out_dir", "check_out_file", "check_paths", "check_replaceable",
           "format_table", "is_result_set", "json_line", "json_text", "print_json", "publish", "safe_name", "strict",
           "verify_result_set", "write_atomic", "write_manifest"]


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
    file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's private 0600. A symbolic
    link is followed (its target is written), never replaced by a file."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
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


@contextlib.contextmanager
def atomic_dir(out: str | Path, config: object = None) -> Iterator[Path]:
    """Build a result directory in a temporary sibling and swap it in whole on success: a crash leaves the old
    result set (or none), never a mix of old and new files.

    The last file written is `manifest.json` (every file with its size and SHA-256, the configuration and its
    hash, the kvplan version): a directory without one is not a complete result set. Between the two renames
    there is, for an instant, no set at OUT at all; never a mixed one. The temporary sibling carries kvplan's
    staging marker (`ownership.MARKER`), so that a killed process's leftovers are recognised by it, not by name.
    """
    out = resolve_out(Path(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(out)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp"))
    try:
        write_marker(tmp, "tmp", out)
        tmp.chmod(0o777 & ~current_umask())  # as mkdir would make it, not mkdtemp's private 0700
        yield tmp
        write_manifest(tmp, config)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(tmp, out)


def publish(staging: Path, out: Path, flag: str = "--out") -> None:
    """Swap a finished staging directory in as `out`, replacing an earlier result set (only the files its manifest
    lists: anything else there refuses the swap, and the new set stays at `staging`).

    Another process may publish into `out` at the same moment (two runs into one --out): the swap is retried
    while `out` comes and goes under it, so one of them ends up there whole; the loser says what happened."""
    out = resolve_out(out, flag)
    for _ in range(_PUBLISH_TRIES):
        try:  # again now: files may have appeared since the check before the work
            present = owned_files(out, flag)
        except UserError as exc:
            raise UserError(f"{exc}; the complete set of this run is left at {staging}") from None
        old = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.old")
        try:
            if present is not None:
                write_marker(out, "old", out)
                os.replace(out, old)
            os.replace(staging, out)
        except FileNotFoundError:  # the other process moved `out` away between our look and our rename
            continue
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if old.exists():  # the earlier set we moved aside: superseded by the other's, or given its place back
                if out.exists():
                    discard(old)
                else:
                    os.replace(old, out)
                    drop_marker(out)
            continue
        drop_marker(out)
        if present is not None:
            discard(old)
        return
    raise UserError(f"{flag}: {out}: another kvplan process kept replacing this result set while this one "
                     f"published; this run's complete set is left at {staging} (until the next run into it); "
                     "allowed: one run at a time per output directory")


_PUBLISH_TRIES = 20


def is_result_set(path: Path) -> bool:
    """`path` holds a result set kvplan wrote: a real directory whose manifest.json is kvplan's."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        read_manifest(path)
    except UserError:
        return False
    return True


def check_replaceable(path: Path, flag: str = "--out") -> None:
    """A result set replaces `path`, so `path` must hold nothing kvplan did not write: it is absent, empty, or an
    earlier result set holding exactly the files its manifest lists, unchanged. Anything else is refused, never
    emptied (`ownership.owned_files`)."""
    owned_files(resolve_out(path, flag), flag)


def write_manifest(folder: Path, config: object = None) -> dict:
    """`manifest.json` in `folder`: what a reader checks to know the set is complete and whose it is (every file
    but the manifest itself and the staging marker, which leaves with the staging)."""
    from kvplan import __version__

    files = sorted(p for p in folder.rglob("*") if p.is_file() and str(p.relative_to(folder)) not in (MANIFEST, MARKER))
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
    hash and that nothing else is; a UserError names the file and what is wrong (no manifest: an incomplete set)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a directory; allowed: a result set (the --out of simulate, replay, validate "
                         "or run)")
    again = "allowed: rerun the command that wrote it"
    try:
        listed = read_manifest(folder)
    except UserError as exc:
        raise UserError(f"{exc}; {again}") from None
    try:
        entries, dirs = entries_under(folder)
    except OSError as exc:
        raise UserError(f"{folder}: cannot be listed ({exc.strerror})") from None
    present = {name for name in entries if name in listed or not kvplans_own(folder, name, listed)}
    holding = {str(parent) for name in listed for parent in Path(name).parents}
    present |= {name + "/" for name in dirs if name not in holding}  # a folder kvplan did not make
    if present != set(listed):
        differ = sorted(present ^ set(listed))
        raise UserError(f"{folder}: files differ from {MANIFEST}: {differ[:5]}" + (" ..." if len(differ) > 5 else "")
                        + f" (the set is incomplete or was changed); {again}")
    for name, entry in listed.items():
        path = folder / name
        if path.is_symlink() or not path.is_file():
            raise UserError(f"{path} is not the regular file {MANIFEST} lists; {again}")
        data = path.read_bytes()
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise UserError(f"{path} does not match {MANIFEST} ({len(data)} bytes, {entry['bytes']} listed; "
                             f"changed or truncated since kvplan wrote it); {again}")
    doc = strict_json.loads((folder / MANIFEST).read_bytes())
    assert isinstance(doc, dict)  # read_manifest has read it as one
    return doc


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_name(value: str, where: str) -> str:
    """A name from a user's file that becomes a file or directory under --out: one plain path component, so it
    can never leave --out (no `/`, no `..`, no leading dot or dash)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise UserError(f"{where}: {short(value)} cannot name a folder under --out; allowed: 1-100 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit (no '/' or '..')")
    return value


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Before any work: `path` can become a result directory (it is not a file, a link to one follows it, its
    parent can be made, and nothing kvplan did not write is in it)."""
    path = resolve_out(path, flag)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {path} exists and is not a directory; allowed: a directory path (a result set "
                         "is replaced whole)")
    check_replaceable(path, flag)
    _check_parent(path, flag)


def check_out_file(path: str | Path, flag: str = "--out") -> None:
    """Before any work: `path` can be written as a regular file (not a directory, a device or /dev/null)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise UserError(f"{flag}: {path} is {kind}; allowed: a regular file path")
    _check_parent(path, flag)


def _check_parent(path: Path, flag: str) -> None:
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag}: {path}: {parent} is not a directory; allowed: a path under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: {path}: {parent} is not writable; allowed: a path you may write")
