"""fp8 on the device: casts to and from float8_e4m3fn / float8_e5m2 and ``torch._scaled_mm``,
against eager through the simulator on tile-edge shapes, through ``torch.compile`` with the
ran-on-device assertion.

fp8 results are compared bit for bit (``_bits``): device and eager round the same fp32 value
once; bf16/fp32 results of ``_scaled_mm`` at the per-dtype tolerances of
``neuron_compiler.testing``, which ``test_tolerances_can_fail`` checks against a result that
drops the last K tile. On trn2/trn3 ``_scaled_mm`` runs TensorE's double-row mode (K tiles of
256, ``lowering/tiling/matmul/fp8.py``): tile-edge shapes, trn1 without it, a program that drops
one packed row failing the comparison, and the TensorE time halved against bf16.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lowering_helpers import lower_and_run
from neuron_compiler.testing import assert_close, assert_matches_eager
from runtime_sim.isa import DType
from runtime_sim.memory import cast_to

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.view(torch.uint8), expected.view(torch.uint8)
    nan = actual.float().isnan() & expected.float().isnan()
    bad = (a != e) & ~nan
    assert not bool(bad.any()), (f"{int(bad.sum())} of {e.numel()} fp8 values differ, first at "
                                 f"{bad.nonzero()[0].tolist()}")


def _wide(*shape, seed=0):
    """Values over fp8's whole range and beyond: subnormals, ties, overflow, inf, NaN, -0.0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.empty(shape).uniform_(-14, 12, generator=g))
    flat = x.view(-1)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 448.0, 464.0, 465.0,
                            57344.0, 61440.0, 2.0 ** -10, 2.0 ** -17])
    flat[: special.numel()] = special[: flat.numel()]
    return x


def test_machine_rounding_matches_torch_for_every_bf16_value():
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = bits.float().numpy()
    for dt, mdt in ((E4M3, DType.FP8_E4M3), (E5M2, DType.FP8_E5M2)):
        got = cast_to(x, mdt)
        want = torch.from_numpy(x).to(dt)
        _bits(torch.from_numpy(got.view(np.uint8).copy()).view(dt), want)


@pytest.mark.parametrize("shape", [(1, 1), (127, 129), (128, 513), (3, 129, 5)])
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_casts_round_trip(shape, src, fp8):
    x = _wide(*shape).to(src)
    low = lower_and_run(lambda x: (x.to(fp8), x.to(fp8).to(src)), x)
    _bits(low.outputs[0], x.to(fp8))
    assert_close(low.outputs[1], x.to(fp8).to(src), atol=0.0, rtol=0.0)


@pytest.mark.parametrize("mkn", [(1, 1, 1), (16, 32, 24), (129, 513, 130), (128, 256, 512)])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32, E4M3])
@pytest.mark.parametrize("scales", ["tensor", "rowwise"])
def test_scaled_mm(mkn, out, scales):
    M, K, N = mkn
    g = torch.Generator().manual_seed(M * 7 + K)
    a = (torch.randn(M, K, generator=g) * 3).to(E4M3)
    b = (torch.randn(N, K, generator=g) * 3).to(E4M3)
    if scales == "tensor":
        sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    else:
        sa, sb = torch.rand(M, 1, generator=g) + 0.5, torch.rand(1, N, generator=g) + 0.5
    args = [a, b, sa, sb]
    if out is not E4M3:
        args.append(torch.randn(N, generator=g).to(out))

    def fn(a, b, sa, sb, *bias):
        return torch._scaled_mm(a, b.t(), sa, sb, bias=bias[0] if bias else None, out_dtype=out)

    low = lower_and_run(fn, *args)
    want = fn(*args)
    if out is E4M3:
        # one fp32 rounding apart at most: compare the decoded values one fp8 ulp apart
        assert_close(low.outputs[0].float(), want.float(), rtol=0.125, atol=2.0 ** -9)
    else:
        assert_close(low.outputs[0], want)
    assert any(k.startswith("aten._scaled_mm") for k in low.compiled.ops)


def test_scaled_mm_and_casts_through_torch_compile_run_on_the_device():
    x = torch.randn(130, 513)
    w = torch.randn(129, 513)

    def quantized_linear(x, w, sx, sw):
        xq, wq = (x / sx).to(E4M3), (w / sw).to(E4M3)
        return torch._scaled_mm(xq, wq.t(), sx, sw, out_dtype=torch.bfloat16)

    d = assert_matches_eager(quantized_linear, x, w, torch.tensor(0.02), torch.tensor(0.01))
    assert d["fallback_nodes"] == 0 and d["device_nodes"] >= 3
    assert any("aten._scaled_mm.default" in p["ops"] for p in d["partitions"])
    d = assert_matches_eager(lambda q: q.to(torch.float32) * 2, (torch.randn(64, 129) * 50).to(E5M2))
    assert d["fallback_nodes"] == 0


def test_unsupported_variants_fall_back_with_a_reason():
    from lowering.api import why_unsupported
    from lowering_helpers import trace
    a = torch.randn(16, 32).to(E4M3)
    b = torch.randn(24, 32).to(E4M3)
    gm = trace(lambda a, b, s: torch._scaled_mm(a, b.t(), s, s, scale_result=s, out_dtype=E4M3),
               a, b, torch.tensor(1.0))
    node = next(n for n in gm.graph.nodes if n.op == "call_function" and "scaled_mm" in str(n.target))
    assert "scale_result is not supported" in why_unsupported(node)


