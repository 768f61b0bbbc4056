"""innet replay: MLCommons Chakra execution traces on the fabric. The .et format byte for byte (ASTRA-sim's public
microbenchmark traces are what innet writes, by their git blob ids); the schedule's virtual time on hand-made traces;
the public 8-NPU microbenchmarks (all-reduce, all-gather, all-to-all, 1 MB) on a star of 8 and 8 hosts of a fat-tree
k=4 in every mode, exact, each call within 10% of the timing model, bytes per link the planner's; a bad trace in
one line."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from innet.api import prepare
from innet.commands import main
from innet.errors import UserError
from innet.integrations.chakra.make import data_parallel, microbenchmark, pipeline
from innet.integrations.chakra.replay import replay
from innet.integrations.chakra.schedule import Schedule
from innet.integrations.chakra.trace import COMP, RECV, SEND, Node, RankTrace, collective_node, load, parse, trace_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# git blob ids of ASTRA-sim's examples/workload/microbenchmarks/NAME/8npus_1MB/NAME.RANK.et (MIT licence), rank 0..7,
# at commit 518bd513ae110428cd62eb60efc0f3993fd53c70 of github.com/astra-sim/astra-sim
PUBLIC = {
    "ALL_REDUCE": ["ea968f4071245b01039cbb9e704f301e3203484f", "fbcee3b505df37214191da627eb49a25983cdae7",
                   "42f3f05459f77804ee2ebc47020d02becf7eb8ee", "c3488e26cdc7becef45f5a05f5f687593044d22d",
                   "72052d2a881782454e737766ff32b3fe699fda9c", "22088cbe54281de65fb54d497a1543e5aedf3d25",
                   "045b36071c3c75f6f1fabd7924d7c4515d262e4b", "fc8c4c520d4f9424798086833b2521cf59f3ff30"],
    "ALL_GATHER": ["16abd39ce5c86e503301ef3086509e85da5a880b", "3bf545e236320277e6f05ad352131e345bceafa3",
                   "f9318e73411735fb008e3bb1a65cd59a0a3172be", "21413a715fb052bfc25465838cdfca5a16801da0",
                   "d4a6f0e9884d851952cd64b2ed22a425bb936b05", "65d1574a4e44f1e3966a0ecb3b2ac628ce7eec8c",
                   "05edf8ee38080c7557d5bbe7ee339207635c7991", "4cf65e2e29073a518afd107bd8972c489e66e056"],
    "ALL_TO_ALL": ["6cb71d4fca0d894a3eca7dbf122a2998a53555d3", "7c68529da149714edf64d1efa4532b57c4acb541",
                   "bf98464e9362a59bc5f6e304de89acba04230e16", "8ecd151496caf3ff5e40067d8a72e01ade5461f8",
                   "342ad486cb3f5b81e4edea30094481ca80ff668c", "c809ec72297f1838987653bd3526184810621743",
                   "079661f4c81a5a8b35fba9d84661ab9144cfb5e8", "3b4f1f9d68d23ac69ffb7ccb3b0b0d237138868b"],
}


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    """The three 8-NPU 1 MB microbenchmark traces, as innet writes them: a folder each."""
    where = tmp_path_factory.mktemp("microbenchmarks")
    folders = {}
    for kind in PUBLIC:
        folders[kind] = where / kind.lower()
        folders[kind].mkdir()
        microbenchmark(str(folders[kind]), kind, 8)
    return folders


def test_innet_writes_astra_sims_microbenchmark_traces_byte_for_byte(public):
    for kind, ids in PUBLIC.items():
        files = sorted(os.listdir(public[kind]), key=lambda f: int(f.split(".")[1]))
        assert files == [f"{kind.lower()}.{r}.et" for r in range(8)]
        assert [blob_id((public[kind] / f).read_bytes()) for f in files] == ids, kind


def test_a_trace_reads_back_as_written():
    node = Node(7, "mixed", COMP, ctrl_deps=(1, 300), data_deps=(2,), start_time_micros=5, duration_micros=1234,
                attrs={"is_cpu_op": True, "n": -3, "big": 1 << 40, "x": 0.25, "s": "text", "raw": b"\x00\xff"})
    version, nodes = parse(trace_bytes([node, collective_node(8, "", "ALL_GATHER", 4096, (7,))], "0.0.4"))
    assert version == "0.0.4"
    assert nodes[0] == node
    assert (nodes[1].type, nodes[1].data_deps, nodes[1].attrs) == (7, (7,), {"is_cpu_op": False, "comm_type": 2,
                                                                           "comm_size": 4096})
    # a packed list attribute (involved_dim, as Chakra's converter writes it) and an unknown field skipped
    attr = b"\x0a\x0cinvolved_dim" + b"\xe2\x01\x04\x0a\x02\x01\x00" + b"\xa8\x1f\x05"
    message = b"\x08\x09" + b"\x52" + bytes([len(attr)]) + attr
    _, [read] = parse(b"\x00" + bytes([len(message)]) + message)
    assert (read.id, read.attrs) == (9, {"involved_dim": (True, False)})


def trace(*ranks):
    return [RankTrace(f"rank{r}.et", "0.0.4", tuple(nodes)) for r, nodes in enumerate(ranks)]


def comp(id, micros, *deps, cpu=False):
    return Node(id, f"comp{id}", COMP, data_deps=deps, duration_micros=micros, attrs={"is_cpu_op": cpu})


def message(id, kind, src, dst, size, *deps, tag=0):
    return Node(id, f"msg{id}", kind, data_deps=deps, attrs={"comm_src": src, "comm_dst": dst, "comm_size": size,
                                                             "comm_tag": tag})


def test_the_schedule_honours_dependencies_lanes_and_the_network_one_call_at_a_time():
    carried = []

    def network(calls):  # every call takes 1 ms
        carried.append([(c.kind, c.name) for c in calls])
        return 0.001

    ranks = trace(
        # rank 0: 100 us of compute, then the all-reduce; a CPU node beside it on its own lane; 50 us after
        [comp(1, 100), collective_node(2, "ar", "ALL_REDUCE", 64, (1,)), comp(3, 50, 2), comp(4, 400, cpu=True),
         message(5, SEND, 0, 1, 8, 3), message(6, SEND, 0, 1, 8, 3, tag=1)],
        # rank 1: 300 us, and a control dependency on a node the file lacks (Chakra's converter writes those)
        [Node(1, "c", COMP, ctrl_deps=(99,), duration_micros=300), collective_node(2, "ar", "ALL_REDUCE", 64, (1,)),
         message(3, RECV, 0, 1, 8, 2, tag=1), message(4, RECV, 0, 1, 8, 2)])
    timed, end = Schedule(ranks).run(network)
    assert [(t.comm.kind, round(t.start, 6), round(t.end, 6)) for t in timed] == [
        ("ALL_REDUCE", 0.0003, 0.0013), ("SEND", 0.00135, 0.00235), ("SEND", 0.00135, 0.00235)]
    assert carried == [[("ALL_REDUCE", "ar")], [("SEND", "msg5"), ("SEND", "msg6")]]  # both messages at once
    assert {(t.comm.tag, t.comm.nodes) for t in timed[1:]} == {(0, ((0, 5), (1, 4))), (1, ((0, 6), (1, 3)))}
    assert end == pytest.approx(0.00235)


def test_compute_on_one_lane_waits_its_turn():
    timed, end = Schedule(trace([comp(1, 100), comp(2, 100), comp(3, 100, cpu=True)])).run(lambda calls: 0.0)
    assert timed == [] and end == pytest.approx(0.0002)


@pytest.fixture(scope="module", params=["star", "fat-tree"])
def fabric(request):
    return prepare(request.param, default_backend="local", calibrate=False, workers=8, mode="all")


@pytest.mark.parametrize("kind", list(PUBLIC))
def test_the_public_microbenchmarks_replay_exact_in_every_mode_at_the_models_time(kind, public, fabric):
    traces = load([str(public[kind])])
    schedule = Schedule(traces)
    assert [m.spec.mode for m in fabric.runs] == ["innet", "pbox", "ring"]
    for m in fabric.runs:
        record = replay(fabric.graph, m.spec, traces, schedule)
        assert record.correct and record.ranks == 8, m.spec.mode
        [call] = record.calls
        assert (call.kind, call.bytes, call.ranks) == ({"ALL_REDUCE": "allreduce", "ALL_GATHER": "all_gather",
                                                        "ALL_TO_ALL": "all_to_all"}[kind], 1 << 20, tuple(range(8)))
        assert call.start_s == 0 and call.time_s == pytest.approx(record.virtual_s)
        assert abs(call.model_s / call.time_s - 1) < 0.10, (m.spec.mode, call.time_s, call.model_s)
        moved = {k: b for k, b in record.link_bytes.items() if b}
        assert moved and moved == {k: b for k, b in record.predicted_link_bytes.items() if b}, m.spec.mode
        hosts = [k for k in moved if k.startswith("h")]
        assert len(hosts) == 8  # every rank's link carried its share


def test_a_pipeline_of_sends_and_a_data_parallel_step_replay_in_virtual_time(tmp_path):
    pipe = load(pipeline(str(tmp_path / "pipe")))
    prepared = prepare("star", default_backend="local", calibrate=False, workers=2, mode="ring")
    record = replay(prepared.graph, prepared.runs[0].spec, pipe)
    first, second = record.calls
    assert record.correct and [c.kind for c in record.calls] == ["send", "send"]
    assert first.start_s == pytest.approx(0.0005) and second.start_s == pytest.approx(first.end_s + 0.001)
    assert record.virtual_s == pytest.approx(second.end_s + 0.0005)
    assert record.link_bytes == record.predicted_link_bytes
    step = load(data_parallel(str(tmp_path / "dp")))
    prepared = prepare("star", default_backend="local", calibrate=False, workers=8, mode="innet")
    record = replay(prepared.graph, prepared.runs[0].spec, step)
    small, big = record.calls
    assert record.correct and (small.bytes, big.bytes) == (256 << 10, 1 << 20)
    assert small.start_s == pytest.approx(0.0025)  # forward and the last layer's backward
    assert big.start_s == pytest.approx(max(small.end_s, 0.0035))  # the network carries one call at a time
    assert record.virtual_s == pytest.approx(big.end_s + 0.0002)


def test_the_readme_command_replays_the_shipped_example(tmp_path):
    with open(os.path.join(ROOT, "README.md")) as f:
        [command] = [line for line in f.read().splitlines() if line.startswith("innet replay ")]
    argv = command.split()[1:] + ["--json", str(tmp_path / "replay.json")]
    out = subprocess.run([sys.executable, "-m", "innet", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    runs = json.loads((tmp_path / "replay.json").read_text())["runs"]
    assert [r["mode"] for r in runs] == ["innet", "pbox", "ring"] and all(r["correct"] for r in runs)
    assert out.stdout.count("bytes per link: the planner's prediction, exactly") == 3


def one_line(capsys, *argv):
    assert main(["replay", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_a_bad_trace_is_one_line(tmp_path, capsys, public):
    good = (public["ALL_REDUCE"] / "all_reduce.0.et").read_bytes()
    (tmp_path / "cut.0.et").write_bytes(good[:-3])
    assert "the message at byte 8 claims 72 bytes" in one_line(capsys, str(tmp_path / "cut.0.et"))
    (tmp_path / "junk.0.et").write_bytes(b"\x05\xff\xff\xff\xff\xff")
    assert "is not a Chakra execution trace" in one_line(capsys, str(tmp_path / "junk.0.et"))
    (tmp_path / "empty").mkdir()
    assert "holds no Chakra trace files" in one_line(capsys, str(tmp_path / "empty"))
    assert "ranks 0, 2" in one_line(capsys, str(public["ALL_REDUCE"] / "all_reduce.0.et"),
                                    str(public["ALL_REDUCE"] / "all_reduce.2.et"))
    assert "--workers 4 cannot replay it" in one_line(capsys, str(public["ALL_REDUCE"]), "--workers", "4")
    assert "not --backend mininet" in one_line(capsys, str(public["ALL_REDUCE"]), "--backend", "mininet")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for r, kind in enumerate(["ALL_REDUCE", "ALL_GATHER"]):
        (mixed / f"m.{r}.et").write_bytes(trace_bytes([collective_node(0, "c", kind, 64)]))
    assert "rank 0 issues ALL_REDUCE of 64 bytes, rank 1 ALL_GATHER of 64 bytes" in one_line(capsys, str(mixed))


@pytest.mark.parametrize("ranks, message", [
    ([[comp(1, 1, 2)]], "needs the data of node 2, which the file does not have"),
    ([[comp(1, 1, 2), comp(2, 1, 1)]], "is on a cycle of dependencies"),
    ([[comp(1, 1), comp(1, 2)]], "appears twice"),
    ([[message(1, SEND, 0, 1, 8)], []], "rank 0's send to rank 1 (tag 0) has no matching receive"),
    ([[message(1, RECV, 1, 0, 8)], []], "rank 0's receive from rank 1 (tag 0) has no matching send"),
    ([[message(1, SEND, 0, 5, 8)], []], "comm_dst 5 is not a rank of the 2"),
    ([[message(1, SEND, 0, 0, 8)], []], "node 1 (msg1) sends to its own rank"),
    ([[collective_node(1, "c", "BROADCAST", 8, root=2)], [collective_node(1, "c", "BROADCAST", 8, root=2)]],
     "root 2 is not a rank of the 2"),
    ([[collective_node(1, "c", "ALL_REDUCE", 8)], []], "different numbers of collectives"),
    ([[message(1, RECV, 1, 0, 8), collective_node(2, "c", "ALL_REDUCE", 8, (1,))],
      [collective_node(1, "c", "ALL_REDUCE", 8), message(2, SEND, 1, 0, 8, 1)]], "collective 1 is issued by rank(s) 1"),
])
def test_a_trace_that_cannot_run_says_why_in_one_line(ranks, message):
    with pytest.raises(UserError) as caught:
        Schedule(trace(*ranks)).run(lambda calls: 0.001)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_every_kind_of_collective_replays_exact_with_the_planners_bytes():
    kinds = ["REDUCE", "BROADCAST", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "GATHER", "SCATTER", "BARRIER"]
    nodes = tuple(collective_node(i, k.lower(), k, 40000 + 4 * i, (i - 1,) if i else (), root=1)
                  for i, k in enumerate(kinds))
    traces = [RankTrace(f"t.{r}.et", "0.0.4", nodes) for r in range(4)]
    prepared = prepare("leaf-spine", default_backend="local", calibrate=False, workers=4, mode="all")
    for m in prepared.runs:
        record = replay(prepared.graph, m.spec, traces)
        assert [c.kind for c in record.calls] == ["reduce", "broadcast", "reduce_scatter", "reduce_scatter", "gather",
                                                  "scatter", "barrier"]
        assert all(c.correct for c in record.calls) and record.correct, m.spec.mode
        assert all(b.start_s == pytest.approx(a.end_s) for a, b in zip(record.calls, record.calls[1:], strict=False))
        assert record.link_bytes == record.predicted_link_bytes, m.spec.mode
