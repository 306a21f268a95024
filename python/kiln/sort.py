"""TVM's CPU sorts (`sort`, `argsort`, `topk`) as kiln loops.

TVM lowers these operators on the CPU to one `T.call_packed("tvm.contrib.sort.<op>", ...)`
of its C++ runtime: a stable sort (`std::stable_sort`) of each row along the axis, comparing
with `<` (ascending) or `>` (descending), equal values keeping their order; `topk` returns the
first `k` of that order. The bridge writes the same sort as kiln IR, so that kiln builds it:

- each row is copied with its positions into a scratch buffer of `2 n` values and `2 n`
  positions, then merged bottom-up, runs of 1, 2, 4, ... (`ceil(log2 n)` passes, unrolled here
  since `n` is a constant), the two halves of the scratch taking turns as source and
  destination;
- a merge takes the right run's head only when it is strictly before the left one's (`<`
  ascending, `>` descending), so equal values keep their order: TVM's result, element for
  element, for every input without NaN (with a NaN, `std::stable_sort`'s comparison is not an
  order and its result is unspecified; here a NaN stays where the merges leave it);
- rows run in parallel (the outermost loop), each with its own scratch;
- `topk` with a small `k` (at most `TOPK_INSERTION`) keeps the first `k` in order as it scans
  the row instead: an element enters when it is strictly before the `k`-th (a later element
  equal to an earlier one comes after it, as in the stable order), moving the ones after it
  down. The same `k` elements in the same order as sorting all of the row. The row is
  scanned in blocks of `TOPK_BLOCK`: once `k` are held, a block whose best element (its
  maximum, or its minimum ascending, found in vectors) is not strictly before the `k`-th is
  skipped whole, so most of a long row costs a vector load and a reduction per block.

The sorted axis must have a constant length (the passes are unrolled); the others may be
symbolic (a batch). A compact row-major layout and no element offset are taken; anything else
is a `BridgeError` naming the construct.
"""

from __future__ import annotations

import math

OPS = ("tvm.contrib.sort.sort", "tvm.contrib.sort.argsort", "tvm.contrib.sort.topk")

#: The largest `k` for which `topk` keeps its first `k` in order by insertion (`_top_rows`)
#: instead of sorting the whole row: `n` comparisons and, for each element that enters, at most
#: `k` moves (8 rows of 32000, `k` = 50: 26x faster than the merge sort of the rows).
TOPK_INSERTION = 64

#: `topk` by insertion scans its rows in blocks of this many elements, and skips a whole block
#: (after one vector reduction) when none of its elements can enter.
TOPK_BLOCK = 16


def _c(v, dtype="int64"):
    return {"const": int(v), "dtype": dtype}


def _v(name):
    return {"var": name}


def _op(op, *args):
    return {"op": op, "args": list(args)}


def _load(buf, *idx):
    return {"op": "load", "buffer": buf, "indices": list(idx)}


def _store(buf, idx, value):
    return {"stmt": "store", "buffer": buf, "indices": list(idx), "value": value}


def _seq(*stmts):
    return {"stmt": "seq", "stmts": list(stmts)}


def _for(var, extent, body, kind="serial"):
    """`for var in [0, extent)`: `extent` an int, a symbolic axis (`_Sym`) or an int64 IR
    expression."""
    if isinstance(extent, _Sym):
        extent = _cast("int64", extent.expr)
    elif isinstance(extent, int):
        extent = _c(extent)
    return {
        "stmt": "for",
        "var": {"name": var, "dtype": "int64"},
        "min": _c(0),
        "extent": extent,
        "kind": kind,
        "body": body,
    }


def _if(cond, then, else_=None):
    out = {"stmt": "if", "cond": cond, "then": then}
    if else_ is not None:
        out["else"] = else_
    return out


def _let(var, dtype, value, body):
    return {"stmt": "let", "var": {"name": var, "dtype": dtype}, "value": value, "body": body}


