"""``innet launch -- python train.py``: the examples train through the network as they do on gloo under torchrun; a
failing rank is one line; Ctrl-C at any point leaves no process and no folder behind."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.test_guide import readme_commands
from tests.torchrun import torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def launch(*args, timeout=600, env=ENV):
    return subprocess.run([sys.executable, "-m", "innet", "launch", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def own_tmp(tmp_path) -> dict[str, str]:
    """The launcher's environment with ``tmp_path`` its temporary folder: its run's folder made there, where no
    other launch on the machine makes its own, and a mark on every process it starts (they inherit it)."""
    return dict(ENV, TMPDIR=str(tmp_path))


def folders(tmp_path) -> list[str]:
    """The launch folders in ``tmp_path`` (``own_tmp``)."""
    return glob.glob(os.path.join(str(tmp_path), "innet-launch-*"))


def accuracy(out: str, backend: str) -> float:
    found = re.search(rf"backend cpu:{backend}, 2 ranks: test accuracy ([\d.]+), [\d.]+ ms per step, (\d+) steps", out)
    assert found, out
    return float(found.group(1))


def collectives(out: str) -> dict[str, int]:
    """The launcher's count of each collective through the network."""
    line = re.search(r"collectives through the network: (.*)", out).group(1).split(";")[0]
    return {name: int(count) for name, count in (part.split() for part in line.split(", "))}


def both_said(proc, word: str) -> None:
    """Read the launch's output until both ranks said ``word`` (their lines may interleave)."""
    said = ""
    while said.count(word) < 2:
        line = proc.stdout.readline()
        assert line, "the launch ended before both ranks said " + word
        said += line


def leftovers(marker: str, where: str = "cmdline") -> list[str]:
    """Processes whose command line (``where``: or environment, "environ") names ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/{where}", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


LAUNCHES = [c for t, c in readme_commands() if t == "PyTorch: `innet launch`" and c.startswith("innet launch")]


def test_readme_launches_both_examples_on_the_star_of_4():
    assert [c.split()[-1] for c in LAUNCHES] == ["examples/ddp_digits.py", "examples/fsdp_digits.py"]
    assert all(c.split()[:-2] == "innet launch --backend local --topo star --workers 4 --".split() for c in LAUNCHES)


@pytest.mark.slow
@pytest.mark.parametrize("command", LAUNCHES)
def test_readmes_launch_trains_through_innet_as_gloo_under_torchrun(command):
    """README's command on 2 ranks for 2 epochs, and the script under torchrun on gloo, same seeds: the accuracy
    through innet within 0.5 points of gloo's; the script's collectives counted on the network's links (FSDP: its
    reduce-scatters and all-gathers)."""
    script = command.split()[-1]
    example = os.path.basename(script)[:-3]
    gloo = torchrun(script, "--epochs", "2")
    assert gloo.returncode == 0, gloo.stderr[-2000:]
    flags = command.replace("--workers 4", "--workers 2").split()[2:-2]
    out = launch(*flags, sys.executable, script, "--epochs", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert abs(accuracy(out.stdout, "innet") - accuracy(gloo.stdout, "gloo")) <= 0.005
    steps = int(re.search(r"(\d+) steps", out.stdout).group(1))
    calls = collectives(out.stdout)
    if example == "ddp_digits":
        assert calls["allreduce"] == steps  # one bucket a step
    else:
        assert calls["reduce_scatter"] == 2 * steps and calls["all_gather"] >= 4 * steps  # per layer
    links = dict(re.findall(r"(h\d--s1) (\d+)", out.stdout))
    assert set(links) == {"h1--s1", "h2--s1"} and all(int(b) > 0 for b in links.values())
    tiers = re.search(r"bytes per tier: host-tor (\d+)", out.stdout)
    assert int(tiers.group(1)) == sum(int(b) for b in links.values())
    assert "fidelity: launch innet: faithful" in out.stdout


def test_a_failing_rank_ends_the_run_in_one_line_and_leaves_nothing(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import os, time\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "if os.environ['RANK'] == '1':\n    raise SystemExit('rank one gives up on purpose')\ntime.sleep(600)\n")
    out = launch("--backend", "local", "--topo", "star", "--workers", "3", "--", sys.executable, str(script), timeout=300,
                 env=own_tmp(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: rank 1 failed (exit 1): rank one gives up on purpose"]
    assert leftovers(str(script)) == []
    assert folders(tmp_path) == []


def launch_leaving_nothing(script, *flags, workers=3):
    """``script`` launched on ``workers`` local ranks (``flags`` before the --): its result and seconds, once
    checked that no process and no folder of it is left (its folder made beside ``script``: ``own_tmp``)."""
    started = time.monotonic()
    out = launch("--backend", "local", "--topo", "star", "--workers", str(workers), *flags, "--", sys.executable,
                 str(script), timeout=300, env=own_tmp(script.parent))
    took = time.monotonic() - started
    assert leftovers(str(script)) == []
    assert folders(script.parent) == []
    return out, took


@pytest.mark.slow
def test_a_rank_that_sleeps_forever_ends_the_run_within_its_timeout_named_with_its_last_words(tmp_path):
    """Rank 1 joins, then sleeps instead of its first all_reduce, which ranks 0 and 2 wait in: the launcher names it
    once the others have waited --collective-timeout, not torch's 30 minutes later."""
    script = tmp_path / "sleeps.py"
    script.write_text("import os, sys, time, torch\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "if os.environ['RANK'] == '1':\n    print('rank one nods off', file=sys.stderr, flush=True)\n"
                      "    time.sleep(10 ** 6)\ndist.all_reduce(torch.ones(3))\n")
    out, took = launch_leaving_nothing(script, "--collective-timeout", "5")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: rank 1 did not enter collective call 1 within 5 s of the others (--collective-timeout): "
        "rank one nods off"]
    assert took < 120  # the ranks' start (torch's import) on a busy machine, 5 s, and their stop


