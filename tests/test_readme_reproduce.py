"""README's "Reproducing the papers" and docs/experiments.md, run as written: each ``innet reproduce``
command (``innet`` is ``python -m innet``), and the example experiment file."""

import json
import os
import re
import subprocess
import sys

import pytest

from innet.experiments.file import shipped
from tests.test_readme import blocks, section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPRODUCE = section("Reproducing the papers")
PAPERS = ("phub", "topk", "ensemble", "pipesgd", "p3", "ssp", "canary", "fsdp")
COMMANDS = [line for b in blocks(REPRODUCE, "sh") for line in b.strip().splitlines()]
with open(os.path.join(ROOT, "docs", "experiments.md")) as f:
    DOC = f.read()


def innet(command: str, cwd) -> subprocess.CompletedProcess:
    argv = command.split()
    assert argv[0] == "innet"
    return subprocess.run([sys.executable, "-m", "innet", *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)


def test_every_shipped_experiment_has_its_command_and_its_figure():
    """Each command is ``innet reproduce NAME`` for a shipped NAME: tests/test_experiments.py runs every one of
    them (with ``--quick``: the full sweeps take minutes each; their figures are the ones committed)."""
    assert COMMANDS == [f"innet reproduce {name}" for name in PAPERS]
    assert sorted(c.split()[-1] for c in COMMANDS) == sorted(shipped())
    figures = re.findall(r"!\[[^]]*\]\((docs/figures/(\w+)\.png)\)", REPRODUCE)
    assert [name for _, name in figures] == [c.split()[-1] for c in COMMANDS]
    for path, _ in figures:
        with open(os.path.join(ROOT, path), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_documented_experiment_file_runs_as_written(tmp_path):
    [example] = blocks(DOC, "toml")
    (tmp_path / "star.toml").write_text(example)
    [command] = [line for b in blocks(DOC, "sh") for line in b.strip().splitlines()]
    out = innet(command, tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "star" / "points.csv") as f:
        rows = f.read().splitlines()
    assert rows[0] == "series,bw,completion_s,cross_rack_bytes,correct,command,completion_s/pbox,cross_rack_bytes/pbox"
    assert [r.split(",")[:2] for r in rows[1:]] == [[s, bw] for bw in ("10", "100", "1000") for s in ("innet", "pbox")]


def _paragraph(name: str) -> str:
    """README's paragraph on experiment ``name``: from its ``(`name`)`` to its command."""
    start = REPRODUCE.index(f"(`{name}`)")
    return " ".join(REPRODUCE[start:REPRODUCE.index("```sh", start)].split())


def _stated(name: str, points: dict) -> list[str]:
    """The figures README states for ``name``, formatted as README writes them, from the sweep's points.json."""
    rows = points["points"]
    flag = points["sweep"]
    at = {(r["series"], r[flag]): r for r in rows}
    speedup = points["summary"].get("speedup", {})
    if name == "phub":
        stock = [at["stock", n]["cross_rack_bytes"] for n in (2, 8)]
        [hier] = {r["cross_rack_bytes"] for r in rows if r["series"] == "phub"}
        [one] = {r["cross_rack_bytes"] for r in rows if r["series"] == "innet"}
        assert all(at["pbox", n]["cross_rack_bytes"] == 2 * at["stock", n]["cross_rack_bytes"] for n in points["values"])
        flat = speedup["pbox"].values()
        return [f"The hierarchy is {speedup['phub']['2']:.1f}× to {speedup['phub']['8']:.1f}× faster than the stock PS",
                f"stay at {hier / 1e6:.1f} MB while the stock PS's grow from {stock[0] / 1e6:.1f} MB at 2 per rack to "
                f"{stock[1] / 1e6:.1f} MB at 8 (the flat PBox: twice)",
                f"The flat PBox is no faster ({min(flat):.2f}× to {max(flat):.2f}×",
                f"in-network aggregation is {speedup['innet']['2']:.1f}× to {speedup['innet']['8']:.1f}× faster, "
                f"with {one / 1e6:.1f} MB"]
    if name == "topk":
        first = at["sparse", 0.01]
        within = [d for d in points["values"] if at["sparse", d]["completion_s/dense"] >= 0.98]
        return [f"At 1% sparse moves {100 * first['total_bytes/dense']:.1f}% of dense's bytes and is "
                f"{speedup['sparse']['0.01']:.1f}× faster", f"within 2% of dense's at a density of {within[0]}",
                f"(saving under 1%) at {points['summary']['breakeven']['sparse']:.2f}"]
    if name == "ensemble":
        two, eight = at["shared", 2], at["shared", 8]
        assert two["input.bytes/unicast"] == 2 / 3
        return ["With 2 jobs the shared stream moves 2/3 of the bytes",
                f"with 8 jobs {100 * eight['input.bytes/unicast']:.0f}%",
                f"delivers {1 / two['input.completion_s/unicast']:.0f}× to {1 / eight['input.completion_s/unicast']:.0f}× sooner"]
    if name == "pipesgd":
        gain = speedup["pipesgd"]
        model = at["bsp", 97]["prediction.iteration_s"] / at["pipesgd", 97]["prediction.iteration_s"]
        return [f"{gain['97']:.2f}× at compute-scale 97 (model {model:.2f}×", f"{gain['48']:.2f}× at 48",
                f"{gain['194']:.2f}× at 194",
                f"{gain['24']:.1f}× and {gain['388']:.1f}× at the ends of the sweep (24 and 388)"]
    if name == "p3":  # issue 47's Done-when: each peak gain within 25% (relative) of the paper's, the ablation beside
        gain = speedup
        (vx, vgg), (rx, resnet) = (max(gain[s].items(), key=lambda kv: kv[1]) for s in ("p3_vgg19", "p3_resnet50"))
        assert abs((vgg - 1) / 0.66 - 1) <= 0.25 and abs((resnet - 1) / 0.25 - 1) <= 0.25
        sliced, first, whole = (gain[s]["60"] for s in ("sliced_vgg19", "priority_vgg19", "whole_vgg19"))
        assert gain["p3_vgg19"]["60"] > sliced > first > 1 > whole  # slicing earns most of it; imbalance costs most
        return [f"VGG-19 {vgg:.2f}× at {vx} Mbit/s", f"ResNet-50 {resnet:.2f}× at {rx} (paper 1.25×)",
                f"slicing alone {sliced:.2f}×, priority alone {first:.2f}×", f"make the KVStore {1 / whole:.1f}× slower"]
    if name == "ssp":
        rate = {k: at[k]["iterations_per_s"] for k in at}
        assert all(r["max_staleness"] <= r["staleness"] for r in rows if r["series"] == "ssp")
        return [f"BSP's {rate['bsp', 0]:.1f} iterations/s through SSP's {rate['ssp', 1]:.1f} (s=1) and "
                f"{rate['ssp', 8]:.1f} (s=8) to ASP's {rate['asp', 0]:.1f}", f"ASP's reaches {at['asp', 0]['max_staleness']}"]
    if name == "canary":
        fat, leaf = speedup["dynamic"], speedup["dynamic-leaf-spine"]
        loads = [str(v) for v in points["values"]]
        assert all(r["correct"] for r in rows)
        # issue 46's bounds at default settings: never over 3% slower where there is nothing to route around (the
        # median of 3 seeds: tests/test_dynamic.py; one seed's background phases move a point +-4%: 0.96x at 50%
        # here), at least 1.25x where the core is congested
        assert min(fat.values()) >= 0.95 and min(leaf.values()) >= 1.25
        best = {s: {at[s, v]["best"] for v in points["values"]} for s in ("static", "static-leaf-spine")}
        assert best == {"static": {"placement=tree"}, "static-leaf-spine": {"placement=tor"}}  # "at the default window"
        return [", ".join(f"{fat[k]:.2f}×" for k in loads) + " the best static (`tree` at the default window)",
                ", ".join(f"{leaf[k]:.2f}×" for k in loads) + " faster (`tor`)"]
    if name == "fsdp":
        def over_ddp(mode, n, metric="iteration_s"):
            return at[f"fsdp-{mode}", n][metric] / at[f"ddp-{mode}", n][metric]

        assert all(r["correct"] for r in rows)
        time = {(s, n): f"{at[s, n]['iteration_s']:.3f} s" for s in ("fsdp-ring", "fsdp-innet") for n in (1, 2)}
        return [f"takes {over_ddp('innet', 2):.2f}× DDP's in the switches, {over_ddp('pbox', 2):.2f}× at the PBox, "
                f"{over_ddp('ring', 2):.2f}× as a ring", f"puts {over_ddp('innet', 2, 'tier_bytes.host-tor'):.2f}× DDP's bytes",
                f"({over_ddp('ring', 2, 'tier_bytes.host-tor'):.2f}× as a ring)",
                f"Sharded, the ring beats the switches: {time['fsdp-ring', 1]} against {time['fsdp-innet', 1]} with 1 per "
                f"rack, {time['fsdp-ring', 2]} against {time['fsdp-innet', 2]} with 2"]
    raise AssertionError(f"no figures known for {name}")


@pytest.mark.parametrize("name", PAPERS)
def test_the_papers_figures_are_what_innet_reproduce_draws(name, reproduced):
    """Each figure README states for a paper is what its ``innet reproduce NAME`` command (the full sweep, on the
    fabric in virtual time: seconds; run once, shared with tests/test_experiments.py) writes in points.json, as
    README rounds it."""
    out, folder = reproduced(name)
    assert out.returncode == 0, out.stderr
    with open(folder / "points.json") as f:
        points = json.load(f)
    points["values"] = list(dict.fromkeys(r[points["sweep"]] for r in points["points"]))
    text = _paragraph(name)
    for figure in _stated(name, points):
        assert figure in text, (figure, text)
