"""innet.results.files: a root run in a folder others can write overwrites nothing and writes through no link.
Run as root too (CI is root): ownership checks then use another uid's folders, made with chown."""

import json
import os
import stat
import subprocess
import sys

import pytest

from innet.errors import UserError
from innet.results.files import (
    NewFolder,
    check_outputs,
    make_output_folder,
    make_private_folder,
    open_new,
    write_text_atomic,
    writing,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes a folder another user owns")


@pytest.fixture()
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


def test_an_atomic_write_replaces_a_file_and_not_its_other_hard_link(tmp_path, victim):
    target = tmp_path / "results.json"
    os.link(victim, target)
    write_text_atomic(str(target), "new")
    assert target.read_text() == "new" and victim.read_text() == "precious\n"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("plant, says", [
    ("link", "it is a symbolic link; innet does not write through links: remove it or name another file"),
    ("folder", "it is a folder; name a file"),
    ("fifo", "it is not a regular file (a device, FIFO or socket); name a file"),
])
def test_a_link_folder_or_fifo_at_the_name_is_one_line_and_touches_nothing(tmp_path, victim, plant, says):
    target = tmp_path / "results.json"
    {"link": lambda: target.symlink_to(victim), "folder": target.mkdir, "fifo": lambda: os.mkfifo(target)}[plant]()
    for write in (lambda: write_text_atomic(str(target), "evil"), lambda: check_outputs((), (str(target),))):
        with pytest.raises(UserError) as exc:
            write()
        assert str(exc.value) == f"cannot write {target}: {says}"
    assert victim.read_text() == "precious\n" and leftovers(tmp_path) == []


def test_a_folder_reached_through_a_link_is_refused(tmp_path, victim):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="link is a symbolic link; innet does not write through links: name the folder"):
        write_text_atomic(str(tmp_path / "link" / "results.json"), "x")
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), writing(str(target)) as fh:
        fh.write(b"half")
        raise RuntimeError("the disk filled")
    assert target.read_text() == "old" and leftovers(tmp_path) == []


def test_open_new_refuses_an_existing_file_or_link_and_makes_a_new_one_private(tmp_path, victim):
    link = tmp_path / "lock"
    link.symlink_to(victim)
    for path in (victim, link):
        with pytest.raises(UserError, match="it exists already"):
            open_new(str(path))
    with open_new(str(tmp_path / "new")) as fh:
        fh.write(b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o600 and victim.read_text() == "precious\n"


def test_the_default_folder_is_always_new_and_said_once(tmp_path):
    name = NewFolder(str(tmp_path / "results" / "20250101-000000"))
    os.makedirs(name)  # as a planter would: the name is predictable
    made = make_output_folder(name)
    assert made == f"{name}-2" and make_output_folder(name) == made  # a second write goes to the same folder
    assert make_output_folder(NewFolder(name)) == f"{name}-3"


def test_a_named_folder_is_made_or_must_be_ones_own_and_closed_to_others(tmp_path):
    assert make_output_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert make_output_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")  # mine: used again
    open_to_all = tmp_path / "shared"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(UserError) as exc:
        make_output_folder(str(open_to_all))
    assert str(exc.value) == (f"{open_to_all} can be written by others (mode 777): innet writes only into a folder "
                              "no one else can write; chmod go-w it or name a new folder")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(UserError, match="is a symbolic link; innet writes only into a real folder"):
        check_outputs((str(tmp_path / "link"),), ())


@root_only
def test_a_folder_another_user_owns_is_refused_and_the_default_steps_past_it(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UserError, match=f"{theirs} belongs to .*uid {NOBODY}.*, not .*innet writes only into a "
                                        "folder it makes or one of your own"):
        make_output_folder(str(theirs))
    assert make_output_folder(NewFolder(str(theirs))) == f"{theirs}-2"
    os.chown(tmp_path / "theirs-2", NOBODY, NOBODY)  # swapped for one of theirs after it was made
    with pytest.raises(UserError, match="belongs to"):
        make_private_folder(str(tmp_path / "theirs-2"))


def test_a_private_folder_is_0700_and_a_run_record_0600(tmp_path, monkeypatch):
    from innet.backends.mininet import cleanup

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # as an older innet left /run/innet
    monkeypatch.setattr(cleanup, "STATE_DIR", str(state))
    record = cleanup.RunState("run1", str(tmp_path / "run1"))
    record.add_pid("h1", os.getpid())
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(record.path).st_mode) == 0o600 and os.listdir(state) == ["run1.json"]
    (tmp_path / "link").symlink_to(state)
    with pytest.raises(UserError, match="link is a symbolic link"):
        make_private_folder(str(tmp_path / "link"))


def test_a_link_planted_at_the_default_results_file_overwrites_nothing(tmp_path, victim):
    """The attack issue 45 reproduced: the next second's results/<timestamp>/results.json planted as a link to
    a file the runner can write. The run writes into a new folder beside it; the victim is untouched."""
    stamp = "20250101-000000"
    planted = tmp_path / "results" / stamp
    planted.mkdir(parents=True)
    (planted / "results.json").symlink_to(victim)
    (planted / "links.csv").symlink_to(victim)
    if os.geteuid() == 0:
        os.chown(planted, NOBODY, NOBODY)
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); time.strftime = lambda f, *a: sys.argv[2]\n"
            "from innet.cli import main; sys.exit(main(sys.argv[3:]))")
    out = subprocess.run([sys.executable, "-c", code, ROOT, stamp, "--backend", "local", "--topo", "star",
                          "--workers", "2", "--elements", "100", "--no-plots"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "precious\n" and os.path.islink(planted / "results.json")
    assert f"results: results/{stamp}-2/results.json, results/{stamp}-2/links.csv" in out.stdout
    assert json.loads((tmp_path / "results" / f"{stamp}-2" / "results.json").read_text())["runs"][0]["correct"]


def test_json_naming_a_planted_link_is_one_line_before_the_run(tmp_path, victim):
    (tmp_path / "r.json").symlink_to(victim)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "local", "--topo",
                          "star", "--workers", "2", "--elements", "100", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 2 and out.stdout == "" and out.stderr == (
        f"error: cannot write {tmp_path / 'r.json'}: it is a symbolic link; innet does not write through links: "
        "remove it or name another file\n")
    assert victim.read_text() == "precious\n" and sorted(os.listdir(tmp_path)) == ["r.json", "victim"]