@pytest.mark.slow
def test_a_rank_that_never_joins_ends_the_run_within_the_start_timeout_named(tmp_path):
    script = tmp_path / "late.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '2':\n"
                      "    print('rank two never joins', file=sys.stderr, flush=True)\n    time.sleep(10 ** 6)\n"
                      "import torch.distributed as dist\ndist.init_process_group()\n")
    out, took = launch_leaving_nothing(script, "--start-timeout", "12")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: rank 2 did not join the process group within 12 s (--start-timeout): rank two never joins"]
    assert took < 120


@pytest.mark.slow
def test_a_rank_that_raises_is_named_not_the_peer_that_lost_its_connection(tmp_path):
    """Rank 2 raises between collectives; ranks 0 and 1 then fail in theirs (gloo: "Connection closed by peer").
    The launcher names the rank that exited first, rank 2, with its own last line."""
    script = tmp_path / "raises.py"
    script.write_text("import os, torch\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "t = torch.ones(3)\ndist.all_reduce(t)\nif os.environ['RANK'] == '2':\n"
                      "    raise ValueError('rank two breaks on purpose')\nwhile True:\n    dist.all_reduce(t)\n")
    out, _ = launch_leaving_nothing(script)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: rank 2 failed (exit 1): ") and out.stderr.rstrip().endswith(
        "ValueError: rank two breaks on purpose"), out.stderr


