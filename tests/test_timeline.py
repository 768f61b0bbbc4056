"""``--timeline FILE``: a Chrome/Perfetto trace of a run, each rank's calls as slices and each switch's slots held as a
counter track; checked against the trace-event format's rules here, and loaded by Perfetto's trace processor where
it can run."""

import json
import os
import shutil
from collections import Counter, defaultdict

import pytest

import innet
from innet.errors import UserError
from innet.planning.rules import validate
from innet.planning.spec import RunSpec

# The Trace Event Format (Chrome's "Trace Event Format" document) as far as innet writes it: per phase, the fields
# an event must have and their types. Complete events ("X") have a duration, counters ("C") numeric args,
# metadata ("M") name a process or thread, or sort one.
NUMBER = (int, float)
PHASES = {
    "X": {"name": str, "cat": str, "pid": int, "tid": int, "ts": NUMBER, "dur": NUMBER, "args": dict},
    "C": {"name": str, "pid": int, "tid": int, "ts": NUMBER, "args": dict},
    "M": {"name": str, "pid": int, "tid": int, "args": dict},
}
METADATA = {"process_name": ("name", str), "thread_name": ("name", str), "process_sort_index": ("sort_index", int)}


def check_trace_format(trace):
    """Every rule of the format innet's traces rely on, or an AssertionError naming the event."""
    assert set(trace) == {"traceEvents", "displayTimeUnit"} and trace["displayTimeUnit"] in ("ms", "ns")
    named = set()
    for e in trace["traceEvents"]:
        assert e.get("ph") in PHASES, e
        assert set(e) == {"ph", *PHASES[e["ph"]]}, e
        for key, kind in PHASES[e["ph"]].items():
            assert isinstance(e[key], kind) and not isinstance(e[key], bool), (key, e)
        if e["ph"] == "M":
            key, kind = METADATA[e["name"]]
            assert isinstance(e["args"][key], kind), e
            named.add((e["pid"], e["tid"] if e["name"] == "thread_name" else None))
        else:
            assert e["ts"] >= 0 and (e["ph"] != "X" or e["dur"] >= 0), e
            assert (e["pid"], None) in named, f"an event of a process never named: {e}"
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in named, f"a slice of a thread never named: {e}"
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, NUMBER) for v in e["args"].values()), e


def processes(trace):
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}


def test_every_rank_has_a_slice_per_call_within_the_run_and_every_switch_its_slots(tmp_path):
    """Leaf-spine of 2 racks x 2, every mode, one reduce-scatter: per mode a slice per rank, inside the run's
    completion time; the ToRs that aggregate hold slots and free them all by the end, the PBox and ring runs'
    switches hold none."""
    path = tmp_path / "t.json"
    report = innet.run("leaf-spine", backend="local", mode="all", collective="reduce_scatter", placement="tree",
                       elements=100_003, timeline=str(path))
    trace = json.loads(path.read_text())
    check_trace_format(trace)
    names, events = processes(trace), trace["traceEvents"]
    assert "timeline" not in report.runs[0].to_json()  # the trace is its own file, not results.json's
    for r in report.runs:
        label = f"{r.mode} ({r.placement}, local)"
        [pid] = [p for p, n in names.items() if n == f"{label}: job 1, calls per rank"]
        slices = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        assert Counter(e["tid"] - 1 for e in slices) == {rank: 1 for rank in range(4)}  # thread ids: rank + 1
        assert {e["name"] for e in slices} == {"reduce_scatter"}
        assert min(e["ts"] for e in slices) == 0.0  # virtual time: every rank starts at once
        assert all(e["ts"] + e["dur"] <= r.completion_s * 1e6 * (1 + 1e-9) for e in slices), r.mode
        held = defaultdict(list)
        for e in events:
            if e["ph"] == "C" and names[e["pid"]].startswith(f"{label}: switch "):
                held[names[e["pid"]].removeprefix(f"{label}: switch ")].append((e["ts"], e["args"]["held"]))
        assert sorted(held) == ["s1 (256 slots)", "t1 (256 slots)", "t2 (256 slots)"]
        for switch, steps in held.items():
            assert steps[-1][1] == 0, (switch, steps[-1])
            assert [t for t, _ in steps] == sorted(t for t, _ in steps) and all(0 <= n <= 256 for _, n in steps)
            if switch.startswith("t") or r.mode != "innet":  # a ToR holds a slot until the spine's result comes back;
                assert (max(n for _, n in steps) > 0) == (r.mode == "innet"), (r.mode, switch)  # the spine's two
                # contributions arrive at one instant (a symmetric tree), its slots held for no time


def test_calls_follow_one_another_on_each_rank(tmp_path):
    """Three all-reduce calls on a star of 4: three slices per rank, each starting when the one before ended,
    the last ending with the run."""
    path = tmp_path / "t.json"
    report = innet.run("star", backend="local", mode="innet", workers=4, iterations=3, timeline=str(path))
    trace = json.loads(path.read_text())
    check_trace_format(trace)
    by_rank = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_rank[e["tid"] - 1].append((e["args"]["call"], e["ts"], e["ts"] + e["dur"]))
    assert sorted(by_rank) == [0, 1, 2, 3]
    record = report.runs[0]
    assert record.timeline is not None
    for calls in by_rank.values():
        assert [c[0] for c in calls] == [0, 1, 2]
        assert all(a[2] <= b[1] for a, b in zip(calls, calls[1:], strict=False))
        assert calls[-1][2] == pytest.approx(record.timeline.end_s * 1e6)


def test_a_timeline_where_it_cannot_be_written_or_means_nothing_is_one_line(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(UserError, match="is a folder"):
        innet.prepare("star", backend="local", timeline=str(tmp_path / "dir"))
    with pytest.raises(UserError, match="timeline.*cluster.*each keep their own"):
        validate(RunSpec(backend="mininet", timeline=str(tmp_path / "t.json"), cluster="a,b"))
    from innet import cli

    assert cli.main(["--backend", "local", "--plan-only", "--timeline", str(tmp_path / "t.json")]) == 2
    assert not (tmp_path / "t.json").exists()


def test_the_trace_loads_in_perfettos_trace_processor(tmp_path):
    """Where Perfetto's trace processor runs (the ``perfetto`` package fetches its binary on first use, which
    needs the network; TRACE_PROCESSOR_SHELL names one already here): its slices and counter tracks are ours."""
    tp_module = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    shell = os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")
    path = tmp_path / "t.json"
    innet.run("star", backend="local", mode="innet", workers=4, iterations=2, timeline=str(path))
    try:
        config = tp_module.TraceProcessorConfig(bin_path=shell) if shell else None
        tp = tp_module.TraceProcessor(trace=str(path), config=config)
    except Exception as exc:  # noqa: BLE001 - no binary and no network to fetch one: say so
        pytest.skip(f"Perfetto's trace processor cannot start here: {exc}")
    with tp:
        slices = list(tp.query("select t.tid as rank, count(*) as n from slice s join thread_track tt on "
                               "s.track_id = tt.id join thread t using(utid) group by t.tid"))
        assert sorted((s.rank - 1, s.n) for s in slices) == [(r, 2) for r in range(4)]
        tracks = {row.name for row in tp.query("select name from counter_track")}
        assert any("slots" in name for name in tracks), tracks

