#!/usr/bin/python3
"""Learning curves and a per-agent summary of an agentrt run directory.

    scripts/plot_curves.py RUN_DIR [--metric episode_return_mean]

Reads RUN_DIR/metrics.jsonl (one line per Runtime::Report: {"run_time", "time",
"agent", "rank", "step", "metrics": {...}}; the keys and their types are
plan/records.schema.json's "metrics_record") and RUN_DIR/status.json, writes one
SVG per agent, RUN_DIR/plots/<agent>.svg (the metric against env steps; a
restart from a checkpoint shows as a marker where the curve resumes), prints a
summary table and the paths of the plots. With matplotlib (Debian's
python3-matplotlib) it also draws every agent on one figure, RUN_DIR/plots/curves.png
(axes, legend, restarts marked) and, for a run with a league, the members' Elo
ratings over the run from RUN_DIR/league/state.json, RUN_DIR/plots/league.png;
without it those figures are skipped, the rest needs only the standard library.
Exit status 0, or 1 when there is nothing to plot.
"""
import argparse
import html
import json
import math
import os
import sys


def read_metrics(path):
    """agent -> list of (run_time, step, metrics) from rank 0, in file order."""
    series = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"plot_curves: {path}:{number}: skipped, not JSON ({e})", file=sys.stderr)
                continue
            if rec.get("rank", 0) != 0 or "agent" not in rec:
                continue
            series.setdefault(rec["agent"], []).append(
                (rec.get("run_time", 0.0), rec.get("step", 0), rec.get("metrics", {})))
    return series


def nice_ticks(lo, hi, count=5):
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 0.5:
        ticks.append(t)
        t += step
    return ticks


def fmt_num(v):
    if abs(v) >= 10000:
        return f"{v / 1000:.0f}k"
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k"
    if v == int(v):
        return str(int(v))
    return f"{v:.2f}"


