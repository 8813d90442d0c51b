#!/usr/bin/env python3
"""Plot `verbsnet-perf --json` results: bus bandwidth and time against message size.

usage: testharness/plot.py -o OUT.png RUN.json [RUN.json ...] [--label NAME ...] [--title T]
                           [--baseline]

One line per run (one colour per JSON file), out-of-place solid and in-place dashed, log-scaled
size axis, two panels (busbw in GB/s, time in us). --baseline adds each run's `--baseline tcp`
rows as a dotted line. Labels default to the file names; the title defaults to the command the
runs share (e.g. `verbsnet-perf all_reduce --ranks 4 -d float, transport tcp`).

Needs matplotlib (Debian: python3-matplotlib, which testharness/plot-setup.sh installs). When the
python3 on PATH lacks it but the system's /usr/bin/python3 has it, the script re-runs itself there.
"""

import argparse
import json
import os
import sys


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
                and not os.environ.get("VERBSNET_PLOT_REEXEC"):
            os.environ["VERBSNET_PLOT_REEXEC"] = "1"
            os.execv(system, [system] + sys.argv)
        sys.exit("plot.py: matplotlib is not installed: run `bash testharness/plot-setup.sh` "
                 "(apt-get install python3-matplotlib) or `pip install matplotlib`")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def load(path):
    """The last JSON object with `rows` in the file (verbsnet-perf --json prints one line)."""
    found = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("rows"), list):
                found = obj
    if found is None:
        sys.exit(f"plot.py: {path} holds no verbsnet-perf --json result (an object with rows)")
    if not found["rows"]:
        sys.exit(f"plot.py: {path} has no rows")
    return found


def command(run):
    """The command of a run: its `command` field, else rebuilt from the JSON fields."""
    if run.get("command"):
        return run["command"]
    parts = ["verbsnet-perf", str(run.get("collective", "?")), "--ranks", str(run.get("nranks", "?"))]
    if run.get("datatype"):
        parts += ["-d", str(run["datatype"])]
    if run.get("transport"):
        parts += ["--transport", str(run["transport"])]
    return " ".join(parts)


def human(size):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN.json")
    ap.add_argument("-o", "--output", required=True, metavar="OUT.png")
    ap.add_argument("--label", action="append", default=[], help="legend name per run, in order")
    ap.add_argument("--title")
    ap.add_argument("--baseline", action="store_true", help="also draw the --baseline rows")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.runs):
        sys.exit(f"plot.py: {len(args.label)} --label for {len(args.runs)} runs")
    runs = [load(p) for p in args.runs]
    labels = args.label or [os.path.splitext(os.path.basename(p))[0] for p in args.runs]
    cmds = [command(r) for r in runs]
    if args.title:
        title = args.title
    elif len(set(cmds)) == 1:
        title = cmds[0]
    else:
        title = "; ".join(f"{l}: {c}" for l, c in zip(labels, cmds))

    plt = _matplotlib()
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sizes_all = set()
    for i, (run, label) in enumerate(zip(runs, labels)):
        c = colours[i % len(colours)]
        rows = sorted(run["rows"], key=lambda r: r["size"])
        sizes = [r["size"] for r in rows]
        sizes_all.update(sizes)
        for key, style, what in (("out_of_place", "-", "out-of-place"), ("in_place", "--", "in-place")):
            bw = [r[key]["busbw"] for r in rows]
            t = [r[key]["time_us"] for r in rows]
            ax_bw.plot(sizes, bw, style, color=c, marker="o", markersize=3, label=f"{label} {what}")
            ax_t.plot(sizes, t, style, color=c, marker="o", markersize=3, label=f"{label} {what}")
        if args.baseline and all("baseline" in r for r in rows):
            ax_bw.plot(sizes, [r["baseline"]["busbw"] for r in rows], ":", color=c,
                       label=f"{label} baseline ({run.get('baseline', {}).get('kind', '?')})")
            ax_t.plot(sizes, [r["baseline"]["time_us"] for r in rows], ":", color=c,
                      label=f"{label} baseline")
    ticks = sorted(sizes_all)
    if len(ticks) > 10:
        step = (len(ticks) + 9) // 10
        ticks = ticks[::step]
    for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s)"), (ax_t, "time per operation (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(s) for s in ticks], rotation=45)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_bw.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot.py: wrote {args.output} ({len(runs)} run(s), {len(sizes_all)} sizes)")


if __name__ == "__main__":
    main()
