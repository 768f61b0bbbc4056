"""run_topology.py end to end on the local backend, and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_issue_command_eight_workers_a_million_elements(tmp_path):
    out = run_cli("--backend", "local", "--topo", "star", "--workers", "8", "--elements", "1000003",
                  "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"))
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    [r] = data["runs"]
    assert r["correct"] is True and r["workers"] == 8 and r["elements"] == 1000003
    for key in ("mode", "backend", "program", "iterations", "max_abs_error", "completion_s", "link_bytes",
                "tier_bytes", "retransmissions", "packets_dropped"):
        assert key in r
    # every byte counted on a link also appears in its tier
    assert sum(r["link_bytes"].values()) == sum(r["tier_bytes"].values())
    assert (tmp_path / "o" / "links.csv").read_text().startswith("mode,backend,link,tier,bytes")


@pytest.mark.parametrize("args,message", [
    (["--topo", "nope"], "unknown topology 'nope'"),
    (["--program", "nope"], "unknown program 'nope'"),
    (["--elements", "0"], "--elements must be between 1 and 2.14748e+09, got 0"),
    (["--iterations", "-2"], "--iterations must be between 1 and 1e+06, got -2"),
    (["--loss", "1.5"], "loss must be a probability"),
    (["--workers", "99"], "more than the 4 hosts"),
    (["--topo", "fat-tree", "--k", "3"], "even k"),
    (["--switch-memory", "100"], "bytes of register memory but switch"),
    (["--topo", "/nonexistent/t.graphml"], "does not exist"),
    (["--topo", "BAD_GRAPHML"], "is not valid GraphML"),
    (["--program", "SYNTAX_ERROR"], "syntax error at line 2"),
    (["--program", "RAISES"], "failed to load: ZeroDivisionError"),
    (["--program", "HUGE"], "needs 4294967296 bytes of register memory but switch"),
    (["--racks", "0"], "--racks must be between 1 and 4096, got 0"),
    (["--topo", "leaf-spine", "--oversubscription", "0"], "--oversubscription must be between 1 and 1024"),
    (["--timeout", "0"], "--timeout must be between 1e-06 and 1e+09, got 0.0"),
    (["--bw", "-5"], "--bw must be between 0.001 and 1e+07, got -5.0"),
    (["--pipeline", "2"], "--pipeline overlaps a workload's compute with its communication: it needs --workload"),
    (["--dup", "-0.1"], "dup must be a probability"),
    (["--fault", "h1t1:loss=0.1"], "is not LINK:key=value"),
    (["--fault", "h1--t1:speed=3"], "unknown fault 'speed'"),
    (["--fault", "h1--s1:loss=0.1"], "does not have"),
    (["--crash", "h9@1"], "not a host of this topology"),
    (["--crash", "h1@soon"], "HOST@SECONDS"),
    (["--jobs", "9"], "--jobs must be between 1 and the 4 workers"),
    (["--pbox-cores", "0"], "--pbox-cores must be between 1 and 256, got 0"),
    (["--mode", "pbox", "--topo", "NO_PBOX"], "needs a PBox host"),
    (["--topo", "star", "--workers", "0"], "--workers must be between 1 and 65536, got 0"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--elements", "many"], "invalid int value"),
    (["--job-slots", "-1"], "--job-slots must be between 0 and 1.04858e+06, got -1"),
    (["--pool-slots", "-2"], "--pool-slots must be between 0 and 1.04858e+06, got -2"),
    (["--pool-slots", "8", "--program", "forward"], "program forward keeps no slot pool"),
    (["--pool-slots", "4096"], "lower its slots (--pool-slots) or elements (--packet-elements), or raise --switch-memory"),
    (["--packet-elements", "2048", "--pool-slots", "512"], "(--packet-elements), or raise --switch-memory"),
    (["--packet-elements", "2240"], "--packet-elements must be 1..2239 (a frame must fit a 9000-byte jumbo MTU), got 2240"),
    (["--packet-elements", "-3"], "--packet-elements must be between 0 and 65536, got -3"),
    (["--jobs", "2", "--job-priority", "0"], "--job-priority wants one band in 0..2 per job (2)"),
    (["--job-priority", "3"], "--job-priority wants one band in 0..2"),
    (["--job-priority", "urgent"], "argument --job-priority: wants bands like 0,2"),
    (["--shared-input"], "--shared-input needs --input-elements"),
])
def test_bad_input_gets_one_clear_line(args, message, tmp_path, capsys):
    """Refusals checked in process (innet.cli.main): the command line's own line, with no interpreter to start."""
    from innet import cli

    files = {
        "BAD_GRAPHML": ("t.graphml", "<graphml><graph><node id='a'/>"),
        "SYNTAX_ERROR": ("p.py", "from innet import SwitchProgram\nclass P(SwitchProgram:\n"),
        "RAISES": ("p.py", "x = 1 / 0\n"),
        "HUGE": ("p.py", "import numpy as np\nfrom innet import Register, SwitchProgram, on_packet\n"
                         "class Huge(SwitchProgram):\n    slots = 2**20\n    elements = 1024\n"
                         "    registers = (Register('pool', ('slots', 'elements'), np.int32),)\n"
                         "    @on_packet('contribution')\n    def c(self, ctx, pkt):\n        return None\n"),
        "NO_PBOX": ("t.json", '{"nodes": [{"id": "h1"}, {"id": "h2"}, {"id": "s"}], "links": [{"source": "h1", "target": "s"}, '
                              '{"source": "h2", "target": "s"}]}'),
    }
    args = list(args)
    for i, a in enumerate(args):
        if a in files:
            name, text = files[a]
            (tmp_path / name).write_text(text)
            args[i] = str(tmp_path / name)
    code = cli.main(["--backend", "local", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_mininet_backend_as_non_root_says_use_sudo(monkeypatch, capsys):
    from innet import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["--topo", "star"]) == 2
    assert capsys.readouterr().err.strip() == "error: the mininet backend needs root: run with sudo, or use --backend local"


def test_mode_all_compares_the_three_modes(tmp_path):
    out = run_cli("--backend", "local", "--mode", "all", "--hosts-per-rack", "3", "--elements", "20000", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    head, *rows = out.stdout.splitlines()[:4]
    assert "time/pbox" in head and "xrack/pbox" in head and "busiest_link" in head
    assert [r.split()[0] for r in rows] == ["innet", "pbox", "ring"]
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    innet, pbox, ring = runs
    assert all(r["correct"] for r in runs)
    assert innet["cross_rack_bytes"] * 3 == pbox["cross_rack_bytes"]  # exactly 1/H with H=3
    for r in runs:
        assert r["link_bytes"] == r["predicted_link_bytes"]
        assert r["max_link_bytes"] == r["link_bytes"][r["busiest_link"]]
    for png in ("links.png", "tiers.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_only_starts_nothing_and_prints_the_tree():
    out = run_cli("--backend", "local", "--plan-only", "--topo", "fat-tree", "--placement", "tree")
    assert out.returncode == 0
    assert "root c1" in out.stdout and "lower bound" in out.stdout and "cross-rack" in out.stdout


def test_the_bandwidth_cap_is_mininets_alone(monkeypatch, capsys, tmp_path):
    """TCLink cannot shape above 1000 Mbit/s; the fabric can: a 10 Gbit/s run is the fabric's to make."""
    from innet import cli

    assert cli.main(["--backend", "local", "--bw", "10000", "--elements", "1000", "--out", str(tmp_path), "--no-plots"]) == 0
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cli.main(["--backend", "mininet", "--bw", "2000", "--dilation", "off"]) == 2  # undilated: stops before Mininet
    assert ("--bw 2000 is 2000 Mbit/s on the dilated links (--dilation factor 1), above the 1000 TCLink can shape: "
            "dilate by at least 2, or use the local backend") in capsys.readouterr().err


def test_plan_only_with_mode_all_plans_every_mode(capsys):
    from innet import cli

    assert cli.main(["--backend", "local", "--plan-only", "--mode", "all"]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("topology ")]
    assert [h.split("mode ")[1].split(",")[0] for h in heads] == ["innet", "pbox", "ring"]


def test_predict_prints_the_error_of_a_plain_call_with_latency(tmp_path):
    """README's example: star of 4, 65536 elements, 1 ms on every link."""
    out = run_cli("--backend", "local", "--topo", "star", "--workers", "4", "--elements", "65536", "--delay", "0.001",
                  "--predict", "--out", str(tmp_path), "--no-plots")
    assert out.returncode == 0, out.stderr
    head, row = [line.split() for line in out.stdout.splitlines() if "completion_s" in line or line.startswith("innet ")][-2:]
    assert head[-1] == "error" and row[2] == "0.0062" and row[3] == "0.0062" and abs(float(row[4].rstrip("%"))) < 1


def test_an_interrupt_during_the_imports_is_exit_130_without_a_traceback():
    """An interrupt that lands while networkx defines its classes reaches run_topology.py wrapped in a
    RuntimeError (Python 3.11's __set_name__): still one line and exit 130, as on a slow CI machine."""
    inject = (
        "import builtins, runpy, sys\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name == 'networkx':\n"
        "        class Slot:\n"
        "            def __set_name__(self, owner, attr):\n"
        "                raise KeyboardInterrupt\n"
        "        class Graph:\n"
        "            adj = Slot()\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        f"sys.argv = ['run_topology.py', '--backend', 'local']\n"
        f"runpy.run_path({os.path.join(ROOT, 'run_topology.py')!r}, run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", inject], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (130, "interrupted\n")


def test_the_command_lines_interrupt_guard_is_in_place_before_anything_slow_loads():
    """``import innet.commands`` (and so ``import innet``) loads only the standard library: run_topology.py and
    the ``innet`` command set their interrupt guard before scapy, numpy or networkx start loading, so an interrupt
    at any point of start-up is exit 130. innet's names still resolve on first use."""
    code = ("import sys, innet.commands; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'scapy', 'numpy', 'networkx', 'torch'}))); "
            "import innet; print(innet.SwitchProgram.__module__, innet.run.__module__, 'Reduction' in dir(innet))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["", "innet.switch.program innet.api True"]
