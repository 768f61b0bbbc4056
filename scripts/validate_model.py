#!/usr/bin/env python3
"""The timing model against measurement: a grid of runs, each predicted and measured, with the error.

Local backend (virtual time): modes x link delay x bandwidth, top-k densities, BSP/SSP/ASP with a
straggler, the ring at 4/8/16 workers, several jobs, and a workload under BSP, P3, pipelining and
Pipe-SGD's BSP baseline, wide-area Topology Zoo graphs, and loss (0.1-20%, medians of ``--seeds``); with
``--mininet`` also the Mininet grid (scripts/mininet_grid.py: each point on Mininet, the local fabric and the
model side by side, taking the Mininet lock), and with ``--mininet-only`` that grid alone (``--doc`` then
replaces only the doc's Mininet section). Writes a CSV and a markdown table (and with ``--doc``
docs/validation.md, with the papers' claims reproduced), and prints the median and worst |error|.

    python scripts/validate_model.py [--quick] [--mininet | --mininet-only] [--csv FILE] [--doc FILE]
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import io
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import IO

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.api import mode_specs, run, spec_of  # noqa: E402
from innet.backends.mininet.cleanup import STATE_DIR  # noqa: E402
from innet.cli import parse_options  # noqa: E402
from innet.errors import UserError  # noqa: E402
from innet.planning.prediction import direction_bytes  # noqa: E402
from innet.planning.spec import program_of  # noqa: E402
from innet.planning.timing import busiest_direction  # noqa: E402
from innet.results.files import make_private_folder, open_new, write_text_atomic  # noqa: E402
from innet.schemes.modes import plan_run  # noqa: E402
from scripts import mininet_grid as grid  # noqa: E402

BOUND = 10.0  # percent: the model's promise on the local backend (issue #18)
LOCK = os.path.join(STATE_DIR, "mininet.lock")  # in root's own 0700 folder: no one else can plant or hold it
STAR = "--topo star --elements 65536"
SSP = "--topo star --mode pbox --iterations 10 --straggler h1:3"
WORKLOAD = "--bw 100 --workload resnet50 --iterations 3 --compute-scale 80"
LOSSES = (0.001, 0.01, 0.05, 0.2)


def local_grid(quick: bool) -> list[str]:
    """The grid's points, as run_topology.py flags (sampled: each axis crossed with the modes, not all at once)."""
    if quick:
        small = "--topo star --elements 16384"
        return [f"{small} --mode {m}" for m in ("innet", "pbox", "ring")] + [
            f"{small} --mode innet --delay 0.0005 --bw 100", f"{small} --mode innet --topk 0.01",
            f"{small} --mode pbox --iterations 4 --straggler h1:3 --consistency ssp --staleness 3",
        ]
    grid = [f"{STAR} --mode {m} --bw {bw} --delay {d}" for m in ("innet", "pbox", "ring")
            for bw in (100, 1000) for d in (0, 0.0005, 0.002)]
    grid += [f"{STAR} --mode {m} --topk {k}" for m in ("innet", "pbox") for k in (0.001, 0.01, 0.1, 0.5)]
    grid += [f"--topo leaf-spine --mode innet --topk {k}" for k in (0.01, 0.1)]
    grid += [f"{SSP} --consistency {c}" for c in ("bsp", "ssp --staleness 3", "asp")]
    grid += [f"--topo star --mode ring --workers {n}" for n in (4, 8, 16)]
    grid += [f"--topo leaf-spine --mode {m} --jobs 2" for m in ("innet", "pbox", "ring")]
    grid += [f"{WORKLOAD} --mode {m}" for m in ("innet", "pbox", "ring")]
    grid += [f"{WORKLOAD} --pipeline 2", f"{WORKLOAD} --slice 50000 --priority p3",
             f"{WORKLOAD} --delay 0.0005 --pipeline 2"]
    return grid