@pytest.mark.slow
def test_the_ranks_store_is_the_launchers_and_listens_on_loopback_only(tmp_path):
    """Rank 0 looks, in its own /proc, at what listens on MASTER_PORT: the launcher's store, on 127.0.0.1 alone
    (torch's own rank-0 store would listen on every interface)."""
    script = tmp_path / "looks.py"
    script.write_text("import os, sys\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "port = int(os.environ['MASTER_PORT'])\nfound = []\n"
                      "for table in ('/proc/net/tcp', '/proc/net/tcp6'):\n"
                      "    for line in open(table).read().splitlines()[1:]:\n"
                      "        local, state = line.split()[1], line.split()[3]\n"
                      "        if state == '0A' and int(local.split(':')[1], 16) == port:\n"
                      "            found.append(local.split(':')[0])\n"
                      "if dist.get_rank() == 0:\n    print('listening', os.environ['MASTER_ADDR'], found)\n"
                      "dist.destroy_process_group()\nsys.stdout.flush()\nos._exit(0)\n")  # README's advice: gloo's teardown abort
    out, _ = launch_leaving_nothing(script, workers=2)
    assert out.returncode == 0, out.stderr
    assert "[rank0]: listening 127.0.0.1 ['0100007F']" in out.stdout.splitlines()


@pytest.mark.parametrize("when", ["starting", "training"])
def test_ctrl_c_at_any_point_leaves_no_process_and_no_folder(tmp_path, when):
    script = tmp_path / "trains.py"
    script.write_text("import time, torch\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "t = torch.ones(3)\ndist.all_reduce(t)\nprint('up', flush=True)\n"
                      "while True:\n    dist.all_reduce(t)\n    time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-m", "innet", "launch", "--backend", "local", "--topo", "star", "--workers",
                             "2", "--", sys.executable, str(script)], cwd=ROOT, env=own_tmp(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,  # SIGINT's default even where the suite's is ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if when == "starting":  # the run's folder is there: the ranks are being started, importing torch
        while not folders(tmp_path):
            time.sleep(0.01)
        time.sleep(0.2)
    else:
        both_said(proc, "up")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert leftovers(str(script)) == []
    assert folders(tmp_path) == []


def test_each_ranks_output_comes_whole_lines_at_a_time_prefixed_with_its_rank(tmp_path):
    """Ranks that write their lines in pieces, unbuffered, at once: every line on the launcher's output is one rank's
    whole line, "[rankR]: " before it (a last line without its newline gets one)."""
    script = tmp_path / "talks.py"
    script.write_text("import os, sys, time\nr = os.environ['RANK']\nfor i in range(40):\n"
                      "    for piece in (f'rank {r} ', f'line {i} ', 'ends here\\n'):\n"
                      "        sys.stdout.write(piece)\n        sys.stdout.flush()\n        time.sleep(0.001)\n"
                      "sys.stdout.write(f'rank {r} ends without a newline')\n")
    out = launch("--backend", "local", "--topo", "star", "--workers", "3", "--", sys.executable, str(script))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[:-4]  # the launcher's summary after them
    for rank in "012":
        mine = [ln for ln in lines if ln.startswith(f"[rank{rank}]: ")]
        assert mine == [f"[rank{rank}]: rank {rank} line {i} ends here" for i in range(40)] + [
            f"[rank{rank}]: rank {rank} ends without a newline"]
    assert len(lines) == 3 * 41, out.stdout


def test_a_launch_without_a_command_or_in_a_gloo_mode_is_one_line():
    out = launch("--backend", "local", "--topo", "star", "--workers", "2")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: innet launch needs a command after --, e.g. innet launch --backend local -- python train.py"]
    for backend in ("local", "mininet"):  # before anything is built
        out = launch("--backend", backend, "--topo", "star", "--workers", "2", "--", "/nonexistent/cmd")
        assert out.returncode == 2 and out.stderr.splitlines() == [
            "error: innet launch cannot run /nonexistent/cmd: no such command, or not an executable file"]
    out = launch("--backend", "local", "--collective-timeout", "inf", "--", "true")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "error: --collective-timeout must be a positive number of seconds, got inf"]
    out = launch("--backend", "local", "--mode", "all", "--", "true")
    assert out.returncode == 2 and "innet, pbox or ring, one at a time: not --mode all" in out.stderr
    out = launch("--backend", "local", "--topo", "fat-tree", "--k", "16", "--", "true")  # 1023 ranks (a host is the PBox): ~270 GiB
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: 1023 torch ranks need about 269.9 GiB") and "use fewer --workers" in out.stderr


