"""A transformers BERT in timing mode: the second call transfers at most 5% of the first.

The default run uses a one-layer BERT (seconds); the full-size bert-base b1 s128 bf16 of issue 6
is the ``slow`` case (about 30 s):

    python -m pytest -m slow tests/test_backend_residency_bert.py -s
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _two_calls(layers: int, seq: int, target: str) -> tuple[dict, dict, int]:
    torch.manual_seed(0)
    cfg = transformers.BertConfig() if layers == 12 else transformers.BertConfig(
        num_hidden_layers=layers)
    model = transformers.BertModel(cfg).eval().to(torch.bfloat16)
    compiled = torch.compile(model, backend="neuron",
                             options={"target": target, "sim_mode": "timing"})
    dicts = []
    for _ in range(2):   # new input ids on each call: nothing but the weights is reused
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        with torch.no_grad(), neuron_compiler.profile() as prof:
            compiled(input_ids=ids)
        dicts.append(assert_ran_on_device(prof, min_device_fraction=0.9))
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in tables)
    return dicts[0], dicts[1], weights


def _check(first: dict, second: dict, weights: int, time_too: bool = True) -> None:
    print(f"\nfirst call : transfer {first['transfer_time_us']:10.1f} us "
          f"{first['transfer_bytes']:>11,d} B  simulated {first['simulated_time_us']:9.1f} us")
    print(f"second call: transfer {second['transfer_time_us']:10.1f} us "
          f"{second['transfer_bytes']:>11,d} B  simulated {second['simulated_time_us']:9.1f} us")
    print(f"second / first: {second['transfer_bytes'] / first['transfer_bytes']:.4f} of the bytes, "
          f"{second['transfer_time_us'] / first['transfer_time_us']:.4f} of the time")
    assert first["warmup"]["graph_calls"] >= 1 and second["warmup"]["graph_calls"] == 0
    assert second["steady_state"]["transfer_bytes"] == second["transfer_bytes"]
    # every weight but the embedding tables (read by eager fallbacks on the host, never sent)
    # was sent on the first call
    assert first["transfer_bytes"] >= weights
    assert second["transfer_bytes"] <= 0.05 * first["transfer_bytes"]
    if time_too:   # one layer: the fixed latency of each small copy weighs more than its bytes
        assert second["transfer_time_us"] <= 0.05 * first["transfer_time_us"]
    assert second["simulated_time_us"] == pytest.approx(first["simulated_time_us"])


def test_one_layer_bert_second_call_transfers_under_5_percent():
    _check(*_two_calls(layers=1, seq=64, target="trn2"), time_too=False)


@pytest.mark.slow
def test_bert_base_second_call_transfers_under_5_percent():
    _check(*_two_calls(layers=12, seq=128, target="trn1"))
