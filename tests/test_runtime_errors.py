"""Run-time failures of a device partition, through ``torch.compile``: a machine error the
simulator raises while running a (hand-broken) program is a ``NeuronRunError`` naming the graph,
the partition, the instruction and its ATen op; bad inputs (meta tensors in functional mode,
tensors beyond the target's HBM) are refused before any simulation starts."""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import neuron_compiler
from neuron_compiler.errors import NeuronInputError, NeuronInternalError, NeuronRunError
from neuron_compiler.runtime import PROGRAM_CACHE, hbm_capacity_bytes
from runtime_sim.errors import MachineError
from runtime_sim.isa import Program
from runtime_sim.targets import get_target


def _programs() -> list:
    return [p for p in PROGRAM_CACHE._entries.values() if p.compiled is not None]


def _without_waits(program: Program) -> Program:
    """``program`` with every semaphore wait dropped: engines no longer wait for the DMA that
    fills their operands (a race, or a read of never-written memory)."""
    flat = program.flat()
    streams = {q: tuple(dataclasses.replace(i, waits=()) for i in s)
               for q, s in flat.streams.items()}
    return dataclasses.replace(flat, streams=streams)


@pytest.mark.parametrize("mode", ["functional", "timing"])
def test_machine_error_at_run_time_names_partition_and_op(fresh_dynamo, mode):
    PROGRAM_CACHE.clear()
    f = torch.compile(lambda x, w: torch.relu(x @ w) * 2.0, backend="neuron",
                      options={"sim_mode": mode})
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 96, generator=g), torch.randn(96, 80, generator=g)
    # fp32 products summed in another order than the CPU's: the project's fp32 tolerance (an
    # unseeded draw once gave a 4e-5 relative difference on a near-cancelling element)
    torch.testing.assert_close(f(x, w), torch.relu(x @ w) * 2.0, rtol=1e-4, atol=1e-4)
    progs = _programs()
    assert len(progs) == 1
    compiled = progs[0].compiled
    compiled.program = _without_waits(compiled.program)
    compiled._timing = None                      # timing mode simulates the broken program
    if mode == "timing":                         # its static checks see bounds, not races
        first = next(q for q in compiled.program.streams if str(q).startswith("dma"))
        ins = compiled.program.streams[first]
        bad = dataclasses.replace(ins[0].srcs[0], partition_start=7)
        compiled.program.streams[first] = (dataclasses.replace(ins[0], srcs=(bad,)),) + ins[1:]
    with pytest.raises(NeuronRunError) as info:
        f(x, w)
    err = info.value
    assert isinstance(err, NeuronInternalError) and isinstance(err.__cause__, MachineError)
    msg = str(err)
    assert msg.startswith("internal error running device partition "), msg
    assert f"/{err.partition} (" in msg and err.graph in msg
    assert "float32[64, 96]" in msg                              # the signature
    assert err.instruction is not None and err.instruction in msg
    assert err.rule == err.__cause__.rule and err.rule in msg
    # the instruction's tag names the node it came from: the op is named, not every op
    tag = err.__cause__.instr.tag
    assert tag and any(op.startswith("aten.") for op in err.ops), (err.ops, tag)
    assert all("(node " in op for op in err.ops), err.ops


def test_meta_input_in_functional_mode_is_refused(fresh_dynamo):
    f = torch.compile(lambda x: torch.relu(x) + 1.0, backend="neuron")
    with pytest.raises(NeuronInputError, match=r"input \w+ \(float32\[4, 8\]\) is on the meta "
                                               r"device.*sim_mode='timing'"):
        f(torch.empty(4, 8, device="meta"))


def test_meta_input_in_timing_mode_is_timed(fresh_dynamo):
    f = torch.compile(lambda x: torch.relu(x) + 1.0, backend="neuron",
                      options={"sim_mode": "timing"})
    with neuron_compiler.profile() as prof:
        y = f(torch.empty(4, 8, device="meta"))
    assert y.device.type == "meta" and y.shape == (4, 8)
    assert prof.to_dict()["simulated_time_us"] > 0


def test_hbm_capacity_is_one_core_share_of_the_chip():
    gib = 1 << 30
    assert [hbm_capacity_bytes(get_target(t)) for t in ("trn1", "trn2", "trn3")] == [
        16 * gib, 12 * gib, 18 * gib]


def test_partition_beyond_hbm_fails_fast(fresh_dynamo):
    """512 GiB of zeros: refused in seconds (it used to run for hours), naming the buffer, its
    bytes and the capacity."""
    f = torch.compile(lambda: torch.zeros(2 ** 37).sum(), backend="neuron")
    t0 = time.perf_counter()
    with pytest.raises(NeuronInputError) as info:
        f()
    assert time.perf_counter() - t0 < 30
    msg = str(info.value)
    assert f"{4 * 2 ** 37:,} bytes" in msg and f"{12 << 30:,} bytes of one trn2" in msg, msg
    assert "buffer " in msg and "temporaries" in msg


def test_inputs_beyond_hbm_are_refused_before_compiling(fresh_dynamo, monkeypatch):
    """Inputs alone past the capacity: refused before the lowering runs (capacity lowered to
    keep the test small)."""
    import neuron_compiler.runtime as rt
    monkeypatch.setattr(rt, "hbm_capacity_bytes", lambda target: 1000)
    lowered = []
    monkeypatch.setattr(rt.DevicePartition, "_prepare",
                        lambda *a: lowered.append(a) or pytest.fail("compiled"))
    f = torch.compile(lambda x, y: x * y + 1.0, backend="neuron")
    with pytest.raises(NeuronInputError, match=r"its inputs need 2,048 bytes of HBM, more than "
                                               r"the 1,000 bytes.*arg\w* \(float32\[16, 16\]\): 1,024 bytes"):
        f(torch.randn(16, 16), torch.randn(16, 16))
    assert not lowered
