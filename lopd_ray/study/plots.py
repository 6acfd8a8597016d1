"""A study's plots: held-out reward of the student alone against generations consumed and against training wall
time, one line per arm (mean over seeds, band: +-1 std; ablations dashed with markers), and beside it, where the
arm's runs watched it (eval.teacher), its teacher's (dashed, thin, the arm's colour, labelled "teacher")."""
from __future__ import annotations

import os

from lopd_ray.study.results import TEACHER, arm_curves, watched_teacher

AXES = {"episodes": "episodes sampled", "train_seconds": "training wall time (s)"}


def write_plots(out_dir: str, results: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x_key, label in AXES.items():
        fig, ax = plt.subplots(figsize=(10, 5))
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # one colour per arm in a grid of up to 20
        for arm, summary in results["arms"].items():
            draw_arm(ax, results, arm, summary, x_key)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out reward\n(student alone; teacher: with its context)")
        ax.set_title(results["name"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        path = os.path.join(out_dir, f"held_out_vs_{x_key}.png")
        fig.savefig(path + ".tmp.png", dpi=110)
        os.replace(path + ".tmp.png", path)
        plt.close(fig)
        paths.append(path)
    return paths


def draw_arm(ax, results: dict, arm: str, summary: dict, x_key: str) -> None:
    """The arm's student curve with its band, and its teacher's where its runs watched it."""
    x, mean, std = arm_curves(results, arm, x_key)
    style = "-" if summary["kind"] == "method" else "--"
    (line,) = ax.plot(x, mean, style, marker="o", markersize=3, label=f"{arm} ({summary['seeds']})")
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    if watched_teacher(results, arm):
        x, mean, _ = arm_curves(results, arm, x_key, TEACHER)
        ax.plot(x, mean, "--", linewidth=1.0, color=line.get_color(), label=f"{arm} teacher")
