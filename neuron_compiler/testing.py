"""Helpers for testing functions, models and kernels compiled with the neuron backend.

The trap these avoid: a fallback (or Dynamo silently running eager after too many recompiles)
makes every numeric comparison pass. ``run_on_device`` therefore returns the profile,
``assert_ran_on_device`` fails unless device partitions actually ran, and
``assert_matches_eager`` does both plus the comparison, at tolerances that can fail.

Property testing (hypothesis; ``pip install hypothesis``, part of the ``test`` extra)::

    from hypothesis import given
    from neuron_compiler.testing import assert_matches_eager, tensors

    @given(x=tensors(dtypes=[torch.float32, torch.bfloat16]))
    def test_my_gelu(x):
        assert_matches_eager(my_gelu, x)

- ``shapes()``: shapes whose dims are drawn from the tile edges (``TILE_EDGES``: 1, 127, 128,
  129, 511, 512, 513, ...) or at random, under a total element budget.
- ``tensors(shapes=None, dtypes=None, values=None)``: torch tensors of those shapes and dtypes;
  ``values="special"`` mixes NaN, +-inf, denormals and -0.0 into finite values.
- ``assert_matches_eager(fn, *args, ...)``: compile ``fn`` with the backend, run it on the
  simulated device, run it in eager, fail unless it ran on the device (``min_device_fraction``
  of the ATen compute nodes) and every output (and every argument ``fn`` mutates) matches.
- ``TOLERANCES`` / ``CANCELLATION`` / ``assert_close``: the per-element comparison it uses.
- ``check_kernel(kernel, reference, shapes=...)``: an NKI kernel (``neuron_compiler.nki``) run
  on the simulator against its numpy reference over hypothesis-drawn shapes;
  ``kernel_shapes(("K", "M"), ("K", "N"))`` draws argument shapes with shared named dims on the
  tile edges. Returns each example's simulated time (docs/nki.md, "Testing it").

Invariants
- ``ensure_backends_registered`` only registers ``neuron``/``neuron_sim`` with Dynamo when they
  cannot already be resolved (e.g. running from a source checkout that is not pip-installed);
  it never replaces a registered backend.
- Tolerances hold element by element: ``|a - e| <= atol + rtol * |e|`` with the dtype's
  ``rtol`` (``TOLERANCES``) and, unless ``atol`` is given, the floor
  ``default_atol(e) = max(atol_dtype, CANCELLATION[dtype] * mean |e|)``: a near-zero element may
  be a cancellation of terms as large as the typical result, whose rounding noise is a few ulps
  of that magnitude (fp32: 1e-5 of it; bf16/fp16: about one ulp). Never scaled by the size of
  the computation, so a halved, zeroed or negated reduction and a matmul that drops a K tile
  fail in fp32 and in bf16, and a single wrong small element among large ones fails once its
  error passes the floor (``tests/test_testing_helpers.py`` injects each). NaN must be NaN
  where eager has NaN; infinities must coincide with their sign; integer and bool results must
  be equal; with ``check_zero_sign=True`` each zero must have eager's sign.
- Arguments are copied by ``clone_as_given``: same sizes, strides and storage offset, storage
  of their own, so ``fn`` sees a transposed or sliced argument as the caller gave it.
- ``assert_matches_eager`` resets Dynamo (``torch._dynamo.reset()``) before compiling, so every
  call compiles ``fn`` afresh for the shapes it is given (no recompile limit, no stale guard):
  other functions compiled in the process recompile on their next call.
- Importing this module does not import hypothesis; the strategies import it when built.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree

from neuron_compiler.profile import Profile, profile

# dims that cross the machine's tile edges: 128 partitions, 512-element PSUM banks / moving tiles
TILE_EDGES = (1, 2, 3, 127, 128, 129, 255, 256, 257, 511, 512, 513)
FLOAT_DTYPES = (torch.float32, torch.bfloat16)
# (rtol, atol) per dtype: fp32/bf16 are the OpInfo conformance tolerances (docs/testing.md)
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
    torch.float8_e4m3fn: (0.125, 2.0 ** -9),   # one ulp (3 mantissa bits); smallest subnormal
    torch.float8_e5m2: (0.25, 2.0 ** -16),
}
# The cancellation floor per dtype, as a fraction of the result's mean magnitude: an element near
# zero may be the difference of terms about as large as the result's typical element, so its
# rounding noise is a few units in the last place of THAT magnitude, not of its own. fp32 results
# are accumulated at their own precision (a different summation order shows as ~sqrt(n) ulps of
# the terms at a long sum's near-zero elements): 1e-5 is about 84 ulps. bf16/fp16 results are
# accumulated in fp32 and rounded once: about one ulp (1.3 and 1.0). fp8: the atol above.
CANCELLATION: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.bfloat16: 1e-2,
    torch.float16: 1e-3,
    torch.float8_e4m3fn: 2.0 ** -9,
    torch.float8_e5m2: 2.0 ** -16,
}


def ensure_backends_registered() -> None:
    """Make ``backend="neuron"`` / ``"neuron_sim"`` resolvable in this process."""
    from torch._dynamo.backends import registry
    from torch._dynamo.exc import InvalidBackend

    from neuron_compiler.backend import neuron_backend, neuron_sim_backend
    for name, fn in (("neuron", neuron_backend), ("neuron_sim", neuron_sim_backend)):
        try:
            registry.lookup_backend(name)
        except InvalidBackend:
            registry.register_backend(fn, name=name)


def compile_for_neuron(fn: Callable, options: Mapping[str, object] | None = None,
                       backend: str = "neuron", **compile_kwargs: object) -> Callable:
    """``torch.compile(fn, backend=backend, options=options)``."""
    ensure_backends_registered()
    return torch.compile(fn, backend=backend, options=dict(options) if options else None,
                         **compile_kwargs)


def run_on_device(compiled: Callable, *args: object, **kwargs: object) -> tuple[object, Profile]:
    """Call ``compiled`` inside a fresh ``profile()``; return (output, profile)."""
    with profile() as prof:
        out = compiled(*args, **kwargs)
    return out, prof


def assert_ran_on_device(prof: Profile, min_device_fraction: float = 1.0) -> dict:
    """Fail unless device partitions ran and at least ``min_device_fraction`` of the ATen
    compute nodes were on the device; returns ``prof.to_dict()``."""
    d = prof.to_dict()
    total = d["device_nodes"] + d["fallback_nodes"]
    if not d["graphs"]:
        raise AssertionError("no neuron-compiled graph ran (did Dynamo fall back to eager, e.g. "
                             "after hitting torch._dynamo.config.recompile_limit?)")
    if not d["partitions"]:
        raise AssertionError(f"no device partition ran; fallbacks: {d['fallbacks']}")
    frac = d["device_nodes"] / total if total else 0.0
    if frac < min_device_fraction:
        raise AssertionError(
            f"only {d['device_nodes']}/{total} ATen compute nodes ran on the device "
            f"({100 * frac:.1f}% < {100 * min_device_fraction:.1f}%); fallbacks: "
            + "; ".join(f"{f['op']} x{f['count']}: {f['reason']}" for f in d["fallbacks"]))
    return d


# ---- comparison ---------------------------------------------------------------------------------
def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for results of ``dtype`` (0, 0 for integers and bool)."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def default_atol(expected: torch.Tensor) -> float:
    """The absolute floor ``assert_close`` uses when no ``atol`` is given:
    ``max(atol, CANCELLATION[dtype] * mean |expected|)`` over the finite elements (see
    ``CANCELLATION``). It is the same for every element; each element's own magnitude enters
    only through ``rtol``, so a small element next to large ones is checked at the floor, not at
    the large ones' tolerance."""
    _, a0 = tolerance(expected.dtype)
    e = expected.detach().cpu().double()
    fin = e[e.isfinite()]
    mean = float(fin.abs().mean()) if fin.numel() else 0.0
    return max(a0, CANCELLATION.get(expected.dtype, 0.0) * mean)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(x) for x in mask.nonzero()[0].tolist())


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None,
                 rtol: float | None = None, check_zero_sign: bool = False,
                 what: str = "output") -> None:
    """Fail unless ``actual`` matches ``expected``: same shape and dtype; NaN exactly where
    ``expected`` has NaN; the same infinities; elsewhere, element by element,
    ``|a - e| <= atol + rtol * |e|``, with the dtype's ``TOLERANCES`` ``rtol`` unless given and
    ``default_atol(expected)`` unless ``atol`` is given (an ``atol`` given is absolute).
    Integers and bool: equal. ``check_zero_sign``: where eager has a zero, the sign of the zero
    must be the same (-0.0 vs 0.0 fails; ``1 / x`` tells them apart).

    A halved, zeroed or negated result fails: its large elements are off by half of themselves,
    far above ``rtol``. A single wrong element fails when its error exceeds the floor plus
    ``rtol`` of its own magnitude, whatever its neighbours' magnitude (fp32: a 0.5 returned as
    50.5 among 1e6 values fails: the floor is 10)."""
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtype {actual.dtype} != eager {expected.dtype}")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not e.dtype.is_floating_point:
        bad = a != e
        if bool(bad.any()):
            i = _first(bad)
            raise AssertionError(f"{what}: {int(bad.sum())} of {e.numel()} elements differ; first "
                                 f"at {list(i)}: {a[i].item()} vs eager {e[i].item()}")
        return
    rtol = tolerance(e.dtype)[0] if rtol is None else rtol
    atol = default_atol(e) if atol is None else atol
    a, e = a.double(), e.double()
    nan_a, nan_e = a.isnan(), e.isnan()
    if not torch.equal(nan_a, nan_e):
        i = _first(nan_a != nan_e)
        raise AssertionError(f"{what}: NaN in {int(nan_a.sum())} elements, eager in "
                             f"{int(nan_e.sum())}; first mismatch at {list(i)}: {a[i].item()} vs "
                             f"eager {e[i].item()}")
    inf_e = e.isinf()
    if not torch.equal(a.isinf(), inf_e) or not torch.equal(a[inf_e], e[inf_e]):
        i = _first((a.isinf() != inf_e) | (inf_e & (a != e)))
        raise AssertionError(f"{what}: infinities differ; first at {list(i)}: {a[i].item()} vs "
                             f"eager {e[i].item()}")
    fin = ~(nan_e | inf_e)
    err = torch.where(fin, (a - e).abs(), torch.zeros_like(a))
    allowed = atol + rtol * e.abs()
    bad = fin & (err > allowed)
    if bool(bad.any()):
        # the worst element relative to its own allowance (not the largest absolute error)
        ratio = torch.where(bad, err / allowed.clamp_min(1e-300), -math.inf)
        i = tuple(int(x) for x in torch.unravel_index(torch.argmax(ratio), e.shape))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {int(fin.sum())} elements out of tolerance "
            f"(|a - e| <= atol + rtol * |e| per element, rtol={rtol:g}, atol={atol:g}); worst at "
            f"{list(i)}: {a[i].item()!r} vs eager {e[i].item()!r} (error {err[i].item():g}, "
            f"allowed {allowed[i].item():g}; max abs error {float(err.max()):g})")
    if check_zero_sign:
        zero = fin & (e == 0)
        bad = zero & (a == 0) & (torch.signbit(a) != torch.signbit(e))
        if bool(bad.any()):
            i = _first(bad)
            raise AssertionError(f"{what}: {int(bad.sum())} of {int(zero.sum())} zeros have the "
                                 f"other sign; first at {list(i)}: {a[i].item()!r} vs eager "
                                 f"{e[i].item()!r}")


