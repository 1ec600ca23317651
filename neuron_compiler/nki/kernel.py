"""``@nki.jit`` kernels: trace, check, simulate, return values; record each call in the profile.

A call ``kernel(a, b)`` (or ``kernel[g0, g1](a, b)`` for an SPMD grid, or
``nki.simulate_kernel(kernel, a, b)``):
1. turns each array argument (numpy or torch) into an HBM input tensor of the program, others
   are passed to the kernel unchanged;
2. runs the kernel's Python once per SPMD instance under one ``Tracer`` (tracer.py): all
   instances go into one program for one NeuronCore, in launch order; they overlap where their
   queues allow (``shared_hbm`` tensors are shared, as in NKI);
3. the returned HBM tensors (and any argument the kernel wrote) are the program's outputs;
4. the simulator (runtime_sim.simulate) runs the program in functional mode with its checks:
   values and time; outputs come back as numpy arrays, or torch tensors when an argument was one.
   A written argument is also updated in place (kernels that write their output argument).

Every call is recorded in each open ``neuron_compiler.profile()`` as one partition call of a
graph of kind ``"nki"`` named after the kernel, with its simulated time, engine busy shares and
(``export_chrome_trace``) its timeline. Programs are cached per kernel, target, grid, argument
shapes/dtypes and the other arguments' values (when hashable).

Target: ``jit(target=...)``, ``simulate(..., target=...)``, or ``with nki.target("trn3"):``
around the calls; default trn2.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
from dataclasses import dataclass, field

import numpy as np

from runtime_sim.isa import DType, Program
from runtime_sim.simulator import simulate as sim_run
from runtime_sim.stats import SimResult
from runtime_sim.targets import get_target

from .tensor import NkiTensor, np_dtype, to_dtype
from .tracer import Tracer

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("nki_target", default=None)


@dataclass
class OpCall:
    """An ``nki_op`` node being run by a compiled graph (op.py): its kernel calls run on
    ``target`` and are recorded as partitions ``nki <op>/<kernel>`` of ``graph``; ``pending``
    (ns, bytes, tensors): the op's host->device copies, charged to its first kernel call."""

    graph: object
    op: str
    target: str
    pending: tuple | None = None
    kernels: list = field(default_factory=list)
    producer: tuple | None = None       # (graph, partition, signature) of the last kernel call


_OP_CALL: contextvars.ContextVar[OpCall | None] = contextvars.ContextVar("nki_op_call", default=None)


@contextlib.contextmanager
def op_call(call: OpCall):
    """Run the kernel calls inside the block as part of ``call`` (see ``OpCall``)."""
    tok = _OP_CALL.set(call)
    try:
        yield call
    finally:
        _OP_CALL.reset(tok)


@contextlib.contextmanager
def target(name: str):
    """Run the kernel calls inside the block on ``name`` ("trn1", "trn2", "trn3")."""
    get_target(name)
    tok = _TARGET.set(name)
    try:
        yield
    finally:
        _TARGET.reset(tok)


@dataclass
class KernelRun:
    """One simulated kernel call: its program, result (stats, trace) and output arrays."""

    kernel: str
    target: str
    grid: tuple[int, ...]
    program: Program
    result: SimResult
    outputs: list = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    outputs_value: object = None    # what the call returns: one array, a tuple/list, or None

    @property
    def time_us(self) -> float:
        return self.result.stats.total_ns / 1e3

    @property
    def stats(self):
        return self.result.stats

    def summary(self) -> str:
        s = self.result.stats
        busy = ", ".join(f"{k} {v:.0%}" for k, v in sorted(s.busy_fraction().items()))
        return (f"{self.kernel} on {self.target}{' grid ' + str(list(self.grid)) if self.grid else ''}: "
                f"{s.total_ns / 1e3:.2f} us simulated ({self.program.num_instructions} instructions, "
                f"roofline {s.roofline_ns / 1e3:.2f} us, {s.roofline_bound()}-bound); busy: {busy}")

    def run(self, inputs=None, mode: str = "timing", trace: bool = False):
        """Re-run the program (the profile's trace export calls this)."""
        r = sim_run(self.program, inputs, mode=mode, checks="static", trace=trace)
        return r.outputs, r

    def export_chrome_trace(self, path: str) -> None:
        from runtime_sim.trace import write_chrome_trace
        _, r = self.run(trace=True)
        write_chrome_trace(path, r)


