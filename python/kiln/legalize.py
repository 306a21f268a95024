"""Relax operators that `kiln.tvm.compile` legalizes itself, where TVM 0.27's legalization writes
a PrimFunc that reads outside a buffer.

kiln's CPU code checks every index read from memory (docs/codegen.md, "Indices read from memory
are checked"), so a PrimFunc that gathers out of bounds raises `IndexError` where TVM's build
reads whatever lies there. That is right for a caller's bad indices (an embedding's token ids),
but a few of TVM's own legalizations gather out of bounds on valid input and throw the value
away afterwards. Those operators are legalized here, before TVM's pipeline runs, into PrimFuncs
that compute the same result from in-bounds reads only:

- `relax.slice_scatter(x, src, start, end, step, axis)`: TVM's `topi.slice_scatter` takes
  `src` at `clip((i - start) // step, 0, x.shape[axis] - 1)` for every `i` along the axis and
  then keeps `x` where `i` is outside the slice, so it reads rows of `src` past its extent
  whenever `src` is shorter than `x` along the axis (always, but for a whole-axis slice). Here
  the index is clipped to `src`'s extent, and the element comes from `src` only inside the slice.

Every other operator is left to TVM's pipeline, which legalizes it as `tvm.compile` does.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx

_SLICE_SCATTER = "relax.slice_scatter"


def _slice_scatter(x: te.Tensor, src: te.Tensor, start, end, step, axis: int) -> te.Tensor:
    """`x` with the positions `start, start + step, ... < end` along `axis` taken from `src`."""
    axis = int(axis)
    if axis < 0:
        axis += len(x.shape)
    last = src.shape[axis] - 1

    def element(*i):
        j = i[axis]
        d = j - start
        inside = tirx.all(j >= start, j < end, tirx.floormod(d, step) == 0)
        k = tirx.max(tirx.min(tirx.floordiv(d, step), last), 0)
        at = list(i)
        at[axis] = k
        return tirx.Select(inside, src(*at), x(*i))

    return te.compute(x.shape, element, name="T_slice_scatter")


@relax.expr_functor.mutator
class _Legalizer(relax.PyExprMutator):
    """Replaces the calls of the operators above with calls of kiln's PrimFuncs."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.op = tvm.ir.Op.get(_SLICE_SCATTER)

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if call.op != self.op:
            return call
        start, end, step = (a.value for a in call.args[2:5])
        return self.builder_.call_te(
            _slice_scatter, call.args[0], call.args[1], start, end, step, int(call.attrs.axis),
            primfunc_name_hint="slice_scatter")

    def run(self) -> tvm.IRModule:
        for gv, func in self.mod.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the operators above legalized by kiln (the module itself when it has none)."""
    op, found = tvm.ir.Op.get(_SLICE_SCATTER), []

    def seen(e):
        if isinstance(e, relax.Call) and e.op == op:
            found.append(e)

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, seen)
    return _Legalizer(mod).run() if found else mod
