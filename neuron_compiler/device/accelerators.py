"""What this torch build has besides the simulated device, and the backward thread that follows.

- ``other_accelerator_built()``: True when torch was built with another accelerator (CUDA,
  ROCm, an available MPS or XPU); then that one owns ``pin_memory`` and autograd's device
  threads, and the registration leaves them alone (``registration`` module docstring, 3-4).
- ``single_threaded_backward()``: autograd runs a backward that reaches a non-CPU device on a
  worker thread of that device; for a Python backend that thread calls into Python (the device
  guard, the kernels), and at interpreter exit it can abort the process ("terminate called
  without an active exception"). On a torch build without another accelerator, every thread
  that runs a device op (``dispatch.dispatch``) or registers the device calls this: its
  backward then runs on the calling thread, as a CPU backward always does.

Invariant: a leaf of the device package (torch only), so that the registration and the
dispatcher both import it and neither imports the other's importer.
"""
from __future__ import annotations

import threading

import torch

_THREADS = threading.local()


def other_accelerator_built() -> bool:
    """Is another accelerator built into this torch (module docstring)?"""
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    return (torch.version.cuda is not None or torch.version.hip is not None
            or bool(mps is not None and mps.is_available())
            or bool(xpu is not None and xpu.is_available()))


def single_threaded_backward() -> None:
    """Backward on the calling thread for this thread (module docstring); cheap after the
    first call in a thread; a no-op on builds with another accelerator."""
    if getattr(_THREADS, "done", False):
        return
    _THREADS.done = True
    if not other_accelerator_built():
        torch._C._set_multithreading_enabled(False)
