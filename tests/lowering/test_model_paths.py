"""The paths a transformer layer takes between kernels: activation recognition, epilogue fusion
into matmul and attention, residency layouts that differ between writer and reader, operands
transposed straight from SBUF, and the DMA prefetch queues.

Each test checks values against eager through the simulator AND the structure that makes the
path fast (one kernel where there were two, a tensor kept in SBUF, a queue choice), so a
regression to the slow path fails even when the values still match.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lowering.kir import EOp, Expr
from lowering.passes.patterns import _rewrite
from lowering.tir.schedule import PREFETCH_LANES
from lowering_helpers import assert_close, compile_fn, lower_and_run, rand
from runtime_sim.isa import EngineKind, Memory
from runtime_sim.targets import get_target


def _kernels(low) -> list[str]:
    return [ln.split("= ", 1)[1].split("[", 1)[0] for ln in low.dumps["ir_post_fusion.txt"].splitlines()
            if " = " in ln]


def _notes(low) -> list[str]:
    return [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]


def gelu_new(x):
    """transformers' NewGELUActivation, written out as GPT-2 does."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# ---- activation recognition -----------------------------------------------------------------

X = Expr(EOp.LOAD, index=0)


def _c(v):
    return Expr(EOp.CONST, value=v)


def _m(a, b):
    return Expr(EOp.MUL, (a, b))


def _a(a, b):
    return Expr(EOp.ADD, (a, b))


def _tanh_gelu(inner_cube, outer):
    inner = _m(_c(math.sqrt(2 / math.pi)), _a(X, _m(_c(0.044715), inner_cube)))
    return outer(_a(Expr(EOp.TANH, (inner,)), _c(1.0)))


@pytest.mark.parametrize("cube", ["pow", "x*x*x"])
@pytest.mark.parametrize("outer", ["0.5*x*t", "x*t*0.5", "(x*0.5)*t"])
def test_tanh_gelu_written_out_is_recognised_in_any_grouping(cube, outer):
    c = Expr(EOp.POW, (X, _c(3.0))) if cube == "pow" else _m(_m(X, X), X)
    o = {"0.5*x*t": lambda t: _m(_m(_c(0.5), X), t), "x*t*0.5": lambda t: _m(_m(X, t), _c(0.5)),
         "(x*0.5)*t": lambda t: _m(_m(X, _c(0.5)), t)}[outer]
    assert _rewrite(_tanh_gelu(c, o)) == Expr(EOp.GELU_TANH, (X,))


@pytest.mark.parametrize("wrong", ["cubic 0.05", "half 0.6", "square"])
def test_near_misses_of_tanh_gelu_are_left_alone(wrong):
    cube = _m(X, X) if wrong == "square" else Expr(EOp.POW, (X, _c(3.0)))
    k = 0.05 if wrong == "cubic 0.05" else 0.044715
    h = 0.6 if wrong == "half 0.6" else 0.5
    inner = _m(_c(math.sqrt(2 / math.pi)), _a(X, _m(_c(k), cube)))
    e = _m(_m(_c(h), X), _a(Expr(EOp.TANH, (inner,)), _c(1.0)))
    assert _rewrite(e) == e


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_then_written_out_gelu_is_one_matmul_with_the_activation_on_evacuation(dtype):
    x, w, b = rand(129, 200, dtype=dtype), rand(200, 600, dtype=dtype) * 0.1, rand(600, dtype=dtype)
    fn = lambda x, w, b: gelu_new(torch.addmm(b, x, w))       # noqa: E731
    low = lower_and_run(fn, x, w, b)
    assert _kernels(low) == ["matmul"], low.dumps["ir_post_fusion.txt"]
    assert "gelu_tanh" in low.dumps["ir_post_fusion.txt"]
    # eager rounds each of the eight ops; the activation rounds once (bf16: within its tolerance)
    assert_close(low.outputs[0], fn(x, w, b))
    exact = F.gelu(torch.addmm(b.float(), x.float(), w.float()), approximate="tanh")
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert_close(low.outputs[0].float(), exact, rtol=tol, atol=tol)


def test_bias_folded_once_when_the_epilogue_uses_the_sum_twice():
    """silu(x @ w + b) reads the biased product twice; the bias row joins PSUM exactly once."""
    x, w, b = rand(129, 96, seed=1), rand(96, 200, seed=2) * 0.1, rand(200, seed=3)
    fn = lambda x, w, b: F.silu(torch.addmm(b, x, w))          # noqa: E731
    low = lower_and_run(fn, x, w, b)
    assert _kernels(low) == ["matmul"]
    assert_close(low.outputs[0], fn(x, w, b))


