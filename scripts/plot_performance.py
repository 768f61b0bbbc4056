#!/usr/bin/env python3
"""README's performance figure, drawn from the benchmarks' own records (results/bench.jsonl).

Four panels, each from the latest table of one benchmark (``make bench`` writes them all):
in-network goodput against the link rate without dilation, one line per packet size
(``scripts/bench_allreduce.py``); each mode's time over in-network's against theory
(same table); Mininet's completion time over the local backend's with time dilation
(``scripts/bench_dilation.py``); one switch against the Linux bridge, lossless and under
overload (``scripts/bench_switch.py``). A benchmark with no table in the file leaves its
panel saying so.

    python scripts/plot_performance.py [--bench results/bench.jsonl] [--out docs/figures/performance.png]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.results.files import save_figure  # noqa: E402

ALLREDUCE = "all-reduce goodput and mode ratios"
DILATION = "time dilation: Mininet against virtual time"
SWITCH = "switch vs Linux bridge"


def latest(path: str) -> dict[str, list[dict[str, Any]]]:
    """Per benchmark name, its tables, the last ones first; of the all-reduce benchmark, one table per
    packet size holding each link rate's latest rows (its rates are often measured in separate runs)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                entry = json.loads(line)
                tables.setdefault(entry["bench"], []).insert(0, entry)
    if ALLREDUCE in tables:
        by_size: dict[Any, dict[str, Any]] = {}
        for entry in tables[ALLREDUCE]:  # latest first: a rate already taken keeps its later rows
            size = entry.get("packet_elements") or 0
            merged = by_size.setdefault(size, {**entry, "rows": []})
            have = {row[0] for row in merged["rows"]}
            merged["rows"] += [row for row in entry["rows"] if row[0] not in have]
        for merged in by_size.values():
            merged["rows"].sort(key=lambda row: row[0])
        tables[ALLREDUCE] = list(by_size.values())
    return tables


def rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(entry["header"], row, strict=True)) for row in entry["rows"]]


def plot(tables: dict[str, list[dict[str, Any]]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((good, ratio), (dil, sw)) = plt.subplots(2, 2, figsize=(11, 8))
    for entry in tables.get(ALLREDUCE, []):
        size = entry.get("packet_elements") or "default"
        table = rows(entry)
        inn = [r for r in table if r["mode"] == "innet"]
        good.plot([r["Mbit/s"] for r in inn], [r["goodput"] for r in inn], "o-", label=f"{size} values/packet")
        for mode, marker in (("pbox", "s"), ("ring", "^")):
            sel = [r for r in table if r["mode"] == mode]
            ratio.plot([r["Mbit/s"] for r in sel], [r["x innet"] / r["theory"] for r in sel], marker + "-",
                       label=f"{mode}, {size} values/packet")
    good.axhline(0.9, color="grey", ls="--", lw=1)
    good.set(xscale="log", xlabel="link rate, Mbit/s (no dilation)", ylabel="in-network goodput / line rate",
             title="in-network goodput, star of 4 (bench_allreduce)", ylim=(0, 1.05))
    ratio.axhspan(0.9, 1.1, color="grey", alpha=0.2)
    ratio.set(xscale="log", xlabel="link rate, Mbit/s (no dilation)", ylabel="time ratio / theory",
              title="PBox (N×) and ring (2(N−1)/N) against in-network")
    for ax in (good, ratio):
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no bench_allreduce table", ha="center", transform=ax.transAxes)
    if tables.get(DILATION):
        table = rows(tables[DILATION][0])
        labels = [f"{r['topology']} {r['host Mbit/s']:g}\n{r['mode']} F={r['dilation']:g}" for r in table]
        dil.bar(range(len(table)), [r["mininet/local"] for r in table], color="tab:blue")
        dil.set_xticks(range(len(table)), labels, fontsize=6)
        dil.axhline(1.1, color="grey", ls="--", lw=1)
        dil.set(ylabel="Mininet / local completion time", title="time dilation (bench_dilation)")
    else:
        dil.text(0.5, 0.5, "no bench_dilation table", ha="center", transform=dil.transAxes)
    if tables.get(SWITCH):
        table = rows(tables[SWITCH][0])
        at = list(range(len(table)))
        sw.bar([x - 0.2 for x in at], [r["innet/bridge"] for r in table], 0.4, label="lossless")
        if all("at 2x / lossless" in r for r in table):
            sw.bar([x + 0.2 for x in at], [r["at 2x / lossless"] * r["innet/bridge"] for r in table], 0.4,
                   label="offered twice the lossless rate")
        else:  # tables from before the 2x column
            sw.bar([x + 0.2 for x in at], [r["innet pps overloaded"] / r["bridge pps"] for r in table], 0.4,
                   label="offered as fast as the sender can")
        sw.set_xticks(at, [f"{r['program']}\n{r['elements/pkt']}" for r in table], fontsize=7)
        sw.axhline(1.0, color="grey", ls="--", lw=1)
        sw.set(ylabel="innet packets/s / Linux bridge's", title="one switch against the bridge (bench_switch)")
        sw.legend(fontsize=7)
    else:
        sw.text(0.5, 0.5, "no bench_switch table", ha="center", transform=sw.transAxes)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default=os.path.join("results", "bench.jsonl"))
    p.add_argument("--out", default=os.path.join("docs", "figures", "performance.png"))
    args = p.parse_args(argv)
    if not os.path.exists(args.bench):
        print(f"error: no benchmark records at {args.bench}: run make bench first", file=sys.stderr)
        return 2
    plot(latest(args.bench), args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
