"""Data parallelism over neuron-compiled modules: the collectives of DDP and FSDP2, timed by the
collective model, and the comparison of a compiled training run with an eager one.

Where the collectives are (torch 2.13), and how each is timed:
- **DDP** (``torch.nn.parallel.DistributedDataParallel`` around ``torch.compile(module,
  backend="neuron")``): the gradient all_reduce is issued by DDP's C++ ``Reducer`` from autograd
  hooks when a bucket's gradients are ready, i.e. **outside every compiled graph** (Dynamo's
  ``DDPOptimizer`` only splits the compiled forward at bucket boundaries so that each bucket's
  backward graph ends before the next, ``torch/_dynamo/backends/distributed.py``).
  ``time_ddp(ddp, target)`` registers a DDP communication hook (``register_comm_hook``, the
  documented way to replace the Reducer's all_reduce) that runs torch's default
  ``allreduce_hook`` (divide by the world size, all_reduce SUM through the process group: the
  values are gloo's) and records one ``all_reduce`` of the bucket's flat buffer.
- **FSDP2** (``torch.distributed.fsdp.fully_shard``): the parameter all_gather (before forward and
  backward) and the gradient reduce_scatter (after backward) are issued by FSDP's module and
  autograd hooks, which Dynamo does not trace (``torch._dynamo.config.skip_fsdp_hooks``, default
  True): outside compiled graphs too. ``time_fsdp(model, target)`` sets FSDP2's comm API
  (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``) on every FSDP module to
  comms that call what FSDP2's defaults call (``dist.all_gather_single`` /
  ``dist.reduce_scatter_single``) and record each call.
- **DDP under compiled autograd** (``torch._dynamo.config.optimize_ddp = "python_reducer"`` and
  ``compiled_autograd = True``, a compiled step that calls ``loss.backward()``): DDP's Python
  reducer all_reduces each gradient with ``_functional_collectives.all_reduce`` from a
  post-accumulate-grad hook, which compiled autograd traces **into the compiled backward graph**:
  device operations of ``neuron_compiler.collectives`` (one per parameter, not bucketed), timed
  there; nothing here is needed but ``train(..., compile_step=...)``.
- Other functional collectives inside a compiled graph (TP, SimpleFSDP) are likewise
  ``neuron_compiler.collectives``' business.

Each hook call is timed by ``collectives.record_collective``, the same path as an in-graph
collective: ``runtime_sim.collectives.collective_cost(kind, bytes, group size, target, lnc)``
(nccom-test's size: the all_reduce buffer, the all_gather output, the reduce_scatter input). It
lands in every open ``neuron_compiler.profile()`` under ``collectives`` / ``collective_time_us``,
the summary's collective table and the Chrome trace, filed under a ``GraphRecord`` of kind
``"comm_hook"`` (named ``ddp_comm_hook`` / ``fsdp2_comm``; op names say the bucket or the FSDP
module). Not timed: FSDP2's HSDP all_reduce (``dist.all_reduce`` called directly), DDP's initial
parameter broadcast (before training), the host copies of a bucket (the gradients are taken to be
in HBM, where the compiled backward wrote them).

Invariants
- The hooks change no value: DDP's gradients are those of torch's default hook, FSDP2's those of
  its default comms (the same process-group calls).
- A hook call outside a compiled graph call is filed under the phase of the last graph call
  (``profile``: the step it belongs to), so ``warmup`` / ``steady_state`` include it;
  ``hook_collective_time_us(d)`` gives the hooks' total over the profile.
- ``compare_runs`` fails on a loss or gradient element outside ``|a - e| <= atol + rtol |e|``
  (``GRAD_RTOL``; ``atol`` = ``GRAD_CANCELLATION`` x the tensor's mean magnitude): one gradient
  element off by 1e-3 of the tensor's largest fails.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from neuron_compiler.collectives import record_collective
from neuron_compiler.device.residency import tensor_bytes
from neuron_compiler.profile import GraphRecord

DDP_HOOK = "ddp_comm_hook"
FSDP_HOOK = "fsdp2_comm"
HOOK_KIND = "comm_hook"
# fp32 training on the simulator against eager fp32: the rounding of a different summation order
# (testing.TOLERANCES / CANCELLATION for float32)
GRAD_RTOL = 1e-4
GRAD_CANCELLATION = 1e-5


def hook_record(name: str, target: str, lnc: int = 1) -> GraphRecord:
    """The record under which a hook's collectives are filed (no compute nodes of its own),
    placed by ``lnc``: the compiled module's option (the backend's default, 1)."""
    return GraphRecord(name=name, kind=HOOK_KIND, target=target, device_nodes=0,
                       fallback_nodes=0, fallbacks=(), partitions=(), lnc=lnc)


# ---- DDP ---------------------------------------------------------------------------------------
def ddp_hook(target: str = "trn2", lnc: int = 1, group: object = None) -> Callable:
    """A DDP comm hook ``hook(state, bucket)``: torch's default all_reduce of the bucket, timed
    (module docstring). ``group``: the process group (default: the default group)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    record = hook_record(DDP_HOOK, target, lnc)

    def hook(state, bucket):   # no annotations: DDP checks them, and this module's are strings
        pg = group if group is not None else dist.group.WORLD
        buf = bucket.buffer()
        nbytes = tensor_bytes(buf)            # before the hook divides it in place
        t0 = time.perf_counter_ns()
        fut = allreduce_hook(pg, bucket)
        record_collective(record, f"c10d.allreduce (DDP bucket {bucket.index()})", "all_reduce",
                          nbytes, dist.get_world_size(pg), time.perf_counter_ns() - t0)
        return fut

    return hook


