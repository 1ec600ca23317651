"""Fused attention: matmul -> softmax -> matmul (written out, or scaled_dot_product_attention)
becomes one ATTENTION kernel (online softmax over key blocks) that matches eager.

Shapes cross the tile edges: query rows 1 / 128 / 129 / 300 (blocks of 128, groups of them),
keys 1 / 700 / 1537 / 2048 / 2600 (blocks of 512; >= 3 full blocks run the software-pipelined
key loop, the rest its unrolled remainder), head widths 16 / 64 / 128.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run

CASES = [(1, 2, 200, 700, 64), (2, 1, 128, 128, 128), (1, 1, 1, 1, 16), (1, 1, 300, 2048, 64),
         (1, 1, 129, 2600, 32), (1, 1, 64, 1537, 16)]


def _kernels(low) -> list[str]:
    return [ln.split("= ", 1)[1].split("[", 1)[0] for ln in low.dumps["ir_post_fusion.txt"].splitlines()
            if " = " in ln]


def _written(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("form", ["sdpa", "written"])
def test_attention_is_one_kernel_and_matches_eager(form, shape, dtype):
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S * 7 + Sk)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (S, Sk, Sk))
    fn = F.scaled_dot_product_attention if form == "sdpa" else _written
    low = lower_and_run(fn, q, k, v)
    assert _kernels(low) == ["attention"], low.dumps["ir_post_fusion.txt"]
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()       # the tolerance can fail: drop the last query row
    bad[..., -1, :] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


def test_attention_with_an_additive_mask():
    """A mask added to the scores stays in the score expression of the fused kernel."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (130, 600, 600))
    mask = torch.randn(1, 2, 130, 600, generator=g)
    fn = lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) * 0.2 + m, dim=-1) @ v  # noqa: E731
    low = lower_and_run(fn, q, k, v, mask)
    assert _kernels(low) == ["attention"], low.dumps["ir_post_fusion.txt"]
    assert_close(low.outputs[0], fn(q, k, v, mask))


def test_fully_masked_rows_are_nan_in_softmax_and_zero_in_safe_softmax():
    """A row whose scores are all -inf: eager softmax gives NaN, SDPA's _safe_softmax 0."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g) for n in (5, 700, 700))
    mask = torch.zeros(1, 1, 5, 700)
    mask[..., 2, :] = float("-inf")
    written = lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) + m, dim=-1) @ v  # noqa: E731
    low = lower_and_run(written, q, k, v, mask)
    ref = written(q, k, v, mask)
    assert torch.isnan(ref[..., 2, :]).all()
    assert_close(low.outputs[0], ref)
    boolmask = mask == 0
    sdpa = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    low = lower_and_run(sdpa, q, k, v, boolmask)
    ref = sdpa(q, k, v, boolmask)
    assert (ref[..., 2, :] == 0).all()
    assert_close(low.outputs[0], ref)


def test_probabilities_read_twice_are_not_fused():
    """The softmax output is also returned: the pattern stays three kernels, and the dump says
    why."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 64, 16, generator=g) for _ in range(3))

    def fn(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return p @ v, p

    low = lower_and_run(fn, q, k, v)
    assert "attention" not in _kernels(low)
    out, p = fn(q, k, v)
    assert_close(low.outputs[0], out)
    assert_close(low.outputs[1], p)


@pytest.mark.parametrize("shape", [(1, 2, 128, 128, 64), (1, 1, 300, 300, 32), (1, 1, 1100, 1100, 16),
                                   (1, 1, 200, 700, 16)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("form", ["sdpa", "written"])
def test_causal_attention_skips_hidden_blocks_and_matches_eager(form, shape):
    """A causal mask (SDPA's is_causal, or the tril mask a GPT writes out) becomes the kernel's
    causal flag: hidden key blocks are skipped, diagonal blocks get a precomputed mask."""
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S + Sk)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (S, Sk, Sk))
    if form == "sdpa":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    else:
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2) * D ** -0.5
            keep = torch.ones(S, Sk, dtype=torch.bool).tril()
            return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v
    low = lower_and_run(fn, q, k, v)
    post = low.dumps["ir_post_fusion.txt"]
    assert _kernels(low)[-1] == "attention" and "causal=True" in post, post
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)


PIPELINED = [(1, 2, 1024, 3000, 64, False, torch.bfloat16), (1, 1, 1100, 2600, 32, False, torch.bfloat16),
             (1, 1, 2560, 2560, 32, True, torch.bfloat16), (1, 1, 3072, 3072, 16, True, torch.bfloat16)]


@pytest.mark.parametrize("shape", PIPELINED, ids=lambda s: "x".join(map(str, s[:5])) + ("c" if s[5] else "")
                         + ("-fp32" if s[6] is torch.float32 else ""))
