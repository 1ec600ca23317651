"""GPT-2 in train mode (dropout on) trains for three AdamW steps through ``backend="neuron"``.

The issue's train-mode case: a transformers GPT-2 with two small layers, every dropout at 0.1,
``labels=`` so the loss and its backward are in the graph. Dropout itself falls back (its random
mask comes from eager's generator, with the reason recorded), so with the same seed the compiled
run consumes the same random numbers as eager and the three losses must match eager's; everything
else is asserted to have run on the device.
"""
from __future__ import annotations

import copy

import pytest
import torch

import neuron_compiler

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _losses(model, ids, compiled: bool) -> list[float]:
    torch.manual_seed(1)
    fn = torch.compile(model, backend="neuron") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        out = fn(ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses


def test_gpt2_two_layers_trains_three_adamw_steps_with_dropout():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 16))
    with neuron_compiler.profile() as prof:
        got = _losses(model, ids, compiled=True)
    want = _losses(ref, ids, compiled=False)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert got[2] < got[0]  # it learns
    d = prof.to_dict()
    assert d["device_nodes"] > 10 * d["fallback_nodes"], d["fallbacks"]
    reasons = {f["op"]: f["reason"] for f in d["fallbacks"]}
    assert "aten.native_dropout.default" in reasons and reasons["aten.native_dropout.default"]
    # parameters changed on the device path: the compiled model's weights moved like eager's
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-5)
