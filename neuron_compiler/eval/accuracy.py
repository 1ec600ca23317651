"""Accuracy of compiled outputs against eager reference outputs, per output, per dtype.

Metrics of one output (``compare``), computed in float64 over the finite positions of both:
- ``max_abs``: max |actual - expected|;
- ``max_rel``: max |actual - expected| / max(|expected|, atol) (the floor keeps near-zero
  reference values from making it meaningless; with atol 0 the floor is the dtype's tiny);
- ``cosine``: cosine similarity of the flattened tensors (1.0 when both are all zero);
- ``mismatched``: elements failing |actual - expected| <= atol + rtol * |expected|
  (``torch.allclose``'s rule), counting a NaN/Inf where the other side differs as a mismatch.
An output passes when ``mismatched == 0``, ``cosine >= min_cosine`` (not judged when both
tensors are within atol of zero everywhere: their direction is rounding noise) and the shapes
and dtypes agree.

Invariants
- Thresholds are per dtype (``Thresholds``); ``DEFAULT_THRESHOLDS`` covers every dtype that a
  user flag can name (``--atol float32=1e-4`` or ``--atol 1e-4`` for every dtype; the same for
  ``--rtol`` and ``--min-cosine``); integer and bool outputs must match exactly by default.
- ``flatten_outputs`` names outputs by their path (``out``, ``out[0]``, ``out.logits``); its
  order is the model's, so the same model yields the same names on every run.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Thresholds:
    atol: float
    rtol: float
    min_cosine: float

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine}


# fp32: the simulator computes in fp32 with a different summation order than eager (tiled K,
# PSUM accumulation), so a few ulps times the depth of a small model; 2-byte types: about two
# bf16/fp16 ulps at 1.0, as torch.testing's defaults (bf16 rtol 1.6e-2, fp16 1e-3) widened for
# whole models.
DEFAULT_THRESHOLDS: dict[str, Thresholds] = {
    "float64": Thresholds(1e-6, 1e-5, 0.99999),
    "float32": Thresholds(1e-4, 1e-3, 0.9999),
    "bfloat16": Thresholds(5e-2, 5e-2, 0.999),
    "float16": Thresholds(5e-3, 5e-3, 0.9995),
    "float8_e4m3fn": Thresholds(0.25, 0.25, 0.99),
    "float8_e5m2": Thresholds(0.5, 0.5, 0.98),
    "int64": Thresholds(0.0, 0.0, 1.0), "int32": Thresholds(0.0, 0.0, 1.0),
    "int16": Thresholds(0.0, 0.0, 1.0), "int8": Thresholds(0.0, 0.0, 1.0),
    "uint8": Thresholds(0.0, 0.0, 1.0), "bool": Thresholds(0.0, 0.0, 1.0),
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_threshold_flags(atol: list[str], rtol: list[str], min_cosine: list[str]
                          ) -> dict[str, Thresholds]:
    """Apply ``--atol/--rtol/--min-cosine`` values (``V`` or ``DTYPE=V``) to the defaults;
    raises ValueError naming the flag and the bad value."""
    table = dict(DEFAULT_THRESHOLDS)
    for flag, field_name, values in (("--atol", "atol", atol), ("--rtol", "rtol", rtol),
                                     ("--min-cosine", "min_cosine", min_cosine)):
        for text in values or ():
            name, sep, value = text.rpartition("=")
            dtypes = [name] if sep else list(table)
            if sep and name not in table:
                raise ValueError(f"{flag}: unknown dtype {name!r}; known: {', '.join(table)}")
            try:
                v = float(value)
            except ValueError:
                raise ValueError(f"{flag}: {value!r} is not a number (expected VALUE or "
                                 f"DTYPE=VALUE)") from None
            if math.isnan(v) or v < 0 or (field_name == "min_cosine" and v > 1):
                raise ValueError(f"{flag}: {v} is out of range (atol/rtol >= 0, "
                                 f"0 <= min-cosine <= 1)")
            for d in dtypes:
                table[d] = replace(table[d], **{field_name: v})
    return table


def flatten_outputs(obj: object, prefix: str = "out") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a model's output, named by its path; non-tensor leaves are skipped."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, Mapping):
        out: list[tuple[str, torch.Tensor]] = []
        for k, v in obj.items():
            out += flatten_outputs(v, f"{prefix}.{k}")
        return out
    if isinstance(obj, (tuple, list)):
        out = []
        for i, v in enumerate(obj):
            out += flatten_outputs(v, f"{prefix}[{i}]")
        return out
    return []


def compare(name: str, actual: torch.Tensor | None, expected: torch.Tensor,
            table: dict[str, Thresholds]) -> dict:
    """One output's accuracy row (module docstring)."""
    dt = dtype_name(expected.dtype)
    th = table.get(dt, DEFAULT_THRESHOLDS["float32"])
    row = {"name": name, "dtype": dt, "shape": list(expected.shape),
           "thresholds": th.to_dict(), "max_abs": None, "max_rel": None, "cosine": None,
           "mismatched": None, "numel": int(expected.numel()), "passed": False, "problem": None}
    if actual is None:
        row["problem"] = "the compiled model did not return this output"
        return row
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        row["problem"] = (f"expected {dt}{list(expected.shape)}, got "
                          f"{dtype_name(actual.dtype)}{list(actual.shape)}")
        return row
    a = actual.detach().to(torch.float64).reshape(-1)
    e = expected.detach().to(torch.float64).reshape(-1)
    both = torch.isfinite(a) & torch.isfinite(e)
    same_special = (~torch.isfinite(a)) & (~torch.isfinite(e)) & (
        (torch.isnan(a) & torch.isnan(e)) | (a == e))
    diff = (a - e).abs()
    tiny = float(torch.finfo(expected.dtype).tiny) if expected.dtype.is_floating_point else 1.0
    floor = max(th.atol, tiny)
    ok = torch.where(both, diff <= th.atol + th.rtol * e.abs(), same_special)
    fa, fe = a[both], e[both]
    row["max_abs"] = float(diff[both].max()) if fa.numel() else 0.0
    row["max_rel"] = float((diff[both] / fe.abs().clamp_min(floor)).max()) if fa.numel() else 0.0
    na, ne = float(fa.norm()), float(fe.norm())
    row["cosine"] = (1.0 if na == 0 and ne == 0 else
                     0.0 if na == 0 or ne == 0 else float(fa @ fe) / (na * ne))
    row["mismatched"] = int((~ok).sum())
    failed = []
    if row["mismatched"]:
        failed.append(f"{row['mismatched']} of {row['numel']} elements outside "
                      f"atol {th.atol:g} + rtol {th.rtol:g} x |expected|")
    # a direction is judged only above the noise: two tensors within atol of zero everywhere
    # (a gradient that is exactly 0 in exact arithmetic, rounding noise on both sides) pass
    negligible = (float(fa.abs().max()) <= th.atol and float(fe.abs().max()) <= th.atol
                  if fa.numel() else True)
    if row["cosine"] < th.min_cosine and not negligible:
        failed.append(f"cosine {row['cosine']:.6f} < {th.min_cosine}")
    row["problem"] = "; ".join(failed) or None
    row["passed"] = not failed
    return row


def compare_outputs(actual: object, expected: object, table: dict[str, Thresholds]
                    ) -> list[dict]:
    got = dict(flatten_outputs(actual))
    return [compare(name, got.get(name), ref, table) for name, ref in flatten_outputs(expected)]
