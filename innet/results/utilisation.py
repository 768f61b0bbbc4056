"""Link utilisation over time: what every link direction carried, sample by sample, the jobs' bytes and
background traffic's apart (``--background``); written as utilisation.csv and utilisation.png."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from innet.results.files import save_figure, write_text_atomic


@dataclass(frozen=True)
class Utilisation:
    """Cumulative bytes of every link direction (``links``: "a->b", at ``rates_bps``) at each time of ``times``:
    ``job_bytes[k][i]`` and ``background_bytes[k][i]`` sent into the link by ``times[k]``, ``carried_bytes[k][i]``
    (both together) out of it (serialised: the rest still queued)."""

    links: tuple[str, ...]
    rates_bps: tuple[float, ...]
    times: tuple[float, ...]
    job_bytes: tuple[tuple[int, ...], ...]
    background_bytes: tuple[tuple[int, ...], ...]
    carried_bytes: tuple[tuple[int, ...], ...]

    def rows(self) -> list[tuple[float, str, int, int, float]]:
        """Per interval and link direction: (end of the interval, link, the jobs' bytes sent into it then, the
        background's, the link's utilisation over it: the bytes it carried over what it could)."""
        out = []
        for k in range(1, len(self.times)):
            span = self.times[k] - self.times[k - 1]
            for i, link in enumerate(self.links):
                job = self.job_bytes[k][i] - self.job_bytes[k - 1][i]
                bg = self.background_bytes[k][i] - self.background_bytes[k - 1][i]
                carried = self.carried_bytes[k][i] - self.carried_bytes[k - 1][i]
                used = carried * 8 / (self.rates_bps[i] * span) if span > 0 else 0.0
                out.append((self.times[k], link, job, bg, round(used, 4)))
        return out

    def peak(self) -> dict[str, float]:
        """Each link direction's highest utilisation over one interval (busy ones only)."""
        best: dict[str, float] = {}
        for _, link, _, _, used in self.rows():
            best[link] = max(best.get(link, 0.0), used)
        return {k: v for k, v in sorted(best.items(), key=lambda kv: -kv[1]) if v > 0}

    def to_json(self) -> dict[str, Any]:
        """results.json keeps the summary; utilisation.csv has every sample."""
        interval = self.times[1] - self.times[0] if len(self.times) > 1 else 0.0
        return {"samples": len(self.times), "interval_s": interval,
                "peak": {k: v for k, v in list(self.peak().items())[:8]}}


def write_utilisation_csv(path: str, sampled: list[tuple[str, Utilisation]]) -> None:
    """utilisation.csv: every sample of every (mode, utilisation) in ``sampled``."""
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(["mode", "time_s", "link", "job_bytes", "background_bytes", "utilisation"])
    for mode, util in sampled:
        for time, link, job, bg, used in util.rows():
            out.writerow([mode, f"{time:.9f}", link, job, bg, used])
    write_text_atomic(path, text.getvalue())


def plot_utilisation(util: Utilisation, path: str, top: int = 8) -> None:
    """The ``top`` busiest link directions' utilisation against time, the background's share shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    busiest = list(util.peak())[:top]
    fig, ax = plt.subplots(figsize=(8, 4))
    rows = util.rows()
    for link in busiest:
        mine = [(t, used, bg * 8) for t, name, _, bg, used in rows if name == link]
        ax.plot([m[0] * 1e3 for m in mine], [m[1] for m in mine], label=link)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("utilisation")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("busiest link directions (jobs' and background bytes)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
