"""A study's plots: held-out reward of the student alone against generations consumed and against training wall
time, one line per arm (mean over seeds, band: +-1 std; ablations dashed; a marker of its own per arm, so that
lines lying on each other stay told apart), and beside it, where the arm's runs watched it (eval.teacher), its
teacher's (dashed, thin, the arm's colour, labelled "teacher"). The title names the model and the budget."""
from __future__ import annotations

import os

from lopd_ray.study.results import TEACHER, arm_curves, watched_teacher

AXES = {"episodes": "episodes sampled", "train_seconds": "training wall time (s)"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def plot_title(results: dict) -> str:
    """The study's name, the model its runs trained (as their settings name it) and their shared budget."""
    overrides = [o for run in results["runs"].values() for o in run.get("overrides", [])]
    models = sorted({o.split("=", 1)[1] for o in overrides if o.startswith("model.path=")})
    budget = results.get("budget", {})
    parts = [", ".join(models) if models else "",
             f"{budget['episodes']} episodes, {budget['max_new_tokens']} new tokens per turn" if budget else "",
             f"seeds {', '.join(sorted({str(run['seed']) for run in results['runs'].values() if 'seed' in run}))}"
             if any("seed" in run for run in results["runs"].values()) else ""]
    return results["name"] + "".join(f"; {part}" for part in parts if part)


def write_plots(out_dir: str, results: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for x_key, label in AXES.items():
        entries = sum(1 + watched_teacher(results, arm) for arm in results["arms"])  # the legend's lines
        fig, ax = plt.subplots(figsize=(10, max(5.0, 0.19 * entries + 1.0)))
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # one colour per arm in a grid of up to 20
        for i, (arm, summary) in enumerate(results["arms"].items()):
            draw_arm(ax, results, arm, summary, x_key, MARKERS[i % len(MARKERS)])
        ax.set_xlabel(label)
        ax.set_ylabel("held-out reward\n(student alone; teacher: with its context)")
        ax.set_title(plot_title(results), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        path = os.path.join(out_dir, f"held_out_vs_{x_key}.png")
        fig.savefig(path + ".tmp.png", dpi=110)
        os.replace(path + ".tmp.png", path)
        plt.close(fig)
        paths.append(path)
    return paths


def draw_arm(ax, results: dict, arm: str, summary: dict, x_key: str, marker: str = "o") -> None:
    """The arm's student curve with its band, and its teacher's where its runs watched it."""
    x, mean, std = arm_curves(results, arm, x_key)
    style = "-" if summary["kind"] == "method" else "--"
    (line,) = ax.plot(x, mean, style, marker=marker, markersize=4, markerfacecolor="none",
                      label=f"{arm} ({summary['seeds']})")
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    if watched_teacher(results, arm):
        x, mean, _ = arm_curves(results, arm, x_key, TEACHER)
        ax.plot(x, mean, "--", linewidth=1.0, color=line.get_color(), label=f"{arm} teacher")