def _alloc(name, dtype, n, body, scope):
    return {
        "stmt": "allocate",
        "buffer": {"name": name, "dtype": dtype, "shape": [_c(n)], "scope": scope},
        "body": body,
    }


def _cast(dtype, x):
    return {"op": "cast", "dtype": dtype, "args": [x]}


class _Tensor:
    """A `tvm_stack_make_array` argument: the kiln buffer it names, with its constant shape."""

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, shape


def convert(fn, call):
    """The kiln statement for `call`, a `tvm_call_packed` of one of `OPS`, in the function being
    converted by `fn` (a `bridge._Function`)."""
    from . import bridge

    op = str(call.args[0].value)
    tensors, scalars = [], []
    for k, a in enumerate(call.args[1:]):
        if bridge._kind_name(a) == "Call" and str(a.op.name).endswith("tvm_stack_make_array"):
            tensors.append(fn.at(f"args[{k + 1}]", _tensor, fn, a))
        else:
            scalars.append(a)
    want = {"sort": 2, "argsort": 2, "topk": None}[op.rsplit(".", 1)[1]]
    if (want is not None and len(tensors) != want) or len(tensors) < 2:
        raise fn.error(call, f"`{op}` with {len(tensors)} arrays is not converted")
    try:
        values = [s.value for s in scalars]
    except AttributeError:
        raise fn.error(call, f"`{op}` with a non-constant argument is not converted") from None
    data, outs = tensors[0], tensors[1:]
    if op.endswith(".topk"):
        if len(values) != 4:
            raise fn.error(call, f"`{op}` with {len(values)} scalar arguments is not converted")
        k, axis, ret_type, ascend = int(values[0]), int(values[1]), str(values[2]), bool(values[3])
        kinds = {"both": ("values", "indices"), "values": ("values",), "indices": ("indices",)}
        if ret_type not in kinds or len(kinds[ret_type]) != len(outs):
            raise fn.error(call, f"`{op}` returning {ret_type!r} in {len(outs)} arrays is not converted")
        writes = list(zip(kinds[ret_type], outs))
    else:
        if len(values) != 2:
            raise fn.error(call, f"`{op}` with {len(values)} scalar arguments is not converted")
        axis, ascend = int(values[0]), bool(values[1])
        k = 0
        writes = [("values" if op.endswith(".sort") else "indices", outs[0])]
    nd = len(data.shape)
    if axis < 0:
        axis += nd
    if not 0 <= axis < nd:
        raise fn.error(call, f"`{op}` along axis {axis} of a {nd}-dimensional array")
    n = data.shape[axis]
    if isinstance(n, _Sym):
        raise fn.error(call, f"`{op}` along an axis of symbolic length `{n}` (only the other axes "
                       "may be symbolic) is not converted")
    if k < 1:
        k = n
    # Past the row's `n` elements (`k > n`), TVM writes nothing: those outputs keep what they
    # held, and so they do here.
    for kind, t in writes:
        want_shape = data.shape[:axis] + [k] + data.shape[axis + 1:]
        if t.shape != want_shape:
            raise fn.error(call, f"`{op}`: output `{t.name}` has shape {t.shape}, expected {want_shape}")
        if kind == "values" and t.dtype != data.dtype:
            raise fn.error(call, f"`{op}`: values `{t.name}` of type {t.dtype} for {data.dtype} data")
    if op.endswith(".topk") and k <= TOPK_INSERTION and k < n:
        return _top_rows(fn, data, axis, ascend, k, writes)
    return _sort_rows(fn, data, axis, ascend, k, writes)


