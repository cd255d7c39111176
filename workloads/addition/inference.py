"""Greedy (or sampled) decoding for the addition model, independent of the training framework.

A `Predictor` loads a checkpoint's canonical parameters once and runs the forward pass with
numpy (default: no jax/torch import, fast to start), jax, or torch. The decode loop is one generator,
`generate_stream` (a `Step` per forward pass: each sequence's new text, then its finished completion),
which `completions` runs to its end and `Predictor.stream` hands to a streaming server. `Decoder` is what
a server calls (`complete`, `stream`), for one process (`Predictor`) or a whole slice
(`addition.slice_serving.SlicePredictor`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from addition import checkpoint as ckpt
from addition.data import EOS, PAD, TaskSpec, decode, encode_prompt
from addition.model_jax import ModelConfig, forward

LogitsFn = Callable[[np.ndarray], np.ndarray]
BACKENDS = ("numpy", "jax", "torch")


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" (eos) or "length"
    num_tokens: int  # generated tokens, eos included


@dataclass(frozen=True)
class Step:
    """One decode step of a batch, as `generate_stream` yields it (one entry per sequence).

    text: what each sequence's completion gained at this step ("" for none: eos, a pad, a leading
    zero held back, or a sequence already finished). finished: a sequence's whole `Completion` at the
    step it finished, else None; every sequence finishes exactly once in a stream, and its text is
    the concatenation of its `text` entries up to then.
    """

    text: tuple[str, ...]
    finished: tuple[Completion | None, ...]

    @classmethod
    def of(cls, outs: Sequence[Completion]) -> Step:
        """A finished batch as one step (for a `complete` function that has no stream)."""
        return cls(tuple(o.text for o in outs), tuple(outs))


class _Answer:
    """One sequence's completion as it is written, as a person writes it and cut at the token budget.

    The model writes the zero-padded answer ("007", eos); leading zeros are held back until the next
    token decides them: a digit drops them ("7"), eos or the end of the sequence leaves one ("0"), any
    other character keeps them all ("00+", as `answer_text` reads text that is not a number). Text only
    grows, so what a stream sent never needs taking back. (Unlike `answer_text`, a zero-padded number
    the model follows with a non-digit, "07+", reads "7+": the stream had sent "7" already.)
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.text, self.zeros, self.leading = limit, "", 0, True
        self.done: Completion | None = None if limit > 0 else Completion("", "length", 0)

    def feed(self, token: int) -> str:
        if self.done is not None or token == PAD:
            return ""
        if token == EOS:
            return self.end(eos=True)
        char = decode([token])
        if self.leading:
            if char == "0":
                self.zeros += 1
                return ""
            self.leading = False
            char = char if char.isdigit() else "0" * self.zeros + char
        return self._add(char)

    def end(self, eos: bool) -> str:
        """The sequence is over (eos, or its last position): flush a held zero and finish."""
        if self.done is not None:
            return ""
        added = self._add("0") if self.leading and self.zeros else ""
        if self.done is None:  # eos counts as a token within the budget: the add above may have filled it
            self.done = (
                Completion(self.text, "stop", len(self.text) + 1)
                if eos
                else Completion(self.text, "length", len(self.text))
            )
        return added

    def _add(self, text: str) -> str:
        text = text[: self.limit - len(self.text)]
        self.text += text
        if len(self.text) >= self.limit:
            self.done = Completion(self.text, "length", self.limit)
        return text


