"""graph/decompose.py's table against the lowering registry it does not import: the kept ops' overloads
that ember lowers are out of the table, the rest stay decomposed."""
import pytest
import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from ember.graph import decompose
from ember.lowering.registry import get_lowering

aten = torch.ops.aten


def test_kept_ops_leave_the_table_exactly_where_ember_lowers_them():
    table = decompose.decomposition_table()
    base = dict(core_aten_decompositions())
    base.update(get_decompositions([op for op in decompose._EXTRA if op is not None]))
    kept = [getattr(op, name) for op in decompose._KEEP for name in op.overloads()]
    assert any(get_lowering(op) is not None for op in kept if op in base)
    for op in kept:
        assert (op in table) == (op in base and get_lowering(op) is None), op
    assert aten.silu.default in base and aten.silu.default not in table and aten.var.default in table


def test_a_kept_op_lowered_after_the_table_was_built_is_an_error():
    decompose.decomposition_table()
    assert get_lowering(aten.var.default) is None       # kept, decomposed: ember has no lowering for it
    with pytest.raises(RuntimeError, match="after the decomposition table was built"):
        decompose.publish_lowered(aten.var.default)
    assert aten.var.default not in decompose._lowered_ops


def test_the_lazy_table_tells_its_first_use_once():
    """AOTAutograd reads the table only when it traces (a miss of its cache): its first use is when ember's
    backends start booting what compiling needs (KernelBackend.prepare), once."""
    calls = []
    table = decompose.LazyTable(lambda: calls.append(1))
    assert calls == []
    op = next(iter(table))
    assert table[op] is decompose.decomposition_table()[op] and len(table) == len(decompose.decomposition_table())
    assert calls == [1]
