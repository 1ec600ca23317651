"""``neuron-eval --train``: one training step (forward + loss + backward + optimizer), measured
as an inference call is.

The step, the same for the compiled run and the eager reference:
    loss = sum over the model's floating-point output tensors of mean(out.float() ** 2)
    zero the gradients; loss.backward(); SGD(lr=LR) step
The model and its loss are compiled together (``_WithLoss``), so the forward graph ends in the
loss and AOTAutograd builds its backward graph; the optimizer step is compiled too (a third,
inference graph: the parameter updates run on the device).

Invariants
- Every run starts from a deep copy of the factory's model: each target and the eager reference
  take the same number of steps (``--warmup`` + ``--iters``) from the same weights, so the
  values compared after the last step (the loss, every gradient, every updated parameter) are
  comparable. The model's train/eval mode is left as the factory set it (dropout in train mode
  makes the comparison random: use eval mode or p=0).
- A model without trainable parameters (or not an ``nn.Module``) is a usage error
  (``ModelSpecError``).
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._pytree import tree_map

from neuron_compiler.eval.accuracy import flatten_outputs
from neuron_compiler.eval.zoo import LoadedModel, ModelSpecError

LR = 1e-3
DESCRIPTION = (f"loss = sum of mean(out**2) over float outputs; backward; SGD(lr={LR}) step "
               "(compiled)")


class _WithLoss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        outs = [t for _, t in flatten_outputs(self.model(*args, **kwargs))
                if t.is_floating_point()]
        if not outs:
            raise ModelSpecError("--train: the model returns no floating-point tensor to "
                                 "build a loss from")
        return sum(t.float().pow(2).mean() for t in outs)


def check_trainable(loaded: LoadedModel) -> None:
    model = loaded.model
    if not isinstance(model, nn.Module) or not any(p.requires_grad
                                                   for p in model.parameters()):
        raise ModelSpecError("--train needs an nn.Module with trainable parameters, got "
                             f"{type(model).__name__}")


def _fresh(obj: object) -> object:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, obj)


class TrainRunner:
    """Calls one training step per ``__call__``; returns the values compared for accuracy."""

    def __init__(self, loaded: LoadedModel, compile_fn: Callable | None):
        self.loaded = loaded
        self.module = _WithLoss(copy.deepcopy(loaded.model))
        self.params = [(n.removeprefix("model."), p) for n, p in self.module.named_parameters()
                       if p.requires_grad]
        self.opt = torch.optim.SGD([p for _, p in self.params], lr=LR)
        self.loss_fn = compile_fn(self.module) if compile_fn else self.module
        self.step_fn = compile_fn(self.opt.step) if compile_fn else self.opt.step

    def __call__(self) -> dict[str, torch.Tensor]:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(*_fresh(self.loaded.args), **_fresh(self.loaded.kwargs))
        loss.backward()
        self.step_fn()
        out = {"loss": loss.detach()}
        out.update({f"grad.{n}": p.grad.detach().clone() for n, p in self.params
                    if p.grad is not None})
        out.update({f"param.{n}": p.detach().clone() for n, p in self.params})
        return out


def eager_steps(loaded: LoadedModel, steps: int, live_mode_cls: type) -> tuple[dict, dict]:
    """(values after ``steps`` eager steps, the report's ``model.train`` entry: FLOPs and the
    peak of live tensors of one step, gradient bytes, the step's description)."""
    from neuron_compiler.eval.flops import model_flop_counter
    check_trainable(loaded)
    runner = TrainRunner(loaded, None)
    probe = TrainRunner(loaded, None)
    live = live_mode_cls()
    with model_flop_counter() as fc, live:
        probe()
    out = {}
    for _ in range(steps):
        out = runner()
    grads = sum(p.numel() * p.element_size() for _, p in runner.params)
    return out, {"step": DESCRIPTION, "steps": steps, "flops": int(fc.get_total_flops()),
                 "activation_peak_bytes": int(live.peak), "gradient_bytes": int(grads),
                 "optimizer_state_bytes": 0}
