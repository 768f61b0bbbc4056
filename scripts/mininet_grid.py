"""The Mininet validation grid: each point run on Mininet (the reference: the kernel's veth links, qdiscs and real
processes), on the local fabric and by the timing model, side by side (issue #46).

Every point is a ``run_topology.py`` command line at rates this machine carries (10 Mbit/s host links, dilated as
``--dilation auto`` chooses), run with seeds 1..N on both backends (the seed draws the gradients, which frames are
lost, reordered or duplicated, and the background's flows): the median of each. The model's figure is the median of
the Mininet runs' predictions (``--predict``, per-hop latency included), or beside background traffic of the fluid
model's ``background_model_s`` where the runs have one. Errors are against Mininet: local / Mininet - 1, model / Mininet - 1.

    python scripts/validate_model.py --mininet-only [--quick] [--doc docs/validation.md]
"""

from __future__ import annotations

import statistics
import sys
import time

from innet.api import run
from innet.cli import parse_options
from innet.errors import UserError

BOUND = 10.0  # percent: local and model against Mininet at every point (issue #46)
MEDIAN_BOUND = 5.0  # percent: the median over the grid
HEADING = "## Mininet: the kernel as the reference"
STAR = "--topo star --bw 10 --elements 120000"
LEAF = "--topo leaf-spine --bw 10 --elements 65536"
TWO_SPINES = f"{LEAF} --spines 2 --oversubscription 2"  # something to route around: dynamic trees' ground
FAT = "--topo fat-tree --k 4 --bw 10 --elements 32768"
FAULTY_SEEDS = 5  # seeds at least, where the flags inject faults: one loss the timer recovers moves a run 8% on its own
# (the fabric's seeds 1-3 at 1% loss: 0.409/0.420/0.453 s), and the two backends draw different frames once their
# frame counts differ, so two medians of 3 fell 5% apart by chance about 4% of the time (1% with 5)
QUICK = [f"{STAR} --mode ring --collective reduce_scatter", f"{STAR} --mode innet --collective reduce",
         f"{LEAF} --mode innet --jobs 2"]  # the test's: each held against the model by the fidelity verdict too (a lossy
# point is not: its time is its losses' draw, 5 seeds in the grid; the star's all-reduce is test_dilation_mininet's)


def points(quick: bool = False) -> list[str]:
    """The grid, as run_topology.py flags: each axis sampled against the star of 4 (or the topology it needs)."""
    if quick:
        return list(QUICK)
    grid = [f"{STAR} --mode {m}" for m in ("innet", "pbox", "ring")]
    grid += [f"{STAR} --mode innet --bw 25", f"{STAR} --mode pbox --topk 0.1"]
    grid += [f"{STAR} --mode innet --collective {c}" for c in ("reduce_scatter", "all_gather", "broadcast", "reduce",
                                                              "barrier")]
    grid += [f"{STAR} --mode ring --collective reduce_scatter", f"{STAR} --mode pbox --collective broadcast"]
    faults = ("--loss 0.01", "--reorder 0.01", "--dup 0.01", "--loss 0.01 --reorder 0.01",
              "--loss 0.01 --reorder 0.01 --dup 0.01")
    grid += [f"{STAR} --mode innet {f}" for f in faults]
    grid += [f"{STAR} --mode {m} --loss 0.01 --reorder 0.01" for m in ("pbox", "ring")]
    grid += [f"{STAR} --mode {m} --delay 0.005" for m in ("innet", "ring")]
    grid += [f"{LEAF} --mode {m} --oversubscription {o}" for m in ("innet", "pbox") for o in (2, 4)]
    grid += [f"{LEAF} --mode {m} --jobs 2" for m in ("innet", "ring")]
    grid += [f"{TWO_SPINES} --mode innet --background permutation:{load}{p}" for load in (0.25, 0.5, 0.75)
             for p in ("", " --placement dynamic")]
    grid += [f"{TWO_SPINES} --mode innet --background {b}:{load}{p}" for b in ("all-to-all", "incast", "hotspot:s1--t1")
             for load in (0.25, 0.5, 0.75) for p in ("", " --placement dynamic")]
    grid += [f"{FAT} --mode innet", f"{FAT} --mode innet --background permutation:0.5",
             f"{FAT} --mode innet --background permutation:0.5 --placement dynamic"]
    return grid


