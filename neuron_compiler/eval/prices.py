"""On-demand instance prices and chip capacities, for ``neuron-eval``'s cost and memory rows.

Every price has its source, the date it was recorded, and ``assumed=True`` where it is not a
published AWS on-demand price (say so in every report that uses it). Prices change: override
any of them with ``--price INSTANCE=USD_PER_HOUR`` (the report then names the source
``--price``). Regions differ; these are US East (N. Virginia / Ohio) Linux on-demand rates.

Cost model (stated in the report as ``cost.assumption``):
    one model replica per NeuronCore, every core of the instance busy, back to back calls at
    the steady-state p50 latency; cost per million inferences =
    price_per_hour / 3600 / (neuron_cores x 1e6 / p50_us) x 1e6.
It ignores batching across calls, host-side work beyond what was measured, and idle time.

Invariants
- ``INSTANCES`` maps an instance name to one ``Instance``; ``TARGET_INSTANCE`` maps every
  target of ``runtime_sim.targets`` to the instance the cost row is computed for.
- HBM capacities are per chip, from ``shared/hardware.md`` (the Generations table); the
  capacity one NeuronCore can count on is the chip's divided by its cores.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1024 ** 3

# hardware.md, "Generations": HBM per chip (sources named there: trainium_inferentia2_arch.rst,
# trainium2_arch.rst, trainium3_arch.rst).
HBM_BYTES_PER_CHIP: dict[str, int] = {"trn1": 32 * GIB, "trn2": 96 * GIB, "trn3": 144 * GIB}

_AWS_PAGE = "https://aws.amazon.com/ec2/pricing/on-demand/"


@dataclass(frozen=True)
class Instance:
    name: str
    target: str
    chips: int
    neuron_cores: int
    usd_per_hour: float
    source: str
    date: str            # when the price was recorded (YYYY-MM)
    assumed: bool        # True: not a verified published on-demand price


INSTANCES: dict[str, Instance] = {i.name: i for i in (
    # trn1.2xlarge: 1 Trainium chip, 2 NeuronCore-v2 (aws.amazon.com/ec2/instance-types/trn1).
    Instance("trn1.2xlarge", "trn1", 1, 2, 1.34375,
             f"{_AWS_PAGE} (us-east-1, Linux)", "2025-06", assumed=False),
    # trn1.32xlarge: 16 chips, 32 cores; the same rate is quoted by usage.ai's Trainium-vs-GPU
    # post (updated 2026-06-25): "trn1.32xlarge at $21.50/hr".
    Instance("trn1.32xlarge", "trn1", 16, 32, 21.50,
             f"{_AWS_PAGE} (us-east-1, Linux); usage.ai blog 2026-06", "2026-06", assumed=False),
    # trn2.48xlarge: 16 Trainium2 chips (awsdocs-neuron trn2-arch.html), 8 cores each.
    # ASSUMED: the on-demand rate could not be checked from this machine; the figure is the
    # widely reported us-east-2 rate at launch. Override with --price trn2.48xlarge=...
    Instance("trn2.48xlarge", "trn2", 16, 128, 44.70,
             f"ASSUMED: reported launch rate, not verified against {_AWS_PAGE}", "2025-01",
             assumed=True),
    # trn3: no on-demand Trn3 instance price was available to this table. ASSUMED: a 16-chip
    # instance named like trn2's, at trn2's price; both name and price are placeholders.
    Instance("trn3.48xlarge", "trn3", 16, 128, 44.70,
             "ASSUMED: placeholder (no published on-demand Trn3 price); trn2.48xlarge's rate",
             "2026-12", assumed=True),
)}

TARGET_INSTANCE: dict[str, str] = {"trn1": "trn1.32xlarge", "trn2": "trn2.48xlarge",
                                   "trn3": "trn3.48xlarge"}

COST_ASSUMPTION = ("one replica per NeuronCore, all cores of the instance busy, calls back to "
                   "back at the steady-state p50 latency")


def parse_price(text: str) -> tuple[str, float]:
    """``INSTANCE=USD_PER_HOUR`` -> (instance, price); raises ValueError with the reason."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--price expects INSTANCE=USD_PER_HOUR, got {text!r}")
    if name not in INSTANCES:
        raise ValueError(f"--price: unknown instance {name!r}; known: {', '.join(INSTANCES)}")
    try:
        price = float(value)
    except ValueError:
        raise ValueError(f"--price {name}: {value!r} is not a number") from None
    if not price > 0:
        raise ValueError(f"--price {name}: the price must be > 0, got {price}")
    return name, price


def instances_with(overrides: dict[str, float]) -> dict[str, Instance]:
    """The table with ``--price`` overrides applied (source ``--price``, not assumed)."""
    out = dict(INSTANCES)
    for name, price in overrides.items():
        out[name] = replace(out[name], usd_per_hour=price, source="--price (user)",
                            date="this run", assumed=False)
    return out


def cost(target: str, p50_us: float | None, table: dict[str, Instance]) -> dict:
    """The ``cost`` entry of one target in the JSON report."""
    inst = table[TARGET_INSTANCE[target]]
    per_million = None
    if p50_us and p50_us > 0:
        per_second = inst.neuron_cores * 1e6 / p50_us
        per_million = inst.usd_per_hour / 3600.0 / per_second * 1e6
    return {"instance": inst.name, "usd_per_hour": inst.usd_per_hour,
            "neuron_cores": inst.neuron_cores, "chips": inst.chips,
            "usd_per_million_inferences": per_million, "price_source": inst.source,
            "price_date": inst.date, "price_assumed": inst.assumed,
            "assumption": COST_ASSUMPTION}
