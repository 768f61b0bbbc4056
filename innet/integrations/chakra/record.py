"""What ``innet replay`` prints and writes: per mode, a table of the trace's calls (measured time beside the timing
model's, exact or not), bytes per tier and per link beside the planner's; ``--out DIR`` writes DIR/results.json and
DIR/links.csv, ``--json FILE`` the same JSON (the records, one codec: innet.node.codec)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence

from innet.graph import natural_key
from innet.integrations.chakra.replay import ReplayRecord
from innet.node import codec
from innet.results.files import make_output_folder, write_text_atomic


def error(measured: float, model: float) -> str:
    """The model's error against the measurement, in percent ("-" where nothing was measured)."""
    return f"{100 * (model / measured - 1):+.1f}%" if measured > 0 else "-"


def lines(record: ReplayRecord) -> list[str]:
    """A replay's report: its headline, a row per call, bytes per tier and per link."""
    verdict = "exact" if record.correct else "WRONG RESULTS"
    out = [f"replay {record.trace}: {record.ranks} ranks, {record.nodes} nodes, {len(record.calls)} calls on "
           f"{record.topology}, mode {record.mode}: {verdict}, {record.virtual_s:.6f} virtual s"]
    rows = [["call", "collective", "name", "bytes", "ranks", "start_s", "time_s", "model_s", "error", "exact"]]
    for i, c in enumerate(record.calls, 1):
        rows.append([str(i), c.kind, c.name[:32], str(c.bytes), str(len(c.ranks)), f"{c.start_s:.6f}",
                     f"{c.time_s:.6f}", f"{c.model_s:.6f}", error(c.time_s, c.model_s), str(c.correct)])
    if record.calls:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    out.append("bytes per tier: " + (", ".join(f"{t} {b}" for t, b in sorted(record.tier_bytes.items())) or "none"))
    moved = {k: b for k, b in record.link_bytes.items() if b}
    out.append("bytes per link: " + (", ".join(f"{k} {moved[k]}" for k in sorted(moved, key=natural_key)) or "none"))
    predicted = {k: b for k, b in record.predicted_link_bytes.items() if b}
    differ = sorted(set(moved) | set(predicted), key=natural_key)
    differ = [k for k in differ if moved.get(k, 0) != predicted.get(k, 0)]
    out.append("bytes per link: the planner's prediction, exactly" if not differ else
               "bytes per link unlike the planner's: " + ", ".join(f"{k} {moved.get(k, 0)} (predicted {predicted.get(k, 0)})"
                                                                   for k in differ))
    return out


def results_json(records: Sequence[ReplayRecord]) -> str:
    return json.dumps({"runs": codec.to_json(list(records))}, indent=2) + "\n"


def links_csv(records: Sequence[ReplayRecord]) -> str:
    """Each mode's bytes per link, measured and predicted."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["mode", "link", "bytes", "predicted_bytes"])
    for r in records:
        for link in sorted(set(r.link_bytes) | set(r.predicted_link_bytes), key=natural_key):
            writer.writerow([r.mode, link, r.link_bytes.get(link, 0), r.predicted_link_bytes.get(link, 0)])
    return text.getvalue()


def write(records: Sequence[ReplayRecord], out: str = "", json_path: str = "") -> list[str]:
    """The replay's files: ``out``/results.json and ``out``/links.csv, and ``json_path``; their paths."""
    files = []
    if out:
        folder = make_output_folder(out)
        for name, text in (("results.json", results_json(records)), ("links.csv", links_csv(records))):
            write_text_atomic(os.path.join(folder, name), text)
            files.append(os.path.join(folder, name))
    if json_path:
        write_text_atomic(json_path, results_json(records))
        files.append(json_path)
    return files