def generate_stream(
    logits_fn: LogitsFn,
    prompt_ids: np.ndarray,
    spec: TaskSpec,
    max_new_tokens: int,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Iterator[Step]:
    """Decode prompts [B, prompt_len], one `Step` per forward pass, as soon as it returns; logits_fn maps
    [B, seq_len] ids to [B, seq_len, V] logits (`completions` gathers the finished ones).

    The model always writes its whole zero-padded answer ("007" and eos). A caller sees that answer
    as a person writes it ("7"), one token per character plus the eos, cut at `max_new_tokens`.
    The buffer always has the full sequence length, so a jitted logits_fn compiles once per batch
    size; causal attention keeps the not-yet-written positions from influencing earlier ones.
    The loop ends once every sequence has finished: at eos, at `max_new_tokens` tokens of its
    completion, or at the model's sequence length. Sampling draws for every row at every step, finished
    or not, so a seeded rng gives the same completions however soon some rows finish.
    """
    bsz = prompt_ids.shape[0]
    buf = np.full((bsz, spec.seq_len), PAD, dtype=np.int32)
    buf[:, : spec.prompt_len] = prompt_ids
    done = np.zeros(bsz, dtype=bool)
    rows = [_Answer(max(0, max_new_tokens)) for _ in range(bsz)]
    if all(r.done is not None for r in rows):  # max_tokens 0: nothing to decode
        yield Step(("",) * bsz, tuple(r.done for r in rows))
        return
    for t in range(spec.prompt_len, spec.seq_len):
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
        last = t == spec.seq_len - 1
        text, finished = [], []
        for row, token in zip(rows, nxt.tolist(), strict=True):
            was_done = row.done is not None
            text.append(row.feed(token) + (row.end(eos=False) if last else ""))
            finished.append(row.done if not was_done else None)
        yield Step(tuple(text), tuple(finished))
        if all(r.done is not None for r in rows):
            return


def completions(steps: Iterable[Step]) -> list[Completion]:
    """Each sequence's finished `Completion`, in batch order: a decode's steps run to their end."""
    out: list[Completion | None] = []
    for step in steps:
        out = out or [None] * len(step.finished)
        for i, finished in enumerate(step.finished):
            if finished is not None:
                out[i] = finished
    assert all(o is not None for o in out)
    return [o for o in out if o is not None]


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


@dataclass(frozen=True)
class Batch:
    """Text prompts tokenized for one decode, with each completion's token budget."""

    prompt_ids: np.ndarray  # [B, prompt_len]
    spec: TaskSpec
    max_new_tokens: int

    @classmethod
    def of(cls, prompts: Sequence[str], spec: TaskSpec, max_new_tokens: int | None) -> Batch:
        """Raises TokenizeError for a prompt the model cannot read; no max_new_tokens: the whole answer."""
        ids = np.stack([encode_prompt(p, spec) for p in prompts])
        return cls(ids, spec, spec.answer_len if max_new_tokens is None else max_new_tokens)


class Decoder(ABC):
    """Completes text prompts such as "17+25=": `complete` and `stream`, as the OpenAI routes call them.

    The prompts are tokenized here, so a bad one raises TokenizeError before anything is decoded; a
    subclass decodes the tokenized, non-empty `Batch` in `stream_batch` (and `complete_batch`)."""

    spec: TaskSpec

    def complete(
        self,
        prompts: Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> list[Completion]:
        if not prompts:
            return []
        return self.complete_batch(Batch.of(prompts, self.spec, max_new_tokens), temperature, rng)

    def stream(
        self,
        prompts: Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> Iterator[Step]:
        """`complete` step by step (`generate_stream`)."""
        if not prompts:
            return iter(())
        return self.stream_batch(Batch.of(prompts, self.spec, max_new_tokens), temperature, rng)

    def complete_batch(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> list[Completion]:
        return completions(self.stream_batch(batch, temperature, rng))

    @abstractmethod
    def stream_batch(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> Iterator[Step]:
        """The decode of a tokenized, non-empty batch, one `Step` per forward pass."""


class LogitsDecoder(Decoder):
    """A `Decoder` running `generate_stream` over one logits function in this process."""

    def __init__(self, logits: LogitsFn, spec: TaskSpec) -> None:
        self._logits, self.spec = logits, spec

    def stream_batch(self, batch: Batch, temperature: float, rng: np.random.Generator | None) -> Iterator[Step]:
        return generate_stream(self._logits, batch.prompt_ids, batch.spec, batch.max_new_tokens, temperature, rng)


class Predictor(LogitsDecoder):
    """A checkpoint's parameters loaded once, decoded with the numpy, jax or torch forward pass."""

    def __init__(self, params: dict[str, np.ndarray], meta: ckpt.Meta, backend: str = "numpy"):
        super().__init__(logits_fn_for(backend, params, meta.model), meta.task)
        self.params, self.meta, self.backend = params, meta, backend

    @classmethod
    def from_checkpoint(cls, directory: str | Path, backend: str = "numpy") -> Predictor:
        meta = ckpt.load_meta(directory)
        return cls(ckpt.load_params(directory, meta.model), meta, backend)


def exact_match(predictor: Predictor, prompts: Sequence[str], answers: Sequence[str], batch_size: int = 256) -> float:
    hits = 0
    for i in range(0, len(prompts), batch_size):
        outs = predictor.complete(prompts[i : i + batch_size])
        hits += sum(o.text == a for o, a in zip(outs, answers[i : i + batch_size], strict=True))
    return hits / max(len(prompts), 1)
