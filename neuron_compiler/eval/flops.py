"""Where the model's FLOPs ran: ``device_share.by_flops`` without the simulator's own work.

The model's FLOPs are torch's count (``torch.utils.flop_counter``: matmuls, convolutions,
attention; plus the CPU attention kernels, ``CPU_FORMULAS``) over one eager call. The FLOPs that ran on the host are counted the same way, with the
same registry, over one compiled call: every ATen op that executes inside an eager fallback
(``runtime.FallbackOp``: a node the partitioner left outside, or every node of a partition
whose lowering raised ``Unsupported``) is charged to that fallback op. The device's share of the
model's FLOPs is then ``1 - host FLOPs / model FLOPs``, never clipped.

Invariants
- ``HostFlops`` is a ``TorchDispatchMode`` that only counts: it returns every op's result
  unchanged. An op is charged to the innermost enclosing frame that is a ``FallbackOp.forward``
  (a fallback) or a ``DevicePartition._forward`` (``sim_mode="timing"`` runs a partition's
  graph eagerly for its values: that work is the device's, counted as ``device_eager``); an op
  under neither (AOTAutograd's runtime, the optimizer outside any graph) is ``other_host``,
  counted as host work.
- In ``sim_mode="functional"`` a device partition dispatches no ATen compute op (its values
  come from the simulator), so every counted FLOP of the compiled call is host work or
  ``device_eager`` work, never both for the same op.
- The simulated programs' FLOPs (``partitions[].flops``, which include TensorE transposes and
  other work no ATen node asked for) are reported beside it, never mixed into the share.
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (FlopCounterMode, flop_registry, sdpa_backward_flop_count,
                                      sdpa_flop_count, shape_wrapper)

aten = torch.ops.aten


def _cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch's registry has the CUDA attention kernels only; eager SDPA on the CPU dispatches these
# two, which would otherwise count as 0 FLOPs (the formulas are torch's own, for the same maths)
CPU_FORMULAS = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
                aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward}
REGISTRY = {**flop_registry, **{k: shape_wrapper(v) for k, v in CPU_FORMULAS.items()}}


def model_flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` with ``CPU_FORMULAS``: the model's FLOPs over one eager call."""
    return FlopCounterMode(display=False, custom_mapping=CPU_FORMULAS)


def _codes() -> tuple[object, object]:
    from neuron_compiler.runtime import DevicePartition, FallbackOp
    return FallbackOp.forward.__code__, DevicePartition._forward.__code__


class HostFlops(TorchDispatchMode):
    """Counts, per fallback op, the FLOPs of the ATen ops that run inside it (module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.fallback: Counter = Counter()      # fallback op name -> FLOPs
        self.device_eager = 0
        self.other_host = 0
        self._fallback_code, self._partition_code = _codes()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def _where(self) -> tuple[str, str | None]:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code is self._fallback_code:
                return "fallback", getattr(frame.f_locals.get("self"), "op_name", "?")
            if frame.f_code is self._partition_code:
                return "device", None
            frame = frame.f_back
        return "other", None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = REGISTRY.get(func._overloadpacket)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            if n:
                where, op = self._where()
                if where == "fallback":
                    self.fallback[op] += n
                elif where == "device":
                    self.device_eager += n
                else:
                    self.other_host += n
        return out

    @property
    def host(self) -> int:
        return sum(self.fallback.values()) + self.other_host


def count_host_flops(call: Callable[[], object]) -> HostFlops:
    """Run ``call`` (one compiled call, already warmed up) under ``HostFlops``."""
    with HostFlops() as counter:
        call()
    return counter


def flop_share(model_flops: int, counter: HostFlops, program_flops: int) -> dict:
    """The FLOP entries of ``device_share``."""
    host = counter.host
    device = model_flops - host
    return {
        "by_flops": device / model_flops if model_flops else None,
        "model_flops": int(model_flops),
        "device_flops": int(device),
        "host_flops": int(host),
        "host_flops_by_op": dict(sorted(counter.fallback.items())),
        "host_flops_outside_fallbacks": int(counter.other_host),
        "program_flops": int(program_flops),
        "program_extra_flops": int(program_flops - device),
        "flops_method": ("torch.utils.flop_counter: model FLOPs over one eager call; host FLOPs "
                         "over one compiled call, charged to the eager fallback op they ran "
                         "in; device = model - host (not clipped). program_flops: the "
                         "simulated programs' FLOPs, with TensorE transposes and other work "
                         "no ATen node asked for (program_extra_flops)"),
    }
