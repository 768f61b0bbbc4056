"""README's "Writing a switch program" walk-through and its long form (docs/programs.md), run as written: their
files, their tests, their commands; and the commands of README's subsections and docs/running.md's Wireshark."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def section(title: str, doc: str = "README.md") -> str:
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def whole(doc: str) -> str:
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


WALK = section("Writing a switch program")
LONG = whole("docs/programs.md")  # the walk-through's long form: an operator of your own, any other program
FILES = {b.splitlines()[0].removeprefix("# file: "): b for text in (WALK, LONG) for b in blocks(text, "python")
         if b.startswith("# file: ")}
COMMANDS = [line for text in (WALK, LONG) for b in blocks(text, "sh") for line in b.strip().splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    where = tmp_path_factory.mktemp("newcomer")
    for name, text in FILES.items():
        (where / name).write_text(text)
    return where


def test_the_walk_through_has_its_files_and_commands():
    assert set(FILES) == {"my_max.py", "test_my_max.py", "my_prod.py", "count_ports.py", "test_count_ports.py"}
    assert len(COMMANDS) == 5
    readme = {b.splitlines()[0] for b in blocks(WALK, "python")}
    assert readme == {"# file: my_max.py", "# file: test_my_max.py"}  # a reduction and its test, without docs/
    assert [c.split()[-1] for c in COMMANDS[:2]] == ["all", "test_my_max.py"]
    assert "(docs/programs.md)" in WALK


def test_the_max_all_reduce_and_its_test_fit_in_30_lines():
    lines = [line for name in ("my_max.py", "test_my_max.py") for line in FILES[name].splitlines()
             if line.strip() and not line.startswith("# file:")]
    assert len(lines) <= 30
    assert f"That is {len(lines)} non-blank lines, program and test." in WALK


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_runs_as_written(command, workdir):
    argv = command.split()
    assert argv[0] == "python"
    if argv[1] == "run_topology.py":
        argv = [sys.executable, os.path.join(ROOT, "run_topology.py"), *argv[2:], "--out", str(workdir / "out")]
        out = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        rows = [r for r in map(str.split, out.stdout.splitlines())  # the summary's rows: a mode, then correct 4th
                if r[:1] in (["innet"], ["pbox"], ["ring"]) and len(r) > 3 and r[3] in ("True", "False")]
        modes = ["innet", "pbox", "ring"] if "all" in argv else [argv[argv.index("--mode") + 1]]
        assert [r[0] for r in rows] == modes and all(r[3] == "True" for r in rows), out.stdout
    else:
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, *argv[1:], "-q", "-p", "no:cacheprovider"], cwd=workdir, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0 and " passed" in out.stdout, out.stdout + out.stderr


def test_make_test_slow_runs_the_tests_beside_a_burner_and_stops_it():
    out = subprocess.run(["make", "-s", "test-slow", "TESTS=tests/test_layers.py -q -p no:cacheprovider"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    burner = int(re.search(r"burner (\d+) keeps core 0 busy", out.stdout).group(1))
    assert " passed" in out.stdout
    deadline = time.monotonic() + 10  # a SIGTERM is delivered, not yet acted on, when kill returns
    while not _gone(burner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(burner), "the burner outlived the tests"


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def subsection(title: str, within: str = "Running it") -> str:
    text = section(within)
    start = text.index(f"### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start:end if end > 0 else None]


@pytest.fixture()
def shell(tmp_path):
    """Runs a README command line in bash, in a fresh directory with a home of its own, where ``python`` is this
    interpreter and ``run_topology.py`` this checkout's."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=ROOT, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")

    def run(command: str) -> subprocess.CompletedProcess:
        command = command.replace(" run_topology.py ", f" {os.path.join(ROOT, 'run_topology.py')} ")
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    return run


def test_the_topology_file_commands_run_as_written(shell, tmp_path):
    from innet.graph import switches
    from tests.helpers import p4utils_topology
    from topologies import build

    p4run, save = [line for b in blocks(subsection("Topologies"), "sh") for line in b.strip().splitlines()]
    (tmp_path / "topology.json").write_text(json.dumps(p4utils_topology()))
    out = shell(p4run)
    assert out.returncode == 0, out.stderr
    assert [line.split()[:4] for line in out.stdout.splitlines() if line.startswith("innet ")][0] == [
        "innet", "tor", "local", "True"]  # the summary's row (the per-direction table's rows follow)
    out = shell(save)
    assert out.returncode == 0, out.stderr
    assert len(switches(build(str(tmp_path / "ft.graphml")))) == 20


