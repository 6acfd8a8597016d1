"""A run on one self-contained HTML page: its settings, the curves, the metric table, the held-out evaluations, and
a few decoded rollouts of the first and the last logged steps with each response token colored by the
teacher-student gap (green: the teacher, with its privileged context, likes the sampled token more than the student
did; red: less)."""
from __future__ import annotations

import base64
import glob
import html
import os
import re

from omegaconf import OmegaConf

from lopd_ray.reporting.summary import SUMMARY_COLUMNS, summary_rows
from lopd_ray.utils.metrics import read_rows

ROLLOUTS_SHOWN = 3  # per step shown
SETTINGS_SHOWN = ("algorithm.name", "model.path", "env.name", "context.name", "train.total_steps",
                  "train.prompts_per_step", "train.samples_per_prompt", "learner.lr")
# Byte-level BPE spells a space and a newline with these characters.
TOKEN_SPELLING = {"Ġ": " ", "Ċ": "↵\n", "▁": " "}
STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
.tok{white-space:pre-wrap;font-family:monospace;border-radius:2px;margin-right:1px}
.rollout{border:1px solid #ddd;padding:8px;margin:8px 0}.prompt{color:#666;white-space:pre-wrap;font-size:12px}"""


def _token_span(token: str, gap) -> str:
    text = html.escape("".join(TOKEN_SPELLING.get(c, c) for c in token))
    if gap is None:
        return f'<span class="tok">{text}</span>'
    strength = min(abs(gap), 2.0) / 2.0  # saturates at a gap of 2 nats
    color = f"rgba(0,160,0,{strength:.2f})" if gap > 0 else f"rgba(220,0,0,{strength:.2f})"
    return f'<span class="tok" style="background:{color}" title="gap {gap:+.3f}">{text}</span>'


def first_and_last_rollouts(run_dir: str) -> dict[int, list[dict]]:
    """step -> the first records of rollouts/step_N.jsonl, for the first and the last step dumped."""
    dumps = {int(m.group(1)): path for path in glob.glob(os.path.join(run_dir, "rollouts", "step_*.jsonl"))
             if (m := re.fullmatch(r"step_(\d+)\.jsonl", os.path.basename(path)))}
    return {step: read_rows(dumps[step])[:ROLLOUTS_SHOWN] for step in sorted({min(dumps), max(dumps)})} if dumps \
        else {}


def rollout_html(record: dict) -> str:
    gaps = record.get("teacher_student_gap") or [None] * len(record["response_tokens"])
    tokens = "".join(_token_span(t, g) for t, g in zip(record["response_tokens"], gaps))
    return (f'<div class="rollout"><b>{html.escape(record["task_id"])}</b>, reward {record["reward"]:.3g}'
            f'<div class="prompt">{html.escape(record["prompt"])}</div><div>{tokens}</div></div>')


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    cells = lambda row, tag: "".join(f"<{tag}>{html.escape(v if isinstance(v, str) else f'{v:.4g}')}</{tag}>"
                                     for v in row)
    return "<table>" + f"<tr>{cells(header, 'th')}</tr>" + "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows) + \
        "</table>"


def write_html(run_dir: str, out_path: str, curves_png: str) -> str:
    config = OmegaConf.load(os.path.join(run_dir, "config.yaml"))
    with open(curves_png, "rb") as f:
        curves = base64.b64encode(f.read()).decode()
    name = os.path.basename(os.path.normpath(run_dir))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(name)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(name)}</h1>",
             _table(("setting", "value"), [(k, str(OmegaConf.select(config, k))) for k in SETTINGS_SHOWN]),
             f'<h2>Curves</h2><img src="data:image/png;base64,{curves}" style="max-width:100%">',
             "<h2>Metrics</h2>", _table(SUMMARY_COLUMNS, summary_rows(run_dir, ("",)))]
    eval_path = os.path.join(run_dir, "eval.jsonl")
    if os.path.isfile(eval_path):
        rows = read_rows(eval_path)
        columns = tuple(rows[0]) if rows else ()
        parts += ["<h2>Held-out evaluations (the student alone)</h2>",
                  _table(columns, [tuple(r[c] for c in columns) for r in rows])]
    for step, records in first_and_last_rollouts(run_dir).items():
        parts += [f"<h2>Rollouts of step {step}</h2>",
                  "<p>Hover a token for its teacher-student gap (teacher log-prob minus the student's).</p>",
                  *map(rollout_html, records)]
    parts.append("</body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(parts))
    return out_path