MININET_SCRIPT = """import os, sys, time, torch
import torch.distributed as dist


def moved():  # this host's interface, bytes both ways (/proc/net/dev: this namespace's)
    with open('/proc/net/dev') as fh:
        fields = next(line for line in fh if '-eth0:' in line).split(':')[1].split()
    return int(fields[0]) + int(fields[8])


dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((5000,), rank + 1.0)
dist.all_reduce(t)
mean = torch.full((3,), float(rank), dtype=torch.float64)
dist.all_reduce(mean, op=dist.ReduceOp.AVG)
out = torch.empty(world, dtype=torch.int64)
dist.all_to_all_single(out, torch.full((world,), rank, dtype=torch.int64))
dist.barrier()  # through the switch: the ranks begin the next two calls together
before = moved()
shard = torch.empty(SHARD)
dist.reduce_scatter_tensor(shard, torch.arange(world * SHARD, dtype=torch.float32) * (rank + 1))
whole = torch.empty(world * SHARD)
dist.all_gather_into_tensor(whole, shard)
sharded = moved() - before
exact = torch.equal(whole, torch.arange(world * SHARD, dtype=torch.float32) * world * (world + 1) / 2)
sys.stdout.write(f'got {t.min().item()} {t.max().item()} {mean.tolist()} {out.tolist()} {exact} moved {sharded}\\n')
sys.stdout.flush()  # one write: a whole line
while len(sys.argv) > 1:
    dist.all_reduce(t)
    time.sleep(0.01)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # without the interpreter's finalization, which races gloo's threads (README: gloo's teardown abort)
"""
SHARD = 1001  # values per rank: not whole packets of 256, so each rank's piece travels as 4 packets of 251 (1004)


