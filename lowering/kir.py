"""Kernel-level IR: whole-tensor kernels over strided HBM tensors.

Grammar
```
KProgram = (buffers: {name: HbmTensor}, kernels: KOp*, inputs: name*, outputs: TensorRef*)
HbmTensor = (name, numel, dtype, role: input|output|temp)
TensorRef = (buffer, dtype, shape, strides, offset)          # a strided view, in elements
KOp      = (kind: KKind, outs: TensorRef*, ins: TensorRef*, attrs, origin)
Expr     = (op: EOp, args: Expr*, dtype, index, value)        # pointwise expression tree
```

Invariants
- Views never move data: a view op yields a new ``TensorRef`` on the same buffer.
- A POINTWISE kernel's inputs are already broadcast to its output shape (stride 0 on broadcast
  axes), so input ``i`` at output index ``idx`` is ``ins[i]`` at ``idx``. Its expression's LOAD
  leaves index ``ins``; INDEX leaves read the output coordinate along ``Expr.index``.
- A MATMUL kernel computes ``outs[0][b] = ins[0][b] @ ins[1][b]`` over views
  ``[*B, M, K] @ [*B, K, N]`` (one or more batch axes); its optional epilogue expression has
  one ACC leaf (the fp32 product) and LOAD leaves indexing ``ins[2:]``, which are views of the
  output's shape.
- A GATHER kernel computes ``outs[0][I, R] = ins[0][I, ins[1][I], R]``: ``ins[1]`` is the
  integer index (shape ``I``, one lookup per element), ``ins[0]`` a view of the table of shape
  ``(*I, V, *R)`` whose first ``len(I)`` axes are lock-step with the index (stride 0 when every
  lookup reads the same table: an embedding), axis ``attrs.axis == len(I)`` is the indexed axis
  of size ``attrs.bound == V``, and ``R`` is the row each lookup copies; ``outs[0]`` has shape
  ``(*I, *R)`` and the table's dtype. Values are copied as bytes (no arithmetic).
- A SCATTER kernel updates ``outs[0]`` in place: ``outs[0][I, ins[1][I], R] (+)= ins[0][I, R]``
  with the GATHER layout (``outs[0]`` a ``(*I, V, *R)`` view whose first ``len(I)`` axes are
  lock-step with the index ``ins[1]`` of shape ``I``; ``ins[0]`` the ``(*I, *R)`` data). It reads
  nothing else of ``outs[0]`` except the rows it accumulates into, so an earlier kernel must
  have written the whole tensor (a copy of ``self`` or a fill): the tensor has two writers, in
  program order. Lookups apply in row-major order of ``I`` (the last of duplicates wins; with
  ``accumulate`` each adds in fp32 and rounds to the table dtype).
- A SCAN kernel computes the inclusive scan of ``ins[0]`` along ``attrs.dim`` into ``outs[0]``
  (same shape): a running fp32 value, each output rounded once to its dtype.
- A SELECT kernel picks along ``attrs.dim`` of ``ins[0]`` (length C): ``outs`` = (values?,
  indices?) per ``has_values`` / ``has_indices``, each of the input's shape with that dim of size
  ``k`` (or without it when ``keepdim`` is False for a reduction-like k = 1); indices are int64
  positions along the dim (``SelectKAttrs``).
- A RAND kernel writes random numbers into ``outs[0]`` from the seed words ``ins[0]``
  (``RandKAttrs``); the seed is an INPUT buffer named ``rng_seed*`` that ``CompiledGraph.run``
  fills on every call from torch's default generator.
- A CONV kernel is a forward (or data-gradient) convolution over 3-d views ``[N, C, spatial]``
  (``ConvKAttrs``). A CONV_WGRAD kernel is a convolution's weight gradient (``ConvWgradKAttrs``).
- A RESAMPLE kernel maps the trailing ``len(attrs.maps)`` (spatial) axes of ``ins[0]`` through
  one sparse 1-d map per axis, applied separably (``ResampleKAttrs``): pools, pads, upsampling
  and their backward. ``outs`` = (y,) or (y, indices) with the leading axes of ``ins[0]``.
- A MAXPOOL_BWD kernel scatters ``ins[0]`` (the gradient of a 2-d max pool's output) to the
  input positions its ``ins[1]`` (int64 flat indices into each input plane) name, summing
  duplicates (``MaxPoolBwdKAttrs``).
- A kernel never reads a buffer that a later kernel writes (program order is execution order).
- Every ``Expr`` node carries the dtype its value is rounded to (the dtype the ATen op would
  produce in eager), so fusion does not change rounding.
"""
from __future__ import annotations

