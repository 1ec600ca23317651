"""neuron_compiler: the torch face of the neuron backend (Trainium2/3, simulated on the CPU).

``torch.compile(model, backend="neuron")`` works without importing this package (entry points
``neuron`` / ``neuron_sim`` in the ``torch_dynamo_backends`` group). Import it for:

- ``profile()``: a context manager recording what ran on the device and what fell back, with
  simulated, transfer and fallback times (``.summary()``, ``.to_dict()``,
  ``.export_chrome_trace(path)``; ``export_distributed_chrome_trace(prof, path)`` writes one
  trace of every rank under torch.distributed, ``merge_chrome_traces`` merges per-rank files);
- ``NeuronOptions`` / ``validate_options``: the ``options=`` accepted by the backend;
- ``neuron_backend``: the backend callable itself;
- ``bucket_prompt`` / ``prompt_buckets``: a prompt left-padded to a bucket length, so that a new
  prompt length does not compile again (``neuron_compiler.buckets``, ``docs/serving.md``);
- the ``neuron`` device (``neuron_compiler.device``): ``x.to("neuron")``, factories with
  ``device="neuron"``, ``model.to("neuron")``; eager ops on device tensors run on the simulator,
  and ``torch.compile`` over them keeps everything on the device (``docs/device.md``).

``neuron_compiler.nki``: NKI kernels (``@nki.jit``, both API styles) traced into the simulator's
program, checked by the machine's rules, valued and timed on trn1/trn2/trn3 (``docs/nki.md``).

The ``neuron-eval`` command (``python -m neuron_compiler.eval``) lives in ``neuron_compiler.eval``.

Invariants
- Importing this package imports neither ``lowering`` nor the simulator's heavy parts; the
  lowering is imported when the first graph is compiled.
- Importing it registers the ``neuron`` device once (``device.register_device``; a warning, no
  error, when PrivateUse1 already belongs to another backend).
"""
from __future__ import annotations

from neuron_compiler.buckets import BucketedPrompt, bucket_prompt, prompt_buckets
from neuron_compiler.errors import NeuronFallbackError, NeuronOptionError
from neuron_compiler.options import NeuronOptions, validate_options
from neuron_compiler.profile import Profile, profile
from neuron_compiler.version import __version__
from neuron_compiler import device

device.register_device()


def __getattr__(name: str) -> object:
    if name in ("neuron_backend", "neuron_sim_backend"):
        from neuron_compiler import backend
        return getattr(backend, name)
    if name in ("export_distributed_chrome_trace", "merge_chrome_traces"):   # lazy: keeps
        from neuron_compiler import trace_merge    # `python -m neuron_compiler.trace_merge` clean
        return getattr(trace_merge, name)
    raise AttributeError(f"module 'neuron_compiler' has no attribute {name!r}")


__all__ = ["device", "profile", "Profile", "NeuronOptions", "validate_options", "NeuronOptionError",
           "NeuronFallbackError", "neuron_backend", "neuron_sim_backend", "bucket_prompt", "prompt_buckets",
           "BucketedPrompt", "export_distributed_chrome_trace", "merge_chrome_traces",
           "__version__"]