def clone_as_given(x: object) -> object:
    """A copy of every tensor in ``x`` (a pytree) with the same values, sizes, strides and
    storage offset, in storage of its own (detached): a transposed, sliced or expanded
    argument reaches ``fn`` as it was given, and eager and compiled runs never share memory.
    (``Tensor.clone`` would make a sliced tensor contiguous.)"""
    def one(t: object) -> object:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach()
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
        base = torch.empty(t.storage_offset() + extent, dtype=t.dtype, device=t.device)
        out = base.as_strided(t.shape, t.stride(), t.storage_offset())
        src, dst = t, out
        for dim, (n, s) in enumerate(zip(t.shape, t.stride())):
            if s == 0 and n > 1:          # an expanded dim: its elements share one location
                src, dst = src.narrow(dim, 0, 1), dst.narrow(dim, 0, 1)
        dst.copy_(src)
        return out
    return pytree.tree_map(one, x)


def _assert_tree_close(actual: object, expected: object, atol, rtol, check_zero_sign: bool,
                       what: str) -> None:
    la, sa = pytree.tree_flatten(actual)
    le, se = pytree.tree_flatten(expected)
    if sa != se:
        raise AssertionError(f"{what}: structure {sa} != eager {se}")
    for k, (a, e) in enumerate(zip(la, le)):
        w = what if len(le) == 1 else f"{what}[{k}]"
        if isinstance(e, torch.Tensor):
            assert_close(a, e, atol=atol, rtol=rtol, check_zero_sign=check_zero_sign, what=w)
        elif a != e and not (isinstance(e, float) and math.isnan(e) and math.isnan(a)):
            raise AssertionError(f"{w}: {a!r} != eager {e!r}")