def test_groups_are_pipelined_across_groups_and_match_eager(shape):
    """Long sequences: the next group's state, Q and first key block are issued ahead of the
    previous group's last stage (a partial last group on the shared buffers; causal groups with
    odd key-block counts continue the slot parities from group to group)."""
    *dims, causal, dtype = shape
    _sdpa_on_path(dims, causal, dtype, dims[2] + 7 * dims[3], "pipelined across groups")


ITEMS = [(1, 12, 128, 128, 64, True), (2, 3, 200, 300, 32, False), (1, 5, 64, 64, 160, False),
         (1, 4, 129, 129, 16, True), (1, 3, 100, 100, 16, False)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", ITEMS, ids=lambda s: "x".join(map(str, s[:5])) + ("c" if s[5] else ""))
def test_heads_of_one_key_block_are_pipelined_across_items(shape, dtype):
    """Short sequences (every query in one group, every key in one block): the heads
    themselves are software-pipelined, several in flight (odd counts, two query blocks,
    D > 128, causal or not)."""
    *dims, causal = shape
    _sdpa_on_path(dims, causal, dtype, dims[2] * 3 + dims[1], "items software-pipelined")


def _sdpa_on_path(dims, causal: bool, dtype, seed: int, note: str) -> None:
    """SDPA of [B, H, S, D] queries over Sk keys is one attention kernel whose tiling notes
    contain ``note`` (the path taken), and matches eager."""
    B, H, S, Sk, D = dims
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (S, Sk, Sk))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    low = lower_and_run(fn, q, k, v)
    assert _kernels(low) == ["attention"]
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any(note in n for n in notes), notes
    assert_close(low.outputs[0], fn(q, k, v))


ROWS = [(1, 2, 200, 700, 64, torch.bfloat16), (1, 1, 300, 2048, 64, torch.bfloat16),
        (2, 1, 129, 1100, 128, torch.bfloat16), (1, 3, 384, 1536, 16, torch.bfloat16)]


@pytest.mark.parametrize("shape", ROWS, ids=lambda s: "x".join(map(str, s[:5])) + ("-fp32" if s[5] is torch.float32 else ""))
def test_whole_score_rows_take_the_two_phase_softmax_and_match_eager(shape):
    """Unmasked attention over at most four key blocks (2048 keys): every score of a query
    block stays in PSUM, no running statistics; partial query and key blocks. (fp32 operands
    take TensorE transposes of Q and K, whose banks leave too few for whole rows.)"""
    *dims, dtype = shape
    _sdpa_on_path(dims, False, dtype, dims[2] + 3 * dims[3], "two-phase softmax")


def test_two_phase_softmax_with_fully_masked_rows_is_zero_in_safe_softmax():
    """A score expression (a bool mask) on the two-phase path: a row with no visible key ends
    as 0 (m clamped to the lowest finite value, the sum to the smallest normal)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g).to(torch.bfloat16) for n in (200, 700, 700))
    keep = torch.rand(1, 2, 200, 700, generator=g) > 0.3
    keep[:, 1, 150, :] = False
    sdpa = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    low = lower_and_run(sdpa, q, k, v, keep)
    assert any("two-phase softmax" in ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# "))
    ref = sdpa(q, k, v, keep)
    assert (ref[:, 1, 150, :] == 0).all()
    assert_close(low.outputs[0], ref)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_adjacent_narrow_heads_load_q_and_k_two_heads_per_transpose(causal):
    """Heads of 64 features side by side in one row, as a fused QKV projection leaves them:
    Q^T and K^T of two heads come in one DMA transpose each, every head reading its half of the
    partitions; the result matches eager (a partial query block, 10 heads)."""
    g = torch.Generator().manual_seed(13)
    H, S, D = 10, 120, 64
    qkv = torch.randn(1, S, 3 * H * D, generator=g).to(torch.bfloat16)

    def fn(qkv):
        q, k, v = (t.view(1, S, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    low = lower_and_run(fn, qkv)
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("two heads per DMA transpose" in n for n in notes), notes
    assert "attention" in _kernels(low)
    assert_close(low.outputs[0], fn(qkv))


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_resident_projection_heads_are_paired_on_tensor_engine(target):
    """The fused QKV projection computed in the same partition (its output stays in SBUF): Q^T
    and K^T of two heads come by TensorE transposes of the resident rows (no DMA transpose), and
    the causal attention still matches eager over a partial query block; a dropped head fails."""
    g = torch.Generator().manual_seed(17)
    H, S, D, E = 6, 100, 64, 200
    x = torch.randn(1, S, E, generator=g).to(torch.bfloat16)
    w = (torch.randn(E, 3 * H * D, generator=g) * E ** -0.5).to(torch.bfloat16)

    def fn(x, w):
        q, k, v = (t.view(1, S, H, D).transpose(1, 2) for t in (x @ w).split(H * D, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    low = lower_and_run(fn, x, w, target=target)
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("two heads per TensorE transpose of their SBUF-resident rows" in n for n in notes), notes
    prog = low.dumps["program.txt"]
    assert ".pairT[" in prog
    assert not any("transpose=True" in ln and "pairs[" in ln for ln in prog.splitlines())
    ref = fn(x, w)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()
    bad[:, 3] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


def test_fully_masked_rows_of_pipelined_heads_are_zero_in_safe_softmax():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 3, n, 16, generator=g) for n in (5, 70, 70))
    keep = torch.ones(1, 3, 5, 70, dtype=torch.bool)
    keep[:, 1, 2, :] = False
    sdpa = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    low = lower_and_run(sdpa, q, k, v, keep)
    ref = sdpa(q, k, v, keep)
    assert (ref[:, 1, 2, :] == 0).all()
    assert_close(low.outputs[0], ref)


def test_causal_mask_of_pipelined_heads_is_added_on_tensor_engine():
    """Short causal heads: the diagonal mask enters the scores as an accumulating product with
    the identity (no masked copy of the scores in SBUF), and the result still matches eager."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 6, 128, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    low = lower_and_run(fn, q, k, v)
    prog = low.dumps["program.txt"]
    assert any("matmul" in ln and ".ident[" in ln and ".mask0[" in ln and "bfloat16" in ln
               for ln in prog.splitlines()), prog[:2000]
    assert ".cm[" not in prog
    assert_close(low.outputs[0], fn(q, k, v))


