"""Draw the benchmark results as pictures: ``make bench-plot``.

Reads the newest ``bench/results/*.json`` (or the file given) and writes, with matplotlib's
Agg backend (no display needed):

- ``docs/img/bench-ratio.png``: convoy's rate over TensorFlow's per workload, on a log scale,
  the whiskers spanning the ratio of the two ranges (convoy's lowest over TensorFlow's
  highest, to convoy's highest over TensorFlow's lowest) where ranges were measured;
- ``docs/img/bench-workers.png``: the service's throughput over its number of workers, when
  the results hold ``workers`` series (``{"workload", "unit", "points": [{"workers",
  "convoy", "tensorflow"}]}``); without them it says so and draws nothing.

Usage: ``python bench/plot.py [RESULTS.json] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OUT = BENCH.parent / "docs" / "img"
#: Rows that are not rates (a ratio, a memory growth): no bar of convoy over TensorFlow.
NOT_RATES = {"ratio", "MB"}


def newest() -> Path:
    found = sorted(RESULTS.glob("*.json"))
    if not found:
        raise SystemExit(f"no results in {RESULTS}: run make bench first")
    return found[-1]


def _bounds(side: dict) -> tuple[float, float]:
    median = side["median"]
    return side.get("low") or median, side.get("high") or median


def ratio_chart(results: dict, path: Path) -> int:
    """A bar per workload with both sides; returns the number of bars."""
    rows = [r for r in results["results"]
            if r.get("tensorflow") and r["unit"] not in NOT_RATES]
    if not rows:
        return 0
    names = [r["workload"] for r in rows]
    ratios = [r["convoy"]["median"] / r["tensorflow"]["median"] for r in rows]
    below, above = [], []
    for r, ratio in zip(rows, ratios):
        ours_low, ours_high = _bounds(r["convoy"])
        theirs_low, theirs_high = _bounds(r["tensorflow"])
        below.append(max(ratio - ours_low / theirs_high, 0.0))
        above.append(max(ours_high / theirs_low - ratio, 0.0))
    figure, axes = plt.subplots(figsize=(9, 0.36 * len(rows) + 1.6), dpi=110)
    positions = range(len(rows))
    colours = ["#2f7d4f" if ratio >= 1 else "#b5482f" for ratio in ratios]
    axes.barh(positions, ratios, xerr=[below, above], color=colours, capsize=3,
              error_kw={"elinewidth": 1, "ecolor": "#333333"})
    axes.set_xscale("log")
    axes.axvline(1.0, color="#333333", linewidth=0.8)
    axes.set_yticks(list(positions), names, fontsize=8)
    axes.invert_yaxis()
    for y, ratio, up in zip(positions, ratios, above):
        label = f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2f}x"
        axes.annotate(label, (ratio + up, y), xytext=(5, -3), textcoords="offset points",
                      fontsize=7)
    axes.set_xlabel("convoy / TensorFlow (log scale; 1 = as fast)")
    axes.set_title(f"convoy / {results.get('tensorflow', 'TensorFlow')}, "
                   f"{results.get('date', '')}, {results['machine'].get('cpus', '')} "
                   "(medians; whiskers: the ranges' ratio)", fontsize=9)
    axes.grid(axis="x", which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return len(rows)


def workers_chart(results: dict, path: Path) -> int:
    """Throughput over worker count per workload series; returns the number of series."""
    series = results.get("workers") or []
    if not series:
        return 0
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    for one in series:
        points = sorted(one["points"], key=lambda p: p["workers"])
        workers = [p["workers"] for p in points]
        for side, style in (("convoy", "o-"), ("tensorflow", "s--")):
            if all(p.get(side) for p in points):
                medians = [p[side]["median"] for p in points]
                low = [m - _bounds(p[side])[0] for m, p in zip(medians, points)]
                high = [_bounds(p[side])[1] - m for m, p in zip(medians, points)]
                axes.errorbar(workers, medians, yerr=[low, high], fmt=style, capsize=3,
                              label=f"{one['workload']} ({side})")
        axes.set_ylabel(series[0]["unit"])
    axes.set_xlabel("data service workers")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return len(series)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", nargs="?", type=Path, help="a results file (default: newest)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the pictures go")
    args = parser.parse_args()
    source = args.results or newest()
    results = json.loads(source.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    bars = ratio_chart(results, args.out / "bench-ratio.png")
    if bars:
        print(f"{args.out / 'bench-ratio.png'}: {bars} workloads, from {source.name}")
    else:
        print(f"{source.name} has no workload measured on both sides (make bench-tf first): "
              "bench-ratio.png not drawn")
    if workers_chart(results, args.out / "bench-workers.png"):
        print(f"{args.out / 'bench-workers.png'}: throughput over workers")
    else:
        print(f"{source.name} holds no throughput-over-workers series: "
              "bench-workers.png not drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
