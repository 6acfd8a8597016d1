"""The supervised fine-tuning loop of the warm-started builtin models: AdamW, a linear warm-up then a constant or
linearly decaying learning rate, gradient clipping, loss on the labelled tokens only; deterministic for a seed."""
from __future__ import annotations

import random
from typing import Callable


def fine_tune(model_dir: str, draw: Callable[[random.Random, int], tuple[list[int], list[int]]], steps: int,
              batch: int, lr: float, seed: int, warmup_steps: int = 0, decay: bool = True) -> None:
    """`draw(rng, row) -> (token ids, labels)` gives the example of a batch's row (labels -100 where no loss is
    taken); the model in `model_dir` is trained for `steps` batches of `batch` rows and saved in place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / max(warmup_steps, 1)) * (1.0 - step / max(steps, 1) if decay else 1.0)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    for _ in range(steps):
        rows = [draw(rng, row) for row in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (ids, targets) in enumerate(rows):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            labels[row, :len(ids)] = torch.tensor(targets)
            attention_mask[row, :len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.save_pretrained(model_dir)
