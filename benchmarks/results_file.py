"""What every benchmark writes: its figures, with the machine they were measured on, as a JSON file."""
from __future__ import annotations

import json
import os
import platform


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform()}


def write(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), **results}, f, indent=2)
    print(f"wrote {path}", flush=True)
