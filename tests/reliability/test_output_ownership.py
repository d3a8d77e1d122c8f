"""Issue 44, ownership of output: kvplan never changes or removes a file it did not write. A result set is
recognised only by its manifest (every file with its hash), staging directories only by kvplan's marker inside
them, a symlinked --out is followed, every command's outputs are checked against its inputs and each other, and
corrupt kvplan state (manifests, run summaries kept for --resume) is one line naming the file, exit 2.

Every case drives the real CLI in this process and hashes the user's tree before and after."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.errors import UserError
from kvplan.output import MANIFEST, verify_result_set, write_manifest
from kvplan.ownership import MARKER
from tests.badinput.contract import SAMPLE, refused

EXPERIMENT = 'name: t\nmodel: llama-3-8b\nhardware: a100-40gb\nworkload: {trace: "sample:chat"}\n'
DEAD = 2**22 + 4321  # above the default pid_max: no process has it


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (dot-files, links and empty folders included) -> its content's hash, link target
    or 'dir': equal before and after means nothing was changed or removed."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            found[name] = "dir"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def unchanged(capsys, tmp_path: Path, argv: list[str], *where: str, root: Path | None = None) -> str:
    """`kvplan ARGV` is refused with one line (exit 2) and leaves every file under `root` as it was."""
    root = root or tmp_path
    before = tree(root)
    line = refused(capsys, argv, *where, tmp=tmp_path)
    assert tree(root) == before, line
    return line


def simulate(out: Path | str, *extra: str) -> list[str]:
    return ["simulate", "--trace", SAMPLE, *extra, "--out", str(out)]


@pytest.fixture(scope="module")
def experiment_set(tmp_path_factory) -> Path:
    """One finished `kvplan run` result set (about 4 s), copied by the tests that need one."""
    root = tmp_path_factory.mktemp("experiment")
    (root / "e.yaml").write_text(EXPERIMENT)
    assert main(["run", str(root / "e.yaml"), "--out", str(root / "out"), "--quiet", "--json"]) == 0
    return root


@pytest.fixture(scope="module")
def simulate_set(tmp_path_factory) -> Path:
    """One `kvplan simulate --block-size 16 8 --out` result set, copied by the tests that need one."""
    out = tmp_path_factory.mktemp("simulate") / "out"
    assert main([*simulate(out, "--block-size", "16", "8"), "--json"]) == 0
    return out


def copy_set(simulate_set: Path, tmp_path: Path) -> Path:
    shutil.copytree(simulate_set, tmp_path / "out", symlinks=True)
    return tmp_path / "out"


def copy_experiment(experiment_set: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copy(experiment_set / "e.yaml", tmp_path / "e.yaml")
    shutil.copytree(experiment_set / "out", tmp_path / "out", symlinks=True)
    return tmp_path / "e.yaml", tmp_path / "out"


# -- --out on a directory kvplan did not write ----------------------------------------------------------------------
COMMANDS = {
    "simulate": ["simulate", "--trace", SAMPLE],
    "run": ["run", "E"],
    "run --resume": ["run", "E", "--resume"],
    "replay": ["replay", "--model", "tiny-llama", "--trace", SAMPLE],
    "replay --endpoint": ["replay", "--endpoint", "http://127.0.0.1:9", "--trace", SAMPLE, "--vocab-size", "100"],
    "validate": ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy"],
}
LAYOUTS = {  # what a user's --out holds: each is refused as it is
    "empty runs/": {"runs/": None},
    "runs/ and notes": {"runs/": None, "notes.txt": "precious"},
    "a forged manifest": {MANIFEST: "[]", "notes.txt": "precious"},
    "a manifest without notes": {MANIFEST: json.dumps({"kvplan_version": "0", "files": []}), "notes.txt": "mine"},
    "only a dot-file": {".notes": "hidden"},
}


def make(root: Path, layout: dict[str, str | None]) -> None:
    for name, text in layout.items():
        path = root / name
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_out_holding_what_kvplan_did_not_write_is_refused(tmp_path, capsys, command, layout):
    mine = tmp_path / "mine"
    make(mine, LAYOUTS[layout])
    (tmp_path / "e.yaml").write_text(EXPERIMENT)
    argv = [str(tmp_path / "e.yaml") if arg == "E" else arg for arg in COMMANDS[command]]
    unchanged(capsys, tmp_path, [*argv, "--out", str(mine)], "mine")


# -- files a user added to (or edited in) an earlier set --------------------------------------------------------
ADDED = {
    "a file beside the set's": lambda out: (out / "notes.txt").write_text("mine"),
    "a file in a subfolder": lambda out: (out / "block16" / "notes.txt").write_text("mine"),
    "a dot-file": lambda out: (out / ".draft").write_text("mine"),
    "an empty folder": lambda out: (out / "mine").mkdir(),
    "a link out of the set": lambda out: (out / "link").symlink_to(out.parent / "elsewhere.txt"),
    "a listed file edited": lambda out: (out / "block16" / "summary.json").write_text("{}"),
    "a listed file made a link": lambda out: ((out / "block8" / "summary.json").unlink(),
                                              (out / "block8" / "summary.json").symlink_to(out / "block16" / "x")),
}


@pytest.mark.parametrize("added", ADDED)
def test_what_a_user_added_to_an_earlier_set_is_kept(tmp_path, capsys, simulate_set, added):
    out = copy_set(simulate_set, tmp_path)
    (tmp_path / "elsewhere.txt").write_text("not kvplan's")
    ADDED[added](out)
    unchanged(capsys, tmp_path, simulate(out, "--block-size", "16", "8"), "out")


def test_a_user_file_inside_an_experiments_run_is_kept(tmp_path, capsys, experiment_set):
    exp, out = copy_experiment(experiment_set, tmp_path)
    run = next((out / "runs").iterdir())
    (run / "notes.txt").write_text("mine")
    unchanged(capsys, tmp_path, ["run", str(exp), "--out", str(out), "--quiet"], "notes.txt")
    unchanged(capsys, tmp_path, ["run", str(exp), "--out", str(out), "--quiet", "--resume"], "notes.txt",
              root=out)  # --resume links the finished runs into OUT.partial (kvplan's); OUT is as it was


def test_replacing_a_set_removes_its_files_only_and_leaves_no_staging(tmp_path, capsys, simulate_set):
    out = copy_set(simulate_set, tmp_path)
    assert main([*simulate(out, "--block-size", "4"), "--json"]) == 0
    capsys.readouterr()
    manifest = verify_result_set(out)
    assert manifest["config"]["options"]["block_size"] == [4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .tmp, .old or marker left behind
    assert not (out / MARKER).exists()


# -- staging folders: recognised by kvplan's marker, never by their name ------------------------------------------
def test_a_users_partial_folder_is_refused_untouched(tmp_path, capsys):
    (tmp_path / "e.yaml").write_text(EXPERIMENT)
    make(tmp_path / "out.partial", {"runs/": None})
    for resume in ([], ["--resume"]):
        unchanged(capsys, tmp_path, ["run", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "out"), *resume],
                  "out.partial is a directory kvplan did not write")
    (tmp_path / "out.partial" / "thesis.tex").write_text("mine")
    unchanged(capsys, tmp_path, ["run", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "out")], "out.partial")


def interrupted(experiment_set: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """An experiment interrupted after its runs: OUT.partial as kvplan leaves it (marker, runs/)."""
    from kvplan.ownership import write_marker

    exp, out = copy_experiment(experiment_set, tmp_path)
    partial = tmp_path / "out.partial"
    shutil.copytree(out / "runs", partial / "runs")
    write_marker(partial, "partial", out)
    shutil.rmtree(out)
    return exp, out, partial


@pytest.mark.parametrize("where", ["notes.txt", "runs/notes.txt", "runs/KEY/notes.txt", "plots/mine.txt"])
def test_a_user_file_in_kvplans_partial_folder_is_kept(tmp_path, capsys, experiment_set, where):
    exp, out, partial = interrupted(experiment_set, tmp_path)
    key = next((partial / "runs").iterdir()).name
    make(partial, {where.replace("KEY", key): "mine"})
    for resume in ([], ["--resume"]):
        unchanged(capsys, tmp_path, ["run", str(exp), "--out", str(out), "--quiet", *resume], "notes.txt", "mine.txt")


BACKUPS = [f".out.{DEAD}.old", f".out.{DEAD}.tmp", f".out.{DEAD}.ab12.tmp", ".out.123.old", f".out.{DEAD}.ab12.old",
           "out.partial.bak", ".out.partial"]


def test_backup_like_names_beside_out_are_kept(tmp_path, capsys, simulate_set):
    """Folders named as kvplan names its staging (a dead pid, `.tmp`, `.old`) but without its marker."""
    for name in BACKUPS:
        make(tmp_path / name, {"keep.txt": "mine", "runs/": None})
    copy_set(simulate_set, tmp_path)  # an earlier set to replace: a `.old` of it is made and removed
    before = {name: tree(tmp_path / name) for name in BACKUPS}
    assert main([*simulate(tmp_path / "out"), "--json"]) == 0
    capsys.readouterr()
    assert {name: tree(tmp_path / name) for name in BACKUPS} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*BACKUPS, "out"])


def test_a_marker_for_another_output_or_a_live_process_is_not_kvplans_to_clean(tmp_path, capsys):
    for folder, marker in ((f".out.{DEAD}.ab.tmp", {"out": "other", "pid": DEAD}),
                           (f".out.{os.getpid()}.cd.tmp", {"out": "out", "pid": os.getpid()})):
        make(tmp_path / folder, {"keep.txt": "mine"})
        (tmp_path / folder / MARKER).write_text(json.dumps({"kvplan": "staging", "purpose": "tmp", **marker}))
    old = tmp_path / f".out.{DEAD}.ef.old"  # a set kvplan moved aside, with a user's file added meanwhile
    make(old, {"listed.txt": "kvplan's", "keep.txt": "mine"})
    write_manifest(old)
    (old / MANIFEST).write_text(json.dumps({**json.loads((old / MANIFEST).read_text()),
                                            "files": [f for f in json.loads((old / MANIFEST).read_text())["files"]
                                                      if f["path"] == "listed.txt"]}))
    (old / MARKER).write_text(json.dumps({"kvplan": "staging", "purpose": "old", "pid": DEAD, "out": "out"}))
    assert main([*simulate(tmp_path / "out"), "--json"]) == 0
    capsys.readouterr()
    assert all((tmp_path / folder / "keep.txt").read_text() == "mine"
               for folder in (f".out.{DEAD}.ab.tmp", f".out.{os.getpid()}.cd.tmp", old.name))
    assert not (old / "listed.txt").exists() and not (old / MARKER).exists()  # kvplan's file went, the user's stayed


# -- symbolic links --------------------------------------------------------------------------------------------
def test_a_symlinked_out_is_followed_never_replaced(tmp_path, capsys):
    target, link = tmp_path / "real", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target)
    for block in ("16", "8"):
        assert main([*simulate(link, "--block-size", block), "--json"]) == 0
        capsys.readouterr()
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert verify_result_set(target)["config"]["options"]["block_size"] == [int(block)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_symlink_to_a_users_directory_or_nowhere_is_refused(tmp_path, capsys):
    make(tmp_path / "mine", {"notes.txt": "mine"})
    (tmp_path / "to-mine").symlink_to(tmp_path / "mine")
    unchanged(capsys, tmp_path, simulate(tmp_path / "to-mine"), "notes.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    unchanged(capsys, tmp_path, simulate(tmp_path / "dangling"), "symbolic link")
    (tmp_path / "out.partial").symlink_to(tmp_path / "mine")
    (tmp_path / "e.yaml").write_text(EXPERIMENT)
    unchanged(capsys, tmp_path, ["run", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "out")], "symbolic link")


def test_a_symlinked_output_file_is_written_through(tmp_path, capsys):
    target, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    target.write_text("old")
    link.symlink_to(target)
    assert main(["trace", "convert", SAMPLE, str(link), "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text().startswith("{")


# -- output paths against inputs and each other ------------------------------------------------------------------
def a_set_holding(tmp_path: Path, name: str, text: str) -> Path:
    """A kvplan result set (manifest included) that holds `name`: the kind of --out a command may replace."""
    out = tmp_path / "set"
    make(out, {name: text})
    write_manifest(out)
    return out


def collisions(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    trace = tmp_path / "t.jsonl"
    shutil.copy(SAMPLE, trace)
    os.link(trace, tmp_path / "hard.jsonl")
    (tmp_path / "soft.jsonl").symlink_to(trace)
    (tmp_path / "spec.yaml").write_text("requests: 5\n")
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "summary.json").write_text("{}")
    steps = a_set_holding(tmp_path, "steps.jsonl", "{}\n")
    return {
        "calibrate plot over profile": (["calibrate", "--from-replay", str(tmp_path / "replay"), "--model",
                                         "llama-100m", "--out", str(tmp_path / "prof.png")], "the same file"),
        "calibrate into the replay": (["calibrate", "--from-replay", str(tmp_path / "replay"), "--model",
                                       "llama-100m", "--out", str(tmp_path / "replay" / "summary.json")],
                                      "inside the input --from-replay"),
        "calibrate steps over profile": (["calibrate", "--model", "tiny-llama", "--out", str(tmp_path / "p.yaml"),
                                          "--steps-out", str(tmp_path / "p.yaml")], "--steps-out"),
        "calibrate steps over plot": (["calibrate", "--model", "tiny-llama", "--out", str(tmp_path / "p.yaml"),
                                       "--steps-out", str(tmp_path / "p.png")], "--steps-out"),
        "convert onto itself": (["trace", "convert", str(trace), str(trace)], "is the input"),
        "convert onto a hard link": (["trace", "convert", str(trace), str(tmp_path / "hard.jsonl")], "is the input"),
        "convert onto a symlink": (["trace", "convert", str(trace), str(tmp_path / "soft.jsonl")], "is the input"),
        "synth over its spec": (["trace", "synth", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "spec.yaml")],
                                "is the input"),
        "simulate over its profile": (["simulate", "--trace", SAMPLE, "--cost", "recorded", "--profile",
                                       str(steps / "steps.jsonl"), "--out", str(steps)], "holds the input --profile"),
        "simulate over its trace": (["simulate", "--trace", str(trace), "--out", str(tmp_path)], "t.jsonl"),
    }


CASES = ["calibrate plot over profile", "calibrate into the replay", "calibrate steps over profile",
         "calibrate steps over plot", "convert onto itself", "convert onto a hard link", "convert onto a symlink",
         "synth over its spec", "simulate over its profile", "simulate over its trace"]


@pytest.mark.parametrize("case", CASES)
def test_outputs_never_overwrite_inputs_or_each_other(tmp_path, capsys, case):
    argv, where = collisions(tmp_path)[case]
    unchanged(capsys, tmp_path, argv, where)


@pytest.mark.parametrize("command", ["replay", "validate", "run"])
def test_a_result_set_holding_the_commands_input_is_not_replaced(tmp_path, capsys, command):
    out = a_set_holding(tmp_path, "input.yaml" if command != "replay" else "t.jsonl",
                        EXPERIMENT if command == "run" else "- {name: a, block_size: 16}\n")
    argv = {"replay": ["replay", "--model", "tiny-llama", "--trace", str(out / "t.jsonl")],
            "validate": ["validate", "--model", "tiny-llama", "--trace", SAMPLE, "--mode", "policy", "--configs",
                         str(out / "input.yaml")],
            "run": ["run", str(out / "input.yaml")]}[command]
    unchanged(capsys, tmp_path, [*argv, "--out", str(out)], "holds the input")


# -- corrupt kvplan state ----------------------------------------------------------------------------------------
def _rewrite_manifest(run: Path) -> None:
    (run / MANIFEST).unlink()
    write_manifest(run)  # the damage made consistent: the summary itself must be checked


CORRUPT_RUNS = {
    "truncated": lambda run: (run / "summary.json").write_bytes((run / "summary.json").read_bytes()[:40]),
    "empty": lambda run: (run / "summary.json").write_text(""),
    "a list": lambda run: (run / "summary.json").write_text("[]"),
    "a list, manifest rewritten": lambda run: ((run / "summary.json").write_text("[]"), _rewrite_manifest(run)),
    "wrong types, manifest rewritten": lambda run: ((run / "summary.json").write_text('{"summary": 1, "info": []}'),
                                                    _rewrite_manifest(run)),
    "not JSON, manifest rewritten": lambda run: ((run / "summary.json").write_text("{"), _rewrite_manifest(run)),
    "no manifest": lambda run: (run / MANIFEST).unlink(),
    "a truncated manifest": lambda run: (run / MANIFEST).write_text('{"kvplan_version": "1", "fi'),
}


@pytest.mark.parametrize("damage", CORRUPT_RUNS)
def test_corrupt_resume_state_is_one_line(tmp_path, capsys, experiment_set, damage):
    exp, out, partial = interrupted(experiment_set, tmp_path)
    run = next((partial / "runs").iterdir())
    CORRUPT_RUNS[damage](run)
    line = unchanged(capsys, tmp_path, ["run", str(exp), "--out", str(out), "--quiet", "--resume"], run.name)
    assert "rerun without --resume" in line or f"allowed: delete {run}, then rerun" in line


def test_rerunning_without_resume_replaces_corrupt_state(tmp_path, capsys, experiment_set):
    exp, out, partial = interrupted(experiment_set, tmp_path)
    CORRUPT_RUNS["a list"](next((partial / "runs").iterdir()))
    assert main(["run", str(exp), "--out", str(out), "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert verify_result_set(out) and not partial.exists()


BAD_MANIFESTS = {
    "truncated": '{"kvplan_version": "1", "files": [',
    "a list": "[]",
    "files not a list": '{"kvplan_version": "1", "files": "x"}',
    "a path out of the set": '{"kvplan_version": "1", "files": [{"path": "../x", "bytes": 1, "sha256": "' + "0" * 64
                             + '"}]}',
    "NaN bytes": '{"kvplan_version": "1", "files": [{"path": "x", "bytes": NaN, "sha256": "' + "0" * 64 + '"}]}',
    "nested deep": "[" * 100000,
    "not UTF-8": b"\xff\xfe{",
}


@pytest.mark.parametrize("bad", BAD_MANIFESTS)
def test_a_bad_manifest_is_one_line_and_keeps_the_set(tmp_path, capsys, simulate_set, bad):
    out = copy_set(simulate_set, tmp_path)
    text = BAD_MANIFESTS[bad]
    (out / MANIFEST).write_bytes(text if isinstance(text, bytes) else text.encode())
    line = unchanged(capsys, tmp_path, simulate(out), "manifest.json")
    assert "nothing was removed" in line
    unchanged(capsys, tmp_path, ["verify", str(out)], "manifest.json")
    with pytest.raises(UserError, match=r"manifest\.json") as caught:
        verify_result_set(out)
    assert "\n" not in str(caught.value) and len(str(caught.value).replace(str(tmp_path), "T")) < 300


VERIFY_DAMAGE = {
    "a file added": lambda out: (out / "notes.txt").write_text("mine"),
    "a folder added": lambda out: (out / "mine").mkdir(),
    "a link added": lambda out: (out / "link").symlink_to("/etc"),
    "a file truncated": lambda out: (out / "block8" / "summary.json").write_text(""),
    "a file removed": lambda out: (out / "block8" / "summary.json").unlink(),
    "a file made a link": lambda out: ((out / "block8" / "summary.json").unlink(),
                                       (out / "block8" / "summary.json").symlink_to(out / "block16" / "summary.json")),
    "no manifest": lambda out: (out / MANIFEST).unlink(),
}


@pytest.mark.parametrize("damage", VERIFY_DAMAGE)
def test_verify_names_what_differs_from_the_manifest(tmp_path, capsys, simulate_set, damage):
    out = copy_set(simulate_set, tmp_path)
    assert main(["verify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 6
    VERIFY_DAMAGE[damage](out)
    unchanged(capsys, tmp_path, ["verify", str(out)], "manifest.json")


# -- names: calibrate --from-replay prices a model simulate knows -------------------------------------------------
def test_calibrate_from_replay_refuses_an_unknown_model(tmp_path, capsys):
    (tmp_path / "replay").mkdir()
    argv = ["calibrate", "--from-replay", str(tmp_path / "replay"), "--model", "my-server", "--out",
            str(tmp_path / "p.yaml")]
    unchanged(capsys, tmp_path, argv, "--model: unknown model 'my-server'")


def test_a_finished_experiment_holds_only_what_the_partial_check_knows(experiment_set):
    """`runner.AGGREGATES` names what `report.write_results` writes: a new output there must be added to it, or
    an interrupted experiment's OUT.partial holding it would be refused."""
    from kvplan.experiments.runner import AGGREGATES

    names = {p.name for p in (experiment_set / "out").iterdir()}
    assert names <= {*AGGREGATES, "runs", MANIFEST} and {"result.json", "runs.parquet"} <= names
