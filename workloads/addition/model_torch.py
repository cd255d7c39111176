"""The same transformer as model_jax, in torch, with the same parameter names and layout.

Parameters are registered flat under their canonical names, so a torch checkpoint's
params.npz is interchangeable with a JAX one. Imported by torch workers and the torch
inference backend only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from addition.data import TaskSpec, loss_mask
from addition.model_jax import LN_EPS, ModelConfig, param_shapes
from torch import nn


class AdditionTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        for name, shape in param_shapes(cfg).items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))

    def load_canonical(self, params: dict[str, np.ndarray]) -> None:
        expected = param_shapes(self.cfg)
        if {k: tuple(v.shape) for k, v in params.items()} != expected:
            raise ValueError("parameters do not match the model config")
        with torch.no_grad():
            for name, value in params.items():
                getattr(self, name).copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))

    def canonical(self) -> dict[str, np.ndarray]:
        return {name: p.detach().cpu().numpy().copy() for name, p in self.named_parameters()}

    def _p(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        bsz, t = tokens.shape
        h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
        x = self._p("tok_emb")[tokens] + self._p("pos_emb")[:t]
        for i in range(cfg.n_layers):
            p = f"l{i}_"
            y = F.layer_norm(x, (cfg.d_model,), self._p(p + "ln1_g"), self._p(p + "ln1_b"), LN_EPS)
            qkv = (y @ self._p(p + "wqkv") + self._p(p + "bqkv")).view(bsz, t, 3, h, dh)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(dh))
            x = x + att.transpose(1, 2).reshape(bsz, t, cfg.d_model) @ self._p(p + "wo") + self._p(p + "bo")
            y = F.layer_norm(x, (cfg.d_model,), self._p(p + "ln2_g"), self._p(p + "ln2_b"), LN_EPS)
            hidden = F.gelu(y @ self._p(p + "w1") + self._p(p + "b1"), approximate="tanh")
            x = x + hidden @ self._p(p + "w2") + self._p(p + "b2")
        x = F.layer_norm(x, (cfg.d_model,), self._p("lnf_g"), self._p("lnf_b"), LN_EPS)
        return x @ self._p("head_w") + self._p("head_b")


def loss_fn(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Same objective as model_jax.loss_fn."""
    logits = model(tokens[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (nll * mask).sum() / (mask.sum() * tokens.shape[0])


def make_optimizer(
    model: nn.Module, config: dict
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW with the warmup + cosine schedule of model_jax.make_optimizer (or SGD)."""
    lr = float(config["learning_rate"])
    if config["optimizer"] == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    steps = int(config["num_steps"])
    warmup = min(int(config["warmup_steps"]), max(steps - 1, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=float(config["weight_decay"]))
    end = float(config["final_lr_fraction"])

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        progress = min((step - warmup) / max(steps - warmup, 1), 1.0)
        return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: dict,
    spec: TaskSpec,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """One optimizer step on a batch of tokens: the masked loss, backward, the gradient norm clipped to
    grad_clip (adamw only), the schedule advanced; returns the (detached) loss of this worker's batch."""
    mask = torch.from_numpy(loss_mask(spec))
    clip = float(config["grad_clip"]) if config["optimizer"] == "adamw" else 0.0

    def train_step(tokens: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, tokens, mask)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        return loss.detach()

    return train_step


def mean_loss(world: int) -> Callable[[torch.Tensor], float]:
    """A worker's loss as the mean over the `world` workers of the process group (all of them call it at
    the same steps), so rank 0 reports the global mean."""

    def fetch(loss: torch.Tensor) -> float:
        if world > 1:
            loss = loss.clone()
            torch.distributed.all_reduce(loss)
            loss /= world
        return float(loss)

    return fetch