import math

import enum
from dataclasses import dataclass, field, replace

from runtime_sim.isa import DType


@dataclass(frozen=True)
class TensorRef:
    buffer: str
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        """Row-major dense (the stride of a size-1 axis does not matter)."""
        return self.numel <= 1 or all(st == cs for n, st, cs in zip(self.shape, self.strides,
                                                                    contiguous_strides(self.shape)) if n != 1)

    def __str__(self) -> str:
        st = "" if self.is_contiguous() else f" strides={list(self.strides)}"
        off = f" +{self.offset}" if self.offset else ""
        return f"%{self.buffer}{list(self.shape)}:{self.dtype.value}{st}{off}"


def view_as(ref: "TensorRef", shape: tuple[int, ...]) -> "TensorRef | None":
    """``ref`` reshaped to ``shape`` as a view (PyTorch's view rules, on a meta tensor), or None
    when no view of this layout has that shape."""
    import torch
    span = ref.offset + 1 + sum((s - 1) * st for s, st in zip(ref.shape, ref.strides) if s > 0)
    t = torch.empty(max(span, 1), device="meta").as_strided(ref.shape, ref.strides, ref.offset)
    try:
        v = t.view(shape)
    except RuntimeError:
        return None
    return TensorRef(ref.buffer, ref.dtype, tuple(v.shape), tuple(v.stride()), v.storage_offset())


def one_batch_form(out: "TensorRef", ins: tuple["TensorRef", ...]):
    """``out`` and ``ins`` with the same batch axes (an attention tiler indexes every operand
    with the output's batch index): as they are, re-viewed with the output's batch axes, or all
    with an operand's batch axes (a mask [N, 1, S, S] broadcast over the heads of products
    whose batch axis is N*H), or all with one merged batch axis; None when no view gives one
    form (e.g. grouped-query heads, whose key heads are a stride-0 axis that cannot merge with
    the group axis)."""
    n = math.prod(out.shape[:-2])
    forms = [out.shape[:-2]]
    forms += [r.shape[:-2] for r in ins if len(r.shape) > 3 and math.prod(r.shape[:-2]) == n]
    for batch in dict.fromkeys(forms + [(n,)]):
        o = out if out.shape[:-2] == batch else view_as(out, batch + out.shape[-2:])
        rs = [r if r.shape[:-2] == batch else view_as(r, batch + r.shape[-2:]) for r in ins]
        if o is not None and all(r is not None for r in rs):
            return o, rs
    return None


def reindex_batch(expr: "Expr", from_shape: tuple[int, ...], to_shape: tuple[int, ...]) -> "Expr | None":
    """``expr``'s INDEX leaves, written over a [*B, M, N] tensor of ``from_shape``, re-expressed
    over the same elements viewed as ``to_shape`` (same M, N; other batch axes). The two trailing
    axes keep their meaning (their numbers shift with the rank); a batch axis keeps its number
    when both batch shapes are equal, else it has no single axis in the new form: None. Every
    rewrite that re-views a kernel's batch axes maps its expressions through here."""
    if tuple(from_shape[-2:]) != tuple(to_shape[-2:]):
        return None if has_index(expr) else expr
    fr, tr = len(from_shape), len(to_shape)
    same_batch = tuple(from_shape[:-2]) == tuple(to_shape[:-2])
    ok = True

    def walk(x: "Expr") -> "Expr":
        nonlocal ok
        if x.op is EOp.INDEX:
            if x.index >= fr - 2:
                return replace(x, index=x.index - fr + tr)
            if not same_batch:
                ok = False
            return x
        if not x.args:
            return x
        return replace(x, args=tuple(walk(a) for a in x.args))

    out = walk(expr)
    return out if ok else None


def has_index(expr: "Expr") -> bool:
    return expr.op is EOp.INDEX or any(has_index(a) for a in expr.args)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


