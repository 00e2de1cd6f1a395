"""Tracing a vertex function (cavs/vertex.py): a mistake in it is a TraceError when the model is
built, naming the op and the user's line (gathers beyond the arity, scatter twice or never, wrong
shapes, slices past a value's width, unknown or indexed parameters)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import cavs
from cavs import concat, tanh
from tests.engine.helpers import V


def _model_with(cell):
    return cavs.Model(cell, {"W": (8, 4), "b": (4,)}, arity=2, state=4, embedding=(10, 4), classes=5)


def test_trace_errors_name_the_line_and_op():
    def gathers_a_missing_child(v, p):
        v.scatter(v.gather(2))

    def scatters_twice(v, p):
        v.scatter(v.gather(0))
        v.scatter(v.gather(1))

    def never_scatters(v, p):
        v.push(v.gather(0))

    def wrong_shapes(v, p):
        v.scatter(v.gather(0) @ p.W)

    def unknown_param(v, p):
        v.scatter(v.gather(0) @ p.nope)

    with pytest.raises(cavs.TraceError, match=r"test_trace.py:\d+ \(gather\): child index 2 is beyond the declared arity 2"):
        _model_with(gathers_a_missing_child)
    with pytest.raises(cavs.TraceError, match=r"\(scatter\): scatter called twice"):
        _model_with(scatters_twice)
    with pytest.raises(cavs.TraceError, match="scatter was never called"):
        _model_with(never_scatters)
    with pytest.raises(cavs.TraceError, match=r"test_trace.py:\d+ \(matmul\): cannot multiply a vertex vector of width 4"):
        _model_with(wrong_shapes)
    with pytest.raises(cavs.TraceError, match="unknown parameter p.nope"):
        _model_with(unknown_param)


def _cell_with(piece):
    """A vertex function that scatters piece(child 0's state, p)."""
    def cell(v, p):
        h = v.gather(0)
        v.scatter(piece(h, p))
        v.push(h)
    return cell


def test_slices_stay_inside_the_value_concat_needs_a_value_and_layer_norm_a_gain_of_its_width():
    """NumPy clips h[0:20] of a width-8 row to h[0:8] in silence; a vertex function that writes it
    almost certainly meant something else. Negative bounds count from the end, as in Python."""
    _model_with(_cell_with(lambda h, p: concat(h[-2:], h[:2])))
    for piece, message in ((lambda h, p: concat(h[0:8]), r"\(slice\): \[0:8\] reaches past the value's width 4"),
                           (lambda h, p: concat(h[3:1], h), r"\(slice\): \[3:1\] of a value of width 4 is empty"),
                           (lambda h, p: h[0:2.0], r"\(slice\): \[0:2.0\]: the bounds must be whole numbers"),
                           (lambda h, p: concat(), r"\(concat\): concat\(\) needs at least one value"),
                           (lambda h, p: cavs.layer_norm(h, bias=p.W), r"\(layer_norm\): bias must be a parameter of "
                                                                     r"the value's width 4; p.W has shape \(8, 4\)")):
        with pytest.raises(cavs.TraceError, match=r"test_trace.py:\d+ " + message):
            _model_with(_cell_with(piece))


def test_operators_that_are_not_ops_and_non_finite_constants_are_named():
    """Python's TypeError about a Symbol (h // 2, round(h), p.W @ h, p.b * 2) or a NaN on every
    vertex (h * float("nan")) become a TraceError naming the operator and the line."""
    _model_with(_cell_with(lambda h, p: +h))
    for piece, message in ((lambda h, p: h // 2, r"\(//\): not an op of vertex functions; values stay real: use /"),
                           (lambda h, p: h % 2, r"\(%\): not an op"),
                           (lambda h, p: round(h), r"\(rounding\): not an op"),
                           (lambda h, p: h & h, r"\(&, \|, \^, ~\): not an op"),
                           (lambda h, p: p.W @ concat(h, h), r"\(matmul\): p.W @ value is not an op; .* write value @ p.W"),
                           (lambda h, p: h + p.b * 2, r"\(param\): arithmetic on p.b alone is not an op"),
                           (lambda h, p: -p.b + h, r"\(param\): arithmetic on p.b alone"),
                           (lambda h, p: h * float("nan"), r"\(mul\): the constant nan is not a finite number"),
                           (lambda h, p: h - 10 ** 400, r"\(sub\): the constant 1000.* is not a finite number"),
                           (lambda h, p: h ** float("inf"), r"\(power\): the constant inf is not a finite number"),
                           (lambda h, p: cavs.maximum(h, float("-inf")), r"\(maximum\): the constant -inf"),
                           (lambda h, p: cavs.layer_norm(h, eps=-1.0), r"\(layer_norm\): eps must be a number of at least 0")):
        with pytest.raises(cavs.TraceError, match=r"test_trace.py:\d+ " + message):
            _model_with(_cell_with(piece))
    _model_with(_cell_with(lambda h, p: p.b - h))         # a parameter beside a value is still the value's op


def test_vertex_and_edge_mistakes_name_the_line():
    def running(body):
        def cell(v, p):
            body(v, p)
        return cell
    for body, message in ((lambda v, p: v.scatter(v.gather(1.5)), r"\(gather\): the child index must be a whole number "
                                                                   r"in 0..1, got 1.5"),
                          (lambda v, p: v.scatter(v.state), r"\(v.state\): a vertex has no attribute 'state'; it has "
                                                            r"v.gather\(k\)"),
                          (lambda v, p: v.scatter(v.children().states), r"\(children\(\).states\): the edges have no "
                                                                         r"attribute 'states'; they have .state"),
                          (lambda v, p: v.scatter(p.b), r"\(scatter\): got the parameter p.b; scatter takes a "
                                                        r"per-vertex value"),
                          (lambda v, p: (v.scatter(v.gather(0)), v.push(p.b)), r"\(push\): got the parameter p.b")):
        with pytest.raises(cavs.TraceError, match=r"test_trace.py:\d+ " + message):
            _model_with(running(body))


def line_of(fn, text: str) -> str:
    """'test_trace.py:LINE' of the line of fn's source that contains `text`."""
    lines, first = inspect.getsourcelines(fn)
    return f"{Path(__file__).name}:{first + next(i for i, l in enumerate(lines) if text in l)}"


def cell_unknown_param(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.Missing)
    v.scatter(h)
    v.push(h)


def cell_gather_beyond(v, p):
    h = tanh(v.pull() @ p.W + v.gather(2) @ p.U)
    v.scatter(h)
    v.push(h)


def cell_wrong_width(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.U)
    v.scatter(concat(h, h))
    v.push(h)


def cell_no_scatter(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.U)
    v.push(h)


def build(cell):
    return cavs.Model(cell, {"W": (3, 4), "U": (4, 4)}, arity=2, state=4, embedding=(V, 3), classes=2)


@pytest.mark.parametrize("cell, text, message", [
    (cell_unknown_param, "p.Missing", r"unknown parameter p\.Missing"),
    (cell_gather_beyond, "gather(2)", r"gather.*child index 2 is beyond the declared arity 2"),
    (cell_wrong_width, "v.scatter", r"scatter.*width 8.*state width 4"),
])
def test_bad_vertex_functions_raise_trace_error_naming_the_line(cell, text, message):
    with pytest.raises(cavs.TraceError, match=message) as info:
        build(cell)
    assert line_of(cell, text) in str(info.value)


def test_vertex_function_that_never_scatters_names_its_line():
    with pytest.raises(cavs.TraceError, match="scatter was never called") as info:
        build(cell_no_scatter)
    assert line_of(cell_no_scatter, "def cell_no_scatter") in str(info.value)


def test_vertex_function_that_never_scatters_raises_trace_error():
    with pytest.raises(cavs.TraceError, match=r"\(cell_no_scatter\): scatter was never called"):
        build(cell_no_scatter)


def cell_slices_a_parameter(v, p):
    h = tanh(v.pull() @ p.W[:, :2] + v.gather(0) @ p.U)
    v.scatter(h)
    v.push(h)


def test_indexing_a_parameter_raises_trace_error_naming_the_line():
    with pytest.raises(cavs.TraceError) as info:
        build(cell_slices_a_parameter)
    assert line_of(cell_slices_a_parameter, "p.W[:, :2]") in str(info.value)