@pytest.mark.mininet
def test_on_mininet_sums_and_fsdps_calls_go_through_the_switch_and_ctrl_c_leaves_nothing(tmp_path):
    """Each rank in its host: a float sum and a mean, a barrier, a reduce-scatter and an all-gather through the
    switch (the worker client), their bytes on each worker's link the planner's for those calls; an all-to-all of
    int64 as messages from the ranks' hosts, through the switch too; then a run interrupted mid-training leaves no
    interface or state."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    import innet
    from tests.test_emulation import assert_nothing_left

    script = tmp_path / "sums.py"
    script.write_text(MININET_SCRIPT.replace("SHARD", str(SHARD)))
    flags = ["--backend", "mininet", "--topo", "star", "--workers", "2", "--packet-elements", "256"]
    out = launch(*flags, "--", sys.executable, str(script))
    assert out.returncode == 0, out.stderr[-2000:]
    got = re.findall(r"^\[rank([01])\]: got 3.0 3.0 \[0.5, 0.5, 0.5\] \[0, 1\] True moved (\d+)$", out.stdout, re.M)
    assert sorted(r for r, _ in got) == ["0", "1"], out.stdout
    assert collectives(out.stdout) == {"all_to_all": 1, "allreduce": 2, "barrier": 2, "reduce_scatter": 1, "all_gather": 1}
    assert "messages through the network (send/recv, all-to-all, gather, scatter): 2: " in out.stdout
    assert "over the TCP side plane" not in out.stdout
    predicted = sum(innet.plan("star", workers=2, backend="local", packet_elements=251, collective=c,
                               elements=2 * 1004).modes[0].predicted_link_bytes["h1--s1"]
                    for c in ("reduce_scatter", "all_gather"))
    for moved in (int(b) for _, b in got):  # the two calls' frames on a worker's link, a retransmission or two at most more
        assert predicted <= moved <= 1.02 * predicted, (moved, predicted)
    links = {name: int(b) for name, b in re.findall(r"(h\d--s1) (\d+)", out.stdout)}
    assert set(links) == {"h1--s1", "h2--s1"} and all(b > 2 * 5000 * 4 + predicted for b in links.values())
    assert "fidelity: launch innet: not judged" in out.stdout
    proc = subprocess.Popen([sys.executable, "-m", "innet", "launch", *flags, "--", sys.executable, str(script), "loop"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    both_said(proc, "got")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert leftovers(str(script)) == []
    assert_nothing_left()


@pytest.mark.mininet
@pytest.mark.parametrize("when", ["building", "switches up"])
def test_ctrl_c_on_mininet_while_it_builds_or_starts_the_ranks_leaves_nothing(tmp_path, when):
    """Interrupted while the topology comes up, or while the ranks start in their hosts (importing torch, meeting):
    no process, interface or state left."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    from tests.test_emulation import assert_nothing_left

    script = tmp_path / "waits.py"
    script.write_text("import time\nimport torch.distributed as dist\ndist.init_process_group()\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-m", "innet", "launch", "--backend", "mininet", "--topo", "star", "--workers",
                             "2", "--", sys.executable, str(script)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said = ""
    while when not in said:
        line = proc.stderr.readline()
        assert line, "the launch ended before saying " + when
        said += line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, said + err
    assert leftovers(str(script)) == []
    assert_nothing_left()


SLEEPERS = {  # a rank that sleeps forever: before joining its group, or instead of its first collective
    "start": ("import os, sys, time\nif os.environ['RANK'] == '1':\n"
              "    print('rank one never joins', file=sys.stderr, flush=True)\n    time.sleep(10 ** 6)\n"
              "import torch.distributed as dist\ndist.init_process_group()\n",
              ["--start-timeout", "15"],
              "error: rank 1 did not join the process group within 15 s (--start-timeout): rank one never joins"),
    "collective": ("import os, sys, time, torch\nimport torch.distributed as dist\ndist.init_process_group()\n"
                   "if os.environ['RANK'] == '1':\n    print('rank one nods off', file=sys.stderr, flush=True)\n"
                   "    time.sleep(10 ** 6)\ndist.all_reduce(torch.ones(3))\n",
                   ["--collective-timeout", "3"],
                   "error: rank 1 did not enter collective call 1 within 3 s of the others (--collective-timeout): "
                   "rank one nods off"),
}


@pytest.mark.mininet
@pytest.mark.parametrize("when", list(SLEEPERS))
def test_on_mininet_a_rank_that_sleeps_forever_ends_the_run_within_its_timeout_named(tmp_path, when):
    """Each rank in its host, the store and its watch in rank 0's (innet.integrations.launch.watch.serve): rank 1
    never joins, or never enters the all-reduce rank 0 waits in through the switch. The run ends once the timeout
    has passed, in one line naming rank 1 with its own last words (not the switch's abort after half of --timeout,
    blamed on rank 0), and leaves no process, interface, namespace, state or folder behind."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    from tests.test_emulation import assert_nothing_left

    source, flags, said = SLEEPERS[when]
    script = tmp_path / "sleeps.py"
    script.write_text(source)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "innet", "launch", "--backend", "mininet", "--topo", "star",
                             "--workers", "2", *flags, "--", sys.executable, str(script)], cwd=ROOT, text=True,
                            env=own_tmp(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _, err = proc.communicate(timeout=120)  # the network built, the ranks' torch imported on a busy machine,
    except subprocess.TimeoutExpired:  # the timeout, the teardown; else it hangs: Ctrl-C, which removes the network
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 2 and took < 120, (took, err)
    assert [ln for ln in err.splitlines() if not ln.startswith("innet: ")] == [said], err
    assert leftovers(f"TMPDIR={tmp_path}\0", "environ") == []  # every process the run started: ranks, switches, watch
    assert folders(tmp_path) == []
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == namespaces
    assert_nothing_left()


@pytest.mark.mininet
def test_on_mininet_a_rank_late_by_less_than_the_collective_timeout_is_waited_for(tmp_path):
    """Rank 1 enters the all-reduce 8 s after rank 0: the switch waits (the launch's --timeout is at least 4
    collective timeouts), where at --timeout 10 it aborted the job after 5 s and rank 0 failed."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    from tests.test_emulation import assert_nothing_left

    script = tmp_path / "late.py"
    script.write_text("import os, time, torch\nimport torch.distributed as dist\ndist.init_process_group()\n"
                      "if os.environ['RANK'] == '1':\n    time.sleep(8)\nt = torch.ones(3)\ndist.all_reduce(t)\n"
                      "print('sum', t.tolist(), flush=True)\ndist.destroy_process_group()\nos._exit(0)\n")
    out = launch("--backend", "mininet", "--topo", "star", "--workers", "2", "--collective-timeout", "30", "--",
                 sys.executable, str(script), timeout=300)
    assert out.returncode == 0, out.stderr
    assert sorted(ln for ln in out.stdout.splitlines() if " sum " in ln) == [
        "[rank0]: sum [2.0, 2.0, 2.0]", "[rank1]: sum [2.0, 2.0, 2.0]"]
    assert_nothing_left()


@pytest.mark.mininet
@pytest.mark.slow
def test_fsdp_on_mininet_trains_as_gloo_with_its_shards_through_the_switch():
    """The FSDP example, each rank in its host, 2 ranks, 2 epochs: gloo's accuracy within 0.5 points, every
    reduce-scatter and all-gather through the switch (none over the side plane)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    from tests.test_emulation import assert_nothing_left

    gloo = torchrun("examples/fsdp_digits.py", "--epochs", "2")
    assert gloo.returncode == 0, gloo.stderr[-2000:]
    out = launch("--backend", "mininet", "--topo", "star", "--workers", "2", "--", sys.executable,
                 "examples/fsdp_digits.py", "--epochs", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert abs(accuracy(out.stdout, "innet") - accuracy(gloo.stdout, "gloo")) <= 0.005
    steps = int(re.search(r"(\d+) steps", out.stdout).group(1))
    calls = collectives(out.stdout)
    assert calls["reduce_scatter"] == 2 * steps and calls["all_gather"] >= 4 * steps, calls
    assert "over the TCP side plane" not in out.stdout
    assert_nothing_left()


def test_gloos_teardown_abort_is_recognised_by_its_signature_not_by_the_exit_code():
    """A run that printed its result and then aborted in gloo's teardown is retried (tests/torchrun.py); one that
    aborted before its result, or failed any other way, is the test's failure."""
    from tests.torchrun import teardown_abort

    def run(code, out, err):
        return subprocess.CompletedProcess([], code, out, err)

    result = "fsdp_digits: backend cpu:gloo, 2 ranks: test accuracy 0.9417, 3.10 ms per step, 88 steps\n"
    aborted = "terminate called without an active exception\n... (exitcode: -6) ..."
    assert teardown_abort(run(1, result, aborted), r"test accuracy [\d.]+")
    assert not teardown_abort(run(1, "", aborted), r"test accuracy [\d.]+")  # died before its result
    assert not teardown_abort(run(1, result, "RuntimeError: Connection closed by peer (exitcode: 1)"), r"test accuracy")
    assert not teardown_abort(run(0, result, ""), r"test accuracy")


def test_a_mininet_launch_waits_in_the_switches_as_long_as_the_watch_and_refuses_a_shorter_timeout_given():
    """On Mininet the switches' calls wait at least PATIENCE collective timeouts (the watch judges first): the default
    --timeout is raised to it, one given shorter is refused in one line, never replaced."""
    from innet.errors import UserError
    from innet.integrations.launch.mininet import PATIENCE, patient
    from innet.planning.spec import RunSpec

    assert patient(RunSpec(), 300).timeout == PATIENCE * 300
    assert patient(RunSpec(timeout=2000.0), 300).timeout == 2000.0
    with pytest.raises(UserError) as err:
        patient(RunSpec(timeout=5.0), 300)
    assert err.value.args[0] == ("{timeout} 5 would have the switches abort a waiting call before {collective_timeout} "
                                 "300 judges it: give {timeout} at least 1200 (4 x {collective_timeout}), or leave it out")
