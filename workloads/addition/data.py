"""Deterministic addition problems and the character-level tokenizer.

A problem is an index into the space of all operand pairs, i -> (i // 10**d, i % 10**d).
One seeded permutation of that space per (date, seed) makes every backfill reproducible:
the held-out set is the head of the permutation and the training set cycles through the
rest, so the two never share a problem.

Sequences are [prompt "a+b="][answer digits][eos], every number zero-padded to its full
width: "3+4=" is encoded as "03+04=" and its answer as "007". With variable widths the model
saw "3+4=" in a different positional layout from "33+44=" and, a layer deep, learned the short
operands far worse: every held-out error of a trained model had a one-digit operand. Fixed
widths put each digit at the same position in every row, so "=" is always just before the
answer and batched greedy decoding writes every row's answer at the same positions.
Completions drop the leading zeros again (`answer_text`). Text that is not a problem of this
width (a user's free-form prompt) is left-padded instead and still tokenized.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

PAD, EOS = 0, 1
_CHARS = "0123456789+="
VOCAB: tuple[str, ...] = ("<pad>", "<eos>", *_CHARS)
VOCAB_SIZE = len(VOCAB)
_CHAR_TO_ID = {c: i + 2 for i, c in enumerate(_CHARS)}
_ID_TO_CHAR = {i: c for c, i in _CHAR_TO_ID.items()}
MAX_DIGITS = 3  # the permutation holds the whole problem space: 10**6 pairs at 3 digits


class TokenizeError(ValueError):
    """Text outside the task's alphabet or longer than its fixed length."""


@dataclass(frozen=True)
class TaskSpec:
    """Shape of the task: operands have at most `digits` digits."""

    digits: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= MAX_DIGITS:
            raise ValueError(f"digits must be between 1 and {MAX_DIGITS}, got {self.digits}")

    @property
    def prompt_len(self) -> int:
        return 2 * self.digits + 2  # "a+b="

    @property
    def answer_len(self) -> int:
        return self.digits + 2  # sum digits plus eos

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.answer_len

    @property
    def space_size(self) -> int:
        return 10 ** (2 * self.digits)