@pytest.mark.parametrize("shape", ROWS, ids=lambda s: "x".join(map(str, s[:5])))
def test_trn3_takes_exps_on_the_vector_engine_and_runs_transposes_in_the_background(shape):
    """On trn3 (NeuronCore-v4) the two-phase softmax gives some key blocks' exps to VectorE's
    fast exponential (K^T carries the scale, which that instruction has no operand for), and
    the P^T transposes of a query block sit between the next block's products, where TensorE's
    background lane runs them. Values match eager (a dropped row must fail the tolerance)."""
    *dims, dtype = shape
    B, H, S, Sk, D = dims
    g = torch.Generator().manual_seed(S + Sk)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (S, Sk, Sk))
    fn = F.scaled_dot_product_attention
    low = lower_and_run(fn, q, k, v, target="trn3")
    assert _kernels(low) == ["attention"]
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("fast exponential" in n for n in notes), notes
    program = low.dumps["program.txt"]
    assert " exponential" in program or "exponential(" in program, "no VectorE exponential emitted"
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()
    bad[..., -1, :] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


CAUSAL_ROWS = [(1, 2, 1536, 1536, 64), (1, 3, 1024, 1024, 32), (2, 1, 700, 900, 64), (1, 2, 700, 700, 128)]


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("shape", CAUSAL_ROWS, ids=lambda s: "x".join(map(str, s)))
def test_causal_whole_rows_take_only_the_visible_key_blocks_and_match_eager(shape, target):
    """Causal attention over at most 2048 keys takes the two-phase path: each query block's
    products stop at its last row's diagonal, the diagonal's mask goes into the scores on
    TensorE (partial query blocks, diagonals inside and at the end of a key block)."""
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S + 5 * Sk)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(torch.bfloat16) for n in (S, Sk, Sk))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    low = lower_and_run(fn, q, k, v, target=target)
    assert _kernels(low) == ["attention"]
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("visible key blocks only" in n for n in notes), notes
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()         # the tolerance can fail: the first row sees key 0 only
    bad[..., 0, :] = v[..., 1, :]
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


@pytest.mark.parametrize("shape", [(1, 2, 384, 2048, 128), (2, 1, 300, 1900, 128)], ids=lambda s: "x".join(map(str, s)))
def test_tensor_bound_rows_take_one_key_block_by_dma_transposes_on_trn2(shape):
    """On trn2 (no background transposes) a query block whose TensorE work is its busiest
    engine's takes its first key block's P^T by SBUF -> SBUF DMA transposes; values match
    eager (partial query and key blocks)."""
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S + 3 * Sk)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(torch.bfloat16) for n in (S, Sk, Sk))
    fn = F.scaled_dot_product_attention
    low = lower_and_run(fn, q, k, v, target="trn2")
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("P^T by DMA transposes" in n for n in notes), notes
    assert "transpose=True" in low.dumps["program.txt"]
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()
    bad[..., 5, :] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)