@dataclass
class _Traced:
    program: Program
    outputs: list            # (buffer name, shape, DType) of the returned tensors, in order
    arg_outputs: dict        # argument index -> buffer name (arguments the kernel wrote)
    ret_kind: str            # "none" | "one" | "tuple" | "list"
    ops: list[str]
    constants: dict          # input name -> host data of nl.shared_constant tensors


class Kernel:
    """A kernel function made callable on the simulator (``@nki.jit``)."""

    def __init__(self, fn, target: str | None = None, grid: tuple[int, ...] = (), checks=True,
                 **options) -> None:
        self.fn = fn
        self.target = target
        self.grid = grid
        self.checks = checks
        self.options = options
        self.last: KernelRun | None = None
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> "Kernel":
        grid = grid if isinstance(grid, tuple) else (grid,)
        k = Kernel(self.fn, self.target, tuple(int(g) for g in grid), self.checks, **self.options)
        k._cache = self._cache
        k._parent = self
        return k

    def __call__(self, *args, **kwargs):
        if _tracer_active():               # called from inside a kernel: inlined (a sub-kernel)
            return self.fn(*args, **kwargs)
        if any(_is_fake(a) for a in args):
            return self.fake_call(*args, **kwargs)
        return self.simulate(*args, **kwargs).outputs_value

    def fake_call(self, *args, target: str | None = None, **kwargs):
        """The call on fake (or meta) torch tensors, as an ``nki_op``'s fake implementation
        makes it: the kernel is traced on the argument shapes (its program built and checked)
        but not simulated; returns empty tensors shaped as the HBM tensors it returns."""
        import torch
        call = _OP_CALL.get()
        tname = target or (call.target if call else None) or self.target or _TARGET.get() or "trn2"
        t = get_target(tname)
        like = next(a for a in args if _is_fake(a))
        arrays = [_ShapeOnly(tuple(int(s) for s in a.shape), _np_of_torch(a.dtype))
                  if _is_torch(a) else (a if isinstance(a, np.ndarray) else None) for a in args]
        traced = self._trace(t, args, arrays, kwargs)
        outs = [torch.empty(shape, dtype=_torch_of(dt), device=like.device)
                for _, shape, dt in traced.outputs]
        return _shape_return(traced.ret_kind, outs)

    def simulate(self, *args, target: str | None = None, **kwargs) -> KernelRun:
        """Run on the simulator; return the ``KernelRun`` (``.outputs``, ``.time_us``,
        ``.summary()``, ``.export_chrome_trace(path)``)."""
        call = _OP_CALL.get()
        tname = target or (call.target if call else None) or self.target or _TARGET.get() or "trn2"
        t = get_target(tname)
        arrays, torch_like = _host_arrays(args)
        traced = self._trace(t, args, arrays, kwargs)
        inputs = dict(traced.constants)
        inputs.update({name: np.ascontiguousarray(arr) for name, arr in
                       zip(traced.program.inputs, [a for a in arrays if a is not None])})
        res = sim_run(traced.program, inputs, mode="functional", checks=self.checks)
        outs = [_from_bytes(res.outputs[n], shape, dt) for n, shape, dt in traced.outputs]
        for i, n in traced.arg_outputs.items():
            _write_back(args[i], arrays[i], _from_bytes(res.outputs[n], arrays[i].shape, to_dtype(arrays[i].dtype)))
        if torch_like is not None:
            outs = [_to_torch(o, torch_like) for o in outs]
        run = KernelRun(self.__name__, t.name, self.grid, traced.program, res, outs, traced.ops)
        run.outputs_value = _shape_return(traced.ret_kind, outs)
        (getattr(self, "_parent", None) or self).last = run
        self.last = run
        _record(run, arrays)
        return run

    # ---- tracing ---------------------------------------------------------------------------------
    def _trace(self, t, args, arrays, kwargs) -> _Traced:
        key = None
        try:
            key = (t.name, self.grid, tuple((a.shape, str(a.dtype)) if a is not None else _hashable(v)
                                            for a, v in zip(arrays, args)),
                   tuple(sorted((k, _hashable(v)) for k, v in kwargs.items())))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._cache:
            return self._cache[key]
        names = _param_names(self.fn, len(args))
        tracer = Tracer(t, self.__name__)
        tracer.grid = self.grid
        with tracer:
            kargs = []
            arg_store = {}
            for i, (a, v) in enumerate(zip(arrays, args)):
                if a is None:
                    kargs.append(v)
                    continue
                st = tracer.hbm(tuple(a.shape), to_dtype(a.dtype), names[i], role="input")
                arg_store[i] = st.name
                kargs.append(st.view())
            ret = None
            for pid in itertools.product(*[range(g) for g in self.grid]) if self.grid else [()]:
                tracer.begin_instance(pid)
                ret = self.fn(*kargs, **kwargs)
            kind, outs = _flatten(ret)
            specs = []
            for o in outs:
                if not isinstance(o, NkiTensor) or o.memory.value != "hbm":
                    raise TypeError(f"kernel {self.__name__} returned {o!r}; a kernel returns HBM "
                                    f"tensors (nl.ndarray(..., buffer=nl.shared_hbm))")
                if o.storage.name not in tracer.outputs:
                    tracer.outputs.append(o.storage.name)
                specs.append((o.storage.name, o.storage.shape, o.storage.dtype))
            program = tracer.program()
        arg_outputs = {i: n for i, n in arg_store.items() if n in program.outputs and n not in tracer.outputs}
        ops_used = sorted({ins.op.value for s in program.streams.values() for ins in s})
        traced = _Traced(program, specs, arg_outputs, kind, ops_used, dict(tracer.constants))
        if key is not None:
            self._cache[key] = traced
        return traced


