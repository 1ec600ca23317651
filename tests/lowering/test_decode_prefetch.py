"""A load of HBM data that the program writes only later (a decode step's KV cache read before its
one-row update, ``passes/decode_cache.py``) is prefetchable like a weight load
(``tir/analysis.Structure.weight_loads``): it takes the prefetch DMA queues, and its SBUF tiles
live from an earlier kernel (``tir/plan.py``, ``CACHE_STREAMS_AHEAD``), while the scatters that
write the cache later still see every load finish first (eager's values and caches, through the
simulator's race checks). A load of data written *before* it stays on the ordinary queues."""
from __future__ import annotations

import pytest
import torch

from lowering_helpers import assert_close
from lowering.tir.schedule import PREFETCH_LANES
from runtime_sim import EngineKind, Memory
from runtime_sim.targets import get_target
from test_decode_cache_order import _run


def _cache_load_lanes(low, bufs) -> set[int]:
    qpe = get_target("trn2").dma_queues_per_engine
    out = set()
    for q, stream in low.compiled.program.streams.items():
        if q.engine is not EngineKind.DMA:
            continue
        for ins in stream:
            src = ins.srcs[0] if ins.srcs else None
            if (src is not None and src.memory is Memory.HBM and src.buffer in bufs
                    and ins.writes[0].memory is Memory.SBUF):
                out.add(q.index % qpe)
    return out


@pytest.mark.parametrize("on", [True, False])
def test_cache_loads_prefetch_only_when_read_before_the_update(monkeypatch, on):
    import lowering.passes.decode_cache as dc
    monkeypatch.setattr(dc, "ENABLED", on)
    low, ref, _ = _run(12, 1024, 64, 700)
    assert_close(low.outputs[0], ref[0])
    assert torch.equal(low.outputs[1], ref[1]) and torch.equal(low.outputs[2], ref[2])
    lanes = _cache_load_lanes(low, ("in1", "in2"))
    assert lanes, "no cache loads found"
    if on:      # read before the scatters: the prefetch lanes
        assert lanes <= set(range(1, 1 + PREFETCH_LANES)), lanes
    else:       # read after the scatters: ordinary queues, behind the writes
        assert lanes == {0}, lanes


