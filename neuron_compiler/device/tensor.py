"""``NeuronTensor``: a tensor of the ``neuron`` device, its data in the simulated HBM.

A wrapper tensor subclass (``torch.Tensor._make_wrapper_subclass``) whose device is
``neuron:<index>`` (PrivateUse1 renamed) and whose payload, the attribute
``DEVICE_PAYLOAD_ATTR``, is a plain CPU tensor standing for the HBM contents. Every ATen op on it
reaches ``__torch_dispatch__`` (``neuron_compiler.device.dispatch``), below autograd: the
backward's ops are ATen ops too.

The handlers (``dispatch.dispatch`` for every ATen op, ``attention.fused_attention`` for
``F.scaled_dot_product_attention``) build on this module, so it does not import them: the
device's registration installs them (``install_handlers``), once, when ``neuron_compiler`` is
imported, before any device tensor can exist.

Invariants
- The wrapper's sizes, strides, storage offset and dtype are its payload's; a view of a device
  tensor has a payload that is the same view of its base's payload (in-place writes through a
  view reach the base).
- A real payload is a plain ``torch.Tensor`` on the CPU, owned by the device
  (``Residency.own``): a device partition reads it without a copy, a host consumer reads it
  through a charged copy. While Dynamo / AOTAutograd trace, payloads are fake or functional
  tensors: ops then run on them as they are, nothing is simulated or charged.
- ``__tensor_flatten__`` / ``__tensor_unflatten__`` make it a traceable subclass:
  ``torch.compile`` over device tensors hands the backend graphs over the payloads.
- Printing reads the values: it is a user copy to the host, like ``.cpu()``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from neuron_compiler.device.residency import DEVICE_PAYLOAD_ATTR, RESIDENCY, tensor_bytes
from neuron_compiler.device.transfers import charge_user_copy

DEVICE_TYPE = "neuron"

_HANDLERS: dict[str, Callable[..., object]] = {}


def install_handlers(dispatch: Callable[..., object], attention: Callable[..., object]) -> None:
    """Where ``NeuronTensor`` sends its ops (module docstring): ``dispatch(func, args, kwargs)``
    for every ATen op, ``attention(*args, **kwargs)`` (a result or ``NotImplemented``) for
    ``F.scaled_dot_product_attention``; called by ``registration.register``."""
    _HANDLERS.update(dispatch=dispatch, attention=attention)


def device() -> torch.device:
    """The device (one NeuronCore: index 0)."""
    return torch.device(DEVICE_TYPE, 0)


def is_real(payload: torch.Tensor) -> bool:
    """True for a payload holding values (not a fake or functional tensor of a trace)."""
    return type(payload) is torch.Tensor


class NeuronTensor(torch.Tensor):
    """A ``neuron`` device tensor (module docstring). Build one with ``.to("neuron")`` or a
    factory with ``device="neuron"``; ``.cpu()`` copies it back."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        """Every torch function runs as on a plain tensor (as ``_disabled_torch_function_impl``)
        except ``F.scaled_dot_product_attention``: torch picks its fused kernels by device
        type, and for a PrivateUse1 device it takes the math path (bmm, masks, softmax). Here
        it takes the CPU flash kernel's op, which the lowering runs whole."""
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            out = _HANDLERS["attention"](*args, **kwargs)
            if out is not NotImplemented:
                return out
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @staticmethod
    def __new__(cls, payload: torch.Tensor, requires_grad: bool = False) -> "NeuronTensor":
        r = torch.Tensor._make_wrapper_subclass(
            cls, payload.shape, strides=payload.stride(),
            storage_offset=payload.storage_offset(), dtype=payload.dtype, layout=payload.layout,
            device=device(), requires_grad=requires_grad)
        setattr(r, DEVICE_PAYLOAD_ATTR, payload)
        if is_real(payload):
            RESIDENCY.own(payload)
        return r

    @property
    def _is_param(self) -> bool:
        """``nn.Parameter(device_tensor)`` sets this (``isinstance(t, nn.Parameter)`` reads
        it): the payload is then marked as a parameter's (``Residency.mark_parameter``), so
        that compiled inference graphs treat it as one."""
        return bool(self.__dict__.get("_neuron_is_param", False))

    @_is_param.setter
    def _is_param(self, value: bool) -> None:
        self.__dict__["_neuron_is_param"] = bool(value)
        if value and is_real(self.payload):
            RESIDENCY.mark_parameter(self.payload)

    @property
    def payload(self) -> torch.Tensor:
        """The CPU tensor standing for this tensor's HBM contents (no copy is charged: use
        ``.cpu()`` to read values as a user would)."""
        return getattr(self, DEVICE_PAYLOAD_ATTR)

    def tolist(self) -> object:  # noqa: D102 (torch refuses .tolist() on subclasses)
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False) -> object:  # noqa: D102
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                        f"Tensor.cpu() to copy the tensor to host memory first.")

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return [DEVICE_PAYLOAD_ATTR], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: None, outer_size: object,
                             outer_stride: object) -> "NeuronTensor":
        return NeuronTensor(inner[DEVICE_PAYLOAD_ATTR])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return _HANDLERS["dispatch"](func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: str | None = None) -> str:  # noqa: D105
        from torch._tensor_str import _add_suffixes, _tensor_str
        p = self.payload
        if not is_real(p):
            return (f"NeuronTensor(size={tuple(self.shape)}, dtype={self.dtype}, "
                    f"device='{self.device}', payload={type(p).__name__})")
        charge_user_copy("to_host", tensor_bytes(p))
        prefix = "tensor("
        suffixes = [f"device='{self.device}'"]
        if p.numel() == 0 and p.dim() != 1:
            suffixes.append(f"size={tuple(p.shape)}")
        if p.dtype not in (torch.get_default_dtype(), torch.int64, torch.bool):
            suffixes.append(f"dtype={p.dtype}")
        if self.grad_fn is not None:
            suffixes.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            suffixes.append("requires_grad=True")
        contents = "[]" if p.numel() == 0 else _tensor_str(p.detach(), len(prefix))
        return _add_suffixes(prefix + contents, suffixes, len(prefix), False)

    __str__ = __repr__


def wrap(value: object) -> object:
    """Every plain tensor in ``value`` (a tensor, or a tuple / list of them) as a device tensor."""
    if isinstance(value, torch.Tensor) and not isinstance(value, NeuronTensor):
        return NeuronTensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(wrap(v) for v in value)
    return value


def payload_of(value: object) -> object:
    """``value``'s payload when it is a device tensor, else ``value`` (a ``neuron`` device
    argument becomes the CPU device the payloads live on)."""
    if isinstance(value, NeuronTensor):
        return value.payload
    if isinstance(value, torch.device) and value.type == DEVICE_TYPE:
        return torch.device("cpu")
    return value