def seed_for(date: str, seed: int = 0) -> int:
    """A 63-bit seed derived from the logical date string (and an optional user seed)."""
    digest = hashlib.sha256(f"{date}|{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def problem_permutation(seed: int, spec: TaskSpec) -> np.ndarray:
    return np.random.default_rng(seed).permutation(spec.space_size)


def problem_ids(row_ids: np.ndarray, split: str, num_heldout: int, perm: np.ndarray) -> np.ndarray:
    """Problem indices for rows of a split; train rows cycle over everything after the held-out head."""
    row_ids = np.asarray(row_ids, dtype=np.int64)
    if split == "heldout":
        if row_ids.size and row_ids.max() >= num_heldout:
            raise ValueError("held-out row id beyond num_heldout")
        return perm[row_ids]
    if split == "train":
        return perm[num_heldout + row_ids % (perm.size - num_heldout)]
    raise ValueError(f"unknown split {split!r}")


def operands(ids: np.ndarray, spec: TaskSpec) -> tuple[np.ndarray, np.ndarray]:
    base = 10**spec.digits
    return ids // base, ids % base


_PROBLEM = re.compile(r"(\d+)\+(\d+)=")


def canonical_prompt(prompt: str, spec: TaskSpec) -> str:
    """ "3+4=" -> "03+04=" at 2 digits; anything that is not such a problem is returned as it is."""
    m = _PROBLEM.fullmatch(prompt)
    if m is None or max(len(m[1]), len(m[2])) > spec.digits:
        return prompt
    return f"{m[1].zfill(spec.digits)}+{m[2].zfill(spec.digits)}="


def canonical_answer(answer: str, spec: TaskSpec) -> str:
    """ "7" -> "007" at 2 digits (a sum has at most digits + 1 digits)."""
    return answer.zfill(spec.answer_len - 1) if answer.isdigit() else answer


def answer_text(ids: np.ndarray | list[int]) -> str:
    """The generated answer as a person writes it: "007" -> "7", "000" -> "0"."""
    text = decode(ids)
    return (text.lstrip("0") or "0") if text.isdigit() else text


def encode_prompt(prompt: str, spec: TaskSpec) -> np.ndarray:
    """Token ids of a prompt such as "17+25=" (or "3+4=", encoded as "03+04=")."""
    m = _PROBLEM.fullmatch(prompt)
    if m is not None and max(len(m[1]), len(m[2])) > spec.digits:
        # It would fit the prompt's length ("120+7=") but the model never saw such a problem: refuse it
        # rather than answer it wrongly.
        raise TokenizeError(f"prompt {prompt!r}: this model adds numbers of at most {spec.digits} digits")
    prompt = canonical_prompt(prompt, spec)
    if len(prompt) > spec.prompt_len:
        raise TokenizeError(f"prompt {prompt!r} is longer than {spec.prompt_len} characters")
    try:
        ids = [_CHAR_TO_ID[c] for c in prompt]
    except KeyError as exc:
        raise TokenizeError(f"prompt {prompt!r} has a character outside {_CHARS!r}: {exc.args[0]!r}") from None
    return np.array([PAD] * (spec.prompt_len - len(ids)) + ids, dtype=np.int32)


def encode_example(prompt: str, answer: str, spec: TaskSpec) -> np.ndarray:
    """Full training sequence: prompt, zero-padded answer, eos (right pads for free-form text)."""
    answer = canonical_answer(answer, spec)
    if len(answer) > spec.answer_len - 1:
        raise TokenizeError(f"answer {answer!r} is longer than {spec.answer_len - 1} characters")
    tail = [_CHAR_TO_ID[c] for c in answer] + [EOS]
    tail += [PAD] * (spec.answer_len - len(tail))
    return np.concatenate([encode_prompt(prompt, spec), np.array(tail, dtype=np.int32)])


def decode(ids: np.ndarray | list[int]) -> str:
    """Text up to the first eos; pads are skipped."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS:
            break
        if i != PAD:
            out.append(_ID_TO_CHAR[i] if i in _ID_TO_CHAR else "?")
    return "".join(out)


def loss_mask(spec: TaskSpec) -> np.ndarray:
    """Weights over next-token targets (positions 1..L-1): the answer digits and eos.

    Right pads after eos are weighted too; they are deterministic given eos and keep
    the mask the same for every row.
    """
    mask = np.zeros(spec.seq_len - 1, dtype=np.float32)
    mask[spec.prompt_len - 1 :] = 1.0
    return mask


def make_rows(row_ids: np.ndarray, split: str, *, seed: int, num_heldout: int, spec: TaskSpec) -> dict[str, np.ndarray]:
    """Columns for a batch of row ids of one split (what the Ray Data pipeline maps)."""
    perm = problem_permutation(seed, spec)
    ids = problem_ids(row_ids, split, num_heldout, perm)
    a, b = operands(ids, spec)
    prompts = [f"{x}+{y}=" for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    answers = [str(x + y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    tokens = (
        np.stack([encode_example(p, s, spec) for p, s in zip(prompts, answers, strict=True)])
        if prompts
        else (np.zeros((0, spec.seq_len), dtype=np.int32))
    )
    return {
        "problem_id": ids.astype(np.int64),
        "split": np.array([split] * len(ids), dtype=object),
        "a": a.astype(np.int64),
        "b": b.astype(np.int64),
        "prompt": np.array(prompts, dtype=object),
        "answer": np.array(answers, dtype=object),
        "tokens": tokens,
    }


def make_split_rows(row_ids: np.ndarray, *, seed: int, num_heldout: int, spec: TaskSpec) -> dict[str, np.ndarray]:
    """Rows for global ids over [held-out | train]: ids below num_heldout are held out."""
    row_ids = np.asarray(row_ids, dtype=np.int64)
    held = row_ids < num_heldout
    parts = [
        make_rows(row_ids[held], "heldout", seed=seed, num_heldout=num_heldout, spec=spec),
        make_rows(row_ids[~held] - num_heldout, "train", seed=seed, num_heldout=num_heldout, spec=spec),
    ]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def default_num_train(spec: TaskSpec, num_heldout: int) -> int:
    """Every problem outside the held-out set once (9,800 at 2 digits), capped for larger spaces."""
    return min(spec.space_size - num_heldout, 100_000)


def generate(
    date: str, split: str, count: int, *, num_heldout: int, seed: int = 0, digits: int = 2
) -> dict[str, np.ndarray]:
    """In-process generation (tests, local experiments): the same rows the prep pipeline writes."""
    spec = TaskSpec(digits)
    check_sizes(spec, num_heldout)
    return make_rows(np.arange(count), split, seed=seed_for(date, seed), num_heldout=num_heldout, spec=spec)


def check_sizes(spec: TaskSpec, num_heldout: int) -> None:
    if not 0 < num_heldout < spec.space_size:
        raise ValueError(
            f"num_heldout must be between 1 and {spec.space_size - 1} for {spec.digits}-digit operands, got {num_heldout}"
        )
