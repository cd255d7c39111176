"""The product promise: the default JAX training reaches >= 0.9 exact match on 200 held-out problems."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from addition import data, train_jax
from addition.inference import Predictor, exact_match


def test_in_process_training_reaches_ninety_percent_heldout(trained: dict[str, Any]) -> None:
    held = data.generate(trained["date"], "heldout", 200, num_heldout=200)
    pred = Predictor.from_checkpoint(trained["checkpoint"])
    accuracy = exact_match(pred, list(held["prompt"]), list(held["answer"]))
    print(f"held-out exact match {accuracy:.3f} after {trained['metrics']['step']} steps "
          f"in {trained['metrics']['train_s']:.1f}s")  # fmt: skip
    assert trained["metrics"]["step"] == 1500
    assert accuracy >= 0.9
    assert pred.complete(["17+25="])[0].text == "42"


def test_train_local_rejects_bad_config() -> None:
    tokens = np.zeros((10, data.TaskSpec(2).seq_len), dtype=np.int32)
    with pytest.raises(ValueError, match="unknown train_loop_config"):
        train_jax.train_local(tokens, {"num_stepz": 3})
    with pytest.raises(ValueError, match="less than one batch"):
        train_jax.train_local(tokens, {"global_batch_size": 128})