def _tensor(fn, a):
    """A `tvm_stack_make_array(data, shape, strides, ndim, dtype, elem_offset)` of a parameter."""
    from tvm import tirx

    from . import bridge

    data, _shape, strides, _ndim, _dtype, offset = a.args
    if not (isinstance(strides, tirx.IntImm) and int(strides.value) == 0):
        raise fn.error(a, "an array with strides is not converted")
    if not (isinstance(offset, tirx.IntImm) and int(offset.value) == 0):
        raise fn.error(a, "an array with an element offset is not converted")
    # `T.tvm_stack_make_array(x.data, ...)`: `tirx.buffer_data(x)` of a buffer parameter `x`.
    name = None
    if (bridge._kind_name(data) == "Call" and str(data.op.name) == "tirx.buffer_data"
            and len(data.args) == 1):
        buf = data.args[0]
        name = fn.buffers.get(buf.__chandle__())
    if name is None:
        raise fn.error(a, "an array that is not a buffer of the function is not converted")
    shape = []
    for d, e in enumerate(buf.shape):
        if isinstance(e, tirx.IntImm):
            shape.append(int(e.value))
        else:
            shape.append(_Sym(fn.at(f"shape[{d}]", fn.expr, e), str(e)))
    return _Tensor(name, fn.dt(buf.dtype), shape)


class _Sym:
    """A symbolic extent: its kiln expression, compared by its TIR text."""

    def __init__(self, expr, text):
        self.expr, self.text = expr, text

    def __eq__(self, other):
        return isinstance(other, _Sym) and other.text == self.text

    def __repr__(self):
        return self.text


