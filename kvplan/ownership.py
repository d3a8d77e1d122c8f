"""What kvplan may replace or remove, decided by what it wrote there and never by a name.

* A **result set** is a directory whose `manifest.json` kvplan wrote: every file with its size and SHA-256.
  Replacing one removes exactly the listed files (and the manifest); anything else in it (a user's notes, a
  symbolic link, a listed file edited since) makes the replacement refuse, one line, before any work.
* A **staging directory** (`.OUT.<pid>.<tag>.tmp` while a set is built, `.OUT.<pid>.<tag>.old` while one is
  swapped out, `OUT.partial` of an experiment) carries a marker file kvplan wrote inside it (`MARKER`: a small
  JSON naming kvplan, the purpose, the pid and the output it belongs to). Cleanup of a killed process's leftovers
  reads the marker: a user's folder named like `.out.123.old` has none and is never touched.
* A symbolic link given as an output is followed (the set is published at its target); a dangling one is refused.
  Nothing is removed through a link: the walks below never follow one.
* Each command's outputs are checked against its inputs and one another (`check_paths`) before anything runs.

A leaf beside `kvplan.output` (which re-exports what commands use): it imports only the standard library,
`kvplan.errors` and `kvplan.strict_json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvplan.errors import UserError
from kvplan.errors import short_repr as short
from kvplan.strict_json import loads

MANIFEST = "manifest.json"
MARKER = ".kvplan-staging.json"
PURPOSES = ("tmp", "old", "partial")
_SHA256_HEX = 64
_KEEP = "nothing was removed"


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks (a trace or a result table may be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, dict]:
    """The files `folder/manifest.json` lists (relative path -> {bytes, sha256}), each checked to be a plain
    relative path inside `folder`; a missing, unreadable or malformed manifest is a UserError naming the file and
    what is wrong (the caller says what to do)."""
    path = folder / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{folder}: no {MANIFEST}: not a complete result set") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        doc = loads(text)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("kvplan_version"), str) \
            or not isinstance(doc.get("files"), list):
        raise UserError(f"{path}: not a kvplan manifest (an object with kvplan_version and a files list)")
    listed: dict[str, dict] = {}
    for i, entry in enumerate(doc["files"]):
        name = entry.get("path") if isinstance(entry, dict) else None
        size = entry.get("bytes") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        plain = isinstance(name, str) and name and not name.startswith("/") and ".." not in name.split("/") \
            and "\\" not in name and name != MANIFEST
        if not (plain and isinstance(size, int) and not isinstance(size, bool) and size >= 0
                and isinstance(digest, str) and len(digest) == _SHA256_HEX):
            raise UserError(f"{path}: files[{i}] is {short(entry, 40)}; expected path (inside the set), bytes, sha256")
        listed[name] = entry
    return listed


def entries_under(folder: Path) -> tuple[list[str], list[str]]:
    """Every non-directory entry under `folder` (files, links, sockets; relative paths) and every directory,
    deepest first; a link to a directory counts as an entry, never descended."""
    entries, dirs = [], []
    for root, subdirs, files in os.walk(folder, topdown=False, followlinks=False):
        rel = Path(root).relative_to(folder)
        for name in subdirs:
            if (Path(root) / name).is_symlink():
                entries.append(str(rel / name))
        for name in files:
            entries.append(str(rel / name))
        if Path(root) != folder:
            dirs.append(str(rel))
    return entries, dirs


def owned_files(folder: Path, flag: str, *, changed_ok: bool = False) -> list[str] | None:
    """The files kvplan may remove to replace `folder`: None when it does not exist, [] when it is empty, else the
    files its manifest lists that are there. Refuses (UserError, nothing removed) a directory kvplan did not
    write, one holding anything its manifest does not list, and (unless `changed_ok`) a listed file that was
    changed since (a user's edit of a result is theirs now)."""
    if not folder.exists() and not folder.is_symlink():
        return None
    try:
        entries, dirs = entries_under(folder)
        first = next(folder.iterdir(), None)
    except OSError as exc:
        raise UserError(f"{flag}: {folder}: cannot be listed ({exc.strerror}); allowed: a new or empty directory, "
                         "or an earlier kvplan result set") from None
    if first is None:
        return []
    if MANIFEST not in entries:
        raise UserError(f"{flag}: {folder} is a directory kvplan did not write (it holds {first.name!r} and no "
                         f"kvplan {MANIFEST}); {_KEEP}; allowed: a new or empty directory, or an earlier kvplan "
                         "result set (only the files it lists are replaced)")
    try:
        listed = read_manifest(folder)
    except UserError as exc:
        raise UserError(f"{flag}: {exc}; {_KEEP}; allowed: another {flag}, or move this directory away") from None
    extra = sorted(name for name in set(entries) - set(listed) if not kvplans_own(folder, name, listed))
    holding = {str(parent) for name in listed for parent in Path(name).parents}
    extra += sorted(name for name in dirs if name not in holding)  # a folder of the user's, even an empty one
    if extra:
        raise UserError(f"{flag}: {folder} holds {extra[0]!r}" + (f" and {len(extra) - 1} more" if len(extra) > 1
                        else "") + f", which kvplan did not write (not in its {MANIFEST}); {_KEEP}; allowed: move "
                        "what you added out of the set, or another --out")
    present = [name for name in listed if name in set(entries)]
    for name in present:
        path = folder / name
        if not path.is_file() or path.is_symlink():
            raise UserError(f"{flag}: {path} is no longer the regular file kvplan wrote; {_KEEP}; allowed: move it "
                             "out of the set, or another --out")
        if not changed_ok and (path.stat().st_size != listed[name]["bytes"]
                               or file_sha256(path) != listed[name]["sha256"]):
            raise UserError(f"{flag}: {path} was changed since kvplan wrote it (it does not match {MANIFEST}); "
                             f"{_KEEP}; allowed: move your version out of the set, or another --out")
    return present


def kvplans_own(folder: Path, name: str, listed: Mapping[str, object]) -> bool:
    """`name` is kvplan's although `folder`'s manifest does not list it: the manifest itself, the staging marker,
    or a nested set's manifest whose files the outer one lists (sets written before nested manifests were listed)."""
    if name in (MANIFEST, MARKER):
        return True
    inner = Path(name)
    if inner.name != MANIFEST:
        return False
    try:
        files = read_manifest(folder / inner.parent)
    except UserError:
        return False
    return all(str(inner.parent / f) in listed for f in files)


def remove_listed(folder: Path, files: Iterable[str]) -> bool:
    """Remove `files` (relative, checked by `owned_files`), the manifest and the marker, then every directory
    left empty; True when `folder` itself is gone. What else appeared meanwhile stays, and so does the folder."""
    files = list(files)
    entries, _ = entries_under(folder)
    nested = [name for name in entries if name not in files and name != MANIFEST and Path(name).name == MANIFEST
              and kvplans_own(folder, name, dict.fromkeys(files))]  # a set written before these were listed
    for name in [*files, *nested, MANIFEST, MARKER]:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    _, dirs = entries_under(folder)
    for name in [*dirs, "."]:
        with contextlib.suppress(OSError):  # not empty: something kvplan did not write is in it
            (folder / name).rmdir()
    return not folder.exists()


def write_marker(folder: Path, purpose: str, out: Path) -> None:
    """Mark `folder` as kvplan's staging for `out` (see the module's docstring)."""
    doc = {"kvplan": "staging", "purpose": purpose, "pid": os.getpid(), "out": out.name}
    (folder / MARKER).write_text(json.dumps(doc))


def drop_marker(folder: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER).unlink()


def read_marker(folder: Path) -> dict | None:
    """`folder`'s staging marker, or None when it has none (or one kvplan did not write): a real directory only."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    try:
        doc = loads((folder / MARKER).read_bytes())
    except (OSError, ValueError):
        return None
    ok = (isinstance(doc, dict) and doc.get("kvplan") == "staging" and doc.get("purpose") in PURPOSES
          and isinstance(doc.get("pid"), int) and isinstance(doc.get("out"), str))
    return doc if ok else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or a number no process has: not ours to judge as dead
    return True


def remove_stale_siblings(out: Path) -> None:
    """Staging directories a killed process left beside `out`: only those whose marker names `out`, a purpose
    this module gives and a process that no longer runs. A set swapped out (`old`) loses its listed files only."""
    try:
        siblings = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    except OSError:
        return
    for sibling in siblings:
        marker = read_marker(sibling)
        if marker is None or marker["out"] != out.name or alive(marker["pid"]):
            continue
        if marker["purpose"] == "tmp":
            shutil.rmtree(sibling, ignore_errors=True)  # a private directory this module made and filled
        elif marker["purpose"] == "old":
            discard(sibling)


def discard(old: Path) -> None:
    """A replaced set moved aside: its listed files go; anything that appeared in it meanwhile stays (unmarked, so
    that no cleanup ever takes it for kvplan's)."""
    try:
        files = list(read_manifest(old))
    except UserError:
        files = []
    if not remove_listed(old, files):
        drop_marker(old)


def resolve_out(path: Path, flag: str = "--out") -> Path:
    """`path`, or the directory its symbolic link points to: a set is published at a link's target, never over
    the link. A dangling link is refused (following it would create a directory wherever it points)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.exists():
        raise UserError(f"{flag}: {path} is a symbolic link to {target}, which does not exist; allowed: a link to "
                         "an existing directory, or a plain path")
    return target


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _same(a: Path, b: Path) -> bool:
    try:
        return a == b or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return a == b


def _relation(a: Path, b: Path) -> str | None:
    """How path `a` (resolved) overlaps `b`: the same file, inside it, or holding it; None when apart."""
    if _same(a, b):
        return "is"
    if b in a.parents:
        return "is inside"
    if a in b.parents:
        return "holds"
    return None


def check_paths(inputs: Mapping[str, str | Path | None], outputs: Mapping[str, str | Path | None]) -> None:
    """Before any work: no output is (or is inside, or holds) one of the command's inputs, and no two outputs
    overlap, links and hard links resolved. Keys name each path as the user gave it (a flag, or `--out (its plot)`).
    An input that is not there (`sample:chat`, a name the command resolves) cannot be overwritten: skipped."""
    ins = [(flag, path, _real(path)) for flag, path in inputs.items()
           if path is not None and str(path) and os.path.lexists(path)]
    outs = [(flag, path, _real(path)) for flag, path in outputs.items() if path is not None and str(path)]
    for i, (flag, path, real) in enumerate(outs):
        for other, other_path, other_real in ins:
            how = _relation(real, other_real)
            if how is not None:
                raise UserError(f"{flag}: {path} {how} the input {other} {other_path}; allowed: an output path "
                                 "apart from the inputs of the command (nothing was written)")
        for other, other_path, other_real in outs[:i]:
            how = _relation(real, other_real)
            if how is not None:
                raise UserError(f"{flag}: {path} {how} {other} {other_path}; allowed: outputs at distinct paths, "
                                 "neither inside the other (nothing was written)")