class Role(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    TEMP = "temp"


@dataclass(frozen=True)
class HbmTensor:
    name: str
    numel: int
    dtype: DType
    role: Role

    @property
    def bytes(self) -> int:
        return max(1, self.numel) * self.dtype.itemsize


class EOp(enum.Enum):
    # leaves
    LOAD = "load"
    CONST = "const"
    INDEX = "index"
    ACC = "acc"
    # unary
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    ATAN = "atan"           # ScalarE arctan: valid only for |x| <= pi/2 (callers reduce first)
    SIGN = "sign"
    LOGICAL_NOT = "logical_not"
    CAST = "cast"
    # binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"
    XOR = "xor"             # logical: non-zero is true
    BITAND = "bitand"       # two's complement bit patterns (integer dtypes only)
    BITOR = "bitor"
    BITXOR = "bitxor"
    MOD = "mod"             # floor modulo (sign of the divisor), the ALU's mod
    # ternary
    WHERE = "where"


LEAF_OPS = frozenset({EOp.LOAD, EOp.CONST, EOp.INDEX, EOp.ACC})
UNARY_OPS = frozenset({EOp.NEG, EOp.ABS, EOp.EXP, EOp.LOG, EOp.SQRT, EOp.RSQRT, EOp.RECIPROCAL,
                       EOp.TANH, EOp.SIGMOID, EOp.RELU, EOp.GELU, EOp.GELU_TANH, EOp.SILU,
                       EOp.ERF, EOp.SIN, EOp.COS, EOp.ATAN, EOp.SIGN, EOp.LOGICAL_NOT,
                       EOp.CAST})
BINARY_OPS = frozenset({EOp.ADD, EOp.SUB, EOp.MUL, EOp.DIV, EOp.MAX, EOp.MIN, EOp.POW, EOp.EQ,
                        EOp.NE, EOp.LT, EOp.LE, EOp.GT, EOp.GE, EOp.AND, EOp.OR,
                        EOp.XOR, EOp.MOD, EOp.BITAND, EOp.BITOR, EOp.BITXOR})
BITWISE_OPS = frozenset({EOp.BITAND, EOp.BITOR, EOp.BITXOR})
COMPARE_OPS = frozenset({EOp.EQ, EOp.NE, EOp.LT, EOp.LE, EOp.GT, EOp.GE})


@dataclass(frozen=True)
class Expr:
    op: EOp
    args: tuple["Expr", ...] = ()
    dtype: DType = DType.FP32
    index: int = 0        # LOAD: input number; INDEX: output axis
    value: float = 0.0    # CONST value

    def size(self) -> int:
        return 1 + sum(a.size() for a in self.args)

    def loads(self) -> set[int]:
        if self.op is EOp.LOAD:
            return {self.index}
        out: set[int] = set()
        for a in self.args:
            out |= a.loads()
        return out

    def map_loads(self, fn) -> "Expr":
        """Rebuild with every LOAD leaf replaced by ``fn(leaf)``."""
        if self.op is EOp.LOAD:
            return fn(self)
        if not self.args:
            return self
        return replace(self, args=tuple(a.map_loads(fn) for a in self.args))

    def __str__(self) -> str:
        if self.op is EOp.LOAD:
            return f"in{self.index}"
        if self.op is EOp.CONST:
            return repr(self.value)
        if self.op is EOp.INDEX:
            return f"idx{self.index}"
        if self.op is EOp.ACC:
            return "acc"
        inner = ", ".join(str(a) for a in self.args)
        return f"{self.op.value}({inner}):{self.dtype.value}"


def const(value: float, dtype: DType = DType.FP32) -> Expr:
    return Expr(EOp.CONST, (), dtype, 0, float(value))


def load(i: int, dtype: DType) -> Expr:
    return Expr(EOp.LOAD, (), dtype, i)


class KKind(enum.Enum):
    POINTWISE = "pointwise"
    MATMUL = "matmul"
    REDUCE = "reduce"
    SOFTMAX = "softmax"
    LAYER_NORM = "layer_norm"
    GATHER = "gather"
    ATTENTION = "attention"
    CONV = "conv"
    SCATTER = "scatter"
    SCAN = "scan"
    SELECT = "select"
    LAYER_NORM_BWD = "layer_norm_bwd"
    RAND = "rand"
    CONV_WGRAD = "conv_wgrad"
    RESAMPLE = "resample"
    MAXPOOL_BWD = "maxpool_bwd"


class ReduceOp(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


class ScanOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"


@dataclass(frozen=True)
class ScanKAttrs:
    """Inclusive scan along ``dim`` (see the module docstring)."""

    dim: int
    op: ScanOp


@dataclass(frozen=True)
class SelectKAttrs:
    """Top-``k`` along ``dim`` (see the module docstring). ``largest``: the k largest in
    descending order, else the k smallest in ascending order. ``nan_wins``: a NaN is the
    result of the selection (max/min/argmax/argmin, where NaN propagates) rather than ordered
    above +inf (topk/sort: a NaN is the largest value, so it comes last in ascending order).
    Ties keep index order (a stable sort)."""

    dim: int
    k: int
    largest: bool
    nan_wins: bool
    has_values: bool
    has_indices: bool


@dataclass(frozen=True)
class PointwiseAttrs:
    expr: Expr


@dataclass(frozen=True)
class MatmulKAttrs:
    """``epilogue``: evaluated on the product while PSUM is evacuated. ``a_scale`` /
    ``a_shift``: indices into ``ins`` of [K] vectors applied to A along K before the product,
    ``A'[m, k] = A[m, k] * scale[k] + shift[k]`` (a layer norm's affine folded into the matmul
    that reads its output, ``passes/norm_fold.py``); the tiler applies them where A^T tiles
    are made (K on partitions: a per-partition scale and shift)."""

    epilogue: Expr | None = None
    a_scale: int | None = None
    a_shift: int | None = None

    @property
    def prologue_inputs(self) -> tuple[int, ...]:
        """The ``ins`` indices of A's scale/shift vectors (empty: no prologue)."""
        return tuple(i for i in (self.a_scale, self.a_shift) if i is not None)


@dataclass(frozen=True)
class ReduceKAttrs:
    """Reduce ``ins[0]`` over ``dims`` with ``op`` then multiply by ``scale`` (mean);
    ``outs[0]`` has the input's rank with the reduced dims of size 1."""

    op: ReduceOp
    dims: tuple[int, ...]
    scale: float = 1.0


@dataclass(frozen=True)
class SoftmaxKAttrs:
    dim: int
    log: bool = False


@dataclass(frozen=True)
class LayerNormKAttrs:
    """outs = (y, mean, rstd) over the trailing ``normalized_ndim`` dims of ins[0];
    ins = (x, weight?, bias?) with weight/bias present per the flags."""

    normalized_ndim: int
    eps: float
    has_weight: bool
    has_bias: bool


@dataclass(frozen=True)
class LayerNormBwdKAttrs:
    """outs = (grad_input,) of a layer norm over the trailing ``normalized_ndim`` dims;
    ins = (grad_out, x, mean, rstd, weight?): mean/rstd have x's rank with the normalised dims
    of size 1; weight (``has_weight``) has the normalised shape."""

    normalized_ndim: int
    has_weight: bool


@dataclass(frozen=True)
class RandKAttrs:
    """``outs[0]`` (contiguous) filled with uniform [0, 1) (``normal=False``) or standard normal
    numbers from the Philox4x32-10 key in ``ins[0]`` (two int32 words, a seed input fed at call
    time): element ``e`` of the flattened output takes counter ``e`` (normal: ``e`` and
    ``numel + e``, Box-Muller)."""

    normal: bool


@dataclass(frozen=True)
class GatherKAttrs:
    """Row/element gather (see the module docstring): ``axis`` is the table view's indexed axis
    (= the index's rank), ``bound`` its size; a lookup value outside ``[0, bound)`` is an error."""

    axis: int
    bound: int


@dataclass(frozen=True)
class ScatterKAttrs:
    """Row/element scatter into ``outs[0]`` (see the module docstring): ``axis`` and ``bound``
    as in ``GatherKAttrs``; ``accumulate`` adds instead of overwriting."""

    axis: int
    bound: int
    accumulate: bool = False


# An ATTENTION kernel's value width: its output rows [query block, Dv] accumulate in one PSUM
# bank (2 KiB per partition, 512 fp32). The fusion forms no wider kernel; the tiler checks again.
ATTENTION_MAX_DV = 512


@dataclass(frozen=True)
class AttentionKAttrs:
    """``outs[0][b] = epilogue(softmax(score(scale * Q[b] @ KT[b])) @ V[b])`` over views
    ``ins = (Q [*B, Sq, D], KT [*B, D, Sk], V [*B, Sk, Dv], *extra)``: one kernel for the
    matmul -> softmax -> matmul pattern (written out or from scaled_dot_product_attention).

    ``score``: expression over ACC (``scale`` times the product, fp32) and LOAD leaves indexing
    ``extra`` (views of the [*B, Sq, Sk] score shape, e.g. an additive mask) and INDEX leaves
    over the score axes; None means the scaled product itself. ``causal``: keys after the query
    (``k > q + causal_offset``) are masked with -inf, and whole key blocks past the diagonal are
    skipped. ``safe``: a row whose scores are all -inf gives 0 (torch's ``_safe_softmax``)
    instead of NaN. ``epilogue``: expression over ACC (the normalised output, fp32) giving the
    output dtype. ``p_dtype``: dtype of the probabilities fed to the second product.

    ``new_kv``: a decode attention over a KV cache read before its one-row update
    (``passes/decode_cache.py``): ``ins[new_kv:new_kv + 4] = (KN [*B, 1, D], VN [*B, 1, Dv],
    pos_k, pos_v)``, the new key and value rows and the int32 positions (one element each) they
    are written at; key ``pos_k`` of KT is KN's row and row ``pos_v`` of V is VN's, whatever KT and
    V hold there (as if the rows were written first). None: KT and V are used as they are."""

    scale: float
    score: Expr | None
    causal: bool
    causal_offset: int
    safe: bool
    epilogue: Expr
    p_dtype: DType
    new_kv: int | None = field(default=None, metadata={"quiet_default": True})


@dataclass(frozen=True)
class WindowGeometry:
    """The spatial geometry of a sliding window (a convolution's or a pool's): input and output
    (H, W), kernel, stride, padding, dilation."""

    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


@dataclass(frozen=True)
class ConvKAttrs(WindowGeometry):
    """Forward convolution (``tiling/conv.py``): ``ins = (x [N, Ci, H*W], w [Co, Ci/groups, Kh,
    Kw], bias [Co]?)``, ``outs = (y [N, Co, Ho*Wo],)``; ``x``'s last axis walks ``in_hw`` row-major
    (element ``(h, w)`` at ``(h * W + w) * x.strides[2]``), ``y``'s walks ``out_hw`` (or ``y`` is
    a 4-d strided view ``[N, Co, Ho, Wo]``). Zero padding, possibly negative (a shifted window)
    and read past the bottom/right edge as zeros: ``out_hw`` is given, not derived.

    ``dgrad``: a data-gradient (transposed) convolution: ``ins[1]`` is the *forward* weight
    ``[Co', Ci'/groups, Kh', Kw']`` and this kernel's tap ``(j, l)`` is the forward tap
    ``(dgrad[0][j], dgrad[1][l])`` with the channel roles swapped per group (``x`` has the
    forward's ``Co'`` channels, ``y`` its ``Ci'``)."""

    groups: int
    has_bias: bool
    dgrad: tuple[tuple[int, ...], tuple[int, ...]] | None = None


@dataclass(frozen=True)
class ConvWgradKAttrs(WindowGeometry):
    """``gw[co, ci, kh, kw] = sum_{n, oh, ow} g[n, co, oh, ow] * xpad[n, grp(co)*Cig + ci,
    oh*sh + kh*dh, ow*sw + kw*dw]`` (``tiling/conv_backward.py``): ``ins = (x [N, Ci, H*W],
    g [N, Co, Ho*Wo])``, ``outs = (gw [Co, Ci/groups, Kh, Kw],)`` contiguous; the geometry of
    the forward convolution."""

    groups: int


@dataclass(frozen=True)
class AxisMap:
    """One spatial axis of a RESAMPLE kernel, a sparse ``n_out x n_in`` matrix: output position
    ``o`` is the sum (or the max) over the entries ``(o, i, w, cls)`` of ``w * x[i]``; an output
    with no entry is 0 (sum). ``cls`` groups entries the tiler may turn into one strided run
    (a pool's kernel tap, a pad's region, a bilinear tap), in the order a max visits them:
    within one output, entries of a smaller class have a smaller ``i``."""

    n_in: int
    n_out: int
    entries: tuple[tuple[int, int, float, int], ...]

    def __repr__(self) -> str:        # the dump's kernel line: a summary, not every entry
        ws = sorted({w for _, _, w, _ in self.entries})
        wtxt = ",".join(f"{w:g}" for w in ws[:4]) + (",..." if len(ws) > 4 else "")
        return f"map({self.n_in}->{self.n_out}, {len(self.entries)} entries, w={wtxt})"


@dataclass(frozen=True)
class Divisors:
    """Per spatial axis, the divisor of each position (None: 1 everywhere). ``each``: divide by
    every axis's divisor in turn (``sum / kh / kw``, adaptive pools) instead of once by their
    product (``sum / (kh * kw)``, ``avg_pool2d``)."""

    per_axis: tuple[tuple[float, ...] | None, ...]
    each: bool = False


@dataclass(frozen=True)
class ResampleKAttrs:
    """``y = M_0 (x) ... (x) M_k`` applied to each plane of ``ins[0]`` (see ``AxisMap``; None
    is the identity), innermost axis first. ``reduce``: SUM (linear) or MAX (a max over the
    entries; weights are 1; ``indices`` adds the int64 output ``outs[1]``: the flat index into
    the input plane of the first maximum in row-major order, as ``max_pool2d_with_indices``).
    ``pre``: divide the input by these per-position divisors first; ``post``: divide the result.
    """

    maps: tuple[AxisMap | None, ...]
    reduce: ReduceOp
    indices: bool = False
    pre: Divisors | None = None
    post: Divisors | None = None


@dataclass(frozen=True)
class MaxPoolBwdKAttrs(WindowGeometry):
    """``grad_in[r, q] = sum over outputs o with ins[1][r, o] == q of ins[0][r, o]`` over planes
    ``r``: ``ins = (grad_out [R, Ho*Wo], indices [R, Ho*Wo] int64)``, ``outs = (grad_in [R,
    H*W],)``; each index lies in the window of its output (the forward pool's geometry), which
    is what the tiler exploits."""


KAttrs = (PointwiseAttrs | MatmulKAttrs | ReduceKAttrs | SoftmaxKAttrs | LayerNormKAttrs | GatherKAttrs
          | AttentionKAttrs | ConvKAttrs | ScatterKAttrs | ScanKAttrs | SelectKAttrs
          | LayerNormBwdKAttrs | RandKAttrs | ResampleKAttrs | MaxPoolBwdKAttrs
          | ConvWgradKAttrs)


@dataclass(frozen=True)
class KOp:
    kind: KKind
    outs: tuple[TensorRef, ...]
    ins: tuple[TensorRef, ...]
    attrs: KAttrs
    origin: tuple[str, ...] = ()   # names of the ATen nodes this kernel computes

    def __str__(self) -> str:
        outs = ", ".join(map(str, self.outs))
        ins = ", ".join(map(str, self.ins))
        if isinstance(self.attrs, PointwiseAttrs):
            a = str(self.attrs.expr)
        elif isinstance(self.attrs, MatmulKAttrs):
            m = self.attrs
            parts = [("epilogue", m.epilogue, ""), ("a_scale", m.a_scale, "in"),
                     ("a_shift", m.a_shift, "in")]
            a = ", ".join(f"{n}={p}{v}" for n, v, p in parts if v is not None)
        else:
            a = ", ".join(f"{k}={getattr(self.attrs, k)}" for k, f in self.attrs.__dataclass_fields__.items()
                          if not (f.metadata.get("quiet_default") and getattr(self.attrs, k) == f.default))
        return f"{outs} = {self.kind.value}[{a}]({ins})  # {','.join(self.origin)}"


@dataclass
class KProgram:
    buffers: dict[str, HbmTensor] = field(default_factory=dict)
    kernels: list[KOp] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[TensorRef] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # e.g. WhyNoFuse lines of the fusions

    def __str__(self) -> str:
        lines = [f"inputs: {', '.join(self.inputs)}"]
        for b in self.buffers.values():
            lines.append(f"buffer %{b.name}: {b.numel} x {b.dtype.value} ({b.role.value})")
        for k in self.kernels:
            lines.append(str(k))
        lines.append("outputs: " + ", ".join(map(str, self.outputs)))
        lines += [f"# {n}" for n in self.notes]
        return "\n".join(lines)