def _tracer_active() -> bool:
    from .tracer import active
    return active() is not None


def _param_names(fn, n: int) -> list[str]:
    try:
        ps = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        ps = []
    return [ps[i] if i < len(ps) else f"arg{i}" for i in range(n)]


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    hash(v)
    return v


def _flatten(ret):
    if ret is None:
        return "none", []
    if isinstance(ret, tuple):
        return "tuple", list(ret)
    if isinstance(ret, list):
        return "list", list(ret)
    return "one", [ret]


def _shape_return(kind: str, outs: list):
    if kind == "none":
        return None
    if kind == "one":
        return outs[0]
    return tuple(outs) if kind == "tuple" else list(outs)


# ---- host arrays ----------------------------------------------------------------------------------

def _is_torch(v) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "detach")


def _host_arrays(args):
    """Per argument: its numpy array (None for a non-array argument); and the torch device of
    the first torch argument (None when there is none)."""
    out = []
    torch_like = None
    for v in args:
        if isinstance(v, np.ndarray):
            out.append(v)
        elif _is_torch(v):
            torch_like = v if torch_like is None else torch_like
            out.append(_torch_to_numpy(v))
        else:
            out.append(None)
    return out, torch_like


def _is_fake(v) -> bool:
    """A torch tensor without data: a FakeTensor (an op's fake implementation) or meta."""
    if not _is_torch(v):
        return False
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(v) or v.device.type == "meta"


@dataclass(frozen=True)
class _ShapeOnly:
    """An argument's shape and dtype (what tracing needs) without data."""

    shape: tuple
    dtype: np.dtype


