"""A run's curves as PNG files (matplotlib): one file per panel that the run logged anything for, and
`curves.png` with every panel side by side."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lopd_ray.utils.metrics import read_metrics, select_metrics


@dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[str, ...]  # a name ending in "/" takes every metric under that prefix
    log_scale: bool = False


PANELS = {
    "reward": Panel("reward", ("rollout/reward_mean", "eval/reward_mean", "eval/teacher_reward_mean")),
    "kl": Panel("KL of the student to its teacher", ("lopd/kl", "distill/student_kl", "actor/kl"), log_scale=True),
    "beta": Panel("privileged margin: dual variable and violation", ("lopd/beta", "lopd/margin_violation")),
    "timing": Panel("seconds per step, by stage", ("timing_s/",)),
}


# A metric drawn dashed in the colour of the one it is read against (listed before it in its panel), and its label.
COMPANIONS = {"eval/teacher_reward_mean": ("eval/reward_mean", "teacher")}


def panel_series(rows: list[dict], panel: Panel) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (steps, values) for the panel's metrics the run logged."""
    return {n: ([r["step"] for r in rows if n in r], [r[n] for r in rows if n in r])
            for n in select_metrics(rows, panel.metrics)}


def _draw(ax, panel: Panel, series: dict) -> None:
    colours = {}
    for name, (steps, values) in series.items():
        partner, label = COMPANIONS.get(name, (None, name))
        style = {"linestyle": "--", "color": colours.get(partner)} if partner else {}
        (line,) = ax.plot(steps, values, marker="o", markersize=2, linewidth=1.2, label=label, **style)
        colours[name] = line.get_color()
    if panel.log_scale and all(v > 0 for _, values in series.values() for v in values):
        ax.set_yscale("log")
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def write_pngs(run_dir: str, out_dir: str) -> list[str]:
    """The PNG paths written (the overview first)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    drawn = {key: (panel, s) for key, panel in PANELS.items() if (s := panel_series(rows, panel))}
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.basename(os.path.normpath(run_dir))
    cols = min(2, len(drawn))
    rows_ = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(6 * cols, 3.8 * rows_), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, drawn.values()):
        _draw(ax, panel, series)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.suptitle(name, fontsize=11)
    fig.tight_layout()
    paths = [os.path.join(out_dir, "curves.png")]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    for key, (panel, series) in drawn.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        _draw(ax, panel, series)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, f"{key}.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