def time_ddp(ddp: nn.Module, target: str = "trn2", lnc: int = 1) -> nn.Module:
    """Register ``ddp_hook`` on a ``DistributedDataParallel`` (once: DDP takes one comm hook);
    ``target`` and ``lnc`` should be the compiled module's. Returns ``ddp``."""
    ddp.register_comm_hook(None, ddp_hook(target, lnc, ddp.process_group))  # type: ignore[operator]
    return ddp


# ---- FSDP2 -------------------------------------------------------------------------------------
def _fsdp_comms() -> tuple[type, type]:
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllocMixin

    class TimedAllGather(DefaultAllocMixin, AllGather):
        """FSDP2's default all_gather (``dist.all_gather_single``), timed."""

        def __init__(self, record: GraphRecord, name: str):
            self.record, self.op_name = record, f"c10d.all_gather ({name})"

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t0 = time.perf_counter_ns()
            work = dist.all_gather_single(output_tensor, input_tensor, group=group,
                                          async_op=async_op)
            record_collective(self.record, self.op_name, "all_gather", tensor_bytes(output_tensor),
                              group.size(), time.perf_counter_ns() - t0)
            return work

    class TimedReduceScatter(DefaultAllocMixin, ReduceScatter):
        """FSDP2's default reduce_scatter (``dist.reduce_scatter_single``), timed."""

        def __init__(self, record: GraphRecord, name: str):
            self.record, self.op_name = record, f"c10d.reduce_scatter ({name})"

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            t0 = time.perf_counter_ns()
            work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor,
                                              group=group, op=op, async_op=async_op)
            record_collective(self.record, self.op_name, "reduce_scatter",
                              tensor_bytes(input_tensor), group.size(), time.perf_counter_ns() - t0)
            return work

    return TimedAllGather, TimedReduceScatter


def time_fsdp(model: nn.Module, target: str = "trn2", lnc: int = 1) -> nn.Module:
    """Time the all_gather and reduce_scatter of every FSDP2 module of ``model`` (module
    docstring); call after ``fully_shard``. Returns ``model``."""
    from torch.distributed.fsdp import FSDPModule
    gather, scatter = _fsdp_comms()
    record = hook_record(FSDP_HOOK, target, lnc)
    found = 0
    for name, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            label = f"FSDP2 {name or 'root'}"
            mod.set_custom_all_gather(gather(record, label))
            mod.set_custom_reduce_scatter(scatter(record, label))
            found += 1
    if not found:
        raise ValueError(f"time_fsdp: {type(model).__name__} has no module wrapped by "
                         f"fully_shard; call fully_shard first")
    return model


