"""Background traffic (``--background``): every pattern's flows compete with the job on the local fabric, the
job stays exact, every background byte sent arrives, and the report carries its throughput and utilisation."""

import csv
import os

import pytest

import innet
from innet.errors import UserError
from innet.graph import link_name
from innet.hosts.background import (
    FRAME_BYTES,
    LINK_SHARE,
    BackgroundSpec,
    asked_flows,
    background_flows,
    parse_background,
)
from innet.planning.prediction import path_links
from topologies import build


def test_parse():
    assert parse_background("permutation:0.5") == BackgroundSpec("permutation", 0.5)
    assert parse_background("hotspot:a1--c1:0.25") == BackgroundSpec("hotspot", 0.25, "a1--c1")
    assert not parse_background("none").active
    for bad in ("permutation", "ring:0.5", "incast:1.5", "hotspot:0.5", "permutation:x"):
        with pytest.raises(ValueError):
            parse_background(bad)
    with pytest.raises(UserError, match="background"):
        innet.run("fat-tree", backend="local", background="nope:0.5")


def test_flows_load_the_links_as_asked():
    graph = build("fat-tree", k=4)
    for text in ("permutation:0.5", "all-to-all:0.5", "incast:0.5"):
        flows = asked_flows(graph, parse_background(text), seed=3)
        out: dict[str, float] = {}
        into: dict[str, float] = {}
        for f in flows:
            out[f.src] = out.get(f.src, 0) + f.bps
            into[f.dst] = into.get(f.dst, 0) + f.bps
        assert max(out.values()) <= 0.5e9 + 1 and max(into.values()) <= 0.5e9 + 1, text
        assert max(max(out.values()), max(into.values())) == pytest.approx(0.5e9), text
    hot = background_flows(graph, parse_background("hotspot:a1--c1:0.75"), seed=3)
    assert sum(f.bps for f in hot) == pytest.approx(0.75e9)


def test_flows_sharing_a_link_are_slowed_to_fit_it():
    """Routes take the first switch by name, so a permutation's flows collide on uplinks: what they get is what
    keeps every link direction within LINK_SHARE of its rate, and the links that do not collide keep the ask."""
    graph = build("fat-tree", k=4)
    bg = parse_background("permutation:0.75")
    asked, got = asked_flows(graph, bg, seed=3), background_flows(graph, bg, seed=3)
    load: dict[tuple[str, str], float] = {}
    for f in got:
        for hop in path_links(graph, f.src, f.dst):
            load[hop] = load.get(hop, 0.0) + f.bps
    assert max(load.values()) <= LINK_SHARE * 1e9 * (1 + 1e-9)
    assert max(load.values()) == pytest.approx(LINK_SHARE * 1e9)  # the busiest is full
    assert all(g.bps <= a.bps for g, a in zip(got, asked, strict=True)) and sum(g.bps for g in got) < sum(a.bps for a in asked)


