"""Runs on one self-contained HTML page: their settings side by side, the curves, the metric table, the held-out
evaluations, and a few decoded rollouts of each run's first and last logged steps: each sample's teacher context
(the text it was shown, or the retrieved entries the composer read) beside its response, whose tokens are coloured
by the teacher-student gap (blue: the teacher, with its context, likes the sampled token more than the student did;
orange: less), with a key."""
from __future__ import annotations

import base64
import glob
import html
import os
import re

from omegaconf import OmegaConf

from lopd_ray.reporting.figures import run_name
from lopd_ray.reporting.summary import SUMMARY_COLUMNS, WINDOW, last_means, summary_rows
from lopd_ray.utils.metrics import read_rows

ROLLOUTS_SHOWN = 3  # per step shown
SETTINGS_SHOWN = ("algorithm.name", "model.path", "env.name", "context.name", "teacher.weights", "train.total_steps",
                  "train.prompts_per_step", "train.samples_per_prompt", "learner.lr", "train.seed")
# Byte-level BPE spells a space and a newline with these characters.
TOKEN_SPELLING = {"Ġ": " ", "Ċ": "↵\n", "▁": " "}
# Token backgrounds (Okabe and Ito's blue and orange), at most GAP_ALPHA over white: the page's text keeps a contrast
# of at least 4.5:1 on either.
GAP_COLOURS = {"more": (0, 114, 178), "less": (230, 159, 0)}
GAP_ALPHA = 0.6
GAP_SATURATES = 2.0  # nats
TEXT_COLOUR = "#222222"
STYLE = f"""body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:{TEXT_COLOUR}}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}
.tok{{white-space:pre-wrap;font-family:monospace;border-radius:2px;margin-right:1px}}
.rollout{{border:1px solid #ddd;padding:8px;margin:8px 0}}.prompt{{color:#555;white-space:pre-wrap;font-size:12px}}
.context{{background:#f4f4f4;border-left:3px solid #0072B2;padding:4px 8px;margin:4px 0;white-space:pre-wrap;
font-size:12px}}"""


def gap_background(gap: float) -> str:
    strength = min(abs(gap), GAP_SATURATES) / GAP_SATURATES
    r, g, b = GAP_COLOURS["more" if gap > 0 else "less"]
    return f"rgba({r},{g},{b},{GAP_ALPHA * strength:.2f})"


def _token_span(token: str, gap) -> str:
    text = html.escape("".join(TOKEN_SPELLING.get(c, c) for c in token))
    if gap is None:
        return f'<span class="tok">{text}</span>'
    return f'<span class="tok" style="background:{gap_background(gap)}" title="gap {gap:+.3f}">{text}</span>'


GAP_KEY = (f"<p>Each response token's background is the teacher-student gap (the teacher's log-prob of the sampled "
           f"token minus the student's; hover for the value): {_token_span('teacher likes it more', GAP_SATURATES)} "
           f"{_token_span('teacher likes it less', -GAP_SATURATES)}, full colour at {GAP_SATURATES:g} nats, none "
           f"without a teacher score.</p>")


def first_and_last_rollouts(run_dir: str) -> dict[int, list[dict]]:
    """step -> the first records of rollouts/step_N.jsonl, for the first and the last step dumped."""
    dumps = {int(m.group(1)): path for path in glob.glob(os.path.join(run_dir, "rollouts", "step_*.jsonl"))
             if (m := re.fullmatch(r"step_(\d+)\.jsonl", os.path.basename(path)))}
    return {step: read_rows(dumps[step])[:ROLLOUTS_SHOWN] for step in sorted({min(dumps), max(dumps)})} if dumps \
        else {}


def context_html(record: dict) -> str:
    """What the teacher was shown for the sample: its context's text, or the entries the composer read."""
    if record.get("retrieved_texts"):
        entries = "".join(f"<li>{html.escape(text)}</li>" for text in record["retrieved_texts"])
        return f'<div class="context"><b>Teacher\'s latents from the retrieved entries:</b><ol>{entries}</ol></div>'
    if record.get("teacher_context"):
        text = html.escape(record["teacher_context"].strip())
        return f'<div class="context"><b>Teacher\'s context:</b>\n{text}</div>'
    return ""


def rollout_html(record: dict) -> str:
    gaps = record.get("teacher_student_gap") or [None] * len(record["response_tokens"])
    tokens = "".join(_token_span(t, g) for t, g in zip(record["response_tokens"], gaps))
    return (f'<div class="rollout"><b>{html.escape(record["task_id"])}</b>, reward {record["reward"]:.3g}'
            f'<div class="prompt">{html.escape(record["prompt"])}</div>{context_html(record)}<div>{tokens}</div>'
            f'</div>')


def _cell(value) -> str:
    return html.escape(value if isinstance(value, str) else "" if value is None else f"{value:.4g}")


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    cells = lambda row, tag: "".join(f"<{tag}>{_cell(v)}</{tag}>" for v in row)
    return "<table>" + f"<tr>{cells(header, 'th')}</tr>" + "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows) + \
        "</table>"


def settings_table(run_dirs: list[str]) -> str:
    configs = [OmegaConf.load(p) if os.path.isfile(p := os.path.join(d, "config.yaml")) else OmegaConf.create()
               for d in run_dirs]
    return _table(("setting", *map(run_name, run_dirs)),
                  [(k, *(str(OmegaConf.select(c, k, default="")) for c in configs)) for k in SETTINGS_SHOWN])


def metrics_table(run_dirs: list[str]) -> str:
    """One run: each metric's first and last values and window means; several: each run's mean of its last steps."""
    if len(run_dirs) == 1:
        return _table(SUMMARY_COLUMNS, summary_rows(run_dirs[0], ("",)))
    means = [last_means(d) for d in run_dirs]
    names = list(dict.fromkeys(n for m in means for n in m))
    return (f"<p>Each run's mean over its last {WINDOW} steps.</p>" +
            _table(("metric", *map(run_name, run_dirs)), [(n, *(m.get(n) for m in means)) for n in names]))


def write_html(run_dirs: list[str], out_path: str, curves_png: str) -> str:
    with open(curves_png, "rb") as f:
        curves = base64.b64encode(f.read()).decode()
    title = " vs ".join(map(run_name, run_dirs))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>", settings_table(run_dirs),
             f'<h2>Curves</h2><img src="data:image/png;base64,{curves}" style="max-width:100%">',
             "<h2>Metrics</h2>", metrics_table(run_dirs)]
    for run_dir in run_dirs:
        name = html.escape(run_name(run_dir)) + ": " if len(run_dirs) > 1 else ""
        eval_path = os.path.join(run_dir, "eval.jsonl")
        if os.path.isfile(eval_path):
            rows = read_rows(eval_path)
            columns = tuple(rows[0]) if rows else ()
            parts += [f"<h2>{name}held-out evaluations</h2>",
                      _table(columns, [tuple(r.get(c) for c in columns) for r in rows])]
        for step, records in first_and_last_rollouts(run_dir).items():
            parts += [f"<h2>{name}rollouts of step {step}</h2>", GAP_KEY, *map(rollout_html, records)]
    parts.append("</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(parts))
    return out_path
