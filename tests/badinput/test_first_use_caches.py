"""Every first-use cache kvplan relies on survives an interrupted, damaged, concurrent or impossible first use
(kvplan.caches): built-in models, the torch extension folder, Triton's kernel cache and matplotlib's font cache.
Each case uses private directories (environment variables, tmp_path); a real Triton compile needs a GPU, so its
cases check the directory kvplan hands Triton and what kvplan removes there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplan import caches

ROOT = Path(__file__).resolve().parents[2]
HOUR_AGO = time.time() - 2 * 3600


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    """Fallback caches go under this test's tmp_path, and each test decides afresh (usable_dir says once per
    process)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    caches.usable_dir.cache_clear()
    yield tmp
    caches.usable_dir.cache_clear()


def _unwritable(tmp_path: Path) -> Path:
    """A directory no one can create, root included: it would lie under a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "cache"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


# -- the fallback directory ----------------------------------------------------------------------------------------
def test_an_unwritable_cache_falls_back_to_a_private_one_said_once(tmp_path, private_tmp, capsys, monkeypatch):
    monkeypatch.setenv("KVPLAN_CACHE", "unused")
    folder = _unwritable(tmp_path)
    first = caches.usable_dir(folder, "model", "KVPLAN_CACHE", "models")
    again = caches.usable_dir(folder, "model", "KVPLAN_CACHE", "models")
    assert first == again and first.parent == private_tmp and os.environ["KVPLAN_CACHE"] == str(first)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvplan: the model cache {folder} is not writable (Not a "
                                                   "directory); using ")
    assert "set KVPLAN_CACHE to a writable directory" in lines[0]
    writable = tmp_path / "ok"
    assert caches.usable_dir(writable, "model", "KVPLAN_CACHE", "models") == writable and writable.is_dir()


def test_the_private_directory_is_never_a_link_or_someone_elses(private_tmp, tmp_path):
    planted = private_tmp / f"kvplan-{os.getuid()}-models"
    target = tmp_path / "elsewhere"
    target.mkdir()
    planted.symlink_to(target)  # another user on a shared /tmp could plant this
    chosen = caches.private_dir("models")
    assert chosen != planted and chosen.parent == private_tmp and not chosen.is_symlink()


def test_remove_stale_takes_old_leftovers_only(tmp_path, capsys):
    old, fresh = tmp_path / "old.tmp", tmp_path / "fresh.tmp"
    old.mkdir()
    (old / "part").write_text("half")
    fresh.write_text("being written")
    os.utime(old, (HOUR_AGO, HOUR_AGO))
    assert caches.remove_stale([old, fresh, tmp_path / "gone"], 3600, "a leftover") == [old]
    assert not old.exists() and fresh.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"removed a leftover {old} (" in err


# -- built-in models -----------------------------------------------------------------------------------------------
def _built(cache: Path, name: str = "tiny-llama") -> Path:
    from kvplan.engine.models import resolve_model

    return resolve_model(name, cache)


@pytest.mark.engine
def test_a_truncated_cached_model_is_removed_and_rebuilt(tmp_path, capsys):
    cache = tmp_path / "models"
    entry = _built(cache)
    weights = entry / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # a full disk, a killed copy, an older kvplan writing in place
    assert _built(cache) == entry
    assert weights.read_bytes() == whole  # the same seed: the same model again
    err = capsys.readouterr().err
    assert f"removed a damaged cached model {entry} (model.safetensors is truncated" in err
    assert not list(cache.glob(".*tmp"))


@pytest.mark.engine
@pytest.mark.parametrize("damage", ["no weights", "cut json", "garbage header"])
def test_every_kind_of_damaged_entry_is_rebuilt(tmp_path, capsys, damage):
    cache = tmp_path / "models"
    entry = _built(cache)
    if damage == "no weights":  # an in-place writer killed after config.json
        (entry / "model.safetensors").unlink()
    elif damage == "cut json":
        text = (entry / "config.json").read_text()
        (entry / "config.json").write_text(text[: len(text) // 2])
    else:
        (entry / "model.safetensors").write_bytes(b"\xff" * 4096)
    _built(cache)
    assert "removed a damaged cached model" in capsys.readouterr().err
    from kvplan.engine import model_files

    assert model_files.problem(entry) is None


@pytest.mark.engine
def test_a_model_build_into_an_unwritable_cache_goes_to_the_private_one(tmp_path, private_tmp, capsys):
    entry = _built(_unwritable(tmp_path))
    assert entry.parent.parent == private_tmp and (entry / "config.json").is_file()
    assert "the model cache" in capsys.readouterr().err
    caches.usable_dir.cache_clear()
    assert _built(_unwritable(tmp_path)) == entry  # the next run finds the fallback's entry: built once


@pytest.mark.engine
def test_an_old_unfinished_build_is_removed_and_a_fresh_one_kept(tmp_path, capsys):
    cache = tmp_path / "models"
    cache.mkdir()
    old, fresh = cache / ".tiny-llama.abc.tmp", cache / ".tiny-llama.def.tmp"
    for d in (old, fresh):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 100)
    os.utime(old, (HOUR_AGO, HOUR_AGO))
    _built(cache)
    assert not old.exists() and fresh.exists()  # a fresh one may be a concurrent run's build
    assert "removed an unfinished model build" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.engine
def test_two_concurrent_first_uses_both_succeed_with_one_entry(tmp_path):
    cache = tmp_path / "models"
    code = ("import sys; from pathlib import Path; from kvplan.engine.models import resolve_model; "
            "print(resolve_model('tiny-qwen2', Path(sys.argv[1])))")
    runs = [subprocess.Popen([sys.executable, "-c", code, str(cache)], env=_env(), cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    assert {out.strip() for out, _ in outs} == {str((cache / "tiny-qwen2").resolve())}
    assert sorted(p.name for p in cache.iterdir()) == ["tiny-qwen2"]  # no leftover build


@pytest.mark.engine
def test_a_damaged_model_directory_of_the_user_is_refused_in_one_line(tmp_path, capsys):
    from kvplan.cli import main

    source = _built(tmp_path / "models")
    mine = tmp_path / "my-model"
    mine.mkdir()
    for f in source.iterdir():
        (mine / f.name).write_bytes(f.read_bytes()[:-10] if f.suffix == ".safetensors" else f.read_bytes())
    capsys.readouterr()  # the build's own output
    code = main(["generate", "--model", str(mine), "--prompt-ids", "1 2", "--max-tokens", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"model directory '{mine}': model.safetensors is truncated" in err and "Traceback" not in err


# -- the torch extension folder ------------------------------------------------------------------------------------
def test_an_unwritable_extensions_dir_falls_back(tmp_path, private_tmp, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(_unwritable(tmp_path)))
    chosen = caches.torch_extensions_dir()
    assert chosen.parent == private_tmp and os.environ["TORCH_EXTENSIONS_DIR"] == str(chosen)
    assert "the torch extension cache" in capsys.readouterr().err


@pytest.mark.engine
def test_a_built_library_that_does_not_load_is_rebuilt_once(tmp_path, capsys):
    from kvplan.engine.backends.kernel_build import load_built

    library = tmp_path / "ext.so"
    library.write_bytes(b"\x7fELF truncated")
    calls: list[str] = []

    def load() -> str:
        calls.append("load")
        if library.exists():
            raise ImportError(f"{library}: file too short")
        return "module"

    assert load_built(tmp_path, "ext", load, lambda: calls.append("rebuild")) == "module"
    assert calls == ["load", "rebuild", "load"]
    assert f"removed a corrupt build {library} ({library}: file too short); building it again" in \
        capsys.readouterr().err


@pytest.mark.engine
def test_a_load_failure_without_a_library_is_not_hidden(tmp_path):
    from kvplan.engine.backends.kernel_build import load_built

    def load() -> str:
        raise ImportError("no compiler")

    with pytest.raises(ImportError, match="no compiler"):
        load_built(tmp_path, "ext", load, lambda: None)


# -- Triton's kernel cache (GPU) -----------------------------------------------------------------------------------
def test_triton_gets_a_writable_cache_and_old_unfinished_entries_go(tmp_path, private_tmp, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(_unwritable(tmp_path)))
    chosen = caches.prepare_triton()
    assert chosen is not None and chosen.parent == private_tmp and os.environ["TRITON_CACHE_DIR"] == str(chosen)
    assert "the Triton kernel cache" in capsys.readouterr().err

    cache = tmp_path / "triton"
    old, fresh = cache / "KEY1" / "tmp.pid_1_x", cache / "KEY2" / "tmp.pid_2_y"
    for d in (old, fresh):
        d.mkdir(parents=True)
        (d / "k.cubin").write_bytes(b"half")
    os.utime(old, (HOUR_AGO, HOUR_AGO))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert caches.prepare_triton() == cache
    assert not old.exists() and fresh.exists()
    assert "removed an unfinished Triton cache entry" in capsys.readouterr().err


@pytest.mark.engine
def test_the_triton_interpreter_caches_nothing(tmp_path):
    """What kvplan relies on for CPU runs: under TRITON_INTERPRET=1 a kernel launch writes no cache at all."""
    cache, home = tmp_path / "cache", tmp_path / "home"
    home.mkdir()
    code = ("import torch; from kvplan import kernels; "
            "from kvplan.caches import prepare_triton; assert prepare_triton() is None; "
            "k = torch.zeros(2, 4, 2, 8); kernels.copy_blocks(k, k.clone(), torch.tensor([[0, 1]]))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(TRITON_INTERPRET="1", TRITON_CACHE_DIR=str(cache),
                                                                 HOME=str(home)),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not cache.exists() and not any(home.iterdir())


# -- matplotlib's font cache ---------------------------------------------------------------------------------------
def _plot_env(config: Path) -> dict[str, str]:
    return _env(MPLCONFIGDIR=str(config))


PLOT = "from kvplan.experiments.plots import _figure, _png; fig, ax = _figure(1, 1); print(len(_png(fig)))"


def test_a_stale_font_cache_lock_is_removed_and_plots_do_not_wait(tmp_path):
    config = tmp_path / "mpl"
    config.mkdir()
    lock = config / f"fontlist-v{_font_manager_version()}.json.matplotlib-lock"
    lock.write_text("")  # a process killed while writing the font list (no fontlist json either)
    os.utime(lock, (HOUR_AGO, HOUR_AGO))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PLOT], env=_plot_env(config), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"kvplan: removed a stale matplotlib font-cache lock {lock}" in done.stderr
    assert "Lock error" not in done.stderr and "Could not save" not in done.stderr, done.stderr
    assert list(config.glob("fontlist-*.json")) and not lock.exists()
    assert time.monotonic() - start < 60


def test_a_fresh_font_cache_lock_is_left_to_its_owner(tmp_path, capsys, monkeypatch):
    lock = tmp_path / "fontlist-v1.json.matplotlib-lock"
    lock.write_text("")  # a concurrent process building its font list right now: matplotlib waits for it (5 s)
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path))
    assert caches.prepare_matplotlib() == tmp_path
    assert lock.exists() and capsys.readouterr().err == ""


def test_an_unwritable_matplotlib_dir_falls_back_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", PLOT], env=_plot_env(_unwritable(tmp_path)), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: the matplotlib cache"), done.stderr


def _font_manager_version() -> str:
    from matplotlib.font_manager import FontManager

    return FontManager.__version__


def test_json_of_a_font_list_is_not_kvplans_to_repair(tmp_path):
    """A truncated font list is matplotlib's to rebuild (it reads it in a try and rebuilds): checked so that the
    day it stops doing so, this fails instead of every plot."""
    config = tmp_path / "mpl"
    config.mkdir()
    (config / f"fontlist-v{_font_manager_version()}.json").write_text('{"_version": ')
    done = subprocess.run([sys.executable, "-c", PLOT], env=_plot_env(config), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    json.loads((config / f"fontlist-v{_font_manager_version()}.json").read_text())
