"""innet.io.sched: a node process under SCHED_FIFO with a 1 ns timer slack, put back under the ordinary policy
once it runs its real-time budget without blocking; each in a process of its own (never the test's)."""

import os
import subprocess
import sys

import pytest

from innet.io.sched import PRIORITY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_child(code: str) -> list[str]:
    """Run ``code`` after ``from innet.io.sched import *`` in a new interpreter; its printed words."""
    out = subprocess.run([sys.executable, "-c", "import os, time\nfrom innet.io.sched import *\n" + code],
                         env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def _slack() -> str:
    return "int(open('/proc/self/timerslack_ns').read())"


def test_off_changes_nothing():
    assert _in_child(f"print(prioritize('off'), os.sched_getscheduler(0), {_slack()})") == ["off", str(os.SCHED_OTHER), "50000"]


def test_slack_alone_keeps_the_ordinary_policy():
    assert _in_child(f"print(prioritize('slack'), os.sched_getscheduler(0), {_slack()})") == ["slack", str(os.SCHED_OTHER), "1"]


def test_the_environment_chooses_the_policy():
    os.environ["INNET_SCHED"] = "off"
    try:
        assert _in_child("print(prioritize())") == ["off"]
    finally:
        del os.environ["INNET_SCHED"]


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root")
def test_fifo_until_the_budget_is_spent_without_blocking():
    words = _in_child(
        "granted = prioritize('fifo')\n"
        "policy, priority = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority\n"
        "time.sleep(0.01)\n"  # blocking starts the budget again
        "began = time.process_time()\n"
        "while os.sched_getscheduler(0) != os.SCHED_OTHER and time.process_time() - began < 3: pass\n"
        "print(granted, policy, priority, round(time.process_time() - began, 1), os.sched_getscheduler(0))")
    assert words[:3] == ["fifo", str(os.SCHED_FIFO), str(PRIORITY)]
    assert 0.4 <= float(words[3]) <= 0.8 and words[4] == str(os.SCHED_OTHER)  # RT_BUDGET_US of spinning, then demoted


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the unprivileged path")
def test_without_the_privilege_the_slack_alone():
    assert _in_child("print(prioritize('fifo'), os.sched_getscheduler(0))") == ["slack", str(os.SCHED_OTHER)]


def _granted_to(policy: str) -> str | None:
    """What innet.io.sched.granted reads, from this process, of a child that asked for ``policy``."""
    from innet.io.sched import granted

    with subprocess.Popen([sys.executable, "-c", f"import sys, time\nfrom innet.io.sched import prioritize\n"
                           f"print(prioritize({policy!r}), flush=True)\ntime.sleep(30)"],
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip()  # asked and answered
            return granted(child.pid)
        finally:
            child.kill()


def test_granted_reads_what_another_process_runs_under():
    assert _granted_to("off") == "other"
    assert _granted_to("slack") == "slack"
    assert _granted_to("fifo") == ("fifo" if os.geteuid() == 0 else "slack")


def test_granted_of_a_process_gone_is_none():
    from innet.io.sched import granted

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert granted(child.pid) is None


def test_a_line_names_the_processes_without_the_policy_asked():
    from innet.results.fidelity import sched_line

    every = {"h1": "fifo", "h2": "fifo", "s1": "fifo"}
    assert sched_line(every, "fifo") == ""
    assert sched_line({**every, "h2": "slack"}, "off") == ""  # nothing asked, nothing missed
    line = sched_line({**every, "h10": "slack", "h2": "other"}, "fifo")
    assert line.startswith("scheduler: 2 of 4 processes ran without SCHED_FIFO (h2: other, h10: slack)")


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root")
@pytest.mark.parametrize("ending", ("returns", "is stopped"))
def test_a_node_process_ends_under_the_ordinary_policy(ending):
    """``python -m innet.node``: under SCHED_FIFO while it serves, under the ordinary policy once its part is over,
    whether its role returns or SIGTERM stops it: its teardown (100+ ms of CPU) never runs ahead of a node still in
    its call (a reduce's root saw its last frames ~90 ms late behind three workers tearing down)."""
    serve = ("lambda conf: seen.append(os.sched_getscheduler(0)) or 0" if ending == "returns" else
             "lambda conf: seen.append(os.sched_getscheduler(0)) or os.kill(os.getpid(), signal.SIGTERM) or time.sleep(5)")
    words = _in_child(
        "import atexit, signal, sys\n"
        "import innet.node.__main__ as node\n"
        "seen = []\n"
        f"node.ROLES['probe'] = (object, {serve})\n"
        "node.read = lambda kind, path: None\n"
        "atexit.register(lambda: print(seen, os.sched_getscheduler(0)))\n"
        "sys.exit(node.main(['innet.node', 'probe', 'unused']))\n")
    assert words == [f"[{os.SCHED_FIFO}]", str(os.SCHED_OTHER)]
