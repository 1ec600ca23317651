"""Functional collectives in eager mode on ``neuron`` device tensors, on two gloo ranks.

``funcol.all_reduce(x)`` outside a compiled function returns, on the CPU, an
``AsyncCollectiveTensor`` made by ``_c10d_functional._wrap_tensor_autograd``; on the device the
result is a device tensor holding the collective's output once waited for
(``device/dispatch.py``), and the collective is timed in the profile. A column-parallel linear
layer as DTensor (eager, on a ``neuron`` mesh) checks the same path through DTensor's
redistribution.
"""
from __future__ import annotations

import pytest
import torch

from ranks import run_ranks

WORLD = 2


def _scenarios(rank: int) -> dict:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import neuron_compiler
    out: dict = {}
    x = torch.arange(6.0) + rank
    with neuron_compiler.profile() as prof:
        y = funcol.all_reduce(x.to("neuron"), "sum", dist.group.WORLD)
        z = (y * 2).cpu()
        g = funcol.all_gather_tensor(x.to("neuron"), 0, dist.group.WORLD).cpu()
    d = prof.to_dict()
    out["all_reduce"] = {"device": str(y.device), "values": z.tolist(),
                         "expected": ((torch.arange(6.0) * 2 + 1) * 2).tolist()}
    out["all_gather"] = {"values": g.tolist(),
                         "expected": torch.cat([torch.arange(6.0) + r for r in range(WORLD)]).tolist()}
    out["collectives"] = sorted(c["kind"] for c in d["collectives"])
    out["collective_time_us"] = d["collective_time_us"]

    # DTensor, eager, on the device (a mesh of the ``neuron`` device type: distribute_tensor
    # moves a tensor to its mesh's device): x replicated, w sharded by rows (column parallel),
    # the output gathered to every rank
    mesh = init_device_mesh("neuron", (WORLD,))
    torch.manual_seed(0)
    xf, wf = torch.randn(5, 8), torch.randn(12, 8)
    xd = distribute_tensor(xf.to("neuron"), mesh, [Replicate()])
    wd = distribute_tensor(wf.to("neuron"), mesh, [Shard(0)])
    with neuron_compiler.profile() as prof:
        yd = torch.nn.functional.linear(xd, wd).redistribute(mesh, [Replicate()])
        full = yd.to_local().cpu()
    out["dtensor"] = {"local": type(yd.to_local()).__name__,
                      "max_err": float((full - xf @ wf.T).abs().max()),
                      "scale": float((xf @ wf.T).abs().max()),
                      "collectives": sorted(c["kind"] for c in prof.to_dict()["collectives"])}
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_scenarios, str(tmp_path_factory.mktemp("device_collectives")), WORLD)


def test_eager_funcol_on_device_tensors_gives_device_results_and_is_timed(ranks):
    for r in ranks:
        assert "error" not in r, r.get("error")
        ar = r["all_reduce"]
        assert ar["device"].startswith("neuron") and ar["values"] == ar["expected"]
        assert r["all_gather"]["values"] == r["all_gather"]["expected"]
        assert r["collectives"] == ["all_gather", "all_reduce"]
        assert r["collective_time_us"] > 0


def test_eager_dtensor_on_the_device_matches(ranks):
    for r in ranks:
        assert "error" not in r, r.get("error")
        d = r["dtensor"]
        assert d["max_err"] <= 1e-5 * d["scale"], d
        assert d["local"] == "NeuronTensor" and "all_gather" in d["collectives"], d
