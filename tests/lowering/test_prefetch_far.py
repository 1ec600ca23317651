"""Far prefetch (lowering/tir/prefetch.py): the first blocks of the last weight-streaming loop
load at the starts of earlier weight-streaming kernels into ``<slots>.far``, and their products
run in groups among the streamed blocks. Checked against eager through torch.compile on shapes
that cross the M and N tile edges (a remainder block after the loop), with the far loads in
the program ahead of the loop, a dropped far block caught, the split's group arithmetic, and
the roofline gate (a prefix that streams more than it computes gets nothing)."""
from __future__ import annotations

import re

import pytest
import torch

import neuron_compiler
from lowering.tir import prefetch
from neuron_compiler.errors import NeuronRunError
from neuron_compiler.program_cache import PROGRAM_CACHE
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim import loops
from runtime_sim.isa import Memory, Op

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model(D: int, N: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    body = []
    for _ in range(layers):
        body += [torch.nn.Linear(D, D), torch.nn.GELU()]
    return torch.nn.Sequential(*body, torch.nn.Linear(D, N, bias=False)).to(torch.bfloat16).eval()


def _far_loads(cg) -> int:
    return sum(1 for st in cg.program.streams.values() for i in loops.materialize(st)
               if i.op is Op.DMA_COPY and i.dst.memory is Memory.SBUF and i.dst.buffer.endswith(".far"))


def _far_run(tmp_path, rows: int, note: str, lost: slice) -> None:
    """Compile the model on trn3 for ``rows`` rows, check the far loads and the tile IR's note
    (a regex), the values against eager, and that the columns ``lost`` halved are caught."""
    m = _model(512, 16384 + 300, 8)
    x = torch.randn(rows, 512, dtype=torch.bfloat16)
    c = torch.compile(m, backend="neuron", options={"target": "trn3", "dump_dir": str(tmp_path)})
    with torch.no_grad(), neuron_compiler.profile() as p:
        y = c(x)
        ref = m(x)
    assert_ran_on_device(p)
    (rec,) = p._parts.values()
    assert _far_loads(rec.compiled) > 0
    (tir,) = tmp_path.rglob("tir.txt")
    assert re.search(note, tir.read_text())
    tol = 2e-2
    atol = tol * ref.float().abs().max().item()
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=atol)
    bad = y.clone()
    bad[:, lost] *= 0.5
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad.float(), ref.float(), rtol=tol, atol=atol)


def test_far_blocks_match_eager(tmp_path):
    # the first (far) block's first product halved
    _far_run(tmp_path, 100, r"# prefetch: \d+ of the \d+ blocks of k\d+\.res ", slice(0, 512))


def test_dropped_far_load_is_caught(monkeypatch):
    """The far blocks' values come from their own loads: without block 0's, the products read
    bytes nothing wrote."""
    import lowering.pipeline as pipeline

    def drop_first_far_load(tp, target, plan=None):
        out, note = prefetch.prefetch_far_weights(tp, target, plan)
        assert note is not None
        body, dropped = [], False
        for s in out.body:
            first = next(ins for ins, _ in prefetch.walk((s,), ()))
            if not dropped and "prefetch of" in first.tag:
                dropped = True
                continue
            body.append(s)
        assert dropped
        return prefetch.dataclasses.replace(out, body=tuple(body), _index={}), note

    monkeypatch.setattr(pipeline, "prefetch_far_weights", drop_first_far_load)
    PROGRAM_CACHE.clear()           # compile again, not the previous test's program
    m = _model(512, 16384 + 300, 8)
    x = torch.randn(100, 512, dtype=torch.bfloat16)
    c = torch.compile(m, backend="neuron", options={"target": "trn3"})
    # the simulator reads SBUF bytes no instruction wrote: an internal error naming the buffer
    with torch.no_grad(), pytest.raises(NeuronRunError, match=r"res\.far"):
        c(x)


def test_groups_split_evenly():
    # 32 blocks: 4 prefetched in 4 groups of 1 with 7 streamed each, or 2 groups of 2 with 14
    assert prefetch._groups(32, 4, 3) == [4, 2]
    assert prefetch._groups(32, 6, 3) == [2]          # 3 per group: at most the 3 slots
    assert prefetch._groups(32, 6, 2) == []
    assert prefetch._groups(32, 5, 3) == []           # 27 streamed blocks: no even split
    assert prefetch._groups(8, 4, 3) == [2]           # 4 groups would stream one block each


def test_one_row_far_blocks_match_eager(tmp_path):
    """A one-row model (a decode step): the last matmul loads each K tile's weight piece beside
    its products; the pass splits the pieces' loads from the products (``<slots>.blk``) first."""
    _far_run(tmp_path, 1, r"# prefetch: \d+ of the \d+ blocks of k\d+\.str\.blk ", slice(0, 1536))


def test_dma_bound_prefix_gets_nothing(monkeypatch):
    """Few products over big weights (one row, 32 MB layers): the kernels before the last one
    stream longer than their chain of work takes, so nothing is prefetched."""
    import lowering.pipeline as pipeline

    m = _model(4096, 16384, 2)
    x = torch.randn(1, 4096, dtype=torch.bfloat16)
    idle, notes = [], []
    orig_idle, orig = prefetch.dma_idle_ns, prefetch.prefetch_far_weights

    def spy_idle(*a):
        idle.append(orig_idle(*a))
        return idle[-1]

    def spy(tp, target, plan=None):
        out, note = orig(tp, target, plan)
        notes.append(note)
        return out, note

    monkeypatch.setattr(prefetch, "dma_idle_ns", spy_idle)
    monkeypatch.setattr(pipeline, "prefetch_far_weights", spy)
    PROGRAM_CACHE.clear()
    c = torch.compile(m, backend="neuron", options={"target": "trn3", "sim_mode": "timing"})
    with torch.no_grad():
        c(x)
    assert idle and all(v == 0 for v in idle), idle
    assert notes and all(n is None for n in notes), notes
