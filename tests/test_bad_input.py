"""Every class of bad input the trust issue found, tried through the command line and the Python API: each is one
line (``error: ...``, exit 2 on the command line; one ``UserError`` line from the API) before any work — no
backend is reached, no file or folder is left — never a traceback, a hang, or a run of something else."""

import json
import math
import os

import pytest

import innet
from innet import api, cli
from innet.errors import UserError

# numeric flags: values that are not finite, out of range, or of the wrong kind (as the flag reads its text)
NUMERIC = ["--elements", "--iterations", "--workers", "--seed", "--timeout", "--min-rto", "--initial-rto",
           "--switch-memory", "--pool-slots", "--packet-elements", "--job-slots", "--pbox-cores", "--input-elements",
           "--compute-scale", "--workload-scale", "--loss", "--dup", "--reorder", "--delay", "--bw", "--topk"]
BAD_NUMBERS = ["nan", "inf", "-inf", "-5", "1e400", "x"]
CASES = [[flag, value] for flag in NUMERIC for value in BAD_NUMBERS
         if not (flag in ("--elements", "--iterations", "--workers", "--seed") and value in ("1e400",))]
CASES += [
    # sizes that would hang or overflow before memory is checked
    ["--topo", "fat-tree", "--k", "200"], ["--iterations", "100000000000000000000"], ["--workers", "100000000"],
    ["--input-elements", "100000000000000000000"], ["--pbox-cores", "100000000000000000000"],
    ["--topo", "leaf-spine", "--racks", "100000"], ["--train", "digits", "--hidden", "100000000000000000000"],
    ["--train", "digits", "--batch", "100000000000000000000"], ["--compute-scale", "1e308"],
    # unknown choices and malformed values
    ["--mode", "bogus"], ["--placement", "bogus"], ["--collective", "bogus"], ["--consistency", "bogus"],
    ["--overlap", "bogus"], ["--priority", "bogus"], ["--workload", "bogus"], ["--pipeline", "3"],
    ["--dilation", "fast"], ["--dilation", "nan"], ["--node-group", "-1"], ["--crash", "h1@nan"], ["--crash", "h1"],
    ["--crash", "@1"], ["--straggler", "h1"], ["--straggler", "h1:nan"], ["--job-priority", "x"],
    ["--background", "bogus:0.5"], ["--fault", "h1--s1:loss=2"], ["--fault", "nolink"], ["--topo", "nope"],
    ["--program", "no_such_program"], ["--train", "nope"],
    # options that mean nothing where they are given
    ["--placement", "tor", "--mode", "ring"], ["--placement", "root", "--mode", "pbox"],
    ["--job-slots", "4", "--mode", "ring"], ["--pbox-cores", "2", "--mode", "ring"],
    ["--straggler", "h1:2"], ["--compute-time", "0.1"], ["--shared-input"],
    ["--mode", "pbox", "--consistency", "ssp", "--straggler", "h9:2"], ["--crash", "h9@1"],
    ["--train", "digits", "--iterations", "7"], ["--train", "digits", "--elements", "5"],
    ["--staleness", "2"], ["--overlap", "none"], ["--pipeline", "2"], ["--slice", "100"], ["--priority", "p3"],
    ["--sharded"], ["--root", "1"], ["--collective", "broadcast", "--root", "9"], ["--k", "4"],
    ["--topo", "star", "--racks", "2"], ["--epochs", "2"], ["--cluster-key", "k"], ["--hop-latency", "0.1"],
    ["--program", "forward"], ["--program", "forward", "--placement", "tor"], ["--program", "forward", "--mode", "all"],
    ["--placement", "dynamic", "--program", "sum_allreduce"], ["--program", "dynamic_tree"],
    ["--collective", "reduce", "--program", "forward"],
    ["--dilation", "5"], ["--mode", "gloo"], ["--backend", "gloo", "--mode", "ring"], ["--out", ""],
    # jobs that do not fit
    ["--switch-memory", "20000"], ["--jobs", "9"], ["--topo", "fat-tree", "--k", "64", "--elements", "1000000"],
    ["--pool-slots", "100000", "--packet-elements", "2048"], ["--packet-elements", "3000"],
]
FILES = {  # topology and program files, each with a fault of its own
    "dup_id.json": '{"nodes": [{"id": "h1"}, {"id": "h1"}, {"id": "s1"}], "links": [{"source": "h1", "target": "s1"}]}',
    "ghost.json": '{"nodes": [{"id": "h1"}, {"id": "h2"}, {"id": "s1"}], "links": [{"source": "h1", "target": "s1"}, '
                  '{"source": "h2", "target": "s1"}, {"source": "h3", "target": "s1"}]}',
    "bool_bw.json": '{"nodes": [{"id": "h1"}, {"id": "h2"}, {"id": "s1"}], "links": [{"source": "h1", "target": "s1", '
                    '"bw": true}, {"source": "h2", "target": "s1"}]}',
    "inf_latency.json": '{"nodes": [{"id": "h1"}, {"id": "h2"}, {"id": "s1"}], "links": [{"source": "h1", "target": '
                        '"s1", "latency": Infinity}, {"source": "h2", "target": "s1"}]}',
    "zero_bw.json": '{"nodes": [{"id": "h1"}, {"id": "h2"}, {"id": "s1"}], "links": [{"source": "h1", "target": "s1", '
                    '"bw": 0}, {"source": "h2", "target": "s1"}]}',
    "deep.json": "[" * 200000 + "]" * 200000,
    "no_hosts.json": '{"nodes": [{"id": "s1", "role": "tor"}, {"id": "s2", "role": "spine"}], "links": '
                     '[{"source": "s1", "target": "s2"}]}',
    "not_json.json": "{nodes",
    "dup_id.graphml": "<graphml xmlns='http://graphml.graphdrawing.org/xmlns'><graph edgedefault='undirected'>"
                      "<node id='h1'/><node id='h1'/><node id='s1'/><edge source='h1' target='s1'/></graph></graphml>",
    "ghost.graphml": "<graphml xmlns='http://graphml.graphdrawing.org/xmlns'><graph edgedefault='undirected'>"
                     "<node id='h1'/><node id='s1'/><edge source='h1' target='s1'/><edge source='h2' target='s1'/>"
                     "</graph></graphml>",
    "syntax.py": "from innet import SwitchProgram\nclass P(SwitchProgram:\n",
    "exits.py": "raise SystemExit(3)\n",
    "raises.py": "x = 1 / 0\n",
    "two.py": "from innet import SUM, Reduction\nclass A(Reduction):\n    operator = SUM\nclass B(Reduction):\n"
              "    operator = SUM\n",
    "bad_rule.py": "from innet import Operator, Reduction\nclass X(Reduction):\n"
                   "    operator = Operator('x', 'bitwise_xor', identity=0, rule='sum')\n",
    "batch_only.py": "from innet import SwitchProgram, on_batch\nclass B(SwitchProgram):\n    slots = 4\n"
                     "    @on_batch('contribution')\n    def many(self, ctx, batch):\n        return [], batch\n",
}
for name in FILES:
    CASES.append(["--topo" if not name.endswith(".py") else "--program", f"FILE:{name}"])
