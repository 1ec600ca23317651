"""Make ``neuron`` a torch device: PrivateUse1 renamed, its device module, its factories.

``register(module)`` (called once by ``import neuron_compiler``):
1. PrivateUse1 is renamed ``neuron`` with torch's Python-backend setup
   (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``: rename, the
   generated ``Tensor.neuron()`` / ``is_neuron`` / ``Module.neuron()`` methods, the device module
   ``torch.neuron`` = ``module``, a device guard and hooks so that autograd's engine can run
   backward on the device). On a torch without it, the public steps are taken
   (``rename_privateuse1_backend``, ``generate_methods_for_privateuse1_backend``,
   ``_register_device_module``).
2. Factories reached from a ``device="neuron"`` argument (``torch.empty`` / ``zeros`` / ``ones``
   / ``full`` / ``arange`` / ``rand`` / ``randn`` / ``randint`` / ``randperm`` / ``eye`` /
   ``linspace`` / ``logspace`` / ``scalar_tensor``, and ``empty_strided``, which
   ``.to("neuron")`` calls) get PrivateUse1 kernels (``torch.library``) that build the values on
   the CPU and return a ``NeuronTensor``: random draws come from torch's CPU generator, so a
   seed gives the CPU's values. Their time is not simulated (the device's memset / iota / RNG is
   not modelled) and no copy is charged. ``torch.tensor(data, device="neuron")`` reaches
   ``aten._copy_from`` with the Python key excluded: a PrivateUse1 kernel does that user copy.

3. Registering the device makes it torch's accelerator (``torch.accelerator``), so
   ``DataLoader(pin_memory=True)`` and ``t.pin_memory()`` ask it for pinned host memory, which
   a Python backend cannot provide. On a torch build without another accelerator (where
   ``pin_memory()`` raises anyway), a CPU kernel of ``aten::_pin_memory`` returns an ordinary
   copy: the simulated device reads host memory the same either way.

4. Autograd runs a backward that reaches a non-CPU device on a worker thread of that device;
   for a Python backend that thread calls into Python (the device guard, the kernels), and at
   interpreter exit it can abort the process ("terminate called without an active
   exception"). On a torch build without another accelerator, every thread that runs a
   device op gets ``torch.autograd.set_multithreading_enabled(False)`` (``single_threaded_
   backward``, ``neuron_compiler.device.accelerators``): its backward runs on the calling
   thread, as a CPU backward always does.

5. ``NeuronTensor``'s handlers are installed (``tensor.install_handlers``): every ATen op goes
   to ``dispatch.dispatch``, ``F.scaled_dot_product_attention`` to
   ``attention.fused_attention``. Those modules build on ``tensor.py``, which cannot import
   them: this step, run from the package's ``register_device`` only, joins them.

Invariants
- Registration happens at most once per process; when PrivateUse1 is already renamed to another
  backend (AWS's torch-neuronx, say), nothing is registered and ``why_unavailable()`` says why
  (``import neuron_compiler`` still works: only the device is missing).
- Every op with a ``neuron`` tensor argument reaches ``NeuronTensor.__torch_dispatch__``; the
  PrivateUse1 kernels here only see calls without one (factories).
"""
from __future__ import annotations

import types
import warnings

import torch

from neuron_compiler.device.accelerators import other_accelerator_built, single_threaded_backward
from neuron_compiler.device.attention import fused_attention
from neuron_compiler.device.dispatch import copy_between, dispatch
from neuron_compiler.device.tensor import DEVICE_TYPE, NeuronTensor, install_handlers

FACTORIES = (
    "empty.memory_format", "empty_strided", "zeros", "ones", "full", "arange", "arange.start",
    "arange.start_step", "rand", "rand.generator", "randn", "randn.generator", "randint",
    "randint.generator", "randint.low", "randint.low_generator", "randperm",
    "randperm.generator", "eye", "eye.m", "linspace", "logspace", "scalar_tensor",
)

_STATE: dict[str, object] = {"registered": False, "unavailable": None, "library": None}


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _factory_kernel(op: torch._ops.OpOverload):  # noqa: ANN202
    def kernel(*args: object, **kwargs: object) -> NeuronTensor:
        kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        return NeuronTensor(op(*args, **kwargs))
    kernel.__name__ = f"neuron_{op.__name__.replace('.', '_')}"
    return kernel


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``torch.tensor(data, device="neuron")`` copies with the Python key excluded: this
    PrivateUse1 kernel of ``aten._copy_from`` does that copy (``dispatch._copy_``)."""
    return copy_between(dst, src)


def _pin_memory(self: torch.Tensor, device: object = None) -> torch.Tensor:
    """Host memory "pinned" for the simulated device is ordinary memory (module docstring)."""
    return self.clone()


def _setup(module: types.ModuleType) -> None:
    from torch.utils import backend_registration as br
    setup = getattr(br, "_setup_privateuseone_for_python_backend", None)
    if setup is not None:
        setup(DEVICE_TYPE, backend_module=module)
        return
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module(DEVICE_TYPE, module)


def register(module: types.ModuleType) -> bool:
    """Register the ``neuron`` device (module docstring); True when it is available."""
    install_handlers(dispatch=dispatch, attention=fused_attention)
    if _STATE["registered"]:
        return _STATE["unavailable"] is None
    _STATE["registered"] = True
    current = torch._C._get_privateuse1_backend_name()
    if current != "privateuseone":
        _STATE["unavailable"] = (
            f"PrivateUse1 is already the {current!r} backend (registered by another package, "
            f"e.g. AWS torch-neuronx); the simulated 'neuron' device needs it")
        warnings.warn(f"neuron_compiler: no simulated 'neuron' device: {_STATE['unavailable']}",
                      stacklevel=3)
        return False
    _setup(module)
    lib = torch.library.Library("aten", "IMPL")
    for name in FACTORIES:
        lib.impl(name, _factory_kernel(_overload(name)), "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    if not other_accelerator_built():
        lib.impl("_pin_memory", _pin_memory, "CPU")
    single_threaded_backward()
    _STATE["library"] = lib          # kept alive: dropping it unregisters the kernels
    return True


def why_unavailable() -> str | None:
    """None when the device is registered, else the reason it is not."""
    if not _STATE["registered"]:
        return "neuron_compiler.device has not been registered"
    return _STATE["unavailable"]  # type: ignore[return-value]