def _sort_rows(fn, data, axis, ascend, k, writes):
    """Each row merge-sorted with its positions (module docs); the first `k` written."""
    from . import bridge

    n = data.shape[axis]
    outer = _outer(fn, data, axis)
    vals, pos, cur = fn.fresh("sort_values"), fn.fresh("sort_positions"), fn.fresh("sort_cursor")
    kv = fn.fresh("sort_k")

    def at(buf_k):
        # The element `buf_k` of the row, in `data` (or an output) of the row's other indices.
        return _at(outer, axis, buf_k)

    body = [
        _for(kv, n, _seq(
            _store(vals, [_v(kv)], _load(data.name, *at(_v(kv)))),
            _store(pos, [_v(kv)], _v(kv)),
        ))
    ]
    src, w = 0, 1
    while w < n:
        body.append(_merge_pass(fn, vals, pos, cur, n, w, src, ascend))
        src, w = 1 - src, 2 * w
    off = _c(src * n)
    for kind, t in writes:
        value = _output(kind, t, vals, pos, _op("add", off, _v(kv)))
        body.append(_for(kv, min(k, n), _store(t.name, at(_v(kv)), value)))
    # Scratch of a row: on the stack when small, else from the workspace pool.
    bits = int("".join(c for c in data.dtype if c.isdigit()))
    nbytes = 2 * n * (8 + bits // 8)
    scope = "local" if nbytes <= bridge.MAX_STACK_BYTES else "workspace"
    row = _alloc(vals, data.dtype, 2 * n, _alloc(pos, "int64", 2 * n,
                 _alloc(cur, "int64", 2, _seq(*body), "local"), scope), scope)
    return _rows(outer, row)


def _merge_pass(fn, vals, pos, cur, n, w, src, ascend):
    """One pass: runs of `w` from the half `src` merged pairwise into the other half."""
    p, t = fn.fresh("sort_pair"), fn.fresh("sort_t")
    i, j, lo, mid, hi = (fn.fresh(s) for s in ("sort_i", "sort_j", "sort_lo", "sort_mid", "sort_hi"))
    s_off, d_off = src * n, (1 - src) * n

    def take(x, which):
        # Write the head of run `which` (0 left, 1 right) at `lo + t` and advance it.
        dst = _op("add", _c(d_off), _op("add", _v(lo), _v(t)))
        return _seq(
            _store(vals, [dst], _load(vals, _op("add", _c(s_off), _v(x)))),
            _store(pos, [dst], _load(pos, _op("add", _c(s_off), _v(x)))),
            _store(cur, [_c(which)], _op("add", _v(x), _c(1))),
        )

    # Strictly before: the right head goes first only then, so equal values keep their order.
    right_first = _op(
        "lt" if ascend else "gt",
        _load(vals, _op("add", _c(s_off), _v(j))),
        _load(vals, _op("add", _c(s_off), _v(i))),
    )
    step = _let(i, "int64", _load(cur, _c(0)), _let(j, "int64", _load(cur, _c(1)), _if(
        _op("lt", _v(i), _v(mid)),
        _if(_op("lt", _v(j), _v(hi)), _if(right_first, take(j, 1), take(i, 0)), take(i, 0)),
        take(j, 1),
    )))
    pairs = math.ceil(n / (2 * w))
    merge = _let(lo, "int64", _op("mul", _v(p), _c(2 * w)),
                 _let(mid, "int64", _op("min", _op("add", _v(lo), _c(w)), _c(n)),
                      _let(hi, "int64", _op("min", _op("add", _v(lo), _c(2 * w)), _c(n)), _seq(
                          _store(cur, [_c(0)], _v(lo)),
                          _store(cur, [_c(1)], _v(mid)),
                          _for(t, 2 * w, _if(_op("lt", _op("add", _v(lo), _v(t)), _v(hi)), step)),
                      ))))
    return _for(p, pairs, merge)


def _output(kind, t, vals, pos, slot):
    """The value written to output `t` from `slot` of the scratch: the value (`kind`
    "values"), or the position converted to `t`'s type."""
    if kind == "values":
        return _load(vals, slot)
    p = _load(pos, slot)
    return p if t.dtype == "int64" else _cast(t.dtype, p)


def _outer(fn, data, axis):
    """A loop variable and extent for each axis but the sorted one."""
    return [(fn.fresh(f"ax{d}"), e) for d, e in enumerate(data.shape) if d != axis]


def _at(outer, axis, pos):
    """The indices of element `pos` of the row the loops of `outer` are at."""
    idx = [_v(v) for v, _ in outer]
    idx.insert(axis, pos)
    return idx


def _rows(outer, row):
    """`row` inside the loops of `outer`, the outermost parallel."""
    for d, (v, e) in reversed(list(enumerate(outer))):
        row = _for(v, e, row, kind="parallel" if d == 0 else "serial")
    return row


def _top_rows(fn, data, axis, ascend, k, writes):
    """`topk` of each row by insertion into the first `k` (module docs)."""
    n = data.shape[axis]
    outer = _outer(fn, data, axis)
    vals, pos, st = fn.fresh("top_values"), fn.fresh("top_positions"), fn.fresh("top_state")
    e, q, x, s_, m = (fn.fresh(h) for h in ("top_e", "top_q", "top_x", "top_slot", "top_count"))
    b, j, rf = fn.fresh("top_block"), fn.fresh("top_j"), fn.fresh("top_best")
    cmp = "gt" if not ascend else "lt"
    # st[0]: elements held (at most k); st[2]: whether the element at hand enters; st[3]:
    # whether the block at hand is scanned; st[4], st[5]: the binary search's range.

    def beats(value, slot_expr):
        return _op(cmp, value, _load(vals, slot_expr))

    # The slot it goes to: the first whose element it is strictly before (a binary search of
    # the `m` held, in order; `st[4]`, `st[5]`: the range left). The ones from there to the
    # last slot kept move down one, the last one held dropping out when `k` are held.
    mid = fn.fresh("top_mid")
    lo, hi = _load(st, _c(4)), _load(st, _c(5))
    search = _for(q, k.bit_length(), _if(_op("lt", lo, hi), _let(
        mid, "int64", _op("floordiv", _op("add", lo, hi), _c(2)),
        _if(beats(_v(x), _v(mid)), _store(st, [_c(5)], _v(mid)),
            _store(st, [_c(4)], _op("add", _v(mid), _c(1)))))))
    last = _op("min", _v(m), _c(k - 1))
    shift = _for(q, _op("sub", last, lo), _let(s_, "int64", _op("sub", last, _v(q)), _seq(
        _store(vals, [_v(s_)], _load(vals, _op("sub", _v(s_), _c(1)))),
        _store(pos, [_v(s_)], _load(pos, _op("sub", _v(s_), _c(1)))),
    )))
    insert = _seq(
        _store(st, [_c(4)], _c(0)),
        _store(st, [_c(5)], _v(m)),
        search,
        shift,
        _store(vals, [lo], _v(x)),
        _store(pos, [lo], _v(e)),
        _store(st, [_c(0)], _op("min", _op("add", _v(m), _c(1)), _c(k))),
    )
    # It enters while fewer than `k` are held, or when it is strictly before the `k`-th
    # (`st[2]` 0: it enters).
    enters = _if(_op("lt", _v(m), _c(k)), _store(st, [_c(2)], _c(0)),
                 _if(beats(_v(x), _c(k - 1)), _store(st, [_c(2)], _c(0)),
                     _store(st, [_c(2)], _c(1))))
    step = _let(x, data.dtype, _load(data.name, *_at(outer, axis, _v(e))),
                _let(m, "int64", _load(st, _c(0)), _seq(
                    enters, _if(_op("eq", _load(st, _c(2)), _c(0)), insert))))
    # The row in blocks of `TOPK_BLOCK`: once `k` are held, a whole block whose best element
    # (its max, or min ascending, in vectors) is not strictly before the `k`-th is skipped:
    # none of its elements would enter. A partial last block is always scanned.
    full, blocks = n // TOPK_BLOCK, -(-n // TOPK_BLOCK)

    def at_block(off):
        return _load(data.name, *_at(outer, axis, _op("add", _op("mul", _v(b), _c(TOPK_BLOCK)), off)))

    red = "max" if not ascend else "min"
    tree, w = [_for(j, TOPK_BLOCK, _store(rf, [_v(j)], at_block(_v(j))), kind="vectorized")], TOPK_BLOCK
    while w > 2:
        w //= 2
        t = fn.fresh("top_t")
        tree.append(_for(t, w, _store(rf, [_v(t)], _op(red, _load(rf, _v(t)), _load(
            rf, _op("add", _v(t), _c(w))))), kind="vectorized"))
    best = _op(red, _load(rf, _c(0)), _load(rf, _c(1)))
    tree.append(_if(beats(best, _c(k - 1)), _store(st, [_c(3)], _c(1))))
    held = _op("eq", _load(st, _c(0)), _c(k))
    if full < blocks:
        held = _op("and", held, _op("lt", _v(b), _c(full)))
    extent = TOPK_BLOCK if full == blocks else _op(
        "min", _c(TOPK_BLOCK), _op("sub", _c(n), _op("mul", _v(b), _c(TOPK_BLOCK))))
    scan = _for(b, blocks, _seq(
        _store(st, [_c(3)], _c(1)),
        _if(held, _seq(_store(st, [_c(3)], _c(0)),
                       _alloc(rf, data.dtype, TOPK_BLOCK, _seq(*tree), "local"))),
        _if(_op("eq", _load(st, _c(3)), _c(1)), _for(j, extent, _let(
            e, "int64", _op("add", _op("mul", _v(b), _c(TOPK_BLOCK)), _v(j)), step))),
    ))
    body = [_store(st, [_c(0)], _c(0)), scan]
    for kind, t in writes:
        value = _output(kind, t, vals, pos, _v(q))
        body.append(_for(q, k, _store(t.name, _at(outer, axis, _v(q)), value)))
    row = _alloc(vals, data.dtype, k, _alloc(pos, "int64", k,
                 _alloc(st, "int64", 6, _seq(*body), "local"), "local"), "local")
    return _rows(outer, row)