def test_the_wireshark_commands_run_as_written(shell, tmp_path):
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    from innet.wire.layer import InnetAgg
    from innet.wire.packet import RETX
    from tests.helpers import every_kind

    captures = section("Reading captures in Wireshark", "docs/running.md")  # README's Running it links it
    assert "[docs/running.md](docs/running.md)" in section("Running it") and "Wireshark" in section("Running it")
    install, listing, retx, once = [line.split("   #")[0] for b in blocks(captures, "sh")
                                    for line in b.strip().splitlines()]
    frames = every_kind()
    (tmp_path / "pcaps").mkdir()
    wrpcap(str(tmp_path / "pcaps" / "tor1-eth1.pcap"), [Ether(f) for f in frames])
    assert shell(listing).stdout.count(" innet ") == 0  # not installed yet: plain UDP
    out = shell(install)
    assert out.returncode == 0 and (tmp_path / ".local/lib/wireshark/plugins/innet.lua").exists(), out.stderr
    lines = shell(listing).stdout.splitlines()
    assert len(lines) == len(frames) and all(" innet " in line for line in lines)
    aggs = [Ether(f)[InnetAgg] for f in frames]
    assert shell(retx).stdout.split("\n")[:-1] == [f"{a.rank}\t{a.chunk}" for a in aggs if int(a.flags) & RETX]
    for installed in (True, False):  # given with -X while installed too, it does not load twice
        if not installed:
            (tmp_path / ".local/lib/wireshark/plugins/innet.lua").unlink()
        out = shell(once)
        assert out.returncode == 0 and "Lua" not in out.stderr, out.stderr
        assert out.stdout.count("innet gradient aggregation") == len(frames) and "    chunk: 4294967295" in out.stdout


@pytest.mark.mininet
def test_the_cluster_commands_run_as_written(shell):
    """Test servers up, a run over them with its cluster line, servers down (test_cluster.py checks the figures)."""
    up, run, down = [line.removeprefix("sudo ").replace("scripts/", f"{ROOT}/scripts/")
                     for b in blocks(subsection("Past one machine: a cluster", "Scaling up"), "sh")
                     for line in b.strip().splitlines()]
    out = shell(up)
    try:
        assert out.returncode == 0, out.stderr
        assert run.split("run_topology.py ")[1] in out.stdout  # the script prints the flags the README runs with
        out = shell(run)
        assert out.returncode == 0, out.stderr
        assert re.search(r"^innet cluster \(10.213.57.1: h1 h2 p1 s1 t1; 10.213.57.2: h3 h4 t2\): \d+ B crossed servers "
                         r"on 1 tunnel link\(s\): s1--t2 \d+$", out.stdout, re.M), out.stdout
    finally:
        gone = shell(down)
    assert gone.returncode == 0 and "removed 2 test server(s)" in gone.stdout, gone.stderr


def test_the_bytes_each_way_and_timeline_command_runs_as_written(shell, tmp_path):
    """*Running it*'s reduce-scatter on a star of 4: links.csv gives each downlink its rank's shard (and every chunk's
    header), each way beside the planner's; trace.json holds a reduce-scatter slice per rank and the switch's slots."""
    from innet.wire.collectives import Collective
    from innet.wire.packet import PAYLOAD_OFFSET
    from tests.test_timeline import check_trace_format

    [command] = [line for b in blocks(section("Running it"), "sh") for line in b.strip().splitlines() if "--timeline" in line]
    out = shell(command)
    assert out.returncode == 0, out.stderr
    assert "timeline: trace.json" in out.stdout
    assert re.search(r"^innet +host-tor +\d+ +\d+ +\d+ +\d+$", out.stdout, re.M)  # the table per tier and direction
    [csv] = list((tmp_path / "results").glob("*/links.csv"))
    head, *rows = [line.split(",") for line in csv.read_text().splitlines()]
    assert head == ["mode", "backend", "link", "tier", "bytes", "up", "bytes_up", "bytes_down", "predicted_up",
                    "predicted_down"]
    hosts = {r[2]: r for r in rows if r[3] == "host-tor"}
    shards = [int(s) for s in Collective.shards(65536, 4, 2048)]
    headers = (65536 // 2048 + 1) * PAYLOAD_OFFSET
    for rank, name in enumerate(sorted(hosts)):
        r = hosts[name]
        assert r[5] == f"h{rank + 1}->s1" and r[6:8] == r[8:10] and int(r[4]) == int(r[6]) + int(r[7])
        assert int(r[7]) == headers + 4 * (shards[rank + 1] - shards[rank])  # a quarter of the values down
    trace = json.loads((tmp_path / "trace.json").read_text())
    check_trace_format(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["tid"] for e in slices) == [1, 2, 3, 4] and {e["name"] for e in slices} == {"reduce_scatter"}
    assert any(e["args"].get("name") == "innet (tor, local): switch s1 (256 slots)" for e in trace["traceEvents"])
