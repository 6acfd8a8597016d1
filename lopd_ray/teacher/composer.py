"""The composer phi = (encoder LoRA psi, compressor chi): retrieved experience entries -> K latents each.

The encoder is the frozen teacher backbone with a LoRA adapter named "composer" that is active only while encoding;
the teacher's own forward runs inside `Composer.teacher_model()`, with the adapter disabled (METHOD.md 2.2).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lopd_ray.config import ComposerConfig

ADAPTER_NAME = "composer"
RESAMPLER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Attention(nn.Module):
    """Multi-head attention of the latents over [inputs; latents]; `kv_mask_NS` True where a key may be read."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, q_NKd: torch.Tensor, kv_NSd: torch.Tensor, kv_mask_NS: torch.Tensor) -> torch.Tensor:
        N, K, d = q_NKd.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(N, t.shape[1], self.num_heads, d // self.num_heads).transpose(1, 2)

        k_NSd, v_NSd = self.to_kv(kv_NSd).chunk(2, dim=-1)
        out_NhKe = F.scaled_dot_product_attention(heads(self.to_q(q_NKd)), heads(k_NSd), heads(v_NSd),
                                                  attn_mask=kv_mask_NS[:, None, None, :])
        return self.to_out(out_NhKe.transpose(1, 2).reshape(N, K, d))


class PerceiverResampler(nn.Module):
    """K learned queries read variable-length hidden states through ONE attention + feed-forward pair whose weights
    are shared across the `depth` applications."""

    def __init__(self, d_model: int, num_queries: int, num_heads: int, depth: int):
        super().__init__()
        self.depth = depth
        self.queries_Kd = nn.Parameter(torch.randn(num_queries, d_model) / math.sqrt(d_model))
        self.linear_in = nn.Linear(d_model, d_model)
        self.norm_x = nn.LayerNorm(d_model)
        self.norm_lat = nn.LayerNorm(d_model)
        self.attn = _Attention(d_model, num_heads)
        self.ff = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                                nn.Linear(4 * d_model, d_model, bias=False))
        self.linear_out = nn.Linear(d_model, d_model)
        self.norm_out = nn.LayerNorm(d_model)

    def forward(self, H_NTd: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
        """H_NTd: hidden states, right-padded; mask_NT: 1 at real positions. Returns [N, K, d]."""
        N = H_NTd.shape[0]
        x_NTd = self.norm_x(self.linear_in(H_NTd))  # the inputs do not change across depth: normalize them once
        lat_NKd = self.queries_Kd.unsqueeze(0).expand(N, -1, -1)
        kv_mask_NS = torch.cat([mask_NT.bool(), mask_NT.new_ones(N, lat_NKd.shape[1], dtype=torch.bool)], dim=1)
        for _ in range(self.depth):
            lat_norm_NKd = self.norm_lat(lat_NKd)
            kv_NSd = torch.cat([x_NTd, lat_norm_NKd], dim=1)
            lat_NKd = self.attn(lat_norm_NKd, kv_NSd, kv_mask_NS) + lat_NKd
            lat_NKd = self.ff(lat_NKd) + lat_NKd
        return self.norm_out(self.linear_out(lat_NKd))


def token_embedding_rms(model: nn.Module, sample: int = 4096) -> float:
    """The RMS of the model's input token embeddings over `sample` ids spread across the vocabulary (through the
    embedding module, so that a partitioned model gathers its rows)."""
    embedding = model.get_input_embeddings()
    device = next(model.parameters()).device
    with torch.no_grad():
        ids = torch.linspace(0, embedding.num_embeddings - 1, min(sample, embedding.num_embeddings), device=device)
        return float(embedding(ids.long()).float().pow(2).mean().sqrt())


class Composer(nn.Module):
    """Wraps `backbone` (an HF causal LM, modified in place: LoRA layers are injected into it) and the resampler.

    phi = the LoRA parameters + the resampler's; the backbone's base weights are frozen."""

    def __init__(self, backbone: nn.Module, cfg: ComposerConfig):
        super().__init__()
        from peft import LoraConfig, get_peft_model
        from peft.tuners.tuners_utils import BaseTunerLayer

        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
        self.lm = get_peft_model(backbone, lora, adapter_name=ADAPTER_NAME)
        for name, param in self.lm.named_parameters():
            param.requires_grad_(ADAPTER_NAME in name and "lora_" in name)
        self.lora_layers = [m for m in self.lm.modules() if isinstance(m, BaseTunerLayer)]
        config = backbone.config
        # composer.dtype, whatever the backbone's: the resampler's storage and AdamW step; latents are cast at
        # injection
        self.resampler = PerceiverResampler(config.hidden_size, cfg.num_queries, config.num_attention_heads,
                                            cfg.depth).to(next(backbone.parameters()).device,
                                                          RESAMPLER_DTYPES[cfg.dtype])
        if cfg.output_scale == "token_embeddings":
            with torch.no_grad():
                self.resampler.norm_out.weight.fill_(token_embedding_rms(backbone))
        self.max_entry_tokens = cfg.max_entry_tokens
        self.hidden_size = config.hidden_size

    @contextmanager
    def teacher_model(self) -> Iterator[nn.Module]:
        """The plain HF backbone with the composer's LoRA disabled, for the teacher's forward (layer by layer:
        PeftModel.disable_adapter first walks every module for its status, at every forward)."""
        for layer in self.lora_layers:
            layer.enable_adapters(False)
        try:
            yield self.lm.get_base_model()
        finally:
            for layer in self.lora_layers:
                layer.enable_adapters(True)

    def encode(self, entry_ids: list[list[int]]) -> torch.Tensor:
        """Token ids of N entries (each cut to `max_entry_tokens`) -> latents [N, K, d], LoRA active."""
        device = self.resampler.queries_Kd.device
        if not entry_ids:
            return self.resampler.queries_Kd.new_zeros(0, *self.resampler.queries_Kd.shape)
        entry_ids = [ids[:self.max_entry_tokens] for ids in entry_ids]
        if min(map(len, entry_ids)) == 0:
            raise ValueError("an experience entry has no tokens")
        T = max(map(len, entry_ids))
        ids_NT = torch.zeros(len(entry_ids), T, dtype=torch.long, device=device)
        mask_NT = torch.zeros(len(entry_ids), T, dtype=torch.long, device=device)
        for i, ids in enumerate(entry_ids):
            ids_NT[i, :len(ids)] = torch.tensor(ids, device=device)
            mask_NT[i, :len(ids)] = 1
        decoder = self.lm.get_base_model().get_decoder()  # LoRA lives in its layers; skips the [N, T, V] head
        H_NTd = decoder(input_ids=ids_NT, attention_mask=mask_NT).last_hidden_state
        return self.resampler(H_NTd.to(self.resampler.queries_Kd.dtype), mask_NT)

    def latents(self, entries_per_task: list[list[list[int]]]) -> list[torch.Tensor]:
        """Per task, its J entries' latents concatenated: [J_i * K, d] ([0, d] for a task with no entries)."""
        flat = [ids for entries in entries_per_task for ids in entries]
        lat_NKd = self.encode(flat)
        out, start = [], 0
        for entries in entries_per_task:
            out.append(lat_NKd[start:start + len(entries)].reshape(-1, self.hidden_size))
            start += len(entries)
        return out

    def named_phi_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, param in self.lm.named_parameters():
            if ADAPTER_NAME in name and "lora_" in name:
                yield f"lora.{name}", param
        for name, param in self.resampler.named_parameters():
            yield f"resampler.{name}", param

    def phi_parameters(self) -> list[nn.Parameter]:
        return [param for _, param in self.named_phi_parameters()]

    def phi_state_dict(self) -> dict[str, torch.Tensor]:
        """phi only (no backbone weights), detached CPU copies: what a checkpoint stores."""
        return {name: param.detach().cpu().clone() for name, param in self.named_phi_parameters()}

    def load_phi_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_phi_parameters())
        if set(state) != set(params):
            missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise KeyError(f"phi state dict does not match this composer: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]} (was it saved with other lora_targets or num_queries?)")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(state[name])
