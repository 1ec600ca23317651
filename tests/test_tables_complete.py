"""Per-op tables are complete: every op of the universe a table serves has an entry, and no table
has an entry for an op that does not exist (issue 26, item 4).

The universes, read from the code that indexes each table:
- ``runtime_sim.isa.Op`` (the machine's ops): ``check_instr_shape`` (runtime_sim/checks.py)
  indexes ``ATTRS_OF_OP[op]`` and ``ENGINES_OF_OP[op]`` for every instruction, SEM included,
  then returns for SEM before ``OPERAND_RULES[op]``; the simulator indexes ``SEMANTICS`` and
  ``COSTS`` (and sim_prepare's ``COST_ATTRS``) for every instruction it executes, SEM included.
- ``lowering.kir.KKind`` (the kernel IR's kinds): ``tile_program`` (lowering/tiling) indexes
  ``TILERS[k.kind]`` for every kernel of the program, so every kind needs a tiler.

A missing key would be a ``KeyError`` deep in a pass at the first program that uses the op; a
stale key (an op removed from the enum but kept in a table) cannot happen with enum keys, but a
key of the wrong enum (e.g. an ``EOp`` or a string) can, and is caught by the same equality.
"""
from __future__ import annotations

import dataclasses
import typing

import pytest

from lowering.kir import KKind
from lowering.tiling import TILERS
from runtime_sim.checks import OPERAND_RULES
from runtime_sim.costs import COSTS
from runtime_sim.isa import ATTRS_OF_OP, ENGINES_OF_OP, EngineKind, Op, OpAttrs
from runtime_sim.semantics import SEMANTICS
from runtime_sim.sim_static import COST_ATTRS

ALL_OPS = frozenset(Op)
DATAPATH_OPS = ALL_OPS - {Op.SEM}     # ops with operands (SEM: waits and signals only)


def _diff(table: dict, universe: frozenset) -> str:
    keys = set(table)
    missing = sorted(str(k) for k in universe - keys)
    extra = sorted(repr(k) for k in keys - universe)
    return f"missing entries: {missing}; entries for no op of the universe: {extra}"


def test_attrs_of_op_covers_every_op():
    """Universe: every ``Op`` (SEM included: ``SemAttrs``). Each value is a frozen dataclass of
    the ``OpAttrs`` union, and every class of that union is some op's attrs."""
    assert set(ATTRS_OF_OP) == ALL_OPS, _diff(ATTRS_OF_OP, ALL_OPS)
    union = set(typing.get_args(OpAttrs))
    for op, cls in ATTRS_OF_OP.items():
        assert cls in union, f"{op}: {cls.__name__} is not in the OpAttrs union"
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, \
            f"{op}: {cls.__name__} must be a frozen dataclass"
    unused = union - set(ATTRS_OF_OP.values())
    assert not unused, f"OpAttrs classes no op uses: {sorted(c.__name__ for c in unused)}"


def test_engines_of_op_covers_every_op():
    """Universe: every ``Op`` (SEM: every engine, it is a barrier). Each value is a non-empty
    set of ``EngineKind``."""
    assert set(ENGINES_OF_OP) == ALL_OPS, _diff(ENGINES_OF_OP, ALL_OPS)
    for op, engines in ENGINES_OF_OP.items():
        assert engines and all(isinstance(e, EngineKind) for e in engines), (op, engines)


def test_operand_rules_cover_every_op_with_operands():
    """Universe: every ``Op`` except SEM (``check_instr_shape`` checks SEM has no operands and
    returns before the operand rules). Each value is callable."""
    assert set(OPERAND_RULES) == DATAPATH_OPS, _diff(OPERAND_RULES, DATAPATH_OPS)
    assert all(callable(f) for f in OPERAND_RULES.values())


@pytest.mark.parametrize("name,table", [("SEMANTICS", SEMANTICS), ("COSTS", COSTS),
                                        ("sim_static.COST_ATTRS", COST_ATTRS)])
def test_simulator_tables_cover_every_op(name, table):
    """Universe: every ``Op`` (the simulator executes and times SEM like any instruction)."""
    assert set(table) == ALL_OPS, f"{name}: " + _diff(table, ALL_OPS)
    assert all(callable(f) for f in table.values()), name


def test_tilers_cover_every_kernel_kind():
    """Universe: every ``KKind`` (``tile_program`` looks up ``TILERS[k.kind]`` for each kernel;
    no pass removes a kind before tiling). Each value is callable."""
    universe = frozenset(KKind)
    assert set(TILERS) == universe, _diff(TILERS, universe)
    assert all(callable(f) for f in TILERS.values())
