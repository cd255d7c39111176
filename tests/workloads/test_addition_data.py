from __future__ import annotations

import numpy as np
import pytest
from addition import data


def test_same_date_same_problems_other_date_other_problems() -> None:
    a = data.generate("2026-01-01", "train", 500, num_heldout=200)
    b = data.generate("2026-01-01", "train", 500, num_heldout=200)
    c = data.generate("2026-01-02", "train", 500, num_heldout=200)
    assert list(a["prompt"]) == list(b["prompt"])
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    assert list(a["prompt"]) != list(c["prompt"])
    assert data.seed_for("2026-01-01", 1) != data.seed_for("2026-01-01", 0)


def test_rows_do_not_depend_on_batching() -> None:
    """Ray Data may cut the id range anywhere; a row must come out the same."""
    spec, seed = data.TaskSpec(2), data.seed_for("2026-03-04")
    whole = data.make_split_rows(np.arange(0, 600), seed=seed, num_heldout=200, spec=spec)
    parts = [
        data.make_split_rows(np.arange(s, s + 150), seed=seed, num_heldout=200, spec=spec) for s in range(0, 600, 150)
    ]
    np.testing.assert_array_equal(whole["problem_id"], np.concatenate([p["problem_id"] for p in parts]))
    assert (whole["split"] == "heldout").sum() == 200


def test_heldout_disjoint_from_train_and_answers_correct() -> None:
    spec = data.TaskSpec(2)
    held = data.generate("2026-01-01", "heldout", 200, num_heldout=200)
    # more rows than the space holds: train cycles, and still never reaches a held-out problem
    train = data.generate("2026-01-01", "train", 2 * spec.space_size, num_heldout=200)
    assert len(set(held["problem_id"].tolist())) == 200
    assert not set(held["problem_id"].tolist()) & set(train["problem_id"].tolist())
    assert len(set(train["problem_id"].tolist())) == spec.space_size - 200
    for rows in (held, train):
        for a, b, prompt, answer in zip(
            rows["a"][:300], rows["b"][:300], rows["prompt"][:300], rows["answer"][:300], strict=True
        ):
            assert prompt == f"{a}+{b}=" and answer == str(a + b)
    assert data.default_num_train(spec, 200) == 9800


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_tokenizer_roundtrip(digits: int) -> None:
    spec = data.TaskSpec(digits)
    rows = data.generate("2026-05-05", "train", 50, num_heldout=10, digits=digits)
    assert rows["tokens"].shape == (50, spec.seq_len)
    for prompt, answer, tokens in zip(rows["prompt"], rows["answer"], rows["tokens"], strict=True):
        a, b = prompt[:-1].split("+")
        # every number at its full width: each digit has one position whatever the operands
        assert data.decode(tokens) == f"{a.zfill(digits)}+{b.zfill(digits)}={answer.zfill(digits + 1)}"
        assert data.decode(data.encode_prompt(prompt, spec)) == f"{a.zfill(digits)}+{b.zfill(digits)}="
        assert tokens[spec.prompt_len - 1] == data.encode_prompt("=", spec)[-1]
        assert data.answer_text(tokens[spec.prompt_len :]) == answer


def test_tokenizer_vocab_and_errors() -> None:
    spec = data.TaskSpec(2)
    assert data.VOCAB_SIZE == 14 and data.VOCAB[data.PAD] == "<pad>" and data.VOCAB[data.EOS] == "<eos>"
    assert data.decode(data.encode_prompt("7+5=", spec)) == "07+05="
    assert data.answer_text(data.encode_example("7+5=", "12", spec)[spec.prompt_len :]) == "12"
    assert data.answer_text(data.encode_example("0+0=", "0", spec)[spec.prompt_len :]) == "0"
    # text that is not a problem of this width is left-padded and still tokenized
    np.testing.assert_array_equal(data.encode_prompt("7", spec)[:-1], [data.PAD] * (spec.prompt_len - 1))
    assert data.decode(data.encode_prompt("1+2+3", spec)) == "1+2+3"
    with pytest.raises(data.TokenizeError, match="outside"):
        data.encode_prompt("1-2=", spec)
    with pytest.raises(data.TokenizeError, match="longer"):
        data.encode_prompt("1+2+3+4=", spec)
    # a problem this model never saw, even one that fits the prompt's length, is refused, not answered
    for prompt in ("100+100=", "120+7="):
        with pytest.raises(data.TokenizeError, match="at most 2 digits"):
            data.encode_prompt(prompt, spec)
    with pytest.raises(ValueError):
        data.TaskSpec(4)
    with pytest.raises(ValueError):
        data.check_sizes(spec, spec.space_size)


def test_loss_mask_covers_answer_and_eos_only() -> None:
    spec = data.TaskSpec(2)
    mask = data.loss_mask(spec)
    tokens = data.encode_example("17+25=", "42", spec)
    targets = tokens[1:]
    assert mask.shape == (spec.seq_len - 1,)
    assert data.decode(targets[mask > 0]) == "042"
    assert data.decode(targets[mask == 0]) == "7+25="  # the first token is never a target
