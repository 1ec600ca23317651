"""On-demand instance prices and chip capacities, for ``neuron-eval``'s cost and memory rows.

Every entry names its source (a URL, or a repository + path + commit), the date that source
states, the region, and a ``status``:
- ``"published"``: an on-demand Linux rate found in a public source (quoted as found);
- ``"not published"``: no on-demand rate could be found; ``usd_per_hour`` is None, the report
  prints no cost for it and says how to give one (``--price INSTANCE=USD_PER_HOUR``). A
  Capacity Block or spot rate is never used in its place (they are other purchase options);
- ``"user"``: set with ``--price`` on this run.
Prices change and regions differ: check them, and override any of them with ``--price``.

Cost model (stated in the report as ``cost.assumption``):
    one model replica per NeuronCore, every core of the instance busy, back to back calls at
    the steady-state p50 latency; cost per million inferences =
    price_per_hour / 3600 / (neuron_cores x 1e6 / p50_us) x 1e6.
It ignores batching across calls, host-side work beyond what was measured, and idle time.

Invariants
- ``INSTANCES`` maps an instance name to one ``Instance``; ``TARGET_INSTANCE`` maps every
  target of ``runtime_sim.targets`` to the instance the cost row is computed for.
- ``usd_per_hour`` is None exactly when ``status == "not published"``; no number is ever
  reported as a price without a source.
- HBM capacities are per chip, from ``shared/hardware.md`` (the Generations table); the
  capacity one NeuronCore can count on is the chip's divided by its cores.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1024 ** 3

# hardware.md, "Generations": HBM per chip (sources named there: trainium_inferentia2_arch.rst,
# trainium2_arch.rst, trainium3_arch.rst).
HBM_BYTES_PER_CHIP: dict[str, int] = {"trn1": 32 * GIB, "trn2": 96 * GIB, "trn3": 144 * GIB}

# A public record of the AWS Price List API (``aws pricing get-products --service-code
# AmazonEC2``), read 2026-10-03 UTC; it states "trn1.32xlarge $21.50/h, trn1.2xlarge
# $1.34375/h, inf2.48xlarge $12.98127/h (us-east-2), all effective 2026-09-01", and that the
# same API lists no on-demand rate for trn2.48xlarge, trn2u.48xlarge or trn2.3xlarge (only
# Capacity Block products).
KILN_PRICE_API = ("github.com/foxl-ai/kiln docs/research/trn2-trn3.md section 1.4 @ "
                  "a04d1fab9063fdd0a612f9bdcb3b816a3b5cd10f (AWS Price List API reading)")
# The same repository's price table: "trn1.32xlarge (EC2) | $21.50/h" on-demand,
# "trn2.48xlarge (EC2) | (Pricing API returned no usable rate)", us-east-2, read 2026-10-03.
KILN_PRICE_TABLE = ("github.com/foxl-ai/kiln docs/price-performance.md 'Pricing bases' @ "
                    "a04d1fab9063fdd0a612f9bdcb3b816a3b5cd10f")
USAGE_AI = ("https://www.usage.ai/blogs/aws/ai-ml-cost/trainium-vs-gpu-instances/ (updated "
            "2026-06-25: 'trn1.32xlarge at $21.50/hr' on-demand; region not stated)")

PUBLISHED, NOT_PUBLISHED, USER = "published", "not published", "user"


@dataclass(frozen=True)
class Instance:
    name: str
    target: str
    chips: int
    neuron_cores: int
    usd_per_hour: float | None   # None: no published on-demand price (status "not published")
    status: str                  # PUBLISHED | NOT_PUBLISHED | USER
    source: str                  # where the price (or its absence) was found
    date: str                    # the date the source states
    region: str                  # the region the price is for
    note: str = ""

    def __post_init__(self) -> None:
        if (self.usd_per_hour is None) != (self.status == NOT_PUBLISHED):
            raise ValueError(f"{self.name}: usd_per_hour {self.usd_per_hour} does not agree "
                             f"with status {self.status!r}")


INSTANCES: dict[str, Instance] = {i.name: i for i in (
    # trn1.2xlarge: 1 Trainium chip, 2 NeuronCore-v2 (awsdocs-neuron trn1-arch).
    Instance("trn1.2xlarge", "trn1", 1, 2, 1.34375, PUBLISHED, KILN_PRICE_API,
             "2026-09-01 (effective; read 2026-10-03)", "us-east-2, Linux, shared tenancy"),
    # trn1.32xlarge: 16 chips, 32 cores.
    Instance("trn1.32xlarge", "trn1", 16, 32, 21.50, PUBLISHED,
             f"{KILN_PRICE_API}; also {KILN_PRICE_TABLE}; {USAGE_AI}",
             "2026-09-01 (effective; read 2026-10-03)", "us-east-2, Linux, shared tenancy"),
    # trn2.48xlarge: 16 Trainium2 chips (awsdocs-neuron trn2-arch.html), 8 cores each.
    Instance("trn2.48xlarge", "trn2", 16, 128, None, NOT_PUBLISHED,
             f"{KILN_PRICE_API}; {KILN_PRICE_TABLE}", "2026-10-03", "us-east-2",
             note="the AWS Price List API lists no on-demand rate (only Capacity Block "
                  "products); a 24 h Capacity Block in ap-south-2b at $35.76/h and spot in "
                  "us-east-2c at $14.56/h were seen that day: neither is an on-demand price"),
    # trn3: AWS sells Trn3 as UltraServers only, with no sizes or prices on its page
    # (https://aws.amazon.com/ec2/instance-types/trn3/, as fetched 2026-10-03 per the kiln
    # document, sections 0 and 1.2). The name is one the Neuron driver knows (same section);
    # 16 chips of 8 cores is an assumption, like the instance itself.
    Instance("trn3.48xlarge", "trn3", 16, 128, None, NOT_PUBLISHED,
             "https://aws.amazon.com/ec2/instance-types/trn3/ (per " + KILN_PRICE_API + ")",
             "2026-10-03", "-",
             note="no Trn3 instance size or price is published; the instance name and its "
                  "16 chips are placeholders"),
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
    """The table with ``--price`` overrides applied (status ``user``)."""
    out = dict(INSTANCES)
    for name, price in overrides.items():
        out[name] = replace(out[name], usd_per_hour=price, status=USER,
                            source="--price (user)", date="this run", region="-", note="")
    return out


def cost(target: str, p50_us: float | None, table: dict[str, Instance]) -> dict:
    """The ``cost`` entry of one target in the JSON report."""
    inst = table[TARGET_INSTANCE[target]]
    per_million = None
    if inst.usd_per_hour is not None and p50_us and p50_us > 0:
        per_second = inst.neuron_cores * 1e6 / p50_us
        per_million = inst.usd_per_hour / 3600.0 / per_second * 1e6
    return {"instance": inst.name, "usd_per_hour": inst.usd_per_hour,
            "neuron_cores": inst.neuron_cores, "chips": inst.chips,
            "usd_per_million_inferences": per_million, "price_status": inst.status,
            "price_source": inst.source, "price_date": inst.date,
            "price_region": inst.region, "price_note": inst.note,
            "assumption": COST_ASSUMPTION}


def per_replica(c: dict, cores_per_replica: int, why: str) -> dict:
    """``c`` (a ``cost`` entry computed for one replica per NeuronCore) for replicas that each
    occupy ``cores_per_replica`` NeuronCores (a tensor-parallel group): the instance holds
    ``neuron_cores // cores_per_replica`` of them, so a million calls cost that factor more;
    ``why`` says where the core count comes from (it replaces the assumption's first clause)."""
    if cores_per_replica < 1 or cores_per_replica > c["neuron_cores"]:
        raise ValueError(f"a replica of {cores_per_replica} NeuronCores does not fit "
                         f"{c['instance']} ({c['neuron_cores']} NeuronCores)")
    replicas = c["neuron_cores"] // cores_per_replica
    out = dict(c, cores_per_replica=cores_per_replica, replicas=replicas,
               assumption=f"one replica per {cores_per_replica} NeuronCores ({why}), "
                          f"{replicas} replicas per instance, calls back to back at the "
                          "steady-state p50 latency")
    if c["usd_per_million_inferences"] is not None:
        out["usd_per_million_inferences"] = (c["usd_per_million_inferences"]
                                             * c["neuron_cores"] / replicas)
    return out


def price_text(c: dict) -> str:
    """One line for a report: the price with its status, or why there is none."""
    if c["usd_per_hour"] is None:
        return (f"{c['instance']}: no published on-demand price ({c['price_note']}); set "
                f"--price {c['instance']}=USD_PER_HOUR")
    return (f"{c['instance']}: ${c['usd_per_hour']:g}/h ({c['price_status']}; "
            f"{c['price_region']}; {c['price_date']}; source: {c['price_source']})")