def svg_curve(agent, points, resumes, metric, extra_lines):
    """points: [(step, value)], resumes: [step] where a restart resumed."""
    width, height = 640, 400
    left, right, top, bottom = 70, 20, 50, 60
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_ticks = nice_ticks(0, max(xs) if xs else 1)
    y_ticks = nice_ticks(min(ys + [0.0]), max(ys + [0.0]))
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]

    def sx(x):
        return left + (x - x0) / ((x1 - x0) or 1) * (width - left - right)

    def sy(y):
        return height - bottom - (y - y0) / ((y1 - y0) or 1) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="16">'
           f'{html.escape(agent)}: {html.escape(metric)}</text>']
    for t in x_ticks:
        out.append(f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{height - bottom}" stroke="#eee"/>')
        out.append(f'<text x="{sx(t):.1f}" y="{height - bottom + 18}" text-anchor="middle">{fmt_num(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{width - right}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 8}" y="{sy(t) + 4:.1f}" text-anchor="end">{fmt_num(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               f'fill="none" stroke="#444"/>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 18}" text-anchor="middle">env steps</text>')
    out.append(f'<text x="18" y="{(top + height - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(top + height - bottom) / 2})">{html.escape(metric)}</text>')
    # One polyline per uninterrupted stretch; a restart starts a new one.
    segments, current = [], []
    for i, (x, y) in enumerate(points):
        if current and x < current[-1][0]:
            segments.append(current)
            current = []
        current.append((x, y))
    if current:
        segments.append(current)
    for seg in segments:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
        out.append(f'<polyline points="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for step in resumes:
        out.append(f'<line x1="{sx(step):.1f}" y1="{top}" x2="{sx(step):.1f}" y2="{height - bottom}" '
                   f'stroke="#d62728" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{sx(step) + 4:.1f}" y="{top + 14}" fill="#d62728">resumed at {fmt_num(step)}</text>')
    for i, line in enumerate(extra_lines):
        out.append(f'<text x="{left + 8}" y="{top + 16 + 15 * (i + (1 if resumes else 0))}" '
                   f'fill="#333">{html.escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def pyplot():
    """matplotlib.pyplot drawing to files, or None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def finish_figure(plt, fig, ax, path):
    """Grid, legend, layout, then `path` written whole (a temporary file renamed)."""
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path + ".tmp.png")
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def figure_all(path, curves, metric):
    """Every agent's curve on one matplotlib figure; False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for agent, points, resumes in curves:
        line, = ax.plot([p[0] for p in points], [p[1] for p in points], label=agent, linewidth=1.5)
        for step in resumes:
            ax.axvline(step, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} (dotted: a restart resumed from a checkpoint)")
    finish_figure(plt, fig, ax, path)
    return True


def figure_league(path, history, roles):
    """The league's ratings after each applied result; False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    agents = sorted({a for h in history for a in h["ratings"]})
    for agent in agents:
        points = [(h["results"], h["ratings"][agent]) for h in history if agent in h["ratings"]]
        label = f"{agent} ({roles.get(agent, '?')})"
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, linewidth=1.5,
                linestyle="--" if roles.get(agent) == "anchor" else "-")
    ax.set_xlabel("match results applied")
    ax.set_ylabel("Elo rating")
    ax.set_title("league ratings (dashed: an anchor, which never trains)")
    finish_figure(plt, fig, ax, path)
    return True


def plot_league(run_dir, plots_dir):
    """RUN_DIR/plots/league.png from the league's committed state, when the run has one."""
    try:
        with open(os.path.join(run_dir, "league", "state.json")) as f:
            state = json.load(f)
        with open(os.path.join(run_dir, "plan.json")) as f:
            roles = {m["agent"]: m["role"] for m in json.load(f).get("league", {}).get("members", [])}
    except (OSError, ValueError, KeyError):
        return
    path = os.path.join(plots_dir, "league.png")
    if state.get("history") and figure_league(path, state["history"], roles):
        print(f"league ratings: {os.path.abspath(path)}")


def main():
    parser = argparse.ArgumentParser(description="learning curves (SVG) and a summary of an agentrt run")
    parser.add_argument("run_dir")
    parser.add_argument("--metric", default="episode_return_mean")
    args = parser.parse_args()
    metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        print(f"plot_curves: {metrics_path} does not exist (is {args.run_dir} a run directory?)", file=sys.stderr)
        return 1
    series = read_metrics(metrics_path)
    status = {}
    try:
        with open(os.path.join(args.run_dir, "status.json")) as f:
            status = {a["name"]: a for a in json.load(f).get("agents", [])}
    except (OSError, ValueError, KeyError):
        pass
    agents = list(status) + [a for a in series if a not in status]
    plots_dir = os.path.join(args.run_dir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    rows, written, curves = [], [], []
    for agent in agents:
        recs = series.get(agent, [])
        points = [(step, m[args.metric]) for _, step, m in recs
                  if isinstance(m.get(args.metric), (int, float)) and "eval_capture_rate" not in m]
        resumes = [points[i][0] for i in range(1, len(points)) if points[i][0] < points[i - 1][0]]
        evals = [m for _, _, m in recs if "eval_capture_rate" in m]
        st = status.get(agent, {})
        extra = []
        if evals:
            e = evals[-1]
            extra.append(f"captures/episode: trained {e['eval_capture_rate']:.3f}, "
                         f"random {e['eval_random_capture_rate']:.3f} (x{e['eval_capture_ratio']:.1f})")
        if points:
            path = os.path.join(plots_dir, agent.replace("/", "_") + ".svg")
            with open(path + ".tmp", "w") as f:
                f.write(svg_curve(agent, points, resumes, args.metric, extra))
            os.replace(path + ".tmp", path)
            written.append(path)
            curves.append((agent, points, resumes))
        n = max(1, len(points) // 10)
        first = sum(v for _, v in points[:n]) / n if points else float("nan")
        last = sum(v for _, v in points[-n:]) / n if points else float("nan")
        rows.append((agent, st.get("state", "?"), str(st.get("restarts", "?")),
                     str(points[-1][0] if points else st.get("step", "?")),
                     f"{first:.3f}", f"{last:.3f}",
                     f"x{evals[-1]['eval_capture_ratio']:.1f}" if evals else "-"))
    header = ("agent", "state", "restarts", "env steps", f"{args.metric} first", "last", "captures vs random")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for path in written:
        print(f"learning curve: {os.path.abspath(path)}")
    together = os.path.join(plots_dir, "curves.png")
    if curves and figure_all(together, curves, args.metric):
        print(f"all agents: {os.path.abspath(together)}")
    elif curves:
        print("plot_curves: no matplotlib (apt-get install python3-matplotlib): no figure of all agents")
    plot_league(args.run_dir, plots_dir)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
