"""`-o FILE` of every command that writes one: a regular file (or a new one) is replaced whole, a symbolic link is
followed to its target, and a device, a folder, a missing folder or a folder that cannot be written is refused in
one line before the work starts (autopar/files.py); the file written gets the mode `open(path, "w")` gives."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.errors import AutoparError
from autopar.files import check_output, write_atomic
from autopar.plan import Plan
from helpers.builders import layer, model

runner = CliRunner()
ROOT_USER = os.geteuid() == 0


def tiny_profile():
    return model([layer(0, kind="embedding", block_id="emb"), layer(1), layer(2), layer(3, kind="head",
                                                                                      block_id="head")])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved profile (data: solving it imports nothing) and a plan of it."""
    folder = tmp_path_factory.mktemp("inputs")
    profile = tiny_profile()
    profile.save(folder / "profile.json")
    autopar.estimate(profile, gpus=2, gpu="a100-80gb", tp=1, pp=1, micro_batch_size=1,
                     global_batch_size=2).save(folder / "plan.json")
    return {"profile": folder / "profile.json", "plan": folder / "plan.json"}


def targets(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of place -o may name that must be refused: (path, what the one line says)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "to-full").symlink_to("/dev/full")
    out = {
        "/dev/full": (Path("/dev/full"), "is not a regular file"),
        "a character device": (Path("/dev/null"), "is not a regular file"),
        "a link to a device": (tmp_path / "to-full", "(a link to /dev/full) is not a regular file"),
        "/proc": (Path("/proc/plan.json"), "cannot write in folder /proc"),
        "a folder": (tmp_path / "folder", "is a folder: name a file in it"),
        "a missing folder": (tmp_path / "nonexistent" / "x" / "p.json", "does not exist; create it first"),
        "a path through a file": (tmp_path / "plan.json" / "p.json", "cannot write there"),
    }
    (tmp_path / "plan.json").write_text("{}")
    if not ROOT_USER:  # root writes anywhere but /proc: a folder's mode does not stop it
        (tmp_path / "locked").mkdir(mode=0o500)
        (tmp_path / "readonly.json").write_text("")
        (tmp_path / "readonly.json").chmod(0o444)
        out["an unwritable folder"] = (tmp_path / "locked" / "p.json", "cannot write in folder")
        out["a read-only file"] = (tmp_path / "readonly.json", "is read-only")
    return out


KINDS = ["/dev/full", "a character device", "a link to a device", "/proc", "a folder", "a missing folder",
         "a path through a file"]


@pytest.mark.parametrize("kind", KINDS)
def test_what_cannot_be_written_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    path, said = targets(tmp_path)[kind]
    with pytest.raises(AutoparError, match="^-o .*" + said.replace("(", r"\(").replace(")", r"\)")):
        check_output(path)
    with pytest.raises(AutoparError):
        write_atomic(path, "plan")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not (tmp_path / "nonexistent").exists()  # a missing folder is not created
    assert (tmp_path / "plan.json").read_text() == "{}"
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file left


@pytest.mark.skipif(ROOT_USER, reason="root writes into any folder whatever its mode (/proc is the test above)")
@pytest.mark.parametrize("kind", ["an unwritable folder", "a read-only file"])
def test_an_unwritable_place_is_refused(tmp_path: Path, kind: str) -> None:
    path, said = targets(tmp_path)[kind]
    with pytest.raises(AutoparError, match=said):
        check_output(path)


def test_a_link_is_followed_and_its_target_written(tmp_path: Path) -> None:
    target = tmp_path / "real" / "plan.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "plan.json"
    link.symlink_to(target)
    dangling = tmp_path / "new.json"
    dangling.symlink_to(tmp_path / "real" / "created.json")
    write_atomic(link, "new")
    write_atomic(dangling, "made")
    assert link.is_symlink() and target.read_text() == "new" and link.read_text() == "new"
    assert dangling.is_symlink() and (tmp_path / "real" / "created.json").read_text() == "made"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_new_file_gets_the_mode_open_gives(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with open(tmp_path / "by-open.json", "w") as f:
            f.write("x")
        write_atomic(tmp_path / "by-autopar.json", "x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(tmp_path / "by-autopar.json").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "by-open.json").st_mode) == 0o666 & ~umask


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640


def _commands(saved: dict[str, Path]) -> dict[str, tuple[list[str], str, str]]:
    """command -> (its arguments before -o, the module and function doing its work, which must not run)."""
    profile, plan = str(saved["profile"]), str(saved["plan"])
    return {
        "solve": (["solve", profile, "--gpus", "2"], "autopar.search", "solve_top_k"),
        "trace": (["trace", profile], "autopar.capture", "capture_model"),
        "export": (["export", plan, "--to", "megatron"], "autopar.export", "export"),
        "plot": (["plot", plan], "autopar.report.plot", "plot_plan"),
        "sweep": (["sweep", profile, "--gpus", "2,4"], "autopar.sweep", "sweep"),
        "calibrate": (["calibrate", "--backend", "gloo", "--quick"], "autopar.calibrate.run", "calibrate"),
    }


FILE_NAMES = {"plot": "p.png", "sweep": "p.png"}  # the rest write JSON or text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["solve", "trace", "export", "plot", "sweep", "calibrate"])
def test_every_command_refuses_before_the_work(saved: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, command: str, kind: str) -> None:
    import importlib

    args, module, function = _commands(saved)[command]
    ran: list[str] = []
    monkeypatch.setattr(importlib.import_module(module), function, lambda *a, **k: ran.append(function))
    path, said = targets(tmp_path)[kind]
    if kind in ("a missing folder", "a path through a file", "/proc"):
        path = path.with_name(FILE_NAMES.get(command, "p.json"))
    result = runner.invoke(app, [*args, "-o", str(path)])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: -o "), result.output
    assert said in lines[0] and "Traceback" not in result.output
    assert ran == []  # refused when the command line was read: no solve, trace, drawing or benchmark ran
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and not (tmp_path / "nonexistent").exists()


def test_plot_checks_its_default_file_before_drawing(saved: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(saved["plan"].read_text())
    (tmp_path / "plan.png").mkdir()  # where the figure would go by default
    import autopar.report.plot as plot

    monkeypatch.setattr(plot, "plan_figure", lambda *a: pytest.fail("drew a figure it cannot write"))
    result = runner.invoke(app, ["plot", str(plan)])
    assert result.exit_code == 2 and result.stderr.strip() == f"error: {tmp_path / 'plan.png'} is a folder: name a " \
                                                              f"file in it (e.g. {tmp_path / 'plan.png' / 'out.json'})"


def test_an_image_needs_an_image_name(saved: dict[str, Path], tmp_path: Path) -> None:
    for args in (["plot", str(saved["plan"])], ["sweep", str(saved["profile"]), "--gpus", "2"]):
        result = runner.invoke(app, [*args, "-o", str(tmp_path / "figure.gif")])
        assert result.exit_code == 2 and "must be a .png, .svg or .pdf file" in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []


def test_solve_writes_through_a_link(saved: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "plans" / "best.json"
    target.parent.mkdir()
    link = tmp_path / "plan.json"
    link.symlink_to(target)
    result = runner.invoke(app, ["solve", str(saved["profile"]), "--gpus", "2", "--time-limit", "5", "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and Plan.load(target).world_size == 2 and f"plan written to {link}" in result.stdout