def _once(flags: str, backend: str, seed: int) -> dict[str, object]:
    """One run of ``flags`` with ``--seed seed``: its time, the model's, and whether Mininet judged it faithful."""
    report = run(**parse_options(f"{flags} --seed {seed} --backend {backend} --predict".split()))
    record = report.runs[0]
    key = "iteration_s" if report.spec.workload else "completion_s"
    model = record.get("background_model_s") if report.spec.background.pattern else None
    fidelity = record.get("fidelity") or {}
    return {"figure": key, "s": float(record[key]), "model_s": float(model or record["prediction"][key]),
            "correct": bool(record.correct), "verdict": str(fidelity.get("verdict", "")),
            "dilation": fidelity.get("dilation", ""),
            "cpu_bound": any("CPU-bound" in w for w in record.figures.get("warnings", []))}


def _median(flags: str, backend: str, seeds: int) -> dict[str, object]:
    """The median run of ``seeds`` seeds; its model the median of theirs (a seed's background phases move the model's
    time as they move the run's: fat-tree k=4 at 50% permutation 0.239, 0.213, 0.230 s for seeds 1-3)."""
    runs = sorted((_once(flags, backend, s) for s in range(1, seeds + 1)), key=lambda r: float(str(r["s"])))
    return {**runs[len(runs) // 2], "model_s": statistics.median(float(str(r["model_s"])) for r in runs),
            "runs": [r["s"] for r in runs], "all_correct": all(r["correct"] for r in runs),
            "unfaithful": sum(1 for r in runs if r["verdict"] not in ("", "faithful") or r["cpu_bound"])}


def seeds_for(flags: str, seeds: int) -> int:
    """Seeds a point takes: ``seeds``, and FAULTY_SEEDS at least where it injects loss, duplication or reordering."""
    return max(seeds, FAULTY_SEEDS) if any(f in flags.split() for f in ("--loss", "--dup", "--reorder")) else seeds


def measure_point(flags: str, seeds: int = 3) -> dict[str, object]:
    """One grid point: Mininet, the local fabric and the model, each the median of ``seeds`` seeds (``seeds_for``)."""
    started = time.time()
    seeds = seeds_for(flags, seeds)
    try:
        mn = _median(flags, "mininet", seeds)
        local = _median(flags, "local", seeds)
    except UserError as exc:  # a point this machine cannot run says so in its row; the grid goes on
        return {"flags": flags, "failed": str(exc)}
    except Exception as exc:  # noqa: BLE001 - nor does one crashed run end a half-hour grid: its row names it
        return {"flags": flags, "failed": f"{type(exc).__name__}: {exc}"}
    mn_s, local_s, model_s = float(str(mn["s"])), float(str(local["s"])), float(str(mn["model_s"]))
    row: dict[str, object] = {
        "flags": flags, "figure": mn["figure"], "mininet_s": mn_s, "local_s": local_s, "model_s": model_s,
        "local_err_pct": 100 * (local_s / mn_s - 1), "model_err_pct": 100 * (model_s / mn_s - 1),
        "mininet_runs": mn["runs"], "local_runs": local["runs"], "dilation": mn["dilation"],
        "unfaithful": mn["unfaithful"], "correct": bool(mn["all_correct"] and local["all_correct"]),
        "wall_s": time.time() - started}
    print(f"  mininet grid: {flags}: mininet {mn_s:.4f} s, local {local_s:.4f} s ({row['local_err_pct']:+.1f}%), "
          f"model {model_s:.4f} s ({row['model_err_pct']:+.1f}%)", file=sys.stderr, flush=True)
    return row


def read_rows(path: str) -> list[dict[str, object]]:
    """The rows of a grid's CSV (``validate_model.py --mininet-csv``), typed again: to render the section anew
    without rerunning half an hour of Mininet."""
    import ast
    import csv

    with open(path, newline="") as f:
        rows: list[dict[str, object]] = []
        for r in csv.DictReader(f):
            if r.get("failed"):
                rows.append({"flags": r["flags"], "failed": r["failed"]})
                continue
            kept = {k: v for k, v in r.items() if k != "failed"}
            rows.append({**kept, **{k: float(r[k]) for k in ("mininet_s", "local_s", "model_s", "local_err_pct",
                                                          "model_err_pct", "wall_s")},
                         "mininet_runs": ast.literal_eval(r["mininet_runs"]), "local_runs": ast.literal_eval(r["local_runs"]),
                         "dilation": float(r["dilation"]) if r["dilation"] else "", "unfaithful": int(r["unfaithful"]),
                         "correct": r["correct"] == "True"})
    return rows


def _errors(rows: list[dict[str, object]], key: str) -> list[float]:
    return [abs(float(str(r[key]))) for r in rows if "failed" not in r]


def verdict(rows: list[dict[str, object]]) -> str:
    """The grid's summary line: median and worst |error| of local and of the model against Mininet."""
    done = [r for r in rows if "failed" not in r]
    if not done:
        return "no Mininet points"
    parts = []
    for name, key in (("local fabric", "local_err_pct"), ("model", "model_err_pct")):
        errs = _errors(done, key)
        worst = max(done, key=lambda r: abs(float(str(r[key]))))
        over = sum(1 for e in errs if e > BOUND)
        parts.append(f"{name} vs Mininet: median |error| {statistics.median(errs):.2f}%, worst {max(errs):.2f}% "
                     f"(`{worst['flags']}`), {over} point(s) over {BOUND:g}%")
    failed = len(rows) - len(done)
    return f"{len(done)} points: " + "; ".join(parts) + (f"; {failed} point(s) failed to run" if failed else "")


def table(rows: list[dict[str, object]]) -> list[str]:
    out = ["| run_topology.py flags | Mininet s | local s | model s | local vs Mininet | model vs Mininet | dilation "
           "| Mininet runs (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            out.append(f"| `{r['flags']}` | failed: {r['failed']} | | | | | | |")
            continue
        flag = f" ({r['unfaithful']} of the runs not faithful)" if r["unfaithful"] else ""
        wrong = "" if r["correct"] else " **wrong result**"
        out.append(f"| `{r['flags']}` | {r['mininet_s']:.4f}{wrong} | {r['local_s']:.4f} | {r['model_s']:.4f} | "
                   f"{r['local_err_pct']:+.1f}% | {r['model_err_pct']:+.1f}% | {_dilation(r['dilation'])}{flag} | "
                   + " ".join(f"{s:.4f}" for s in r["mininet_runs"]) + " |")  # type: ignore[attr-defined]
    return out


def _dilation(f: object) -> str:
    return f"{f:.3g}" if isinstance(f, float) else str(f)


def section(rows: list[dict[str, object]], seeds: int, wall_s: float, load: str, again: str = "") -> list[str]:
    """The doc's Mininet section: how it was made (``again``: which points a run with ``--only`` measured again), the
    summary, the table."""
    return [HEADING, "",
            f"Generated by `python3 scripts/validate_model.py --mininet-only --doc docs/validation.md` (or with the "
            f"whole doc, `--mininet`): {wall_s:.0f} s, machine load (1, 5, 15 minutes) `{load}`"
            f"{f' ({again})' if again else ''}. Each point is one "
            f"`run_topology.py` command line with `--seed 1..{seeds}` ({max(seeds, FAULTY_SEEDS)} where it injects faults) "
            "on Mininet (`--dilation auto`: the wall clock "
            f"divided by the dilation) and on the local fabric (virtual time), the median of each; the model is the median "
            "of the Mininet runs' `--predict` (per-hop latency included) or, beside background traffic, of their "
            "`background_model_s` (the fluid model of `innet/planning/timing/fluid.py`: strict-priority link queues, FIFO "
            "within a band; dynamic trees' chunk by chunk as their switches send them, `innet/planning/timing/trees.py`). "
            "Errors are against Mininet: "
            f"local / Mininet - 1 and model / Mininet - 1; the bound is {BOUND:g}% at every point, "
            f"{MEDIAN_BOUND:g}% for the median.", "", verdict(rows) + ".", "", *table(rows), ""]


def splice(doc: str, lines: list[str]) -> str:
    """``doc`` with its Mininet section replaced by ``lines`` (put before the papers' claims where it has none)."""
    text = "\n".join(lines)
    if HEADING in doc:
        head, rest = doc.split(HEADING, 1)
        tail = rest[rest.find("\n## "):] if "\n## " in rest else "\n"
        return head + text + tail
    claims = "## The papers' claims, reproduced"
    if claims in doc:
        head, tail = doc.split(claims, 1)
        return head + text + "\n" + claims + tail
    return doc.rstrip("\n") + "\n\n" + text + "\n"
