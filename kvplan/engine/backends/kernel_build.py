"""Building a torch C++ extension visibly, once, and never waiting forever.

torch's extension loader (`torch.utils.cpp_extension.load`) takes a `lock` file in the build folder on every
call, builds silently for minutes the first time, and waits without end on a `lock` that a killed process left
behind (`file_baton.wait`). Here:

* kvplan's own lock is an `flock` on `kvplan.lock` beside torch's: the kernel drops it when its holder dies, so
  it can never be stale. Whoever holds it is the only kvplan process inside torch's loader for that extension;
  a torch `lock` found while holding it was left by a process that died mid-build, and is removed with a line
  saying so.
* A first build runs in a child process, with a one-line message, a progress line every PROGRESS_S and a time
  bound (KVPLAN_KERNEL_BUILD_TIMEOUT_S, default BUILD_TIMEOUT_S); the child inherits the flock, so an orphaned
  build (its parent SIGKILLed) still holds it. This process then loads the finished library (a no-op ninja run).
* Waiting for another process's build has the same bound. Past it, or when the build fails, `BuildError` says
  why in one line and the caller falls back (the torch attention backend).

`python -m kvplan.engine.backends.kernel_build` builds the CPU decode kernel now: the install step runs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from kvplan.caches import say

BUILD_TIMEOUT_S = 900.0  # a first build took 137 s on a loaded 2-core machine; this is many times that
PROGRESS_S = 15.0
TORCH_LOCK = "lock"  # the file torch.utils.file_baton.FileBaton creates in the build folder
OUR_LOCK = "kvplan.lock"
T = TypeVar("T")


class BuildError(RuntimeError):
    """The extension could not be built or loaded here (the message says why, in one line)."""


def build_timeout_s() -> float:
    text = os.environ.get("KVPLAN_KERNEL_BUILD_TIMEOUT_S")
    try:
        value = float(text) if text else BUILD_TIMEOUT_S
    except ValueError:
        value = BUILD_TIMEOUT_S
    return value if value > 0 else BUILD_TIMEOUT_S


def build_directory(name: str) -> Path:
    """Where torch builds extension `name` (TORCH_EXTENSIONS_DIR or torch's default cache), created."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, False))


def is_built(name: str, sources: tuple[Path, ...] = ()) -> bool:
    """The library is there and newer than its sources (else ninja would rebuild it, silently, in this
    process: a newer kvplan's kernel source is a first build too)."""
    library = build_directory(name) / f"{name}.so"
    try:
        built = library.stat().st_mtime
    except FileNotFoundError:
        return False
    return all(source.stat().st_mtime <= built for source in sources)


@contextlib.contextmanager
def build_lock(folder: Path, timeout_s: float) -> Iterator[int]:
    """Hold kvplan's flock on `folder` (waiting at most `timeout_s` for another process's build), then clear a
    torch lock that no live kvplan process can hold. Yields the lock's file descriptor."""
    fd = os.open(folder / OUR_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start = time.monotonic()
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= timeout_s:
                    raise BuildError(f"another process has been building in {folder} for over {timeout_s:.0f} s") \
                        from None
                if not said:
                    holder = (folder / OUR_LOCK).read_text().strip() or "?"
                    say(f"waiting for another process (pid {holder}) building in {folder}")
                    said = True
                time.sleep(0.2)
        stale = folder / TORCH_LOCK
        if stale.exists():
            age = time.time() - stale.stat().st_mtime
            stale.unlink(missing_ok=True)
            say(f"removed a stale build lock {stale} ({age:.0f} s old, left by an interrupted engine start)")
        yield fd
    finally:
        os.close(fd)  # releases the flock


def build_in_child(name: str, module: str, folder: Path, lock_fd: int, timeout_s: float, what: str) -> None:
    """Run `python -m module --build` (which calls torch's loader) in a child holding our lock, with a message,
    progress and a time bound; raises BuildError when it fails or runs out of time."""
    say(f"building {what} (once per machine, ~1-2 min) in {folder}")
    root = str(Path(__file__).resolve().parents[3])  # the `kvplan` package's parent, for the child's imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    start = last = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", module, "--build-only"], env=env, pass_fds=(lock_fd,),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    os.ftruncate(lock_fd, 0)  # who builds: named to a process that waits (and its own process group)
    os.pwrite(lock_fd, f"{child.pid}\n".encode(), 0)
    try:
        while True:
            try:
                output, _ = child.communicate(timeout=max(0.1, min(PROGRESS_S, start + timeout_s - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now - start >= timeout_s:
                    _kill(child)
                    raise BuildError(f"building {what} did not finish within {timeout_s:.0f} s "
                                     "(KVPLAN_KERNEL_BUILD_TIMEOUT_S)") from None
                if now - last >= PROGRESS_S:
                    last = now
                    say(f"  still building {what}: {now - start:.0f} s")
    except BaseException:  # Ctrl-C: the build goes with us, and the next start clears its torch lock
        _kill(child)
        raise
    if child.returncode != 0:
        last = next((line for line in reversed(output.decode(errors="replace").splitlines()) if line.strip()), "")
        raise BuildError(f"building {what} failed (exit {child.returncode}): {last.strip()[:200]}")
    say(f"built {what} in {time.monotonic() - start:.0f} s")


def load_built(folder: Path, name: str, load: Callable[[], T], rebuild: Callable[[], None]) -> T:
    """`load()` the built library; one that is there but does not load (truncated by a full disk or a killed copy:
    ninja sees it as up to date and never rebuilds it) is removed with a line and built once more."""
    try:
        return load()
    except (TimeoutError, InterruptedError):  # a bound on the caller's side ran out: says nothing of the file
        raise
    except (ImportError, OSError) as exc:
        library = folder / f"{name}.so"
        if not library.exists():
            raise
        library.unlink(missing_ok=True)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]
        say(f"removed a corrupt build {library} ({reason}); building it again")
        rebuild()
        return load()


def _kill(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, 9)
    child.wait()


def main() -> int:
    """`python -m kvplan.engine.backends.kernel_build`: build the CPU decode kernel now (the install step)."""
    from kvplan.engine.backends.cpu_backend import cpu_kernel_error

    error = cpu_kernel_error()
    if error is not None:
        say(f"the CPU decode kernel cannot be built here ({error}); the engine will use the torch attention "
            "backend")
        return 1
    say("the CPU decode kernel is built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