def test_bias_not_folded_when_the_bare_product_is_used_too():
    x, w, b = rand(130, 64, seed=4), rand(64, 96, seed=5) * 0.1, rand(96, seed=6)
    fn = lambda x, w, b: (lambda y: (y + b) * y)(x @ w)        # noqa: E731
    low = lower_and_run(fn, x, w, b)
    assert _kernels(low) == ["matmul"]
    assert_close(low.outputs[0], fn(x, w, b))


# ---- attention epilogue, residency across layouts, resident transposes ------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_heads_merged_and_projected_stay_in_sbuf(dtype):
    """sdpa -> transpose(1, 2) -> [S, H*D] -> @ w: the head merge (and cast) is the attention's
    epilogue, the merged heads stay in SBUF although the attention writes [H, S, D] blocks of
    what the projection reads as rows of H*D, and the projection transposes them on TensorE."""
    B, H, S, D = 1, 3, 129, 32
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3))
    w = (torch.randn(H * D, 80, generator=g) * 0.1).to(dtype)

    def fn(q, k, v, w):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, S, H * D) @ w

    low = lower_and_run(fn, q, k, v, w)
    assert _kernels(low) == ["attention", "matmul"], low.dumps["ir_post_fusion.txt"]
    notes = _notes(low)
    assert any(n.startswith("# resident in SBUF") for n in notes), notes
    assert any("A resident_transpose" in n for n in notes), notes
    assert_close(low.outputs[0], fn(q, k, v, w), scale=4.0)


# ---- prefetch queues --------------------------------------------------------------------------

def test_weight_loads_take_the_prefetch_queues_and_stores_do_not():
    x, w1, w2 = rand(256, 192, seed=8), rand(192, 384, seed=9) * 0.1, rand(384, 160, seed=10) * 0.1
    fn = lambda x, w1, w2: torch.relu(x @ w1) @ w2             # noqa: E731
    low = lower_and_run(fn, x, w1, w2)
    assert_close(low.outputs[0], fn(x, w1, w2))
    qpe = get_target("trn2").dma_queues_per_engine
    lanes: dict[str, set[int]] = {}
    for q, stream in low.compiled.program.streams.items():
        if q.engine is not EngineKind.DMA:
            continue
        for ins in stream:
            src, dst = ins.srcs[0], ins.writes[0]
            kind = ("weight" if src.memory is Memory.HBM and src.buffer in ("in1", "in2")
                    else "store" if dst.memory is Memory.HBM else "other")
            lanes.setdefault(kind, set()).add(q.index % qpe)
    # weights on the prefetch lanes, where no transfer that waits for compute holds them up
    assert lanes["weight"] and lanes["weight"] <= set(range(1, 1 + PREFETCH_LANES)), lanes
    assert lanes["store"] == {0}, lanes


def test_weights_stream_in_during_the_previous_matmul_across_a_norm():
    """mm -> layer_norm -> mm: the second matmul's weight buffers live from the start of the
    first matmul (the previous weight-streaming kernel), not just from the norm kernel before
    it, so their bytes never wait for the first matmul's buffers (plan.weight_buffers)."""
    x, w1, w2 = rand(256, 192, seed=1), rand(192, 384, seed=2) * 0.1, rand(384, 256, seed=3) * 0.1
    fn = lambda x, w1, w2: F.layer_norm(x @ w1, (384,)) @ w2   # noqa: E731
    low = lower_and_run(fn, x, w1, w2)
    assert _kernels(low) == ["matmul", "layer_norm", "matmul"]
    assert_close(low.outputs[0], fn(x, w1, w2))
    spans: dict[str, tuple[int, int]] = {}
    for ln in low.dumps["memory_plan.txt"].splitlines():
        f = ln.split()
        if len(f) > 5 and f[0] == "sbuf" and f[2].startswith("@"):
            off = int(f[2][1:] or f[3])
            rest = f[3:] if f[2] != "@" else f[4:]
            spans[f[1]] = (off, off + int(rest[0]) * int(rest[2]))
    # the second matmul's weight tiles: loaded from in2 (the program's third input)
    loads = {ins.writes[0].buffer for q, s in low.compiled.program.streams.items()
             if q.engine is EngineKind.DMA for ins in s if ins.srcs and ins.srcs[0].buffer == "in2"}
    assert loads, loads
    for w in loads:
        lo, hi = spans[w]
        for name, (a, b) in spans.items():
            if name.startswith("k0."):
                assert b <= lo or hi <= a, (w, spans[w], name, (a, b))


# ---- TensorE-transposed weights load whole rows (trn1 has no DMA transpose) --------------------