CASES += [["--topo", "DIR"], ["--topo", "FIFO"], ["--topo", "/dev/zero"], ["--topo", "MISSING.json"],
          ["--program", "DIR"], ["--program", "MISSING.py"], ["--topo", "UNREADABLE.json"],
          ["--json", "DIR"], ["--save-topology", "DIR"], ["--json", "FIFO"]]


def _materialise(args, tmp_path):
    out = []
    for a in args:
        if a.startswith("FILE:"):
            (tmp_path / a[5:]).write_text(FILES[a[5:]])
            a = str(tmp_path / a[5:])
        elif a == "DIR":
            (tmp_path / "adir").mkdir(exist_ok=True)
            a = str(tmp_path / "adir")
        elif a == "FIFO":
            if not (tmp_path / "fifo").exists():
                os.mkfifo(tmp_path / "fifo")
            a = str(tmp_path / "fifo")
        elif a.startswith("MISSING"):
            a = str(tmp_path / a)
        elif a == "UNREADABLE.json":
            (tmp_path / a).write_text(FILES["zero_bw.json"])
            os.chmod(tmp_path / a, 0)
            if os.geteuid() == 0:
                pytest.skip("root reads a 000-mode file")
            a = str(tmp_path / a)
        out.append(a)
    return out


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """No backend may be reached; the test runs in an empty folder, which must stay empty but for its inputs."""
    def refuse(*_):
        raise AssertionError("a backend was reached")

    for name in list(api.BACKENDS):
        monkeypatch.setitem(api.BACKENDS, name, refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args", CASES, ids=[" ".join(a)[:60] for a in CASES])
def test_bad_input_on_the_command_line_is_one_line_before_any_work(args, nothing_runs, capsys):
    before = set(os.listdir(nothing_runs))
    argv = _materialise(args, nothing_runs)
    inputs = set(os.listdir(nothing_runs))
    code = cli.main(["--backend", "local", "--topo", "star", *argv] if "--topo" not in argv else ["--backend", "local", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    assert "Traceback" not in err[0]
    assert set(os.listdir(nothing_runs)) <= inputs | before, "left something behind"


API_CASES = [
    {"elements": "100"}, {"elements": 1.5}, {"loss": "0.1"}, {"loss": math.nan}, {"delay": math.inf},
    {"out": 123}, {"faults": "loss"}, {"placement": "bogus"}, {"collective": "bogus"}, {"consistency": "bogus"},
    {"overlap": "bogus"}, {"priority": "bogus"}, {"crash": "h1@2"}, {"stragglers": [("h1", "x", 1)]},
    {"timeout": math.nan}, {"workers": True}, {"plots": 1}, {"topo": 5}, {"program": 3}, {"background": 5},
]


@pytest.mark.parametrize("options", API_CASES, ids=[repr(o)[:40] for o in API_CASES])
def test_bad_input_to_the_api_is_one_user_error_line(options, nothing_runs):
    options = {"topo": "star", "backend": "local", **options}
    with pytest.raises(UserError) as caught:
        innet.run(**options)
    assert "\n" not in str(caught.value)


def test_the_table_covers_at_least_150_cases():
    assert len(CASES) + len(API_CASES) >= 150


def test_a_good_run_still_writes_its_results(tmp_path):
    """The guard above would also pass if everything were refused: the same command line with good values runs."""
    code = cli.main(["--backend", "local", "--topo", "star", "--elements", "1000", "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 0 and json.loads((tmp_path / "o" / "results.json").read_text())["runs"][0]["correct"] is True