def _np_of_torch(dt) -> np.dtype:
    return to_dtype(dt).np


def _torch_of(dt: DType):
    import torch
    return {DType.BF16: torch.bfloat16, DType.FP8_E4M3: torch.float8_e4m3fn,
            DType.FP8_E5M2: torch.float8_e5m2, DType.BOOL: torch.bool}.get(
        dt, None) or torch.from_numpy(np.empty(0, dt.np)).dtype


def _torch_to_numpy(v) -> np.ndarray:
    import torch
    t = v.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype is torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(DType.BF16.np)
    return t.contiguous().numpy()


def _to_torch(a: np.ndarray, like):
    import torch
    if a.dtype == DType.BF16.np:
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a.copy())
    return t.to(like.device) if like.device.type != "cpu" else t


def _from_bytes(raw: np.ndarray, shape, dt: DType) -> np.ndarray:
    a = np.asarray(raw).view(np.uint8)[: int(np.prod(shape)) * dt.itemsize].view(dt.np).reshape(shape)
    return a.astype(np.bool_) if dt is DType.BOOL else a.copy()


def _write_back(arg, arr: np.ndarray, value: np.ndarray) -> None:
    if isinstance(arg, np.ndarray):
        arg[...] = value
    elif _is_torch(arg):
        arg.copy_(_to_torch(value, arg))


# ---- profile --------------------------------------------------------------------------------------

_GRAPHS: dict = {}


def _record(run: KernelRun, arrays) -> None:
    from neuron_compiler.profile import GraphRecord, active_profiles, graph_call
    shapes = [list(a.shape) for a in arrays if a is not None]
    call = _OP_CALL.get()
    if call is not None:          # a kernel of an nki_op node of a compiled graph (op.py)
        part = f"nki {call.op}/{run.kernel}" + (str(list(run.grid)) if run.grid else "")
        sig = (run.grid, tuple(tuple(s) for s in shapes))
        call.kernels.append(run)
        call.producer = (call.graph, part, sig)
        ns, nbytes, sent = call.pending or (0.0, 0, 0)
        call.pending = None
        for p in active_profiles():
            p.note_partition_call(call.graph, part, sig, shapes, run, run.result, ns, nbytes, sent)
        return
    if not active_profiles():
        return
    key = (run.kernel, run.target)
    g = _GRAPHS.get(key)
    if g is None:
        g = _GRAPHS[key] = GraphRecord(f"nki_{run.kernel}", "nki", run.target, 0, 0, (), ("kernel",))
    sig = (run.grid, tuple(tuple(s) for s in shapes))
    with graph_call(g):
        for p in active_profiles():
            p.note_partition_call(g, "kernel" + (str(list(run.grid)) if run.grid else ""), sig,
                                  shapes, run, run.result)


# ---- public entry points ------------------------------------------------------------------------------

def jit(fn=None, *, target: str | None = None, checks=True, **options):
    """``@nki.jit`` / ``@nki.jit(target="trn3")`` / ``nki.jit(fn, mode=...)``: a ``Kernel``.
    NKI's other options (``mode``, ``platform_target``, ...) are accepted and ignored."""
    if fn is None:
        return lambda f: Kernel(f, target, checks=checks, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, target, checks=checks, **options)


def simulate_kernel(kernel, *args, **kwargs):
    """NKI's ``simulate_kernel(kernel, *args)``: run ``kernel`` (a ``Kernel``, possibly with a
    grid, or a plain function) and return its outputs."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k(*args, **kwargs)


def simulate(kernel, *args, target: str | None = None, grid=None, **kwargs) -> KernelRun:
    """Run ``kernel`` and return the ``KernelRun`` (values, time, stats, program)."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    if grid is not None:
        k = k[tuple(grid) if isinstance(grid, (tuple, list)) else grid]
    return k.simulate(*args, target=target, **kwargs)


_ = np_dtype
