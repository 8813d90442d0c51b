#!/usr/bin/env python3
"""Plots the CSV of `cargo bench --bench credit_study -- --csv FILE` (needs matplotlib).

usage: credit_study_plot.py CSV PNG [TITLE]
Left: p99 per-message latency against RQ depth, one line per message size, credits on (solid)
and off (dashed), log scale. Right: RNR NAKs per run against RQ depth.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, out = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "verbsnet credit study"
    # Fixed-depth rows only (min_depth == depth); adaptive rows are in the table.
    rows = [r for r in csv.DictReader(open(src)) if r.get("min_depth", r["depth"]) == r["depth"]]
    sizes = sorted({int(r["size"]) for r in rows})
    fig, (lat, rnr) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, size in enumerate(sizes):
        color = f"C{i}"
        for credits, style in (("1", "-"), ("0", "--")):
            pts = sorted(
                (int(r["depth"]), float(r["p99_us"]), int(r["rnr"]))
                for r in rows
                if int(r["size"]) == size and r["credits"] == credits
            )
            if not pts:
                continue
            label = f"{size} B, credits {'on' if credits == '1' else 'off'}"
            lat.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], style, color=color,
                     marker="o", label=label)
            rnr.plot([p[0] for p in pts], [p[2] for p in pts], style, color=color, marker="o",
                     label=label)
    for ax in (lat, rnr):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("RQ depth (VERBSNET_RQ_DEPTH)")
        ax.grid(True, which="both", alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("p99 latency per message (ms)")
    rnr.set_yscale("symlog")
    rnr.set_ylim(bottom=0)
    rnr.set_ylabel("RNR NAKs per run")
    rnr.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    main()