def wide_grid(quick: bool) -> list[str]:
    """Wide-area graphs of the Internet Topology Zoo (topologies/zoo.py: 1-5 ms links, four workers far apart)."""
    zoo = "topologies/examples"  # run from the repository's root
    points = [f"--topo {zoo}/abilene.graphml --elements 262144 --mode {m}" for m in ("innet", "pbox", "ring")]
    return points[:1] if quick else points + [f"--topo {zoo}/aarnet.graphml --elements 262144 --mode {m}"
                                              for m in ("innet", "pbox", "ring")]


def loss_grid(quick: bool) -> list[str]:
    """Loss on every link direction, star of 4 and the default leaf-spine, 262144 elements: the loss term."""
    if quick:
        return ["--topo star --elements 262144 --mode pbox --loss 0.05"]
    return [f"--topo {t} --elements 262144 --mode {m} --loss {p}" for t in ("star", "leaf-spine")
            for m in ("innet", "pbox", "ring") for p in LOSSES]


def measure(flags: str, backend: str) -> dict[str, object]:
    """One point: run it, predict it; the row of the table."""
    report = run(**parse_options(f"{flags} --backend {backend} --predict".split()))  # as its command line has it
    record = report.runs[0]
    print(f"  {backend}: {flags}", file=sys.stderr, flush=True)
    key = "iteration_s" if report.spec.workload else "completion_s"
    got, model = float(record[key]), float(record["prediction"][key])
    return {"backend": backend, "flags": flags, "figure": key, "measured_s": f"{got:.6f}", "model_s": f"{model:.6f}",
            "error_pct": f"{100 * (model / got - 1):+.2f}", "correct": record.correct,
            "cpu_bound": any("CPU-bound" in w for w in record.figures.get("warnings", []))}


