"""First-use caches kvplan relies on, kept usable after an interrupted, concurrent or impossible first use.

What is built or cached on first use, and what can break each (issue 34):

* the CPU decode kernel (torch's extension loader, `TORCH_EXTENSIONS_DIR`): stale locks, bounded builds and
  corrupt libraries are `engine.backends.kernel_build`'s; its folder is chosen here.
* built-in models (`KVPLAN_CACHE`, the smollm2 GGUF conversion and the random models): published by one
  `os.replace`, checked on every use (`engine.model_files`); the folder is chosen here.
* Triton's kernel cache (`TRITON_CACHE_DIR`, default `$TRITON_HOME/.triton/cache`), on a GPU only: Triton writes
  each file into a temporary directory and `os.replace`s it, takes no lock, and recompiles when a group file
  does not parse, so an interrupted or concurrent compile leaves no partial entry, only a `tmp.pid_*` directory
  (removed here once old). A cache it cannot create fails the first kernel launch, after the model loaded.
  Under `TRITON_INTERPRET=1` (CPU) Triton compiles and caches nothing.
* matplotlib's font list (`MPLCONFIGDIR`, default `~/.cache/matplotlib`): written under a lock file that a
  killed process leaves behind; every later plot then waits 5 s, rebuilds the list and warns in four lines.
* Hugging Face caches: kvplan loads with `local_files_only` and builds its random models from configs, so
  nothing is fetched or cached there.

A cache directory that cannot be written is replaced, for this process and its children (the environment
variable is set), by a private per-user one under the temporary directory, with one line saying so; it is kept
across runs, so a fallback cache is still a cache.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

STALE_TMP_S = 3600.0  # a temporary build directory this old belongs to a killed process
MPL_LOCK_STALE_S = 60.0  # matplotlib builds its font list in seconds, and waits only 5 s for a lock


def say(line: str) -> None:
    print(f"kvplan: {line}", file=sys.stderr, flush=True)


def unwritable_reason(folder: Path) -> str | None:
    """None when `folder` exists (or can be created) and a file can be created in it, else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvplan-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def private_dir(what: str) -> Path:
    """A per-user directory for `what` under the temporary directory: reused while it is this user's own real
    directory (never a link or another user's: /tmp is shared), else a fresh one."""
    folder = Path(tempfile.gettempdir()) / f"kvplan-{os.getuid()}-{what}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and unwritable_reason(folder) is None:
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"kvplan-{what}-"))


@functools.cache
def usable_dir(folder: Path, what: str, env: str, slug: str) -> Path:
    """`folder` if it can be written, else a private fallback, said once per process; `env` is set to the
    fallback so that children (a build child, a worker) and the library reading it use it too."""
    reason = unwritable_reason(folder)
    if reason is None:
        return folder
    fallback = private_dir(slug)
    os.environ[env] = str(fallback)
    say(f"the {what} cache {folder} is not writable ({reason}); using {fallback} instead (set {env} to a "
        "writable directory to keep it)")
    return fallback


def remove_stale(paths: Iterable[Path], older_than_s: float, what: str) -> list[Path]:
    """Remove the files or directories in `paths` last touched more than `older_than_s` ago, one line each."""
    removed = []
    now = time.time()
    for path in paths:
        try:
            age = now - path.lstat().st_mtime
            if age < older_than_s:
                continue
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except FileNotFoundError:  # a concurrent process finished (or cleared) it meanwhile
            continue
        except OSError as exc:
            say(f"could not remove {what} {path} ({exc.strerror or exc})")
            continue
        say(f"removed {what} {path} ({age:.0f} s old, left by an interrupted process)")
        removed.append(path)
    return removed


def torch_extensions_dir() -> Path:
    """The root torch builds extensions under, made writable (TORCH_EXTENSIONS_DIR or torch's default)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        root = Path(env)
    else:
        from torch.utils.cpp_extension import get_default_build_root

        root = Path(get_default_build_root())
    return usable_dir(root, "torch extension", "TORCH_EXTENSIONS_DIR", "torch-extensions")


def model_cache_dir(folder: Path) -> Path:
    """The built-in models' cache, made writable (KVPLAN_CACHE or ~/.cache/kvplan/models)."""
    return usable_dir(folder, "model", "KVPLAN_CACHE", "models")


def prepare_triton() -> Path | None:
    """Before Triton's first compile on a GPU: a writable cache, and no temporary directories of killed compiles
    piling up. Nothing under TRITON_INTERPRET=1, where Triton writes nothing."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    env = os.environ.get("TRITON_CACHE_DIR")
    home = Path(os.environ.get("TRITON_HOME") or Path.home())
    folder = usable_dir(Path(env) if env else home / ".triton" / "cache", "Triton kernel", "TRITON_CACHE_DIR",
                        "triton")
    remove_stale(folder.glob("*/tmp.pid_*"), STALE_TMP_S, "an unfinished Triton cache entry")
    return folder


def prepare_matplotlib() -> Path | None:
    """Before the first `import matplotlib`: writable config and cache directories (else matplotlib makes a new
    temporary one per run, rebuilds its font list each time and warns), and no font-list lock a killed process
    left. Returns the cache directory."""
    if "matplotlib" in sys.modules:  # already set up in this process
        return None
    env = os.environ.get("MPLCONFIGDIR")
    if env:
        folder = usable_dir(Path(env), "matplotlib", "MPLCONFIGDIR", "matplotlib")
    else:
        try:
            home = Path.home()
        except RuntimeError:  # no home directory at all
            home = Path("/nonexistent")
        config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib"
        folder = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib"
        broken = next((f for f in (config, folder) if unwritable_reason(f) is not None), None)
        if broken is not None:  # one setting moves both: a config dir matplotlib cannot create is a fallback too
            folder = usable_dir(broken, "matplotlib", "MPLCONFIGDIR", "matplotlib")
    remove_stale(folder.glob("*.matplotlib-lock"), MPL_LOCK_STALE_S, "a stale matplotlib font-cache lock")
    return folder
