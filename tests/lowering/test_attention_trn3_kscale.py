"""SDPA on trn3 with VectorE's fast exponential: K^T is scaled by the softmax scale on load,
and the next head's K^T/V blocks load one key block per query unit of the current head, their
scale on the engine that least lengthens a unit's busiest engine (``attention.plan.
spare_engine``), against eager through the simulator (functional mode: the race detector checks
the K/V sets' reuse across heads).

Shapes cross the tile edges: 1100 keys (two full key blocks of 512 and a partial one of 76),
queries 1100 and 260 (several units per head, and fewer units than key blocks), five heads (the
sets alternate, an odd head ends the loop), head dims 64 and 128, bf16.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run


@pytest.mark.parametrize("Sq,D", [(1100, 128), (260, 64)])
def test_next_head_kv_loaded_block_by_block(Sq, D):
    g = torch.Generator().manual_seed(Sq + D)
    q = torch.randn(1, 5, Sq, D, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 5, 1100, D, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 5, 1100, D, generator=g).to(torch.bfloat16)
    low = lower_and_run(F.scaled_dot_product_attention, q, k, v, target="trn3")
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("VectorE's fast exponential" in n and "K^T scaled" in n for n in notes), notes
    ref = F.scaled_dot_product_attention(q, k, v)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()
    bad[:, 3] *= 0.5                      # one head's values halved: the tolerance must see it
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


def test_scale_goes_where_the_unit_has_room():
    """The K^T scale goes to the engine where it least lengthens a unit's busiest engine: with
    the plan's own busy times (four key blocks' exps split between VectorE and ScalarE, every
    row max on VectorE) never to the busiest of the two. When VectorE is the busiest, the
    cheapest instruction there (VectorE's 4x bf16 mode) lengthens the unit; ScalarE's does not,
    as long as ScalarE has that much room. With ScalarE as busy as VectorE, VectorE's cheaper
    instruction is the better place."""
    from lowering.tiling.attention.plan import block_busy, exp_plan, spare_engine
    from lowering.tiling.attention.steps import KB
    from runtime_sim.isa import AluOp, DType, EngineKind, Memory
    from runtime_sim.targets import TARGETS
    t = TARGETS["trn3"]
    kbs = tuple((c * KB, KB) for c in range(4))
    nv, na, ones = exp_plan(t, kbs, 128, 128, DType.BF16, DType.BF16)
    assert 0 < nv < len(kbs), (nv, na, ones)
    busy = block_busy(t, kbs, 128, 128, DType.BF16, DType.BF16, nv, na, ones, tensor=False, close=True)

    def emit(s, e):
        x = s.tile("k", Memory.SBUF, 128, KB, DType.BF16, 1).ap()
        s.tensor_scalar(x, x, AluOp.MULTIPLY, 0.5, engines=(e,))
    v, a = EngineKind.VECTOR, EngineKind.SCALAR
    busiest = max((v, a), key=busy.get)
    assert spare_engine(t, busy, emit, (v, a)) is not busiest, busy
    busy = {**busy, v: max(busy.values())}      # VectorE the busiest
    roomy = {**busy, a: busy[v] / 2}
    assert spare_engine(t, roomy, emit, (v, a)) is a
    assert spare_engine(t, {**busy, a: busy[v]}, emit, (v, a)) is v