def assert_matches_eager(fn: Callable, *args: object, options: Mapping[str, object] | None = None,
                         atol: float | None = None, rtol: float | None = None,
                         min_device_fraction: float = 1.0, check_zero_sign: bool = False) -> dict:
    """Compile ``fn`` with the neuron backend, run it on the simulated device and in eager
    PyTorch, and fail unless it ran on the device (at least ``min_device_fraction`` of its ATen
    compute nodes) and every output, and every argument ``fn`` mutates, matches eager.

    Each run gets its own copy of ``args`` made by ``clone_as_given``: same sizes, strides and
    storage offset, so a transposed or sliced argument is tested as given. The comparison is
    ``assert_close``, element by element: ``|a - e| <= atol + rtol * |e|`` with the dtype's
    ``rtol`` and the floor ``default_atol(e) = max(atol_dtype, CANCELLATION[dtype] * mean |e|)``
    unless ``atol`` / ``rtol`` are given; ``check_zero_sign=True`` also requires each zero's
    sign to be eager's. Returns ``profile().to_dict()`` of the device run."""
    expected = fn(*clone_as_given(args))
    eager_args = clone_as_given(args)
    fn(*eager_args)                      # the arguments as eager leaves them (in-place ops)
    torch._dynamo.reset()
    dev_args = clone_as_given(args)
    out, prof = run_on_device(compile_for_neuron(fn, options), *dev_args)
    d = assert_ran_on_device(prof, min_device_fraction)
    _assert_tree_close(out, expected, atol, rtol, check_zero_sign, "output")
    _assert_tree_close(dev_args, eager_args, atol, rtol, check_zero_sign, "argument")
    return d


