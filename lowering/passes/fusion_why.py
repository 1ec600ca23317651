"""Why two kernels stayed apart: one ``WhyNoFuse`` line per producer -> consumer pair of kernels
that still meet through a temporary after fusion (``fusion.fuse`` appends them to
``KProgram.notes``; the dump shows them per kernel boundary in ``decisions.md``).

The reason comes from the rule that would have fused the pair, asked again on the final
program (``fusion.chain_plan`` for a pointwise producer, ``fusion.epilogue_plan`` for a matmul
feeding a pointwise kernel): the same predicate that refused it, never a second copy of it.
Pairs no rule fuses (a matmul feeding a norm, a norm feeding a matmul, ...) say so.

Invariants
- One line per (producer, consumer, tensor); the text before the first ``:`` names both kernels'
  ATen nodes (the dump matches boundaries on them).
- Explaining never changes the program.
"""
from __future__ import annotations

from lowering.kir import KKind, KProgram
from lowering.passes.fusion_rules import chain_plan, epilogue_plan, readers_of, writers_of

# what a pair of kinds could become when no rule covers it
NO_RULE = "no fusion rule takes a {p} output into a {c} kernel (the tensor stays resident in " \
          "SBUF between them when it fits, else it goes through HBM)"


def explain(kp: KProgram) -> list[str]:
    readers, writers = readers_of(kp), writers_of(kp)
    outputs = {r.buffer for r in kp.outputs}
    lines: list[str] = []
    for pi, prod in enumerate(kp.kernels):
        # the producer's own refusal (one answer for all its readers)
        chain = chain_plan(kp, pi, readers, writers, outputs)[0] if prod.kind is KKind.POINTWISE else None
        epi = (epilogue_plan(kp, pi, readers, writers, outputs)[0]
               if prod.kind is KKind.MATMUL else None)
        for o in prod.outs:
            X = o.buffer
            for ci in sorted(set(readers.get(X, []))):
                if ci == pi or X not in kp.buffers:
                    continue
                cons = kp.kernels[ci]
                pk, ck = prod.kind.name.lower(), cons.kind.name.lower()
                if prod.kind is KKind.POINTWISE:
                    why = chain
                elif prod.kind is KKind.MATMUL and cons.kind is KKind.POINTWISE:
                    why = epi
                else:
                    why = NO_RULE.format(p=pk, c=ck)
                if why is None:     # fusable now: only when a later pass produced the pair
                    why = "fusable, but the pair formed after the rule's last run"
                line = (f"WhyNoFuse {pk} -> {ck} at {','.join(prod.origin)} -> "
                        f"{','.join(cons.origin)}: %{X}: {why}")
                if line not in lines:
                    lines.append(line)
    return lines