def median_of_seeds(flags: str, seeds: int) -> dict[str, object]:
    """A lossy point on the local backend: each of ``seeds`` seeds (which frames are lost) measured, the median
    run's row, every run's time in ``runs_s`` (one seed's time under 20% loss can be twice another's)."""
    rows = sorted((measure(f"{flags} --seed {s}", "local") for s in range(1, seeds + 1)),
                  key=lambda r: float(str(r["measured_s"])))
    return {**rows[len(rows) // 2], "flags": flags, "runs_s": " ".join(str(r["measured_s"]) for r in rows)}


def claims() -> list[str]:
    """The papers' claims, reproduced here in their own units (each a measured and a predicted figure)."""
    lines = ["| claim (paper) | setting (`run_topology.py --backend local` ...) | measured | model |", "|---|---|---|---|"]

    def ratio(a: str, b: str, key: str = "iteration_s") -> tuple[float, float]:
        ra, rb = measure(a, "local"), measure(b, "local")
        assert ra["figure"] == key
        return float(ra["measured_s"]) / float(rb["measured_s"]), float(ra["model_s"]) / float(rb["model_s"])

    lines += p3_claims()
    base = "--topo star --bw 100 --workload resnet50 --iterations 3 --compute-scale 97 --overlap none"  # pipesgd.toml's
    got, model = ratio(base, f"{base} --pipeline 2")
    lines.append(f"| Pipe-SGD: width-2 speed-up, bound max(compute, comm) over their sum (-> 2x) | "
                 f"`{base} --pipeline 2` vs `--pipeline 1` | {got:.2f}x | {model:.2f}x |")
    got, model = ratio(f"{STAR} --mode pbox", f"{STAR} --mode innet", "completion_s")
    star, graph = spec_of(**parse_options(f"{STAR} --backend local".split()))
    busy = {}
    for mode in ("pbox", "innet"):
        spec = replace(mode_specs(star, graph)[0], mode=mode)
        plan = plan_run(graph, spec, program_of(spec)).plans[0]
        busy[mode] = busiest_direction(graph, direction_bytes(graph, mode, plan, spec.elements, program_of(spec).elements))[1]
    lines.append(f"| PBox (PHub): N x the busiest link's time of in-network, N = 4 | `{STAR} --mode pbox` vs innet | "
                 f"{got:.2f}x completion | {busy['pbox'] / busy['innet']:.2f}x link time, {model:.2f}x completion |")
    rack = "--topo phub-rack --racks 2 --hosts-per-rack 8 --bw 100 --elements 65536 --mode pbox"  # experiments/phub.toml's
    got, model = ratio(f"{rack} --pbox-layout sharded", f"{rack} --pbox-layout rack", "completion_s")
    lines.append(f"| PHub: its hierarchical PBox against a stock sharded PS (up to 2.7x) | `{rack} --pbox-layout rack` vs "
                 f"`--pbox-layout sharded` | {got:.2f}x | {model:.2f}x |")
    got_d, model_d = breakeven()
    lines.append(f"| top-k (Shi et al.): break-even density, bytes on all links (sparse saves under 1%) | `{STAR} --mode "
                 f"innet --topk D` vs dense (as `scripts/sparse_breakeven.py`) | {got_d} | {model_d} |")
    for c in ("ssp --staleness 3", "asp"):
        r = measure(f"{SSP} --consistency {c}", "local")
        rec = run(**parse_options(f"{SSP} --consistency {c} --backend local".split())).runs[0]
        bound = "s = 3" if "ssp" in c else "ASP: no bound"
        lines.append(f"| SSP: a read misses at most s iterations ({bound}) | `{SSP} --consistency {c}` | max staleness "
                     f"read {rec['max_staleness']}; {r['measured_s']} s | {r['model_s']} s |")
    return lines


P3_POINTS = (("vgg19", 60, 66), ("resnet50", 30, 25))  # experiments/p3.toml's peaks: workload, Mbit/s, the paper's %
P3_BASE = "--topo star --workload-scale 0.001 --iterations 2 --compute-scale 250 --predict"  # experiments/p3.toml's [run]


def p3_claims() -> list[str]:
    """P3 against MXNet's KVStore at experiments/p3.toml's peaks: the parameter servers modelled (``--ps``: no
    measurement exists), beside the same runs' own emulated exchange (P3's slices against FIFO whole layers)."""
    lines = []
    for w, bw, paper in P3_POINTS:
        base = f"--bw {bw} --workload {w} {P3_BASE}"
        kv, p3 = (run(**parse_options(f"{base} {f} --backend local".split())).runs[0]
                  for f in ("--ps kvstore", "--ps p3 --priority p3 --slice 500"))
        own, ps = kv["iteration_s"] / p3["iteration_s"], kv["prediction"]["ps_iteration_s"] / p3["prediction"]["ps_iteration_s"]
        lines.append(f"| P3 over MXNet's KVStore, {w} (up to +{paper}%) | `{base} --ps p3 --priority p3 --slice 500` vs "
                     f"`--ps kvstore` | {100 * (own - 1):+.1f}% (innet's own exchange) | {100 * (ps - 1):+.1f}% (the servers, "
                     f"model only) |")
    return lines


def breakeven() -> tuple[str, str]:
    """Top-k's break-even density in bytes on the links (all of them), measured and predicted: where the
    sparse run stops saving 1% against dense (scripts/sparse_breakeven.py's rule)."""
    from scripts.sparse_breakeven import crossing

    def totals(flags: str) -> tuple[int, int]:
        record = run(**parse_options(f"{flags} --backend local".split())).runs[0]
        return sum(record.link_bytes.values()), sum(record.predicted_link_bytes.values())

    base = totals(f"{STAR} --mode innet")
    measured, model = [], []
    for d in (0.1, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6):
        got = totals(f"{STAR} --mode innet --topk {d}")
        measured.append((d, got[0] / base[0]))
        model.append((d, got[1] / base[1]))
    return tuple("none up to 0.6" if at is None else f"{at:.3f}" for at in (crossing(measured), crossing(model)))


def table(rows: list[dict[str, object]]) -> list[str]:
    out = ["| backend | run_topology.py flags | figure | measured s | model s | error | cpu | runs (s) |",
           "|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['backend']} | `{r['flags']}` | {r['figure']} | {r['measured_s']} | {r['model_s']} | {r['error_pct']}% | "
            f"{'CPU-bound' if r['cpu_bound'] else ''} | {r.get('runs_s', '')} |" for r in rows]
    return out


def summary(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "no points"
    errors = [abs(float(str(r["error_pct"]))) for r in rows]
    worst = max(rows, key=lambda r: abs(float(str(r["error_pct"]))))
    return (f"{len(rows)} points: median |error| {statistics.median(errors):.2f}%, worst {max(errors):.2f}% "
            f"({worst['backend']}: {worst['flags']})")


def _csv(path: str, rows: list[dict[str, object]]) -> None:
    table_csv = io.StringIO(newline="")
    fields = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(table_csv, fieldnames=fields, restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, table_csv.getvalue())


def write(args: argparse.Namespace, rows: list[dict[str, object]], claimed: list[str], started: float,
          mininet: list[str]) -> None:
    """The CSV, the table and summaries on stdout, and with ``--doc`` the markdown file (``mininet``: its Mininet
    section, or a line saying why it has none)."""
    _csv(args.csv, rows)
    print("\n".join(table(rows)))
    print(f"local: {summary(rows)}")
    if not args.doc:
        return
    command = "python3 scripts/validate_model.py" + (" --mininet" if args.mininet else "") + f" --doc {args.doc}"
    doc = ["# The timing model against measurement", "",
           f"Generated by `{command}` ({time.time() - started:.0f} s; do not edit by hand). Lossy points: the "
           f"median of {args.seeds} seeds (`runs (s)`: each run's time).", "",
           f"Local backend: {summary(rows)}.", "",
           "Each row is one `run_topology.py` run with these flags, measured in virtual time on the local fabric "
           "and predicted by `innet/planning/timing/` (`--predict` prints the same). The model "
           "covers link bandwidth and latency (`--delay`), the window's pace, top-k's sparse frames and their "
           "densification up the tree, training against the PBox under BSP/SSP/ASP with stragglers "
           "(`innet/planning/timing/consistency.py`), jobs sharing links, and a workload's schedule (FIFO, P3, "
           "`--pipeline 2`, `--overlap none`), wide-area graphs of the Internet Topology Zoo (`topologies/zoo.py`), "
           "and loss (`--loss`: each mode's expected time, `lossy_time`). Error = model / measured - 1. The "
           "local fabric and the model answer to Mininet: the next section.", "",
           *table(rows), "", *mininet, "## The papers' claims, reproduced", "", *claimed, ""]
    write_text_atomic(args.doc, "\n".join(doc))


def kept_section(doc: str | None) -> list[str]:
    """The Mininet section ``doc`` already has (regenerating the local grid keeps it as it was), else none."""
    if not doc or not os.path.exists(doc):
        return []
    with open(doc) as f:
        text = f.read()
    if grid.HEADING not in text:
        return []
    rest = grid.HEADING + text.split(grid.HEADING, 1)[1]
    return rest[:rest.find("\n## ")].split("\n") if "\n## " in rest else rest.split("\n")


def mininet_section(args: argparse.Namespace) -> list[str]:
    """The Mininet grid, run under the Mininet lock: its doc section (its CSV written, its table printed)."""
    started, load = time.time(), " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.from_csv:  # a grid run before: its rows, its wall time, the load it noted
        rows = grid.read_rows(args.from_csv)
        return grid.section(rows, args.repeats, sum(float(str(r.get("wall_s", 0))) for r in rows), args.load)
    kept = {str(r["flags"]): r for r in grid.read_rows(args.mininet_csv)} if args.only else {}
    points = grid.points(args.quick)
    again = [flags for flags in points if flags not in kept or (args.only != "new" and args.only in flags)]
    with mininet_lock() as lock:
        if not (args.no_lock or locked(lock, args.lock_wait)):
            return [grid.HEADING, "", f"No Mininet points: the lock stayed taken for {args.lock_wait:g} s.", ""]
        rows = [grid.measure_point(flags, args.repeats) if flags in again else kept[flags] for flags in points]
    load += " at the start, " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end"
    _csv(args.mininet_csv, rows)
    print("\n".join(grid.table(rows)))
    print(f"mininet grid: {grid.verdict(rows)} ({time.time() - started:.0f} s, load average {load})")
    return grid.section(rows, args.repeats, time.time() - started, f"load average {load}",
                        (f"the {len(again)} of {len(rows)} points " + ("new to the grid measured" if args.only == "new"
                         else f"whose flags hold `{args.only}` measured again") + "; the others are an earlier whole "
                         "grid's") if args.only else "")


def locked(lock: object, wait: float) -> bool:
    """Take the Mininet lock, waiting at most ``wait`` seconds (others' Mininet runs hold it for minutes)."""
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[arg-type]
            return True
        except BlockingIOError:
            if time.time() > deadline:
                return False
            time.sleep(1)


def mininet_lock() -> IO[bytes]:
    """The Mininet lock's file, opened (made new the first time) in /run/innet, root's own 0700 folder."""
    make_private_folder(STATE_DIR)
    try:
        return open_new(LOCK)
    except UserError:  # made by an earlier run: the folder is root's alone, so the file is too
        return open(LOCK, "rb")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a handful of small points (seconds; what the test runs)")
    p.add_argument("--mininet", action="store_true",
                   help="also the Mininet grid: each point on Mininet, local and the model (root; the Mininet lock)")
    p.add_argument("--mininet-only", action="store_true",
                   help="only the Mininet grid; with --doc, replace only the doc's Mininet section")
    p.add_argument("--no-lock", action="store_true",
                   help="with --mininet: do not take the Mininet lock, /run/innet/mininet.lock (the caller holds it)")
    p.add_argument("--lock-wait", type=float, default=3600,
                   help="with --mininet: seconds to wait for the lock before leaving the Mininet points out (default 3600)")
    p.add_argument("--repeats", type=int, default=3,
                   help="with --mininet: seeds per Mininet grid point, on each backend, the median reported (default 3)")
    p.add_argument("--seeds", type=int, default=21, help="seeds per lossy point, the median reported (default 21)")
    p.add_argument("--csv", default="results/validation.csv", help="where the CSV goes (default results/validation.csv)")
    p.add_argument("--mininet-csv", default="results/validation-mininet.csv",
                   help="where the Mininet grid's CSV goes (default results/validation-mininet.csv)")
    p.add_argument("--from-csv", default=None, metavar="FILE",
                   help="with --mininet-only: render the section from this grid CSV instead of running it")
    p.add_argument("--only", default="", metavar="TEXT",
                   help="with --mininet-only: measure again only the points whose flags hold TEXT (e.g. 'dynamic'), "
                        "the others kept from --mininet-csv (a whole grid's); 'new': only the points that CSV lacks")
    p.add_argument("--load", default="not noted", help="with --from-csv: the machine's load during that run, to quote")
    p.add_argument("--doc", default=None, help="also write the tables and the papers' claims to this markdown file")
    args = p.parse_args()
    started = time.time()
    if args.mininet_only:
        section = mininet_section(args)
        if args.doc:
            with open(args.doc) as f:
                write_text_atomic(args.doc, grid.splice(f.read(), section))
        print(f"csv: {args.mininet_csv}")
        return
    rows = [measure(flags, "local") for flags in local_grid(args.quick) + wide_grid(args.quick)]
    rows += [median_of_seeds(flags, 7 if args.quick else args.seeds) for flags in loss_grid(args.quick)]  # 3 seeds: ±7%
    claimed = claims() if args.doc else []
    write(args, rows, claimed, started, mininet_section(args) if args.mininet else kept_section(args.doc))
    print(f"csv: {args.csv}")


if __name__ == "__main__":
    main()
