from __future__ import annotations


class Progress:
    """A progress bar showing step, reward and seconds per step."""

    def __init__(self, start: int, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        line = {"reward": f"{metrics['rollout/reward_mean']:.3f}", "s/step": f"{metrics['timing_s/step']:.1f}"}
        if self.bar is None:
            print(f"step {step} " + " ".join(f"{k}={v}" for k, v in line.items()), flush=True)
            return
        self.bar.set_postfix(line)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:  # closed however the run ends, so that a fault's line starts a line of its own
        self.close()