@pytest.mark.parametrize("pattern", ["permutation:0.5", "all-to-all:0.5", "incast:0.75", "hotspot:a1--c1:0.75"])
def test_every_pattern_leaves_the_job_exact(pattern, tmp_path):
    quiet = innet.run("fat-tree", backend="local", elements=8192).runs[0]
    report = innet.run("fat-tree", backend="local", elements=8192, background=pattern, out=str(tmp_path))
    run = report.runs[0]
    assert run.correct and run.result_digest == quiet.result_digest
    if run.retransmissions == 0:  # the job's own bytes are the job's: the background's are counted apart
        assert dict(run.link_bytes) == dict(quiet.link_bytes)
    bg = run.figures["background"]
    assert bg.sent_bytes == bg.received_bytes > 0  # no loss: every frame sent arrives (those in flight drained)
    assert sum(bg.link_bytes.values()) >= bg.sent_bytes * 2  # every flow crosses at least two links
    with open(tmp_path / "utilisation.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and max(float(r["utilisation"]) for r in rows) <= 1.001
    assert 0 < sum(int(r["background_bytes"]) for r in rows) <= sum(bg.link_bytes.values())
    assert os.path.exists(tmp_path / "utilisation.png")
    assert any("background" in line and "delivered" in line for line in report.lines())
    dynamic = innet.run("fat-tree", backend="local", elements=8192, background=pattern, placement="dynamic").runs[0]
    assert dynamic.correct and dynamic.result_digest == quiet.result_digest  # dynamic trees too
    assert dynamic.figures["background"].received_bytes > 0


def test_background_bytes_follow_the_routed_paths():
    """Each link's background bytes are exactly the frames of the flows whose routed path crosses it."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    run = innet.run(graph, backend="local", elements=4096, background="permutation:0.5").runs[0]
    bg = run.figures["background"]
    assert bg.flows == 4 and run.correct
    per_link: dict[str, int] = {}
    for f in background_flows(graph, parse_background("permutation:0.5"), seed=0):
        for a, b in path_links(graph, f.src, f.dst):
            per_link[link_name(a, b)] = per_link.get(link_name(a, b), 0) + 1
    sent = bg.sent_bytes // bg.flows  # equal rates: every flow sent alike (to a frame)
    for link, n in per_link.items():
        assert abs(bg.link_bytes[link] - n * sent) <= n * 2 * FRAME_BYTES, link


def test_open_loop_background_is_in_full_flow_when_the_job_starts():
    """Issue 46: as on Mininet, whose senders start before the job, the fabric runs open-loop flows alone for
    ``lead_s`` (4 of the sparsest flow's frames) first. Started with the job, they queued behind its whole tensor
    in its hosts' own queues and stayed out of the core while it climbed: fat-tree k=4, 10 Mbit/s, 32768 elements,
    50% permutation took 0.1653 s (seed 1; 0.146-0.165 over seeds 1-3) against Mininet's 0.2081 (the median of
    seeds 1-3, docs/validation.md: -20.6%); now the median of seeds 1-3 is within 12% of it."""
    from innet.hosts.background import lead_s

    graph = build("fat-tree", k=4, bw=10)
    flows = background_flows(graph, parse_background("permutation:0.5"), seed=1)
    assert lead_s(flows) == pytest.approx(4 * FRAME_BYTES * 8 / min(f.bps for f in flows))
    times = []
    for seed in (1, 2, 3):
        run = innet.run(graph, backend="local", elements=32768, background="permutation:0.5", seed=seed).runs[0]
        bg = run.figures["background"]
        assert run.correct and bg.sent_bytes == bg.received_bytes
        times.append(run.completion_s)
    assert sorted(times)[1] == pytest.approx(0.2081, rel=0.12)


def test_unknown_hotspot_link():
    with pytest.raises(UserError, match="does not have"):
        innet.run("fat-tree", backend="local", background="hotspot:h1--h2:0.5")


@pytest.mark.mininet
def test_background_on_mininet():
    """A sender in every host's namespace: the job stays exact (the local backend's result, bit for bit), and
    the background delivers what it sends but the frames in flight when it is stopped. At a load the machine
    carries undilated (10%: at 50% every process was CPU-bound, and under SCHED_FIFO the share delivered varied
    from 31% to all of it from run to run)."""
    options = dict(racks=2, hosts_per_rack=2, elements=20000)
    run = innet.run("leaf-spine", backend="mininet", bw=100, dilation="off", plots=False,
                    background="permutation:0.1", **options).runs[0]
    local = innet.run("leaf-spine", backend="local", **options).runs[0]
    bg = run.figures["background"]
    assert run.correct and run.result_digest == local.result_digest
    assert bg.flows == 4 and bg.offered_mbps == pytest.approx(40.0)
    assert 0 < bg.received_bytes <= bg.sent_bytes and bg.received_bytes >= 0.9 * bg.sent_bytes
