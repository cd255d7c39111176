"""Greedy (or sampled) decoding for the addition model, independent of the training framework.

A `Predictor` loads a checkpoint's canonical parameters once and runs the forward pass with
numpy (default: no jax/torch import, fast to start), jax, or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from addition import checkpoint as ckpt
from addition.data import EOS, PAD, TaskSpec, answer_text, encode_prompt
from addition.model_jax import ModelConfig, forward

LogitsFn = Callable[[np.ndarray], np.ndarray]
BACKENDS = ("numpy", "jax", "torch")


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" (eos) or "length"
    num_tokens: int  # generated tokens, eos included


def generate(
    logits_fn: LogitsFn,
    prompt_ids: np.ndarray,
    spec: TaskSpec,
    max_new_tokens: int,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
) -> list[Completion]:
    """Decode prompts [B, prompt_len]; logits_fn maps [B, seq_len] ids to [B, seq_len, V] logits.

    The model always writes its whole zero-padded answer ("007" and eos). A caller sees that answer
    as a person writes it ("7"), one token per character plus the eos, cut at `max_new_tokens`.
    The buffer always has the full sequence length, so a jitted logits_fn compiles once per batch
    size; causal attention keeps the not-yet-written positions from influencing earlier ones.
    """
    bsz = prompt_ids.shape[0]
    buf = np.full((bsz, spec.seq_len), PAD, dtype=np.int32)
    buf[:, : spec.prompt_len] = prompt_ids
    done = np.zeros(bsz, dtype=bool)
    for t in range(spec.prompt_len, spec.seq_len):
        if done.all():
            break
        logits = np.asarray(logits_fn(buf), dtype=np.float64)[:, t - 1]
        if temperature > 0:
            rng = rng or np.random.default_rng()
            z = logits / temperature
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            nxt = np.array([rng.choice(p.shape[-1], p=row) for row in p], dtype=np.int32)
        else:
            nxt = logits.argmax(-1).astype(np.int32)
        nxt = np.where(done, PAD, nxt)
        buf[:, t] = nxt
        done |= nxt == EOS
    limit = max(0, max_new_tokens)
    out = []
    for i in range(bsz):
        text = answer_text(buf[i, spec.prompt_len :])
        tokens = len(text) + int(done[i])
        if tokens <= limit:
            out.append(Completion(text, "stop" if done[i] else "length", tokens))
        else:
            out.append(Completion(text[:limit], "length", limit))
    return out


def numpy_logits(params: dict[str, np.ndarray], cfg: ModelConfig) -> LogitsFn:
    return lambda ids: forward(params, ids, cfg, np)


def jax_logits(params: dict[str, np.ndarray], cfg: ModelConfig) -> LogitsFn:
    import jax
    import jax.numpy as jnp

    jparams = {k: jnp.asarray(v) for k, v in params.items()}
    fn = jax.jit(lambda p, ids: forward(p, ids, cfg, jnp))
    return lambda ids: np.asarray(fn(jparams, jnp.asarray(ids)))


def torch_logits(params: dict[str, np.ndarray], cfg: ModelConfig) -> LogitsFn:
    import torch
    from addition.model_torch import AdditionTransformer

    model = AdditionTransformer(cfg)
    model.load_canonical(params)
    model.eval()

    def fn(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(ids).long()).numpy()

    return fn


def logits_fn_for(backend: str, params: dict[str, np.ndarray], cfg: ModelConfig) -> LogitsFn:
    if backend == "numpy":
        return numpy_logits(params, cfg)
    if backend == "jax":
        return jax_logits(params, cfg)
    if backend == "torch":
        return torch_logits(params, cfg)
    raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS}")


class Predictor:
    """Parameters loaded for completing text prompts such as "17+25="."""

    def __init__(self, params: dict[str, np.ndarray], meta: ckpt.Meta, backend: str = "numpy"):
        self.params, self.meta, self.spec, self.backend = params, meta, meta.task, backend
        self._logits = logits_fn_for(backend, params, meta.model)

    @classmethod
    def from_checkpoint(cls, directory: str | Path, backend: str = "numpy") -> Predictor:
        meta = ckpt.load_meta(directory)
        return cls(ckpt.load_params(directory, meta.model), meta, backend)

    def complete(
        self,
        prompts: Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> list[Completion]:
        if not prompts:
            return []
        ids = np.stack([encode_prompt(p, self.spec) for p in prompts])
        budget = self.spec.answer_len if max_new_tokens is None else max_new_tokens
        return generate(self._logits, ids, self.spec, budget, temperature, rng)


def exact_match(predictor: Predictor, prompts: Sequence[str], answers: Sequence[str], batch_size: int = 256) -> float:
    hits = 0
    for i in range(0, len(prompts), batch_size):
        outs = predictor.complete(prompts[i : i + batch_size])
        hits += sum(o.text == a for o, a in zip(outs, answers[i : i + batch_size], strict=True))
    return hits / max(len(prompts), 1)
