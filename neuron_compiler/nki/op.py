"""``nki_op``: NKI kernels as torch custom ops, run on the simulator in eager mode and as device
operations inside ``torch.compile(backend="neuron")`` graphs.

TorchNeuron's name and signature (``torch_neuronx.nki_op``)::

    @nki.jit
    def scale_kernel(x, out): ...                 # writes out

    @nki_op("mylib::scale", mutates_args={})
    def scale(x: torch.Tensor) -> torch.Tensor:    # the op's body: plain torch + kernel calls
        out = torch.empty_like(x)
        scale_kernel(x, out)                       # or: return my_kernel(x)
        return out

    scale.register_autograd(backward, setup_context=setup)   # training (torch.library)

``nki_op`` is ``torch.library.custom_op`` (same arguments) plus:

- **A fake implementation derived from the kernels' output declarations.** The body runs on
  fake (or meta) tensors; a kernel called with a fake tensor is *traced* on those shapes, not
  simulated: its program is built and every instruction checked by the machine's rules (so a
  kernel that breaks one fails when the graph is compiled, naming the instruction), and the
  call returns empty tensors with the shapes and dtypes of the HBM tensors the kernel returns.
  An argument the kernel writes keeps its (fake) value. Shapes must be concrete: a symbolic
  size is specialised (``int()``, one guard), as a kernel's Python needs numbers.
- **Eager:** the body runs with real tensors; each kernel call runs on the simulator (values
  and time; ``neuron_compiler.profile()`` records it as an ``"nki"`` graph, kernel.py).
- **Compiled** (``backend="neuron"``): the partitioner (``partition.py``) counts the op's node
  (or the ``auto_functionalized`` node wrapping a mutating op) as a device node, never a
  fallback, and leaves it in the outer graph; ``NkiOpCall`` runs it there: the body runs with
  the host tensors, each kernel call is simulated in functional mode on the compiled graph's
  target (values come from the simulator in both ``sim_mode``s) and recorded in the open
  profiles as a partition of the compiled graph named ``nki <op>/<kernel>[grid]`` with its
  simulated time, engine busy shares and timeline (``export_chrome_trace``).

Invariants
- Residency (as a device partition): an op input whose current data is not in the target's
  HBM is charged as a host->device copy to the op's first kernel call; the op's outputs are
  produced on the device (a host consumer pays the copy back). The body's own torch ops
  (allocation, reshapes) run on the host at no recorded cost.
- Not yet: splicing the kernel's program into a neighbouring partition's program (so that it
  is scheduled with its neighbours and its inputs and outputs need not round-trip through
  HBM); each kernel call is its own program, one after the other.
"""
from __future__ import annotations

import torch

from neuron_compiler.device.residency import RESIDENCY, tensor_bytes
from neuron_compiler.device.transfers import charge_transfer_out
from neuron_compiler.profile import GraphRecord, active_profiles
from runtime_sim.errors import MachineError

from .kernel import OpCall, op_call

# OpOverload -> op name ("mylib::scale"), for every op registered by nki_op
_NKI_OPS: dict[object, str] = {}


def nki_op(name: str, fn=None, /, *, mutates_args, device_types=None, schema=None):
    """Register ``fn`` (a function whose body calls ``@nki.jit`` kernels on torch tensors) as
    the torch custom op ``name`` ("namespace::op"); see the module docstring. Returns
    torch.library's ``CustomOpDef`` (call it like the function; ``.register_autograd``)."""

    def wrap(f):
        op = torch.library.custom_op(name, mutates_args=mutates_args,
                                     device_types=device_types, schema=schema)(f)

        def fake(*args, **kwargs):
            # FakeTensors go through Kernel.__call__'s trace-only path (kernel.py)
            return f(*args, **kwargs)

        op.register_fake(fake)
        _NKI_OPS[op._opoverload] = name
        return op

    return wrap if fn is None else wrap(fn)


def is_nki_op(target: object, args: tuple = ()) -> bool:
    """True when ``target`` is an op registered by ``nki_op``, or an ``auto_functionalized``
    higher-order op whose first argument is one."""
    if target in _NKI_OPS:
        return True
    hop = getattr(torch.ops.higher_order, "auto_functionalized", None)
    hop2 = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)
    return target in (hop, hop2) and bool(args) and args[0] in _NKI_OPS


def nki_op_name(target: object, args: tuple = ()) -> str:
    """How reports name an nki_op node: ``mylib.scale.default`` (the wrapped op's name for an
    ``auto_functionalized`` node)."""
    op = target if target in _NKI_OPS else (args[0] if args else target)
    return str(op) if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))


class NkiOpCall(torch.nn.Module):
    """One ``nki_op`` node of a compiled graph: runs the op (its kernels on the simulator, in
    functional mode, on the graph's target) and records each kernel call as a partition of the
    graph (module docstring)."""

    def __init__(self, op: object, name: str, graph: GraphRecord):
        super().__init__()
        self.op, self.op_name, self.graph = op, name, graph

    @classmethod
    def for_node(cls, node, graph: GraphRecord) -> "NkiOpCall":
        return cls(node.target, nki_op_name(node.target, tuple(node.args)), graph)

    def forward(self, *args: object, **kwargs: object) -> object:
        from neuron_compiler.assumptions import assumptions_of
        from torch.utils._pytree import tree_leaves
        profs = active_profiles()
        target = self.graph.target
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sent = nbytes = 0
        seen: set[int] = set()
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            send, producer, fetch = RESIDENCY.to_device(t, target)
            if fetch:
                charge_transfer_out(producer, t, profs)
            if send:
                sent, nbytes = sent + 1, nbytes + tensor_bytes(t)
        ns = assumptions_of(self.graph).transfer_ns(nbytes, transfers=sent) if sent else 0.0
        call = OpCall(self.graph, self.op_name, target, (ns, nbytes, sent))
        try:
            with op_call(call):
                out = self.op(*args, **kwargs)
        except MachineError as e:        # the kernel broke a machine rule when it ran
            e.add_note(f"in nki_op {self.op_name} of compiled graph {self.graph.name} "
                       f"(target {target})")
            raise
        if not call.kernels:
            raise RuntimeError(f"nki_op {self.op_name}: its body called no @nki.jit kernel; an "
                               f"nki_op runs on the device only through its kernels")
        producer = call.producer
        inputs = {id(t) for t in tensors}
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor) and id(o) not in inputs:
                if not RESIDENCY.produced(o, target, producer):
                    charge_transfer_out(producer, o, profs)
        return out
