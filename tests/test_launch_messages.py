"""The examples that move tensors between pairs of ranks (examples/moe_alltoall.py: all_to_all_single and gather;
examples/pipeline_p2p.py: send, recv, isend, irecv) print under ``innet launch`` the digits they print on gloo under
torchrun, and their messages' bytes on the links in results.json are the planner's prediction."""

import json
import os
import re
import subprocess
import sys

from tests.torchrun import torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "innet", "launch", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)


def results(out: str) -> list[str]:
    """The examples' result lines, the launcher's rank prefix and the backend's name taken off, sorted."""
    lines = [re.sub(r"^\[rank\d+\]: ", "", line) for line in out.splitlines()]
    return sorted(re.sub(r"backend cpu:\w+", "backend", line) for line in lines if re.match(r"(moe_alltoall|pipeline_p2p):", line))


def test_the_moe_example_gives_gloos_checksums_and_its_all_to_all_bytes_are_the_planners(tmp_path):
    """4 ranks on the leaf-spine (two racks: half of each all-to-all crosses the spine): every checksum as gloo's;
    in results.json, the messages' bytes per link as predicted (within 2%: exact on the lossless fabric), on the
    spine's links too, and the all-to-alls counted (3 a step) with nothing over the side plane."""
    script = os.path.join("examples", "moe_alltoall.py")
    gloo = torchrun(script, "--steps", "3", ranks=4, finished=r"moe_alltoall: .* checksums")
    assert gloo.returncode == 0, gloo.stderr[-2000:]
    out = launch("--backend", "local", "--topo", "leaf-spine", "--workers", "4", "--out", str(tmp_path), "--",
                 sys.executable, script, "--steps", "3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert results(out.stdout) == results(gloo.stdout) and len(results(gloo.stdout)) == 1, (out.stdout, gloo.stdout)
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["calls"] == {"all_to_all": 9, "barrier": 1, "gather": 1} and record["side_plane"] == []
    measured, predicted = record["message_link_bytes"], record["predicted_message_link_bytes"]
    assert set(measured) == set(predicted) and any(name.startswith("s") for name in measured)  # a spine link
    for name, want in predicted.items():
        assert abs(measured[name] - want) <= 0.02 * want, (name, measured[name], want)
    assert all(record["link_bytes"][name] >= b for name, b in measured.items())
    assert record["messages"] >= 9 * 4 and record["virtual_s"] > 0
    assert "messages through the network (send/recv, all-to-all, gather, scatter)" in out.stdout


def test_the_pipeline_example_gives_gloos_losses_and_parameters():
    """Two stages: the last stage's losses and both stages' parameters as on gloo, every send on the links."""
    script = os.path.join("examples", "pipeline_p2p.py")
    gloo = torchrun(script, "--steps", "3", ranks=2, finished=r"pipeline_p2p: stage \d")
    assert gloo.returncode == 0, gloo.stderr[-2000:]
    out = launch("--backend", "local", "--topo", "star", "--workers", "2", "--", sys.executable, script, "--steps", "3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert results(out.stdout) == results(gloo.stdout) and len(results(gloo.stdout)) == 3, (out.stdout, gloo.stdout)
    sends = 3 * 4 * 2  # steps, micro-batches, one each way
    assert re.search(rf"collectives through the network: barrier 1, send {sends};", out.stdout), out.stdout
    assert "side plane" not in out.stdout
