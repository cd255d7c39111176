"""A small pre-LayerNorm causal transformer LM, written once for numpy and jax.numpy.

Parameters are a flat dict of float32 numpy arrays (the canonical layout every checkpoint
stores, whichever framework trained it). `forward` takes the array module as an argument,
so serving runs it with numpy without importing jax, and training jits it with jax.numpy.
Nothing here imports jax at module level: drivers import this module cheaply.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from addition.data import VOCAB_SIZE, TaskSpec

Params = dict[str, Any]
LN_EPS = 1e-5


@dataclass(frozen=True)
class ModelConfig:
    seq_len: int = TaskSpec().seq_len
    vocab_size: int = VOCAB_SIZE
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 1
    d_ff: int = 256

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must divide by n_heads ({self.n_heads})")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return cls(**{k: int(data[k]) for k in cls.__dataclass_fields__ if k in data})


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f = cfg.d_model, cfg.d_ff
    shapes: dict[str, tuple[int, ...]] = {"tok_emb": (cfg.vocab_size, d), "pos_emb": (cfg.seq_len, d)}
    for i in range(cfg.n_layers):
        p = f"l{i}_"
        shapes |= {
            p + "ln1_g": (d,), p + "ln1_b": (d,),
            p + "wqkv": (d, 3 * d), p + "bqkv": (3 * d,),
            p + "wo": (d, d), p + "bo": (d,),
            p + "ln2_g": (d,), p + "ln2_b": (d,),
            p + "w1": (d, f), p + "b1": (f,),
            p + "w2": (f, d), p + "b2": (d,),
        }  # fmt: skip
    shapes |= {"lnf_g": (d,), "lnf_b": (d,), "head_w": (d, cfg.vocab_size), "head_b": (cfg.vocab_size,)}
    return shapes


def init_params(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2 style init in numpy (JAX-side init costs seconds per worker under contention)."""
    rng = np.random.default_rng(seed)
    resid_scale = 1.0 / np.sqrt(2 * cfg.n_layers)
    params: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(cfg).items():
        short = name.split("_", 1)[1] if name.startswith("l") and name[1].isdigit() else name
        if short.endswith("_g"):
            value = np.ones(shape)
        elif short.startswith("b") or short.endswith("_b"):
            value = np.zeros(shape)
        else:
            value = rng.normal(0.0, 0.02, shape) * (resid_scale if short in ("wo", "w2") else 1.0)
        params[name] = value.astype(np.float32)
    return params


def _layer_norm(x: Any, g: Any, b: Any, xp: Any) -> Any:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / xp.sqrt(var + LN_EPS) * g + b


def _gelu(x: Any, xp: Any) -> Any:
    # tanh approximation: identical formula in numpy, jax and torch (approximate="tanh")
    return 0.5 * x * (1.0 + xp.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def forward(params: Params, tokens: Any, cfg: ModelConfig, xp: Any = np) -> Any:
    """Logits [B, T, V] for token ids [B, T] (T <= seq_len); xp is numpy or jax.numpy."""
    bsz, t = tokens.shape
    h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
    x = params["tok_emb"][tokens] + params["pos_emb"][:t]
    causal = xp.tril(xp.ones((t, t), dtype=bool))
    for i in range(cfg.n_layers):
        p = f"l{i}_"
        y = _layer_norm(x, params[p + "ln1_g"], params[p + "ln1_b"], xp)
        qkv = (y @ params[p + "wqkv"] + params[p + "bqkv"]).reshape(bsz, t, 3, h, dh)
        q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
        # Python floats keep the arrays' dtype (float32 in numpy, bfloat16 under a bf16 jax forward)
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(dh)
        scores = xp.where(causal, scores, -1e9)
        scores = scores - scores.max(-1, keepdims=True)
        weights = xp.exp(scores)
        weights = weights / weights.sum(-1, keepdims=True)
        att = (weights @ v).transpose(0, 2, 1, 3).reshape(bsz, t, cfg.d_model)
        x = x + att @ params[p + "wo"] + params[p + "bo"]
        y = _layer_norm(x, params[p + "ln2_g"], params[p + "ln2_b"], xp)
        x = x + _gelu(y @ params[p + "w1"] + params[p + "b1"], xp) @ params[p + "w2"] + params[p + "b2"]
    x = _layer_norm(x, params["lnf_g"], params["lnf_b"], xp)
    return x @ params["head_w"] + params["head_b"]


# --- JAX training pieces (jax imported on call) -------------------------------------


def loss_fn(params: Params, tokens: Any, mask: Any, cfg: ModelConfig) -> Any:
    """Mean next-token cross entropy over the answer positions (mask: [T-1])."""
    import jax
    import jax.numpy as jnp

    logits = forward(params, tokens[:, :-1], cfg, jnp)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return (nll * mask).sum() / (mask.sum() * tokens.shape[0])


def make_optimizer(config: dict[str, Any]) -> Any:
    """AdamW with warmup + cosine decay and global-norm clipping, or plain SGD; config is resolved (training.DEFAULTS)."""
    import optax

    lr = float(config["learning_rate"])
    if config["optimizer"] == "sgd":
        return optax.sgd(lr)
    steps = int(config["num_steps"])
    warmup = min(int(config["warmup_steps"]), max(steps - 1, 1))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, lr, warmup, max(steps, warmup + 1), end_value=lr * float(config["final_lr_fraction"])
    )
    return optax.chain(
        optax.clip_by_global_norm(float(config["grad_clip"])),
        optax.adamw(schedule, weight_decay=float(config["weight_decay"])),
    )


def make_train_step(cfg: ModelConfig, optimizer: Any, mesh: Any, mask: np.ndarray, axis: str = "data") -> Any:
    """One data-parallel step: params/optimizer state replicated, tokens sharded over `axis`; ``optimizer`` is
    any (init, update) pair of optax's GradientTransformation shape.

    Gradients are averaged explicitly: check_vma=False so jax.grad returns each device's local
    gradient (with the default check, grad w.r.t. replicated params is already a cross-device
    SUM and a pmean after it would leave it N times too large), and everything is flattened
    into one vector so gloo does a single all-reduce per step instead of one per leaf.
    """
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree
    from jax.sharding import PartitionSpec as P

    mask_j = jnp.asarray(mask)

    def local_step(params: Params, opt_state: Any, tokens: Any) -> tuple[Params, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, mask_j, cfg)
        flat, unravel = ravel_pytree(grads)
        packed = jax.lax.pmean(jnp.concatenate([flat, loss[None]]), axis)
        grads = unravel(packed[:-1])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        # optax.apply_updates' sum, written out: the step needs only the optimizer's init/update (a chip
        # machine without optax runs it with bench.device_model's AdamW)
        params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates)
        return params, opt_state, packed[-1]

    step = jax.shard_map(
        local_step, mesh=mesh, in_specs=(P(), P(), P(axis)), out_specs=(P(), P(), P()), check_vma=False
    )
    return jax.jit(step, donate_argnums=(0, 1))
