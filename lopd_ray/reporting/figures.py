"""Runs' curves as PNG files (matplotlib): one file per panel that a run logged anything for, and `curves.png` with
every panel side by side. Several runs share each panel, a colour per run (a line style per metric)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lopd_ray.utils.metrics import read_metrics, select_metrics

# Okabe and Ito's palette: its colours stay apart for the colour-blind.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442")
LINE_STYLES = ("-", "--", ":", "-.")
# A log axis only where the values span this factor or more: a narrow range reads better on a linear one.
LOG_SPAN = 100.0


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    metrics: tuple[str, ...]  # a name ending in "/" takes every metric under that prefix
    log_scale: bool = False
    # Metrics that sum up the others: with one run, the others are stacked (a part missing at a step is 0 there)
    # under the first of these; with several runs, each run's first total alone is drawn.
    totals: tuple[str, ...] = ()


PANELS = {
    "reward": Panel("reward", "mean reward per episode",
                    ("rollout/reward_mean", "eval/reward_mean", "eval/teacher_reward_mean")),
    "kl": Panel("KL of the student to its teacher", "KL (nats per token)",
                ("lopd/kl", "distill/student_kl", "actor/kl"), log_scale=True),
    "beta": Panel("privileged margin: dual variable and violation", "beta; violation (nats)",
                  ("lopd/beta", "lopd/margin_violation")),
    "timing": Panel("seconds per step, by stage", "seconds", ("timing_s/",), totals=("timing_s/step", "timing_s/wall")),
}


# A metric drawn dashed in the colour of the one it is read against (listed before it in its panel), and its label.
COMPANIONS = {"eval/teacher_reward_mean": ("eval/reward_mean", "teacher")}

Series = dict[str, tuple[list[int], list[float]]]


def panel_series(rows: list[dict], panel: Panel) -> Series:
    """metric -> (steps, values) for the panel's metrics the run logged."""
    return {n: ([r["step"] for r in rows if n in r], [r[n] for r in rows if n in r])
            for n in select_metrics(rows, panel.metrics)}


def _stack(ax, panel: Panel, series: Series) -> None:
    """The parts stacked, each 0 at a step it was not logged, under the first total the run logged."""
    total = next(t for t in panel.totals if t in series)
    steps = series[total][0]
    parts = {n: dict(zip(*s)) for n, s in series.items() if n not in panel.totals}
    ax.stackplot(steps, *([part.get(step, 0.0) for step in steps] for part in parts.values()), labels=list(parts),
                 colors=[COLOURS[i % len(COLOURS)] for i in range(len(parts))], alpha=0.85)
    ax.plot(steps, series[total][1], color="black", linewidth=1.4, label=total)


def _draw_one(ax, panel: Panel, series: Series) -> None:
    """One run: a colour per metric (a companion dashed in its partner's), or the parts stacked under a total."""
    if any(t in series for t in panel.totals):
        _stack(ax, panel, series)
        return
    colours: dict[str, str] = {}
    for name, (steps, values) in series.items():
        partner, label = COMPANIONS.get(name, (None, name))
        colour = colours.get(partner) or COLOURS[len(colours) % len(COLOURS)]
        ax.plot(steps, values, marker="o", markersize=2, linewidth=1.2, label=label, color=colour,
                linestyle="--" if partner else "-")
        colours[name] = colour


def _draw(ax, panel: Panel, runs: dict[str, Series]) -> None:
    """`runs`: run name -> its series of the panel."""
    if len(runs) == 1:
        _draw_one(ax, panel, next(iter(runs.values())))
    else:
        for i, (run, series) in enumerate(runs.items()):
            colour = COLOURS[i % len(COLOURS)]
            total = next((t for t in panel.totals if t in series), None)
            for name, (steps, values) in series.items():
                if total is not None and name != total:
                    continue
                style = LINE_STYLES[panel_position(panel, name) % len(LINE_STYLES)]
                ax.plot(steps, values, marker="o", markersize=2, linewidth=1.2, color=colour, linestyle=style,
                        label=f"{run}: {COMPANIONS.get(name, (None, name))[1]}")
    values = [v for series in runs.values() for _, vs in series.values() for v in vs]
    if panel.log_scale and values and min(values) > 0 and max(values) / min(values) >= LOG_SPAN:
        ax.set_yscale("log")
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def panel_position(panel: Panel, name: str) -> int:
    """Which of the panel's metric names (or prefixes) `name` is."""
    return next(i for i, m in enumerate(panel.metrics) if (name.startswith(m) if m.endswith("/") else name == m))


def run_name(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(run_dir))


def write_pngs(run_dirs: list[str], out_dir: str) -> list[str]:
    """The PNG paths written (the overview first)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {run_name(d): read_metrics(d) for d in run_dirs}
    drawn = {}
    for key, panel in PANELS.items():
        runs = {name: s for name, r in rows.items() if (s := panel_series(r, panel))}
        if runs:
            drawn[key] = (panel, runs)
    os.makedirs(out_dir, exist_ok=True)
    cols = min(2, len(drawn))
    rows_ = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(7.5 * cols, 3.8 * rows_), squeeze=False)
    for ax, (panel, runs) in zip(axes.flat, drawn.values()):
        _draw(ax, panel, runs)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.suptitle(" vs ".join(rows), fontsize=11)
    fig.tight_layout()
    paths = [os.path.join(out_dir, "curves.png")]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    for key, (panel, runs) in drawn.items():
        fig, ax = plt.subplots(figsize=(7.5, 4))
        _draw(ax, panel, runs)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, f"{key}.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
