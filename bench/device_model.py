"""What the chip rows train with where optax is not installed (the TPU machine has only jax and numpy).

`AdamW`: optax.adamw's update (constant learning rate, no clipping), in jax.numpy, with optax's
(init, update) shape, so `addition.model_jax.make_train_step` and `addition.train_jax.DataParallelState`
take it unchanged. `mixed_step`: the demo architecture with float32 master weights, the forward and
backward in bfloat16 (what "a bf16 model" means on a TPU), logits back in float32 for the loss. FLOPs of a
step are counted from the model's shape (`model_flops`) and compared with XLA's own count.

jax is imported inside functions only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from addition.model_jax import ModelConfig


class AdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


class AdamW:
    """optax.adamw(lr, b1, b2, eps, weight_decay)'s update, bias-corrected, decoupled weight decay."""

    def __init__(
        self, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01
    ) -> None:
        self.lr, self.b1, self.b2, self.eps, self.weight_decay = lr, b1, b2, eps, weight_decay

    def init(self, params: Any) -> AdamState:
        import jax
        import jax.numpy as jnp

        zeros = jax.tree.map(lambda p: jnp.zeros(np.shape(p), jnp.float32), params)
        return AdamState(jnp.zeros((), jnp.int32), zeros, jax.tree.map(jnp.copy, zeros))

    def update(self, grads: Any, state: AdamState, params: Any) -> tuple[Any, AdamState]:
        import jax
        import jax.numpy as jnp

        count = state.count + 1
        mu = jax.tree.map(lambda m, g: self.b1 * m + (1 - self.b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: self.b2 * v + (1 - self.b2) * g * g, state.nu, grads)
        c = count.astype(jnp.float32)
        mu_hat_scale, nu_hat_scale = 1 / (1 - self.b1**c), 1 / (1 - self.b2**c)

        def one(m: Any, v: Any, p: Any) -> Any:
            step = (m * mu_hat_scale) / (jnp.sqrt(v * nu_hat_scale) + self.eps) + self.weight_decay * p
            return -self.lr * step

        return jax.tree.map(one, mu, nu, params), AdamState(count, mu, nu)


def mixed_loss(params: dict[str, Any], tokens: Any, mask: Any, cfg: ModelConfig) -> Any:
    """The demo's loss with the forward in bfloat16 (weights cast from their float32 masters)."""
    import jax
    import jax.numpy as jnp
    from addition.model_jax import forward

    low = {k: v.astype(jnp.bfloat16) for k, v in params.items()}
    logits = forward(low, tokens[:, :-1], cfg, jnp).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return (nll * mask).sum() / (mask.sum() * tokens.shape[0])


def mixed_step(cfg: ModelConfig, optimizer: AdamW, mask: np.ndarray) -> Any:
    """One jitted single-chip step (params, opt_state, tokens) -> (params, opt_state, loss), buffers donated."""
    import jax
    import jax.numpy as jnp

    mask_j = jnp.asarray(mask)

    def step(params: dict[str, Any], opt_state: AdamState, tokens: Any) -> tuple[dict[str, Any], AdamState, Any]:
        loss, grads = jax.value_and_grad(mixed_loss)(params, tokens, mask_j, cfg)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return jax.tree.map(lambda p, u: p + u, params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def param_count(cfg: ModelConfig) -> int:
    from addition.model_jax import param_shapes

    return int(sum(np.prod(s) for s in param_shapes(cfg).values()))


def model_flops(cfg: ModelConfig, batch: int, t: int) -> float:
    """A training step's matmul FLOPs from the shape: 3 x (forward) for forward + backward, where the forward
    is 2 x (per-token weight-matrix multiply-adds) x tokens plus the attention's QK^T and AV (the whole T x T
    square, as the model computes it: masked, not skipped). Embedding lookups, norms and softmax not counted."""
    d, f, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    per_token = n * (3 * d * d + d * d + 2 * d * f) + d * cfg.vocab_size
    forward = 2.0 * per_token * batch * t + n * 2 * (2.0 * batch * t * t * d)
    return 3.0 * forward


def xla_flops(compiled: Any) -> float | None:
    """XLA's FLOP count of a compiled program (None where the backend gives none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends have no cost model
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None
