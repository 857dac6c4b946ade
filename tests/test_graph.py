"""The backend-free graph core: Apply, Op identity, walks, FunctionGraph bookkeeping."""
import pytest

from symgpu.graph import (Apply, Constant, Feature, FunctionGraph, MissingInputError, Op, Type,
                          Variable, ancestors, clone_graph, graph_inputs, io_toposort)


class IntType(Type):
    def filter(self, value, strict=False, allow_downcast=None):
        if strict and not isinstance(value, int):
            raise TypeError("not an int")
        return int(value)

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(IntType)

    def __str__(self):
        return "int"


INT = IntType()


class Add(Op):
    __props__ = ("offset",)

    def __init__(self, offset=0):
        self.offset = offset

    def make_node(self, *inputs):
        return Apply(self, list(inputs), [INT()])

    def perform(self, node, inputs, out):
        out[0][0] = sum(inputs) + self.offset


def test_op_identity_from_props():
    assert Add(1) == Add(1) and hash(Add(1)) == hash(Add(1))
    assert Add(1) != Add(2)
    assert str(Add(3)) == "Add{offset=3}"


def test_apply_sets_owner_and_index():
    a, b = INT("a"), INT("b")
    out = Add()(a, b)
    assert out.owner.op == Add() and out.index == 0
    assert out.owner.inputs == [a, b]
    with pytest.raises(TypeError):
        Apply(Add(), [1], [INT()])


def test_walks():
    a, b = INT("a"), INT("b")
    c = Add()(a, b)
    d = Add()(c, a)
    assert set(graph_inputs([d])) == {a, b}
    assert set(ancestors([d])) == {a, b, c, d}
    order = io_toposort([a, b], [d])
    assert order == [c.owner, d.owner]


def test_clone_graph_copies_nodes():
    a, b = INT("a"), INT("b")
    d = Add()(Add()(a, b), a)
    (a2, b2), (d2,), memo = clone_graph([a, b], [d])
    assert d2 is not d and d2.owner.op == d.owner.op
    assert set(graph_inputs([d2])) == {a2, b2}


def test_function_graph_replace_and_prune():
    a, b = INT("a"), INT("b")
    c = Add()(a, b)
    d = Add(1)(c, c)
    fg = FunctionGraph([a, b], [d], clone=False)
    assert len(fg.apply_nodes) == 2
    assert len(fg.clients[c]) == 2
    e = Add(5)(a)
    fg.replace(c, e, reason="test")
    assert c.owner not in fg.apply_nodes
    assert e.owner in fg.apply_nodes
    assert fg.toposort() == [e.owner, d.owner]
    fg.check_integrity()


def test_features_hear_changes():
    events = []

    class Spy(Feature):
        def on_import(self, fgraph, node, reason):
            events.append(("import", str(node.op)))

        def on_prune(self, fgraph, node, reason):
            events.append(("prune", str(node.op)))

        def on_change_input(self, fgraph, node, i, old, new, reason):
            events.append(("change", reason))

    a = INT("a")
    c = Add(1)(a)
    fg = FunctionGraph([a], [c], clone=False, features=[Spy()])
    fg.replace(c, Add(2)(a), reason="why")
    assert ("import", "Add{offset=2}") in events
    assert ("prune", "Add{offset=1}") in events
    assert ("change", "why") in events


def test_missing_input_is_reported():
    a, b = INT("a"), INT("b")
    with pytest.raises(MissingInputError, match="b"):
        FunctionGraph([a], [Add()(a, b)])


def test_constants_need_no_input():
    a = INT("a")
    k = Constant(INT, 3)
    fg = FunctionGraph([a], [Add()(a, k)])
    assert len(fg.apply_nodes) == 1


def test_replace_type_mismatch():
    class OtherType(IntType):
        def __eq__(self, other):
            return type(self) is type(other)

        def __hash__(self):
            return 1

    a = INT("a")
    c = Add()(a)
    fg = FunctionGraph([a], [c], clone=False)
    with pytest.raises(TypeError, match="types differ"):
        fg.replace(c, Variable(OtherType()), reason="bad")


def test_cycle_detected():
    a = INT("a")
    c = Add()(a)
    d = Add()(c)
    c.owner.inputs[0] = d  # corrupt the graph on purpose
    with pytest.raises(ValueError, match="cycle"):
        io_toposort([a], [d])


def test_perform_args_are_resolved_once_per_node_and_passed_to_every_perform():
    """Op.make_thunk: an op with perform_args(node) gets them once, when the thunk is made
    (GPU ops resolve their kernel names this way), and every perform call receives them."""
    import numpy as np
    import symgpu
    import symgpu.tensor as T

    class Scaled(Op):
        __props__ = ()
        resolved = 0

        def make_node(self, x):
            return Apply(self, [x], [x.type()])

        def perform_args(self, node):
            Scaled.resolved += 1
            return (f"scale_{node.inputs[0].dtype}", 3)

        def perform(self, node, inputs, out, name=None, k=None):
            if name is None:            # called directly: derives them itself
                name, k = self.perform_args(node)
            assert name == "scale_float64"
            out[0][0] = inputs[0] * k

    x = T.dvector("x")
    f = symgpu.function([x], Scaled()(x))
    made = Scaled.resolved
    for _ in range(3):
        np.testing.assert_array_equal(f(np.ones(2)), [3.0, 3.0])
    assert Scaled.resolved == made >= 1      # none per call