@pytest.mark.parametrize("shape", [(130, 300, 200), (64, 1000, 520)], ids=lambda s: "x".join(map(str, s)))
def test_transposed_weight_rows_are_staged_in_big_loads_on_trn1(shape):
    """x @ W^T on trn1: W's rows are loaded [128 rows, all of K] per DMA (not a [128, 128] tile
    per K tile, which the DMA fixed cost dominates) and transposed on TensorE from SBUF."""
    M, K, N = shape
    x, w, b = rand(M, K, seed=11), rand(N, K, seed=12) * 0.05, rand(N, seed=13)
    fn = lambda x, w, b: F.linear(x, w, b)                     # noqa: E731
    low = lower_and_run(fn, x, w, b, target="trn1")
    assert _kernels(low) == ["matmul"]
    tir = low.dumps["tir.txt"]
    assert "pe_transpose" in tir and "k0.stage" in tir, _notes(low)
    assert_close(low.outputs[0], fn(x, w, b))
    # W is read in loads of whole rows: at most one per 128 weight rows and pass over W (not
    # one per K tile as well)
    w_loads = sum(1 for q, s in low.compiled.program.streams.items() if q.engine is EngineKind.DMA
                  for ins in s if ins.srcs and ins.srcs[0].buffer == "in1")
    assert w_loads <= -(-N // 128) * -(-M // 128), w_loads


def test_weights_of_a_matmul_keep_every_block_in_its_own_slot_when_they_fit():
    """A resident-B matmul over weights (a graph input) of three blocks: each block has its own
    slot (block_bufs = 3, in the dump's note and the memory plan), so no weight load waits for
    the products of an earlier block; values match eager."""
    x = rand(128, 768, seed=4).to(torch.bfloat16)
    w = (rand(768, 3072, seed=5) * 0.05).to(torch.bfloat16)
    fn = lambda x, w: F.layer_norm(x, (768,)) @ w               # noqa: E731
    low = lower_and_run(fn, x, w)
    note = next(n for n in _notes(low) if "matmul 1 x [128x768]" in n)
    assert "chose resident=B block=2" in note and "block_bufs=3" in note.split(";")[1], note
    assert any(ln.split()[1] == "k1.res" and " 3 x " in ln
               for ln in low.dumps["memory_plan.txt"].splitlines()[3:]), low.dumps["memory_plan.txt"]
    # every weight load is free of waits on TensorE (no slot is reused within the kernel)
    pe_sems = {s for q, st in low.compiled.program.streams.items() if q.engine is EngineKind.TENSOR
               for ins in st for s in ins.signals}
    for q, st in low.compiled.program.streams.items():
        for ins in st:
            if q.engine is EngineKind.DMA and ins.srcs and ins.srcs[0].buffer == "in1":
                assert not {w for w, _ in ins.waits} & pe_sems, ins
    assert_close(low.outputs[0], fn(x, w), scale=4.0)


def test_big_weight_loads_of_consecutive_matmuls_share_one_queue_in_program_order():
    """The weight stream (schedule._streams): loads whose data phase outlasts the descriptor
    generation go to one queue, so the second matmul's weights are issued after the first's
    (the engines serve transfers in issue order) instead of sharing the engines with them."""
    x = rand(128, 768, seed=6).to(torch.bfloat16)
    w1 = (rand(768, 3072, seed=7) * 0.05).to(torch.bfloat16)
    w2 = (rand(3072, 768, seed=8) * 0.05).to(torch.bfloat16)
    fn = lambda x, w1, w2: torch.relu(F.layer_norm(x, (768,)) @ w1) @ w2   # noqa: E731
    low = lower_and_run(fn, x, w1, w2)
    assert_close(low.outputs[0], fn(x, w1, w2), scale=4.0)
    queues = {}
    for q, st in low.compiled.program.streams.items():
        for i, ins in enumerate(st):
            if q.engine is EngineKind.DMA and ins.srcs and ins.srcs[0].buffer in ("in1", "in2") \
                    and ins.writes[0].partitions == 128:
                queues.setdefault(ins.srcs[0].buffer, []).append((q, i))
    assert set(queues) == {"in1", "in2"}, queues
    (q1,), (q2,) = {q for q, _ in queues["in1"]}, {q for q, _ in queues["in2"]}
    assert q1 == q2, queues
    assert max(i for _, i in queues["in1"]) < min(i for _, i in queues["in2"]), queues


def test_resident_rows_are_transposed_once_for_every_block_of_the_weights():
    """x (resident in SBUF) @ W over three weight blocks: x's K tiles are transposed on TensorE
    once (6 transposes for K = 768), not once per block (18), and the values match eager."""
    x = rand(128, 768, seed=9).to(torch.bfloat16)
    w = (rand(768, 3072, seed=10) * 0.05).to(torch.bfloat16)
    fn = lambda x, w: F.layer_norm(x, (768,)) @ w               # noqa: E731
    low = lower_and_run(fn, x, w)
    assert_close(low.outputs[0], fn(x, w), scale=4.0)
    _, res = low.compiled.run(None, mode="timing", trace=True)
    n_tp = sum(1 for e in res.trace if e.queue == "pe" and e.name == "transpose")
    assert n_tp == 6, n_tp
