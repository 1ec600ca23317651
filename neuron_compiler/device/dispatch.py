"""Where each ATen op on ``neuron`` tensors goes (``NeuronTensor.__torch_dispatch__``).

In order:
0. funcol's eager result wrapper (``_c10d_functional._wrap_tensor_autograd``): the collective's
   output, waited for (``wait_tensor`` on the payload), as a device tensor.
   A composite op (``CompositeImplicitAutograd``: ``aten.to``, ``reshape``, ... reach here under
   ``inference_mode``) is decomposed into the ops below.
1. A trace (Dynamo / AOTAutograd: some payload is a fake or functional tensor): the op runs on
   the payloads as they are and its tensor results are wrapped; nothing is simulated.
2. Copies between host and device: ``copy_`` and ``_to_copy`` with one side on the CPU,
   ``_local_scalar_dense`` (``.item()``): the values move, a user copy is charged
   (``transfers``). ``copy_`` between two device tensors is a device-side copy (a DMA within
   HBM, not simulated, not charged). ``empty_like`` / ``new_empty*`` allocate (nothing to
   compute).
3. View ops (``OpOverload.is_view``: view, transpose, expand, slice, select, detach, ...): the
   same view of the payload; no data moves, nothing is simulated.
4. In-place ops ``op_`` whose only written argument is ``self``: the functional ``op`` runs on
   the device (step 5) and its result is written into ``self``'s payload. Other mutating ops
   (``out=`` variants, several outputs written) run on the CPU (``eager.run_on_cpu``).
5. Every other op: ``eager.run_op``, one simulated program per op signature.

Invariants
- The result of an op is what torch's contract says: views alias their base, in-place ops
  return their (mutated) ``self``, other ops return fresh device tensors.
- A device tensor cannot be resized or re-pointed (``resize_`` to another size, ``set_``): the
  error names the op.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from neuron_compiler.device.accelerators import single_threaded_backward
from neuron_compiler.device.residency import tensor_bytes
from neuron_compiler.device.tensor import (DEVICE_TYPE, NeuronTensor, is_real, payload_of,
                                           wrap)
from neuron_compiler.device.transfers import charge_user_copy

aten = torch.ops.aten


def _is_collective_wrapper(func: torch._ops.OpOverload) -> bool:
    """``_c10d_functional._wrap_tensor_autograd`` (registered when funcol is imported)."""
    return func.__name__ == "_wrap_tensor_autograd.default" and func.namespace == "_c10d_functional"


def dispatch(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """Run ``func`` on arguments holding ``neuron`` tensors (module docstring)."""
    single_threaded_backward()
    flat, _ = tree_flatten((args, kwargs))
    devs = [a for a in flat if isinstance(a, NeuronTensor)]
    if any(not is_real(t.payload) for t in devs):
        return _traced(func, args, kwargs)
    if _is_collective_wrapper(func):
        # funcol's eager result wrapper (an AsyncCollectiveTensor, which has no storage of its
        # own): the device result is the collective's output once waited for, as under a trace
        (t,) = args
        return wrap(torch.ops._c10d_functional.wait_tensor.default(payload_of(t)))
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        out = func.decompose(*args, **kwargs)      # under inference_mode: aten.to, reshape, ...
        if out is not NotImplemented:
            return out
    special = _SPECIAL.get(func)
    if special is not None:
        return special(*args, **kwargs)
    if func.is_view:
        return wrap(func(*tree_map(payload_of, args), **tree_map(payload_of, kwargs)))
    if func._schema.is_mutable:
        return _mutating(func, args, kwargs)
    from neuron_compiler.device.eager import run_op
    return run_op(func, args, kwargs)


def _traced(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """Under a trace: run on the payloads; a result that is an argument's payload (an in-place
    op's ``self``) is that argument. A plain tensor of the ``neuron`` device (a factory called
    with ``device=x.device`` inside the traced code: the fake mode builds it without this
    class) joins the payloads through a traced ``.to("cpu")`` (the backend compiles such
    factories for the payloads' CPU device, ``backend.compile_aten_graph``)."""
    by_payload = {id(a.payload): a for a in tree_flatten((args, kwargs))[0]
                  if isinstance(a, NeuronTensor)}

    def inner(a: object) -> object:
        if isinstance(a, torch.Tensor) and not isinstance(a, NeuronTensor) \
                and a.device.type == DEVICE_TYPE:
            return a.to("cpu")
        return payload_of(a)

    cargs, ckwargs = tree_map(inner, args), tree_map(inner, kwargs)
    out = func(*cargs, **ckwargs)
    # an in-place op on such a plain device tensor ran on its CPU copy: write the copy back, so
    # the traced graph keeps the mutation (a factory's tensor updated in place inside compiled
    # code: transformers' lazily created static KV cache)
    for i in _written(func):
        a = args[i] if i < len(args) else None
        if isinstance(a, torch.Tensor) and not isinstance(a, NeuronTensor) \
                and a.device.type == DEVICE_TYPE:
            a.copy_(cargs[i])
            by_payload[id(cargs[i])] = a

    def back(o: object) -> object:
        if not isinstance(o, torch.Tensor):
            return o
        known = by_payload.get(id(o))
        return known if known is not None else NeuronTensor(o)

    return tree_map(back, out)


def _written(func: torch._ops.OpOverload) -> list[int]:
    return [i for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _functional_of(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add.Tensor`` for ``aten.add_.Tensor``; None when there is no such overload."""
    name = func._schema.name.split("::")[-1]
    if not name.endswith("_") or _written(func) != [0]:
        return None
    packet = getattr(aten, name[:-1], None)
    return getattr(packet, func._overloadname, None) if packet is not None else None


def _mutating(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    functional = _functional_of(func)
    if functional is None:
        from neuron_compiler.device.eager import run_on_cpu
        return run_on_cpu(func, args, kwargs, "a mutating op other than op_(self, ...) (an out= "
                          "variant, or several outputs written) is not lowered")
    self = args[0]
    if not isinstance(self, NeuronTensor):
        raise RuntimeError(f"{func}: expected self on the neuron device, got a "
                           f"{self.device.type} tensor")
    from neuron_compiler.device.eager import run_op
    result = run_op(functional, args, kwargs)
    self.payload.copy_(result.payload)
    return self


# ---- copies and host reads ---------------------------------------------------------------------
def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_between(dst, src)


def copy_between(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` where either is a device tensor (module docstring, step 2)."""
    if isinstance(dst, NeuronTensor) and isinstance(src, NeuronTensor):
        dst.payload.copy_(src.payload)
    elif isinstance(dst, NeuronTensor):
        charge_user_copy("to_device", tensor_bytes(src))
        dst.payload.copy_(src)
    else:
        charge_user_copy("to_host", tensor_bytes(src.payload))
        dst.copy_(src.payload)
    return dst


def _to_copy(self: NeuronTensor, **kwargs: object) -> torch.Tensor:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":   # type: ignore[arg-type]
        charge_user_copy("to_host", tensor_bytes(self.payload))
        return aten._to_copy.default(self.payload, **kwargs)
    from neuron_compiler.device.eager import run_op
    return run_op(aten._to_copy.default, (self,), kwargs)


def _local_scalar_dense(self: NeuronTensor) -> object:
    charge_user_copy("to_host", tensor_bytes(self.payload))
    return self.payload.item()


def _resize_(self: NeuronTensor, size: list, memory_format: object = None) -> NeuronTensor:
    if tuple(size) != tuple(self.shape):
        raise RuntimeError(f"aten.resize_: a neuron device tensor cannot be resized in place "
                           f"(from {tuple(self.shape)} to {tuple(size)}); build a new tensor")
    return self


def _refuse(name: str):  # noqa: ANN202
    def refuse(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"{name}: a neuron device tensor cannot be re-pointed at other "
                           f"storage; copy into it (copy_) or build a new tensor")
    return refuse


def _uninitialised(func: torch._ops.OpOverload):  # noqa: ANN202
    """``empty_like`` / ``new_empty`` / ``new_empty_strided``: memory with no defined values
    (allocated, not computed: nothing to simulate)."""
    def build(*args: object, **kwargs: object) -> NeuronTensor:
        return NeuronTensor(func(*tree_map(payload_of, args), **tree_map(payload_of, kwargs)))
    return build


_SPECIAL = {
    aten.empty_like.default: _uninitialised(aten.empty_like.default),
    aten.new_empty.default: _uninitialised(aten.new_empty.default),
    aten.new_empty_strided.default: _uninitialised(aten.new_empty_strided.default),
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.resize_.default: _resize_,
    aten.is_pinned.default: lambda self, device=None: False,
    aten.is_same_size.default: lambda a, b: tuple(a.shape) == tuple(b.shape),
    aten.set_.source_Tensor: _refuse("aten.set_.source_Tensor"),
    aten.set_.source_Storage: _refuse("aten.set_.source_Storage"),
    aten.set_.source_Storage_storage_offset: _refuse("aten.set_.source_Storage_storage_offset"),
}
