"""LNC=1 against LNC=2: simulated steady-state time of a few kernels per target.

    PYTHONPATH=. python bench/bench_lnc.py [--targets trn2,trn3] [--models]

Each case is compiled twice (``options={"lnc": 1}`` and ``{"lnc": 2}``, ``sim_mode="timing"``)
and called twice; the second call's simulated device time is printed (operands already on the
device), with the ratio LNC=2 / LNC=1 and how many physical cores the partitions ran on. The
issue-24 line is ``mm 4096^3 bf16`` on trn2: ratio <= 0.6. ``--models`` runs GPT-2 small
(transformers' default config, random weights, bf16, no KV cache) at batch 2 and 1, seq 128,
instead of the kernels (needs transformers).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import neuron_compiler

BF = torch.bfloat16


def _cases():
    def mm(n):
        return torch.mm, (torch.empty(n, n, dtype=BF), torch.empty(n, n, dtype=BF))

    def sdpa():
        q = [torch.empty(1, 8, 2048, 128, dtype=BF) for _ in range(3)]
        return F.scaled_dot_product_attention, tuple(q)

    def rows(fn):
        return fn, (torch.empty(8192, 4096, dtype=BF),)

    return [("mm 4096^3 bf16", lambda: mm(4096)), ("mm 2048^3 bf16", lambda: mm(2048)),
            ("sdpa [1,8,2048,128]", sdpa),
            ("softmax [8192,4096]", lambda: rows(lambda x: torch.softmax(x, -1))),
            ("layer_norm [8192,4096]", lambda: rows(lambda x: F.layer_norm(x, (4096,)))),
            ("gelu [8192,4096]", lambda: rows(F.gelu))]


def _models():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).eval().to(BF)

    def logits(ids):
        return m(ids, use_cache=False).logits
    return [(f"gpt2-small b{b} s128", lambda b=b: (logits, (torch.randint(0, 50257, (b, 128)),)))
            for b in (2, 1)]


def steady_us(fn, args, target: str, lnc: int) -> tuple[float, str]:
    torch._dynamo.reset()
    f = torch.compile(fn, backend="neuron",
                      options={"target": target, "lnc": lnc, "sim_mode": "timing"})
    f(*args)
    with neuron_compiler.profile() as prof:
        f(*args)
    d = prof.to_dict()
    cores = sorted({len(p.get("cores", [None])) for p in d["partitions"]})
    return d["simulated_time_us"], "/".join(map(str, cores))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn2,trn3")
    ap.add_argument("--models", action="store_true")
    a = ap.parse_args()
    print(f"{'case':26s} {'target':6s} {'lnc=1 us':>10s} {'lnc=2 us':>10s} {'ratio':>6s} cores")
    with torch.no_grad():
        for name, make in (_models() if a.models else _cases()):
            fn, args = make()
            for target in a.targets.split(","):
                one, _ = steady_us(fn, args, target, 1)
                two, cores = steady_us(fn, args, target, 2)
                print(f"{name:26s} {target:6s} {one:10.1f} {two:10.1f} {two / one:6.2f} {cores}",
                      flush=True)


if __name__ == "__main__":
    main()