def test_tolerances_can_fail():
    """The bf16 comparison used above rejects a scaled_mm that drops its last K tile."""
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(129, 513, generator=g) * 3).to(E4M3)
    b = (torch.randn(513, 130, generator=g) * 3).to(E4M3)
    s = torch.tensor(1.0)
    want = torch._scaled_mm(a, b, s, s, out_dtype=torch.bfloat16)
    dropped = torch._scaled_mm(a[:, :512].contiguous(), b[:512].t().contiguous().t(), s, s,
                               out_dtype=torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close(dropped, want)
    with pytest.raises(AssertionError):       # one fp8 value off by one ulp
        wrong = want.float().to(E4M3).view(torch.uint8).clone()
        wrong[0, 0] += 1
        _bits(wrong.view(E4M3), want.float().to(E4M3))


# ---- TensorE's double-row fp8 mode (lowering/tiling/matmul/fp8.py) --------------------------

def _quantized(M, K, N, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 3).to(E4M3)
    b = (torch.randn(N, K, generator=g) * 3).to(E4M3)
    return a, b


def _smm(out):
    return lambda a, b, s: torch._scaled_mm(a, b.t(), s, s, out_dtype=out)


def _matmul_modes(low) -> tuple[int, int]:
    t = low.dumps["tir.txt"]
    return t.count("perf_mode=double_row"), t.count("perf_mode=none")


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("mkn", [(130, 300, 600), (129, 513, 130), (5, 257, 7), (1, 1, 1)])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_scaled_mm_double_row_over_tile_edges(target, mkn, out):
    """K = 300, 513, 257 leave partial K tiles of 44, 1 and 1 rows past the 256-row tiles
    (odd: the pad row is zeroed); M, N cross 128 and 512."""
    M, K, N = mkn
    a, b = _quantized(M, K, N, seed=M + K + N)
    s = torch.tensor(0.37)
    low = lower_and_run(_smm(out), a, b, s, target=target)
    assert_close(low.outputs[0], _smm(out)(a, b, s))
    dr, plain = _matmul_modes(low)
    assert dr > 0 and plain == 0


def test_scaled_mm_on_trn1_does_not_use_double_row():
    a, b = _quantized(129, 513, 130, seed=3)
    s = torch.tensor(1.0)
    low = lower_and_run(_smm(torch.bfloat16), a, b, s, target="trn1")
    assert_close(low.outputs[0], _smm(torch.bfloat16)(a, b, s))
    dr, plain = _matmul_modes(low)
    assert dr == 0 and plain > 0


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_scaled_mm_double_row_through_torch_compile_runs_on_the_device(target):
    a, b = _quantized(130, 300, 600, seed=11)
    d = assert_matches_eager(_smm(torch.bfloat16), a, b, torch.tensor(0.5), options={"target": target})
    assert d["fallback_nodes"] == 0
    assert any("aten._scaled_mm.default" in p["ops"] for p in d["partitions"])


def test_double_row_tolerance_catches_a_dropped_packed_row(monkeypatch):
    """A known-wrong program: every double-row operand reads its first packed row twice (stride 0
    along the packed axis), dropping the second half of each K tile; the comparison fails."""
    from lowering.tiling.matmul import fp8 as matmul_fp8
    ap = matmul_fp8.KPack.ap

    def drop_second_row(self, tile, kt, elem_offset, fw, width):
        if self.pack == 1:
            return ap(self, tile, kt, elem_offset, fw, width)
        return tile.ap(self.parts(kt), elem_offset=elem_offset, dims=((0, self.pack), (1, fw)))

    monkeypatch.setattr(matmul_fp8.KPack, "ap", drop_second_row)
    a, b = _quantized(129, 513, 130, seed=5)
    s = torch.tensor(1.0)
    low = lower_and_run(_smm(torch.bfloat16), a, b, s, target="trn2")
    with pytest.raises(AssertionError):
        assert_close(low.outputs[0], _smm(torch.bfloat16)(a, b, s))


def test_double_row_halves_the_tensor_engine_time_on_trn2():
    """[1024 x 4096] @ [4096 x 1024], operands laid out with K on the rows ([K, M] and [K, N] in
    HBM: plain DMA loads, no transposes), timing mode. By the cost rule each double-row
    instruction does the work of two bf16 ones in the time of one, so TensorE's busy time is
    1 / fp8_matmul_speedup = 1/2 of the bf16 program's (plus the ramp and LoadStationary, which
    weigh more in the shorter program); the whole program cannot beat that ratio, and here it
    stays PE-bound enough to come within 0.7."""
    import neuron_compiler
    from runtime_sim.targets import TRN2
    M, K, N = 1024, 4096, 1024
    aT, b = torch.randn(K, M), torch.randn(K, N)
    runs = {}
    for kind, fn, args in (("bf16", lambda aT, b: aT.t() @ b, (aT.bfloat16(), b.bfloat16())),
                           ("fp8", lambda aT, b, s: torch._scaled_mm(aT.t(), b, s, s, out_dtype=torch.bfloat16),
                            (aT.to(E4M3), b.to(E4M3), torch.tensor(1.0)))):
        torch._dynamo.reset()
        c = torch.compile(fn, backend="neuron", options={"target": "trn2", "sim_mode": "timing"})
        with neuron_compiler.profile() as p:
            c(*args)
        d = p.to_dict()
        assert d["fallback_nodes"] == 0 and len(d["partitions"]) == 1
        runs[kind] = (d["simulated_time_us"], d["partitions"][0]["engine_busy"]["pe"] * d["simulated_time_us"])
    half = 1 / TRN2.fp8_matmul_speedup
    pe_ratio = runs["fp8"][1] / runs["bf16"][1]
    total_ratio = runs["fp8"][0] / runs["bf16"][0]
    assert half <= pe_ratio <= half * 1.1, runs
    assert half <= total_ratio <= 0.7, runs
