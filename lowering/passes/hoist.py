"""Small pointwise kernels of graph inputs moved up (kernel IR -> kernel IR, after fusion).

A decode step computes small values from its inputs in every layer, e.g. GPT-2's cache update
index (``cache_position`` wrapped into the cache) just before the layer's key and value scatters.
In program order such a kernel comes after the layer's QKV projection, so its few GpSimdE
instructions run after that kernel's (engines run their queues in order), and the scatters, then
the attention's cache loads, wait for it. Here every POINTWISE kernel writing at most
``MAX_ELEMS`` elements moves up past at most ``MAX_PASSED`` kernels, no further than just after
the last kernel that writes one of the buffers it reads, and never past another small one (their
order is kept)::

    h = norm(x); q = qkv(h); i = f(pos); scatter(C, i, q)  ->  i = f(pos); h = norm(x); q = qkv(h); scatter(C, i, q)

Invariants
- A kernel moves only past kernels that neither write a buffer it reads or writes nor read or
  write a buffer it writes: every kernel sees the same bytes as before.
- Only kernels writing TEMP buffers of at most ``MAX_ELEMS`` elements in total move (their
  outputs then live longer: a few bytes each).
"""
from __future__ import annotations

from lowering.kir import KKind, KOp, KProgram, Role

MAX_ELEMS = 128
MAX_PASSED = 3      # kernels a small one moves past: GPT-2 decode's norm, QKV projection and
#                     position update (fewer or more measured slower, and so did moving them to
#                     their inputs, all at the start: their GpSimdE instructions then delay the
#                     first layer)


def _bufs(refs) -> set[str]:
    return {r.buffer for r in refs}


def hoist_small_kernels(kp: KProgram) -> list[str]:
    """Move every small pointwise kernel up (module docstring); returns one line per kernel
    moved."""
    done: list[str] = []
    out: list[KOp] = []
    small = set()                   # ids of the small kernels: their order is kept
    for k in kp.kernels:
        pos = len(out)
        if (k.kind is KKind.POINTWISE and k.outs
                and sum(r.numel for r in k.outs) <= MAX_ELEMS
                and all(kp.buffers[r.buffer].role is Role.TEMP for r in k.outs)):
            small.add(id(k))
            reads, writes = _bufs(k.ins), _bufs(k.outs)
            while pos > 0 and len(out) - pos < MAX_PASSED:
                o = out[pos - 1]
                ow, orr = _bufs(o.outs), _bufs(o.ins)
                if id(o) in small or ow & (reads | writes) or orr & writes:
                    break
                pos -= 1
        if pos < len(out):
            done.append(f"{','.join(k.origin[:1]) or 'pointwise'} before "
                        f"{','.join(out[pos].origin[:1]) or out[pos].kind.value}")
        out.insert(pos, k)
    kp.kernels[:] = out
    return done