def hook_collective_time_us(profile_dict: dict) -> float:
    """The modelled time of the collectives the DDP / FSDP2 hooks recorded in a profile's
    ``to_dict()`` (all steps; ``warmup`` / ``steady_state`` file each under its step)."""
    names = {g["name"] for g in profile_dict["graphs"] if g["kind"] == HOOK_KIND}
    return sum(c["time_us"] for c in profile_dict["collectives"] if c["graph"] in names)


# ---- a training run and its comparison ---------------------------------------------------------
@dataclass
class Run:
    """What one training run gave on one rank: per step, the loss and every gradient (the
    rank's local shard for a DTensor parameter, as FSDP2 leaves them)."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, else the tensor (detached, copied)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().clone()


def train(model: nn.Module, params: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]],
          loss_fn: Callable[..., torch.Tensor], lr: float = 0.05,
          compile_step: Callable[[Callable], Callable] | None = None) -> Run:
    """Run one SGD step per batch through ``model`` (the wrapped / compiled callable) and record
    the losses and the gradients of ``params``' named parameters (before each update).
    ``compile_step``: compiles the forward + backward step function as a whole (compiled
    autograd traces the backward, DDP's Python reducer included, when its config is on)."""
    named = list(params.named_parameters())
    opt = torch.optim.SGD([p for _, p in named], lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach()

    if compile_step is not None:
        step = compile_step(step)
    run = Run()
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = step(x, y)
        run.losses.append(float(loss))
        run.grads.append({n: local(p.grad) for n, p in named if p.grad is not None})
        opt.step()
    return run


def compare_runs(eager: Run, compiled: Run, rtol: float = GRAD_RTOL,
                 cancellation: float = GRAD_CANCELLATION) -> list[str]:
    """Every loss and gradient of ``compiled`` against ``eager`` (module docstring); returns the
    failures, one line each (empty: all within tolerance)."""
    from neuron_compiler.testing import assert_close
    bad: list[str] = []
    if len(eager.losses) != len(compiled.losses):
        return [f"steps: {len(compiled.losses)} compiled, {len(eager.losses)} eager"]
    for step, (le, lc) in enumerate(zip(eager.losses, compiled.losses)):
        try:
            assert_close(torch.tensor(lc), torch.tensor(le), rtol=rtol,
                         atol=cancellation * abs(le), what=f"step {step} loss")
        except AssertionError as e:
            bad.append(str(e))
        ge, gc = eager.grads[step], compiled.grads[step]
        if set(ge) != set(gc):
            bad.append(f"step {step}: gradients of {sorted(set(ge) ^ set(gc))} in one run only")
        for name in sorted(set(ge) & set(gc)):
            e = ge[name]
            atol = cancellation * float(e.abs().mean()) if e.numel() else 0.0
            try:
                assert_close(gc[name], e, rtol=rtol, atol=atol, what=f"step {step} grad {name}")
            except AssertionError as err:
                bad.append(str(err))
    return bad


def worst_error(eager: Run, compiled: Run) -> tuple[float, float]:
    """(largest |loss difference| / |loss|, largest gradient error / that tensor's max |e|)."""
    loss = max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(compiled.losses, eager.losses)),
               default=0.0)
    grad = 0.0
    for ge, gc in zip(eager.grads, compiled.grads):
        for n in set(ge) & set(gc):
            scale = float(ge[n].abs().max()) if ge[n].numel() else 0.0
            if scale:
                grad = max(grad, float((gc[n] - ge[n]).abs().max()) / scale)
    return loss, grad


def perturbed(run: Run, step: int, name: str, frac: float = 1e-3) -> Run:
    """A copy of ``run`` with one element of one gradient moved by ``frac`` of that tensor's
    largest magnitude (to show that ``compare_runs`` can fail)."""
    grads = [dict(g) for g in run.grads]
    g = grads[step][name].clone()
    flat = g.view(-1)
    flat[0] += frac * float(g.abs().max())
    grads[step][name] = g
    return Run(list(run.losses), grads)


def batches(n: int, shape_x: Sequence[int], shape_y: Sequence[int],
            seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` seeded (input, target) pairs (a rank passes its own seed: its own data)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape_x, generator=gen), torch.randn(*shape_y, generator=gen))
            for _ in range(n)]
