"""A study's plots: held-out reward of the student alone against generations consumed and against training wall
time, one line per arm (mean over seeds, band: +-1 std; ablations dashed)."""
from __future__ import annotations

import os

from lopd_ray.study.results import arm_curves

AXES = {"episodes": "episodes sampled", "train_seconds": "training wall time (s)"}


def write_plots(out_dir: str, results: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x_key, label in AXES.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for arm, summary in results["arms"].items():
            x, mean, std = arm_curves(results, arm, x_key)
            style = "-" if summary["kind"] == "method" else "--"
            (line,) = ax.plot(x, mean, style, marker="o", markersize=3, label=f"{arm} ({summary['seeds']})")
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out reward, student alone")
        ax.set_title(results["name"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"held_out_vs_{x_key}.png")
        fig.savefig(path + ".tmp.png", dpi=110)
        os.replace(path + ".tmp.png", path)
        plt.close(fig)
        paths.append(path)
    return paths