# ---- hypothesis strategies ----------------------------------------------------------------------
def shapes(min_rank: int = 1, max_rank: int = 3, max_numel: int = 1 << 15,
           edges: Sequence[int] = TILE_EDGES, max_dim: int = 600):
    """A hypothesis strategy of shapes: each dim a tile edge or a random size in
    ``[1, max_dim]``, the total element count capped at ``max_numel`` (a later dim is clipped)."""
    from hypothesis import strategies as st

    dim = st.one_of(st.sampled_from(tuple(edges)), st.integers(1, max_dim))

    @st.composite
    def _shapes(draw):
        rank = draw(st.integers(min_rank, max_rank))
        dims: list[int] = []
        for _ in range(rank):
            left = max(1, max_numel // max(1, math.prod(dims)))
            dims.append(min(draw(dim), left))
        return tuple(dims)

    return _shapes()


_default_shapes = shapes


def _as_strategy(x, default, st):
    if x is None:
        return default
    if hasattr(x, "example") and hasattr(x, "map"):          # already a strategy
        return x
    if isinstance(x, (torch.dtype, tuple)) and not (isinstance(x, tuple) and x and
                                                   isinstance(x[0], (tuple, torch.dtype))):
        return st.just(x)
    return st.sampled_from(list(x))


def _special(dtype: torch.dtype) -> list[float]:
    tiny = {torch.float32: 1e-40, torch.bfloat16: 1e-39, torch.float16: 1e-6}.get(dtype, 0.0)
    return [math.nan, math.inf, -math.inf, -0.0, 0.0, tiny, -tiny]


def make_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int,
                values: object = None) -> torch.Tensor:
    """The tensor ``tensors()`` draws for ``(shape, dtype, seed, values)``: deterministic.
    ``values``: None (uniform in [-2, 2]; integers in [-100, 100]; bool), ``(low, high)``, or
    ``"special"`` (uniform, about one element in eight NaN, +-inf, +-denormal or +-0.0)."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    low, high = values if isinstance(values, tuple) else (-2.0, 2.0)
    if not dtype.is_floating_point:
        lo, hi = (int(low), int(high)) if isinstance(values, tuple) else (-100, 100)
        return torch.randint(lo, hi + 1, shape, generator=g, dtype=dtype)
    x = torch.rand(shape, generator=g, dtype=torch.float32) * (high - low) + low
    if values == "special" and x.numel():
        sp = torch.tensor(_special(dtype), dtype=torch.float32)
        pick = torch.randint(0, len(sp), shape, generator=g)
        where = torch.rand(shape, generator=g) < 0.125
        x = torch.where(where, sp[pick], x)
    elif values not in (None, "special") and not isinstance(values, tuple):
        raise ValueError(f"values must be None, 'special' or (low, high), got {values!r}")
    return x.to(dtype)


def tensors(shapes=None, dtypes=None, values=None):
    """A hypothesis strategy of torch tensors.

    ``shapes``: a shape tuple, a list of them, or a strategy (default ``shapes()``: dims on the
    tile edges or random, at most 2**15 elements). ``dtypes``: a dtype, a list, or a strategy
    (default fp32 and bf16). ``values``: None (uniform in [-2, 2]), ``(low, high)``, or
    ``"special"`` (NaN, +-inf, denormals and -0.0 mixed in). The elements come from a drawn seed
    (``make_tensor``), so large tensors draw fast and a failing example shrinks to a small shape."""
    from hypothesis import strategies as st

    shape_st = _as_strategy(shapes, _default_shapes(), st)
    dtype_st = _as_strategy(dtypes, st.sampled_from(FLOAT_DTYPES), st)
    return st.builds(lambda shp, dt, seed: make_tensor(tuple(shp), dt, seed, values),
                     shape_st, dtype_st, st.integers(0, 2 ** 31 - 1))


# ---- NKI kernels against numpy references -------------------------------------------------------

def kernel_shapes(*spec, dims=None, edges: Sequence[int] = TILE_EDGES, max_dim: int = 600):
    """A hypothesis strategy of argument shapes for a kernel, one tuple per argument, with dims
    named in ``spec`` shared between arguments: ``kernel_shapes(("K", "M"), ("K", "N"))`` draws
    ``K``, ``M`` and ``N`` once each (tile edges or random in ``[1, max_dim]``). An integer in
    ``spec`` is a fixed size. ``dims`` maps a name to its own values (a list or tuple to draw
    from, one int, or a strategy)."""
    from hypothesis import strategies as st

    default = st.one_of(st.sampled_from(tuple(e for e in edges if e <= max_dim)), st.integers(1, max_dim))
    names = sorted({d for shp in spec for d in shp if isinstance(d, str)})
    def _dim(v):
        if v is None:
            return default
        if isinstance(v, int):
            return st.just(v)
        return v if hasattr(v, "example") else st.sampled_from(list(v))

    per = {n: _dim((dims or {}).get(n)) for n in names}

    @st.composite
    def _draw(draw):
        got = {n: int(draw(per[n])) for n in names}
        return tuple(tuple(got[d] if isinstance(d, str) else int(d) for d in shp) for shp in spec)

    return _draw()


def _np_dtype(dtype):
    import numpy as np
    if isinstance(dtype, torch.dtype):
        if dtype is torch.bfloat16:
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(str(dtype).removeprefix("torch."))
    return np.dtype(dtype)


def _as_torch(a) -> torch.Tensor:
    import numpy as np
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def check_kernel(kernel, reference: Callable, shapes=None, *, dims=None, dtypes=None, values=None,
                 grid=None, out_args: Sequence[int] = (), target: str = "trn2",
                 atol: float | None = None, rtol: float | None = None, max_examples: int = 20,
                 seed: int | None = None) -> list[dict]:
    """Drive an NKI kernel (``@nki.jit``, or a plain kernel function) against its numpy
    ``reference`` over hypothesis-drawn shapes that cross tile edges; fail (hypothesis shrinks
    to the smallest failing shapes, named in the message) unless every output matches.

    ``shapes``: a strategy of argument-shape tuples (``kernel_shapes(("M", "N"), ("M", "N"))``),
    the spec itself (``[("M", "N"), ("M", "N")]``), or an explicit list of argument-shape tuples
    (default: one 2-D argument, ``kernel_shapes(("P", "F"))``); ``dims`` as ``kernel_shapes``
    for a spec. ``dtypes``: one dtype (torch or
    numpy) for every argument, a tuple of one per argument, or a list of those to draw from
    (default fp32). ``values``: as ``make_tensor`` (None, ``(low, high)``, ``"special"``).
    ``grid``: None, an SPMD grid tuple, or ``grid(*shapes)`` returning one. ``out_args``:
    indices of arguments the kernel writes (older kernels take their output as a parameter);
    they are compared after what the kernel returns. ``reference(*arrays)`` gets the same
    arrays (fresh copies) and returns the expected output or a tuple of them; a result is
    compared in the kernel output's dtype with ``assert_close`` (``atol``/``rtol`` as there).
    Returns one ``{"shapes", "dtypes", "time_us"}`` per example run (the simulated time)."""
    import hypothesis
    import numpy as np
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from neuron_compiler import nki

    k = kernel if isinstance(kernel, nki.Kernel) else nki.jit(kernel)
    if shapes is None:
        shape_st = kernel_shapes(("P", "F"), dims=dims)
    elif hasattr(shapes, "example") and hasattr(shapes, "map"):
        shape_st = shapes
    elif all(isinstance(d, (str, int)) for shp in shapes for d in shp) and any(
            isinstance(d, str) for shp in shapes for d in shp):
        shape_st = kernel_shapes(*shapes, dims=dims)
    else:
        shape_st = st.sampled_from([tuple(tuple(s) for s in example) for example in shapes])
    if dtypes is None:
        dtype_st = st.just(None)
    elif isinstance(dtypes, list):
        dtype_st = st.sampled_from(dtypes)
    else:
        dtype_st = st.just(dtypes)
    runs: list[dict] = []

    def _one(shp, dts, data_seed):
        dts = dts if isinstance(dts, tuple) else (dts,) * len(shp)
        dts = tuple(torch.float32 if d is None else d for d in dts)
        arrays = []
        for i, (s, d) in enumerate(zip(shp, dts)):
            npd = _np_dtype(d)
            tdt = torch.float32 if npd.kind not in "iub" else _as_torch(np.zeros(1, npd)).dtype
            arrays.append(make_tensor(tuple(s), tdt, data_seed + i, values).numpy().astype(npd))
        expected = reference(*[a.copy() for a in arrays])
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        args = [a.copy() for a in arrays]
        g = grid(*shp) if callable(grid) else grid
        run = nki.simulate(k, *args, target=target, grid=g)
        actual = list(run.outputs) + [args[i] for i in out_args]
        where = f"kernel {k.__name__} on shapes {list(shp)} {[str(d) for d in dts]}"
        if len(actual) != len(expected):
            raise AssertionError(f"{where}: {len(actual)} outputs (returned + out_args), the "
                                 f"reference gave {len(expected)}")
        for j, (a, e) in enumerate(zip(actual, expected)):
            ta = _as_torch(a)
            te = _as_torch(np.asarray(e, dtype=np.float64) if ta.dtype.is_floating_point else e)
            assert_close(ta, te.to(ta.dtype), atol=atol, rtol=rtol, what=f"{where}: output {j}")
        runs.append({"shapes": shp, "dtypes": [str(d) for d in dts], "time_us": run.time_us})

    test = given(shp=shape_st, dts=dtype_st, data_seed=st.integers(0, 2 ** 31 - 1))(_one)
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    settings(max_examples=max_examples, deadline=None, database=None, derandomize=seed is None,
             suppress_health_check=list(HealthCheck))(test)()
    return runs
