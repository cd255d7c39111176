from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from addition import checkpoint as ckpt
from addition import data
from addition.inference import Predictor, completions, generate_stream
from addition.model_jax import ModelConfig, forward, init_params, param_shapes

SPEC = data.TaskSpec(2)
CFG = ModelConfig(seq_len=SPEC.seq_len, n_layers=2)


def _params(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # init leaves LN at identity and biases at 0; perturb everything so parity covers all terms
    return {k: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32) for k, v in init_params(CFG, seed).items()}


def _tokens() -> np.ndarray:
    return data.generate("2026-01-01", "train", 16, num_heldout=200)["tokens"]


def test_numpy_jax_torch_forward_agree() -> None:
    import jax.numpy as jnp
    from addition.inference import torch_logits

    params, tokens = _params(), _tokens()
    ref = forward(params, tokens, CFG, np)
    assert ref.shape == (16, SPEC.seq_len, data.VOCAB_SIZE)
    got_jax = np.asarray(forward({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(tokens), CFG, jnp))
    got_torch = torch_logits(params, CFG)(tokens)
    np.testing.assert_allclose(got_jax, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_torch, ref, rtol=1e-4, atol=1e-4)


def test_attention_is_causal() -> None:
    params, tokens = _params(), _tokens()
    changed = tokens.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % data.VOCAB_SIZE
    a, b = forward(params, tokens, CFG, np), forward(params, changed, CFG, np)
    np.testing.assert_allclose(a[:, :6], b[:, :6], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 6:], b[:, 6:])


def test_jax_and_torch_losses_and_gradients_agree() -> None:
    import jax
    import jax.numpy as jnp
    import torch
    from addition import model_jax, model_torch

    params, tokens = _params(), _tokens()
    mask = data.loss_mask(SPEC)
    jloss, jgrads = jax.value_and_grad(model_jax.loss_fn)(
        {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(tokens), jnp.asarray(mask), CFG
    )
    module = model_torch.AdditionTransformer(CFG)
    module.load_canonical(params)
    tloss = model_torch.loss_fn(module, torch.from_numpy(tokens).long(), torch.from_numpy(mask))
    tloss.backward()
    assert float(jloss) == pytest.approx(float(tloss.detach()), rel=1e-4)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(np.asarray(jgrads[name]), p.grad.numpy(), rtol=2e-3, atol=2e-5, err_msg=name)


def test_greedy_generation_stops_at_eos_and_respects_budget() -> None:
    eos_always = lambda ids: np.eye(data.VOCAB_SIZE)[np.full(ids.shape, data.EOS)]  # noqa: E731
    seven = lambda ids: np.eye(data.VOCAB_SIZE)[np.full(ids.shape, data.encode_prompt("7", SPEC)[-1])]  # noqa: E731
    prompts = np.stack([data.encode_prompt("1+2=", SPEC)] * 2)
    assert [
        (c.text, c.finish_reason, c.num_tokens) for c in completions(generate_stream(eos_always, prompts, SPEC, 4))
    ] == [("", "stop", 1)] * 2
    out = completions(generate_stream(seven, prompts, SPEC, 2))
    assert [(c.text, c.finish_reason, c.num_tokens) for c in out] == [("77", "length", 2)] * 2
    # never past the model's sequence length
    assert completions(generate_stream(seven, prompts, SPEC, 100))[0].text == "7" * SPEC.answer_len


def test_completions_read_as_a_person_writes_the_sum() -> None:
    """The model writes "007" and eos for 3+4; the caller sees "7", two tokens (digit + eos)."""
    answer = data.encode_example("3+4=", "7", SPEC)
    writes_007 = lambda ids: np.eye(data.VOCAB_SIZE)[np.broadcast_to(np.roll(answer, -1), ids.shape)]  # noqa: E731
    prompts = np.stack([data.encode_prompt("3+4=", SPEC)])
    assert [
        (c.text, c.finish_reason, c.num_tokens) for c in completions(generate_stream(writes_007, prompts, SPEC, 4))
    ] == [("7", "stop", 2)]
    assert [
        (c.text, c.finish_reason, c.num_tokens) for c in completions(generate_stream(writes_007, prompts, SPEC, 1))
    ] == [("7", "length", 1)]


def test_checkpoint_roundtrip_and_mismatch(tmp_path: Path) -> None:
    params = _params()
    ckpt.save(tmp_path, ckpt.Meta("jax", 7, 1, CFG, SPEC), params)
    meta = ckpt.load_meta(tmp_path)
    assert (meta.framework, meta.step, meta.model, meta.task) == ("jax", 7, CFG, SPEC)
    loaded = ckpt.load_params(tmp_path, CFG)
    assert loaded.keys() == param_shapes(CFG).keys()
    for k in params:
        np.testing.assert_array_equal(loaded[k], params[k])
    pred = Predictor.from_checkpoint(tmp_path)
    np.testing.assert_allclose(pred._logits(_tokens()), forward(params, _tokens(), CFG, np), rtol=1e-6)
    with pytest.raises(ckpt.CheckpointError, match="do not match"):
        ckpt.load_params(tmp_path, ModelConfig(seq_len=SPEC.seq_len, n_layers=1))
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint"):
        ckpt.load_meta(tmp_path / "nowhere")


def test_checkpoint_at_a_uri_is_copied_to_a_local_directory(tmp_path: Path) -> None:
    params = _params()
    ckpt.save(tmp_path / "c", ckpt.Meta("torch", 3, 0, CFG, SPEC), params)
    with ckpt.local_copy(f"file://{tmp_path / 'c'}") as local:
        assert local != tmp_path / "c"
        pred = Predictor.from_checkpoint(local)
    assert pred.meta.framework == "torch"
    np.testing.assert_array_equal(pred.params["head_w"], params["head_w"])
