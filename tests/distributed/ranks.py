"""Run one function on WORLD gloo ranks (two processes) and collect what each rank returned.

``run_ranks(fn, out_dir, world)`` spawns ``world`` processes; each opens a gloo process group
(file store in ``out_dir``), sets ``NEURON_TEST_OUT=out_dir``, calls ``fn(rank)`` (a module-level
function returning a JSON-ready dict), writes the dict and closes the group; a rank that raised
returns ``{"error": traceback}``. The tests assert on the list, one dict per rank. A rank killed
by a signal after writing its dict (gloo's teardown) is a warning, not a failure; killed before,
or exiting with an error code, it fails the run.
"""
from __future__ import annotations

import json
import os
import traceback
import warnings
from datetime import timedelta
from collections.abc import Callable

import torch.multiprocessing as mp


def _worker(rank: int, fn: Callable[[int], dict], out_dir: str, world: int) -> None:
    import torch.distributed as dist
    os.environ["NEURON_TEST_OUT"] = out_dir
    result: dict = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'store')}",
                                rank=rank, world_size=world)
        result = fn(rank)
    except Exception:                         # reported by the tests, not lost in the child
        result = {"error": traceback.format_exc()}
    finally:
        # the result first: what ``fn`` did is kept whatever the teardown below does
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        if dist.is_initialized():
            # both ranks done before either tears the group down: a rank that exits while the
            # other still has a collective in flight aborts in gloo's threads ("terminate called
            # without an active exception", seen under load); bounded, so a failed rank
            # cannot hang the other
            try:
                dist.monitored_barrier(timeout=timedelta(seconds=120))
            except Exception:
                pass
            dist.destroy_process_group()


def run_ranks(fn: Callable[[int], dict], out_dir: str, world: int) -> list[dict]:
    """What ``fn`` returned on each rank; fails (naming the rank) if one raised."""
    try:
        mp.spawn(_worker, args=(fn, str(out_dir), world), nprocs=world, join=True)
    except mp.ProcessExitedException as exc:
        # a rank killed by a signal after it wrote its result died in gloo's teardown (the
        # abort above, seen under load), not in ``fn``: its result stands, the crash is said
        missing = [r for r in range(world)
                   if not os.path.exists(os.path.join(out_dir, f"rank{r}.json"))]
        if missing or exc.signal_name is None:
            raise
        warnings.warn(f"run_ranks: {exc} after every rank wrote its result (gloo teardown)")
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r} failed:\n{res['error']}"
    return results
