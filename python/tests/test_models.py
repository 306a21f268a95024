"""kiln inside TVM: `kiln.build` on TVM PrimFuncs, and `kiln.tvm.compile` on the model corpus
(`models.py`), every output compared with TVM's own `tvm.compile` build of the same module."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax, te, topi  # noqa: E402
from tvm.script import ir as I  # noqa: E402
from tvm.script import relax as R  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

import kiln  # noqa: E402
import kiln.tvm  # noqa: E402
import models  # noqa: E402
from devices import opencl_or_skip  # noqa: E402

TARGET = "llvm"


def run_vm(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in args])
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return [o.numpy() for o in outs]


def assert_close(got, want, rtol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w).max()), 1e-30)
        err = float(np.abs(g.astype("float64") - w).max()) / scale
        assert err <= rtol, f"max relative error {err:.3g} > {rtol}"


def run_python(*args):
    """`python *args` in a new process that imports this process's kiln (its `sys.path`)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module", params=sorted(models.MODELS))
def model(request):
    name = request.param
    mod, inputs, weights = models.export(name)
    ex = kiln.tvm.compile(mod, TARGET)
    ref = tvm.compile(mod, TARGET)
    return name, mod, ex, ref, inputs + weights


def test_every_primfunc_is_built_by_kiln(model):
    name, _, ex, _, _ = model
    report = ex.kiln_report
    assert report["tvm"] == {}, f"{name}: TVM built {report['tvm']}"
    assert len(report["kiln"]) > 0


def test_outputs_agree_with_tvm(model):
    _, _, ex, ref, args = model
    assert_close(run_vm(ex, args), run_vm(ref, args))


def test_the_large_loops_run_in_parallel_and_agree_without(model):
    name, mod, ex, ref, args = model
    # Every model has a matmul or a convolution worth the thread pool.
    assert ex.kiln_report["parallel"], f"{name}: no loop was made parallel"
    serial = kiln.tvm.compile(mod, TARGET, auto_parallel=False)
    assert serial.kiln_report["parallel"] == {}
    assert_close(run_vm(serial, args), run_vm(ref, args))


def test_export_library_loads_again(model, tmp_path):
    name, _, ex, ref, args = model
    path = tmp_path / f"{name}.so"
    ex.export_library(str(path))
    again = tvm.runtime.load_module(str(path))
    assert_close(run_vm(again, args), run_vm(ref, args))


@I.ir_module
class WithBreak:
    @T.prim_func
    def count(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
        for i in range(8):
            if A[i] > T.float32(100):
                break  # `T.break_loop()`, which kiln does not take
            B[i] = A[i] + T.float32(1)

    @T.prim_func
    def double(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
        for j in range(8):
            B[j] = A[j] * T.float32(2)

    @R.function
    def forward(x: R.Tensor((8,), "float32")):
        cls = WithBreak
        y = R.call_tir(cls.count, (x,), out_ty=R.Tensor((8,), "float32"))
        z = R.call_tir(cls.double, (y,), out_ty=R.Tensor((8,), "float32"))
        return z


def test_unsupported_primfunc_is_an_error_naming_it():
    with pytest.raises(kiln.UnsupportedFunctionError) as e:
        kiln.tvm.compile(WithBreak, TARGET)
    assert set(e.value.failures) == {"count"}
    assert "break_loop" in str(e.value) and "count" in str(e.value)
    assert "fallback=True" in str(e.value)
    assert isinstance(e.value, NotImplementedError)


def test_fallback_builds_the_rest_with_tvm_and_says_so(tmp_path):
    ex = kiln.tvm.compile(WithBreak, TARGET, fallback=True)
    assert ex.kiln_report["kiln"] == ["double"]
    assert set(ex.kiln_report["tvm"]) == {"count"}
    assert "break_loop" in ex.kiln_report["tvm"]["count"]
    x = np.arange(8, dtype="float32")
    (out,) = run_vm(ex, [x])
    np.testing.assert_array_equal(out, 2 * (x + 1))
    ex.export_library(str(tmp_path / "mixed.so"))
    (again,) = run_vm(tvm.runtime.load_module(str(tmp_path / "mixed.so")), [x])
    np.testing.assert_array_equal(again, 2 * (x + 1))


def test_device_targets_are_refused_clearly():
    mod, _, _ = models.export("mlp")
    with pytest.raises(NotImplementedError, match="cuda"):
        kiln.tvm.compile(mod, "cuda")
    with pytest.raises(ValueError, match="fallback=True"):
        kiln.tvm.compile(mod, "opencl", fallback=True)
    with pytest.raises(NotImplementedError, match="opencl"):
        kiln.tvm.register_device_api("cuda")
    with pytest.raises(ValueError, match="bytecode"):
        kiln.tvm.compile(mod, TARGET, exec_mode="compiled")
    with pytest.raises(TypeError, match="IRModule"):
        kiln.tvm.compile("not a module", TARGET)


def relu_prim_func():
    A = te.placeholder((64, 64), name="A")
    return te.create_prim_func([A, topi.nn.relu(A)]).with_attr("global_symbol", "relu")


def test_kiln_build_takes_a_primfunc_and_an_irmodule():
    x = (np.random.rand(64, 64).astype("float32") - 0.5)
    for obj in [relu_prim_func(), tvm.IRModule({"relu": relu_prim_func()})]:
        mod = kiln.build(obj)
        y = np.empty_like(x)
        mod.relu(x, y)
        np.testing.assert_array_equal(y, np.maximum(x, 0))
        t = tvm.runtime.tensor(x)
        out = tvm.runtime.tensor(np.empty_like(x))
        mod.relu(t, out)  # TVM tensors too
        np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))
    ir = kiln.to_kiln(relu_prim_func())
    assert ir["format"] == "kiln-ir/1" and ir["functions"][0]["name"] == "relu"


def _casts(node):
    """Every `cast` node of a kiln IR expression tree (a dict), in order."""
    if isinstance(node, dict):
        here = [node] if node.get("op") == "cast" else []
        return here + [c for v in node.values() for c in _casts(v)]
    if isinstance(node, list):
        return [c for v in node for c in _casts(v)]
    return []


def test_tvm_float_to_int_casts_keep_tvms_semantics_without_undefined_behaviour():
    # TVM's float -> integer `Cast` is C's (no defined result out of range); the bridge writes it
    # as kiln's unsaturated cast, and every other cast as before.
    A = te.placeholder((64, 48), name="A")
    I32 = te.placeholder((64, 48), name="I", dtype="int32")
    fi = te.create_prim_func([A, topi.cast(A, "int32")]).with_attr("global_symbol", "f2i")
    i_f = te.create_prim_func([I32, topi.cast(I32, "float32")]).with_attr("global_symbol", "i2f")
    (c,) = _casts(kiln.to_kiln(fi))
    assert c["dtype"] == "int32" and c["saturate"] is False
    (c,) = _casts(kiln.to_kiln(i_f))
    assert "saturate" not in c
    # In range it agrees with TVM's build; out of range (and NaN) it gives some int32 and never
    # fails or crashes, as TVM's does.
    x = ((np.random.rand(64, 48) - 0.5) * 2e6).astype("float32")
    out = tvm.runtime.tensor(np.empty((64, 48), "int32"))
    tvm.compile(fi, TARGET)["f2i"](tvm.runtime.tensor(x), out)
    want = out.numpy()
    mod = kiln.build(fi)
    got = np.empty_like(want)
    mod.f2i(x, got)
    np.testing.assert_array_equal(got, want)
    x[0, :4] = [np.nan, np.inf, -np.inf, 3e9]
    mod.f2i(x, got)
    np.testing.assert_array_equal(got[1:], want[1:])


def test_tvms_float_max_and_min_give_tvms_bits_with_nans_and_signed_zeros():
    # TVM's float `max(a, b)` is `a > b ? a : b` (`min`: `a < b ? a : b`): with a NaN or two
    # zeros of different signs, the result depends on the order. The bridge writes it so, and
    # kiln's build agrees with TVM's bit for bit (`relu` of NaN is 0, as in TVM); a
    # reduction's update (`acc = max(acc, x)`) stays kiln's `max`, which returns NaN for any.
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    specials = [np.nan, 1.0, np.nan, -0.0, 0.0, 2.0, -np.inf, np.inf]
    a = np.resize(np.array(specials, "float32"), n)
    b = np.resize(np.array([1.0, np.nan, np.nan, 0.0, -0.0, 1.0, np.nan, -1.0], "float32"), n)
    a[8:] = np.random.default_rng(0).standard_normal(n - 8)
    ops = {
        "max": ([A, B], te.compute((n,), lambda i: te.max(A[i], B[i]))),
        "min": ([A, B], te.compute((n,), lambda i: te.min(A[i], B[i]))),
        # Operands computed once each (`let`), as TVM's LLVM does.
        "max_of_sums": ([A, B], te.compute((n,), lambda i: te.max(A[i] * 2.0, B[i] + 1.0))),
        "relu": ([A], topi.nn.relu(A)),
        "clip": ([A], topi.clip(A, -1.0, 1.5)),
    }
    for name, (ins, out) in ops.items():
        f = te.create_prim_func(ins + [out]).with_attr("global_symbol", "f")
        assert '"op": "max"' not in json.dumps(kiln.to_kiln(f)), name
        args = [a, b][: len(ins)]
        want = tvm.runtime.tensor(np.empty(n, "float32"))
        tvm.compile(f, TARGET)["f"](*[tvm.runtime.tensor(x) for x in args], want)
        for target in [None, {"kind": "llvm", "mcpu": "haswell"}]:
            got = np.empty(n, "float32")
            kiln.build(f, target).f(*args, got)
            np.testing.assert_array_equal(got.view("int32"), want.numpy().view("int32"), name)
    # A max reduction keeps kiln's `max`.
    k = te.reduce_axis((0, n), name="k")
    R2 = te.placeholder((2, n), name="R")
    red = te.create_prim_func([R2, te.compute((2,), lambda i: te.max(R2[i, k], axis=k))])
    red = red.with_attr("global_symbol", "f")
    assert '"op": "max"' in json.dumps(kiln.to_kiln(red))
    r = np.stack([a, np.abs(a[8:]).repeat(2)[:n]]).astype("float32")
    got = np.empty(2, "float32")
    kiln.build(red).f(r, got)
    assert np.isnan(got[0]) and got[1] == r[1].max()


def test_tvms_tanh_is_one_exp_with_the_two_exp_rules_bits():
    # The bridge writes `tir.tanh` as TVM's legalization rule computes it, with one `exp` of
    # -2|x| instead of the rule's two: the same bits as the rule written out in TVM's own
    # expressions (both built by kiln, so both take kiln's `exp`), at every value.
    n = 4096
    X = te.placeholder((n,), name="X")
    one = tvm.tirx.const(1.0, "float32")

    def rule(x):
        e_neg, e_pos = te.exp(x * -2.0), te.exp(x * 2.0)
        return tvm.tirx.Select(x >= 0.0, (one - e_neg) / (one + e_neg), (e_pos - one) / (e_pos + one))

    tanh = te.create_prim_func([X, topi.tanh(X)]).with_attr("global_symbol", "f")
    two_exp = te.create_prim_func([X, te.compute((n,), lambda i: rule(X[i]))]).with_attr(
        "global_symbol", "f")
    exps = [c for c in json.dumps(kiln.to_kiln(tanh)).split('"op": ')[1:] if c.startswith('"exp"')]
    assert len(exps) == 1
    edges = [0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-30, 9.0, -9.0, 50.0, -50.0, 100.0, -100.0,
             np.inf, -np.inf, np.nan]
    x = np.concatenate([edges, np.random.default_rng(0).standard_normal(n - len(edges)) * 4])
    x = x.astype("float32")
    for target in [None, {"kind": "llvm", "mcpu": "haswell"}]:
        got, want = np.empty_like(x), np.empty_like(x)
        kiln.build(tanh, target).f(x, got)
        kiln.build(two_exp, target).f(x, want)
        same = (got.view("int32") == want.view("int32")) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (x[~same][:4], got[~same][:4], want[~same][:4])
        assert np.abs(got[len(edges):] - np.tanh(x[len(edges):].astype("float64"))).max() < 1e-6


def _relax_main(params, body):
    """A Relax module whose `main` takes `params` ({name: (shape, dtype)}) and returns
    `body(*vars)`, one operator (legalized by `kiln.tvm.compile` as by `tvm.compile`)."""
    bb = relax.BlockBuilder()
    vs = [relax.Var(n, R.Tensor(shape, dt).asobject()) for n, (shape, dt) in params.items()]
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(body(*vs))
        bb.emit_func_output(out)
    return bb.get()


def test_scatters_are_built_by_kiln_and_agree_with_tvm():
    # TOPI writes scatter_elements, scatter_nd and index_put with TVMScript's IRBuilder, whose
    # `seq_scope()` is an attribute (`pragma_scope`) that only groups statements.
    op = relax.op
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 10)).astype("float32")
    cases = [
        ({"x": ((6, 10), "float32"), "i": ((6, 10), "int32"), "u": ((6, 10), "float32")},
         lambda a, i, u: op.scatter_elements(a, i, u, axis=1, reduction="add"),
         [x, rng.integers(-10, 10, (6, 10)).astype("int32"), x * 2]),
        ({"x": ((6, 10), "float32"), "i": ((3, 2), "int64"), "u": ((3,), "float32")},
         lambda a, i, u: op.scatter_nd(a, i, u, "add"),
         [x, np.array([[0, 2], [0, 2], [5, 9]], "int64"), np.array([1, 2, 3], "float32")]),
        ({"x": ((6, 10), "float32"), "i": ((3,), "int64"), "j": ((3,), "int64"),
          "u": ((3,), "float32")},
         lambda a, i, j, u: op.index_put(a, (i, j), u, accumulate=True),
         [x, np.array([0, 0, 5], "int64"), np.array([2, 2, 9], "int64"),
          np.array([1, 2, 3], "float32")]),
    ]
    for params, body, args in cases:
        mod = _relax_main(params, body)
        ex = kiln.tvm.compile(mod, TARGET)
        assert not ex.kiln_report["tvm"] and ex.kiln_report["kiln"], ex.kiln_report
        got, want = (relax.VirtualMachine(e, tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in args]).numpy() for e in (ex, tvm.compile(mod, TARGET)))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,dtype", [((6, 40), "float32"), ((3, 7, 5), "float64"),
                                         ((4, 100), "int32"), ((2, 9), "float16")])
def test_sorts_are_built_by_kiln_and_give_tvms_order_ties_included(shape, dtype):
    # TVM's CPU sort, argsort and topk call `tvm.contrib.sort.*` in its C++ runtime (a stable
    # sort); kiln writes them as loops (`kiln/sort.py`): the same elements in the same order,
    # equal values included, along every axis, ascending and descending, `topk` by insertion
    # (k <= 64) and by the whole sort (k > 64), and `k` past the row (TVM writes n of them).
    op = relax.op
    rng = np.random.default_rng(1)
    x = rng.integers(-4, 4, shape).astype(dtype)  # many ties
    if dtype.startswith("float"):
        x[..., 1::2] = rng.standard_normal(x[..., 1::2].shape)
    for axis in range(len(shape)):
        n = shape[axis]
        cases = [
            lambda a: op.sort(a, axis=axis),
            lambda a: op.sort(a, axis=axis, descending=True),
            lambda a: op.argsort(a, axis=axis, dtype="int32"),
            lambda a: op.argsort(a, axis=axis, descending=True, dtype="int64"),
            lambda a: op.topk(a, 3, axis=axis, ret_type="both"),
            lambda a: op.topk(a, 2, axis=axis, ret_type="values", largest=False),
            lambda a: op.topk(a, 70, axis=axis, ret_type="indices", dtype="int32"),
            lambda a: op.topk(a, n + 2, axis=axis, ret_type="both"),
        ]
        for body in cases:
            mod = _relax_main({"x": (shape, dtype)}, body)
            ex = kiln.tvm.compile(mod, TARGET)
            assert not ex.kiln_report["tvm"] and ex.kiln_report["kiln"], ex.kiln_report
            outs = []
            for e in (ex, tvm.compile(mod, TARGET)):
                o = relax.VirtualMachine(e, tvm.cpu())["main"](tvm.runtime.tensor(x))
                outs.append([o] if isinstance(o, tvm.runtime.Tensor) else list(o))
            for got, want in zip(*outs):
                got, want = got.numpy(), want.numpy()
                assert got.dtype == want.dtype and got.shape == want.shape
                # Past the row's n elements TVM writes nothing: compare the first n.
                keep = [slice(None)] * len(shape)
                keep[axis] = slice(0, min(n, got.shape[axis]))
                np.testing.assert_array_equal(got[tuple(keep)], want[tuple(keep)])


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_topk_skips_the_blocks_that_cannot_enter_and_keeps_tvms_order(dtype):
    # `topk` by insertion scans a row in blocks of 16 and skips a block whose best element is
    # not strictly before the k-th. Rows of 1000 (a partial last block) with many values equal
    # to the k-th (which must not enter), rising and falling runs, both directions.
    op = relax.op
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, (3, 1000)).astype(dtype)
    x[1] = np.arange(1000) % 37  # runs: a block's best can tie the k-th
    x[2, :500] = 3
    for k in (1, 5, 16, 64):
        for largest in (True, False):
            mod = _relax_main({"x": (x.shape, dtype)}, lambda a: op.topk(
                a, k, axis=1, ret_type="both", largest=largest))
            ex = kiln.tvm.compile(mod, TARGET)
            assert ex.kiln_report["kiln"] and not ex.kiln_report["tvm"], ex.kiln_report
            for got, want in zip(*[relax.VirtualMachine(e, tvm.cpu())["main"](
                    tvm.runtime.tensor(x)) for e in (ex, tvm.compile(mod, TARGET))]):
                np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"k={k}")


@pytest.mark.parametrize("shape,src_len,start,end,step,axis", [
    ((8, 6), 2, 2, 6, 2, 0),     # TVM's legalization gathers `src` rows 3..7 of 2
    ((4, 9, 3), 3, 1, 9, 3, 1),
    ((4, 9, 3), 9, 0, 9, 1, -2),  # the whole axis: TVM returns `src`
    ((5, 7), 2, 0, 2, 1, 1),
    ((5, 7), 1, 6, 7, 1, 1),
])
def test_slice_scatter_reads_src_in_bounds_and_agrees_with_numpy_and_tvm(
        shape, src_len, start, end, step, axis):
    # kiln legalizes `slice_scatter` itself (kiln/legalize.py): TVM's PrimFunc gathers `src` at
    # indices clipped to `x`'s extent, past `src`'s, which kiln's index checks refuse.
    op = relax.op
    rng = np.random.default_rng(3)
    src_shape = list(shape)
    src_shape[axis] = src_len
    x = rng.standard_normal(shape).astype("float32")
    src = rng.standard_normal(src_shape).astype("float32")
    mod = _relax_main({"x": (shape, "float32"), "s": (tuple(src_shape), "float32")},
                      lambda a, b: op.slice_scatter(a, b, start, end, step, axis=axis))
    ex = kiln.tvm.compile(mod, TARGET)
    assert ex.kiln_report["kiln"] and not ex.kiln_report["tvm"], ex.kiln_report
    got, want = (relax.VirtualMachine(e, tvm.cpu())["main"](
        tvm.runtime.tensor(x), tvm.runtime.tensor(src)).numpy()
        for e in (ex, tvm.compile(mod, TARGET)))
    expect = x.copy()
    at = [slice(None)] * len(shape)
    at[axis] = slice(start, end, step)
    expect[tuple(at)] = src
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(got, want)


def test_while_loops_binary_searches_and_nms_are_built_by_kiln_and_agree_with_tvm():
    # TIR `While` (TVM's binary searches and non-maximum suppression) becomes kiln's `while`.
    op = relax.op
    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal((6, 9)) * 2).astype("float32")  # ties with the bounds
    bounds = np.array([-2.0, -1.0, 0.0, 0.0, 1.5, 3.0], "float32")
    boxes = rng.random((1, 12, 4)).astype("float32")
    boxes[..., 2:] += boxes[..., :2]  # x2 > x1, y2 > y1: overlapping boxes
    scores = rng.random((1, 2, 12)).astype("float32")
    data = rng.random((1, 10, 6)).astype("float32")
    cases = [
        ({"x": ((6, 9), "float32"), "b": ((6,), "float32")}, (x, bounds),
         lambda a, b: op.bucketize(a, b)),
        ({"x": ((6, 9), "float32"), "b": ((6,), "float32")}, (x, bounds),
         lambda a, b: op.bucketize(a, b, out_int32=True, right=True)),
        ({"b": ((1, 12, 4), "float32"), "s": ((1, 2, 12), "float32")}, (boxes, scores),
         lambda b, s: op.vision.all_class_non_max_suppression(
             b, s, relax.const(4, "int64"), relax.const(0.3, "float32"),
             relax.const(0.2, "float32"))),
        ({"d": ((1, 10, 6), "float32")}, (data,),
         lambda d: op.vision.get_valid_counts(d, 0.4, 0, 1)),
    ]
    for params, args, body in cases:
        mod = _relax_main(params, body)
        ex = kiln.tvm.compile(mod, TARGET)
        assert ex.kiln_report["kiln"] and not ex.kiln_report["tvm"], ex.kiln_report
        outs = []
        for e in (ex, tvm.compile(mod, TARGET)):
            o = relax.VirtualMachine(e, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
            outs.append([o] if isinstance(o, tvm.runtime.Tensor) else list(o))
        for got, want in zip(*outs):
            np.testing.assert_array_equal(got.numpy(), want.numpy())


@T.prim_func
def _concat_rows(a: T.handle, b: T.handle, c: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, 4))
    B = T.match_buffer(b, (3, 4))
    C = T.match_buffer(c, (n + 3, 4))
    for i, j in T.grid(n + 3, 4):
        C[i, j] = T.if_then_else(i < n, A[i, j], B[i - n, j])


def test_a_dimension_given_as_an_expression_is_read_and_checked():
    # `concat` along a symbolic axis declares its output `(n + 3, 4)`: kiln reads the
    # dimension from the tensor and checks it against `n + 3` on entry, as TVM's packed API.
    f = kiln.build(_concat_rows.with_attr("global_symbol", "cat"))["cat"]
    a = np.arange(20, dtype="float32").reshape(5, 4)
    b = -np.arange(12, dtype="float32").reshape(3, 4)
    c = np.zeros((8, 4), "float32")
    f(a, b, c)
    np.testing.assert_array_equal(c, np.concatenate([a, b]))
    with pytest.raises(RuntimeError, match=r"C.shape\[0\]` must be `n \+ T.int64\(3\)`"):
        f(a, b, np.zeros((7, 4), "float32"))
    # Through Relax: a concat with a symbolic batch, against TVM's build.
    n = tvm.tirx.Var("n", "int64")
    mod = _relax_main({"x": ((n, 4), "float32"), "y": ((3, 4), "float32")},
                      lambda x, y: relax.op.concat([x, y], axis=0))
    ex = kiln.tvm.compile(mod, TARGET)
    assert not ex.kiln_report["tvm"], ex.kiln_report
    got, want = (relax.VirtualMachine(e, tvm.cpu())["main"](
        tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
        for e in (ex, tvm.compile(mod, TARGET)))
    np.testing.assert_array_equal(got, want)


def test_a_select_that_gathers_only_in_its_chosen_arm_is_not_an_error():
    # `nll_loss` with `ignore_index` selects `pred[n, target[n]]` only where the target is not
    # ignored; TVM's select loads it anyway (at -100, out of bounds). The bridge guards such
    # arms, so kiln's index checks see only the chosen one.
    op = relax.op
    rng = np.random.default_rng(0)
    pred = rng.standard_normal((4, 5)).astype("float32")
    target = np.array([1, -100, 3, -100], "int64")
    weights = rng.random(5).astype("float32")
    mod = _relax_main({"p": ((4, 5), "float32"), "t": ((4,), "int64"), "w": ((5,), "float32")},
                      lambda p, t, w: op.nn.nll_loss(p, t, w, reduction="mean", ignore_index=-100))
    got, want = (relax.VirtualMachine(e, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in (pred, target, weights)]).numpy()
        for e in (kiln.tvm.compile(mod, TARGET), tvm.compile(mod, TARGET)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_sorts_take_a_symbolic_batch_and_refuse_a_symbolic_row_clearly():
    op = relax.op
    batch = tvm.tirx.Var("batch", "int64")
    mod = _relax_main({"x": ((batch, 300), "float32")},
                      lambda a: op.topk(a, 5, axis=1, ret_type="both"))
    ex, ref = kiln.tvm.compile(mod, TARGET), tvm.compile(mod, TARGET)
    assert "topk" in ex.kiln_report["kiln"], ex.kiln_report
    for rows in (1, 7):
        x = np.round(np.random.default_rng(rows).standard_normal((rows, 300)) * 3).astype("float32")
        got, want = (relax.VirtualMachine(e, tvm.cpu())["main"](tvm.runtime.tensor(x))
                     for e in (ex, ref))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    n = tvm.tirx.Var("n", "int64")
    mod = _relax_main({"x": ((n, 4), "float32")}, lambda a: op.argsort(a, axis=0))
    with pytest.raises(kiln.UnsupportedFunctionError, match="along an axis of symbolic length `n`"):
        kiln.tvm.compile(mod, TARGET)


def test_indices_out_of_bounds_raise_an_index_error_instead_of_a_crash():
    # TVM's `take` (mode "fast", Relax's default) and TOPI's scatters do not check their indices:
    # TVM's build reads or writes outside the buffer (it warns that fast mode segfaults). kiln's
    # checks every index read from memory, and the VM call raises.
    op = relax.op
    x = np.arange(60, dtype="float32").reshape(6, 10)
    take = _relax_main({"x": ((6, 10), "float32"), "i": ((3,), "int32")},
                       lambda a, i: op.take(a, i, axis=1))
    vm = relax.VirtualMachine(kiln.tvm.compile(take, TARGET), tvm.cpu())
    ok = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([9, 0, 3], "int32")))
    np.testing.assert_array_equal(ok.numpy(), x[:, [9, 0, 3]])
    for bad in (10, -1, 1 << 28):
        with pytest.raises(IndexError, match=r"index out of bounds in `take`: .* axis 1 of `\w+` "
                           r"\(extent 10\)"):
            vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([0, bad, 1], "int32")))
    scatter = _relax_main(
        {"x": ((6, 10), "float32"), "i": ((6, 10), "int32"), "u": ((6, 10), "float32")},
        lambda a, i, u: op.scatter_elements(a, i, u, axis=1))
    vm = relax.VirtualMachine(kiln.tvm.compile(scatter, TARGET), tvm.cpu())
    with pytest.raises(IndexError, match="index out of bounds in `scatter_elements`"):
        vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.full((6, 10), 1000, "int32")),
                   tvm.runtime.tensor(x))


def test_kiln_build_refuses_relax_and_unsupported_tir():
    mod, _, _ = models.export("mlp")
    with pytest.raises(TypeError, match="kiln.tvm.compile"):
        kiln.build(mod)
    with pytest.raises(kiln.BridgeError, match="break_loop"):
        kiln.build(WithBreak["count"].with_attr("global_symbol", "count"))


def test_primfunc_module_through_kiln_tvm_compile(tmp_path):
    ex = kiln.tvm.compile(tvm.IRModule({"relu": relu_prim_func()}), TARGET)
    assert ex.kiln_report["kiln"] == ["relu"]
    x = np.random.rand(64, 64).astype("float32") - 0.5
    out = tvm.runtime.tensor(np.empty_like(x))
    ex["relu"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))


def test_a_symbolic_batch_runs_at_every_size(tmp_path):
    # Relax lowers the shape computation of a symbolic batch to a PrimFunc of its own
    # (`shape_func`): kiln builds it too.
    from tvm.relax.frontend import nn

    mod, params = models.MLP(64, 96, 10).export_tvm(
        {"forward": {"x": nn.spec.Tensor(("batch", 64), "float32")}}
    )
    ex = kiln.tvm.compile(mod, TARGET)
    ref = tvm.compile(mod, TARGET)
    assert ex.kiln_report["tvm"] == {}
    assert "shape_func" in ex.kiln_report["kiln"]
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for _, p in params]
    ex.export_library(str(tmp_path / "mlp_batch.so"))
    again = tvm.runtime.load_module(str(tmp_path / "mlp_batch.so"))
    for batch in [1, 3, 17]:
        args = [rng.standard_normal((batch, 64)).astype("float32")] + weights
        want = run_vm(ref, args)
        assert_close(run_vm(ex, args), want)
        assert_close(run_vm(again, args), want)


def test_a_model_tuned_by_kiln_tune_model_is_built_with_its_records(tmp_path):
    """`ex.kiln_ir` (the model's PrimFuncs as kiln converted them) goes to `kiln tune --model`;
    `kiln.tvm.compile(..., db=)` then schedules every kernel that has a record, and the
    outputs still agree with TVM's."""

    mod, inputs, weights = models.export("mlp")
    ex = kiln.tvm.compile(mod, TARGET)
    assert ex.kiln_report["tuning"] == []
    ir = tmp_path / "mlp.json"
    ir.write_text(json.dumps(ex.kiln_ir))
    db = tmp_path / "mlp.jsonl"
    r = run_python("-m", "kiln", "tune", str(ir), "--model", "--trials", "6",
                   "--target", kiln.tvm._kiln_target(tvm.target.Target(TARGET)),
                   "--db", str(db), "-q")
    assert r.returncode == 0, r.stderr
    assert "| function |" in r.stdout, r.stdout
    tuned = kiln.tvm.compile(mod, TARGET, db=db)
    # Each function with records is built with its winner, or, where no candidate won or the
    # winner lost its pairing with the default (under the load of parallel tests it can), with
    # the default build and a note that says so.
    notes = tuned.kiln_report["tuning"]
    assert notes, r.stdout
    assert all("tuning record applied" in n or "the default build is kept" in n
               for n in notes), notes
    ref = tvm.compile(mod, TARGET)
    assert_close(run_vm(tuned, inputs + weights), run_vm(ref, inputs + weights))


# ---- OpenCL: TVM's VM runs kiln's kernels on kiln's OpenCL runtime (PoCL in CI) ----------




def run_vm_on(ex, args, dev):
    vm = relax.VirtualMachine(ex, dev)
    out = vm["forward"](*[tvm.runtime.tensor(a, dev) for a in args])
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    assert all(str(o.device) == str(dev) for o in outs), [o.device for o in outs]
    return [o.numpy() for o in outs]


@pytest.fixture(scope="module")
def cpu_refs():
    """TVM's own CPU build of each model and its outputs (TVM's wheel has no OpenCL runtime,
    so kiln's OpenCL build is compared with TVM's CPU build)."""
    refs = {}
    for name in sorted(models.MODELS):
        mod, inputs, weights = models.export(name)
        refs[name] = (mod, inputs + weights, run_vm(tvm.compile(mod, TARGET), inputs + weights))
    return refs


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_models_run_on_opencl_in_tvms_vm(name, cpu_refs):
    opencl_or_skip()
    mod, args, want = cpu_refs[name]
    ex = kiln.tvm.compile(mod, "opencl")
    assert ex.kiln_report["tvm"] == {} and ex.kiln_report["kiln"]
    # TVM's pipeline ran without DLight: kiln, not TVM, bound the loops to threads.
    assert '"thread_binding"' not in json.dumps(ex.kiln_ir)
    assert_close(run_vm_on(ex, args, tvm.opencl()), want)


def test_opencl_tensors_are_kilns_and_bad_inputs_are_errors(cpu_refs):
    opencl_or_skip()
    kiln.tvm.register_device_api("opencl")
    kiln.tvm.register_device_api("opencl")  # idempotent
    x = np.arange(12, dtype="float32").reshape(3, 4)
    t = tvm.runtime.tensor(x, tvm.opencl())
    assert str(t.device) == "opencl:0"
    np.testing.assert_array_equal(t.numpy(), x)  # host -> kiln's OpenCL memory -> host
    assert tvm.opencl().exist and not tvm.opencl(7).exist
    assert tvm.opencl().max_threads_per_block >= 1 and tvm.opencl().device_name
    # kiln's errors arrive as TVM's exceptions with kiln's message; nothing is allocated.
    with pytest.raises(RuntimeError, match="kiln allocation.*CL_DEVICE_MAX_MEM_ALLOC_SIZE"):
        tvm.runtime.empty((1 << 40,), "float32", tvm.opencl())
    with pytest.raises(RuntimeError, match="invalid device opencl:3"):
        tvm.runtime.empty((4,), "float32", tvm.opencl(3))
    mod, args, _ = cpu_refs["mlp"]
    ex = kiln.tvm.compile(mod, "opencl")
    # Host tensors where the kernels want OpenCL memory: TVM's message, no crash.
    with pytest.raises(ValueError, match="device_type"):
        relax.VirtualMachine(ex, tvm.opencl())["forward"](*[tvm.runtime.tensor(a) for a in args])
    # A shape that does not match: the VM's check, before any launch.
    bad = [np.zeros((3, 256), "float32")] + args[1:]
    with pytest.raises(RuntimeError, match="shape"):
        run_vm_on(ex, bad, tvm.opencl())


def test_a_symbolic_batch_runs_on_opencl_with_its_shape_function_on_the_host():
    opencl_or_skip()
    from tvm.relax.frontend import nn

    mod, params = models.MLP(64, 96, 10).export_tvm(
        {"forward": {"x": nn.spec.Tensor(("batch", 64), "float32")}}
    )
    ex = kiln.tvm.compile(mod, "opencl")
    assert "shape_func" in ex.kiln_report["kiln"]
    assert '"host": true' in json.dumps(
        next(f for f in ex.kiln_ir["functions"] if f["name"] == "shape_func")["attrs"]
    )
    ref = tvm.compile(mod, TARGET)
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for _, p in params]
    for batch in [1, 5]:
        args = [rng.standard_normal((batch, 64)).astype("float32")] + weights
        assert_close(run_vm_on(ex, args, tvm.opencl()), run_vm(ref, args))


def test_an_opencl_export_loads_in_a_new_process(tmp_path, cpu_refs):
    """`tvm.runtime.load_module` of the `.so` in a fresh process: kiln registers its runtime,
    and the library's host code attaches its device module through tvm-ffi on first launch."""
    opencl_or_skip()
    mod, args, want = cpu_refs["gpt2_block"]
    path = tmp_path / "gpt2_cl.so"
    kiln.tvm.compile(mod, "opencl").export_library(str(path))
    np.save(tmp_path / "want.npy", want[0])
    for i, a in enumerate(args):
        np.save(tmp_path / f"arg{i}.npy", a)
    script = f"""
import numpy as np, tvm, kiln.tvm
from tvm import relax
lib = tvm.runtime.load_module({str(path)!r})
dev = tvm.opencl()
args = [np.load({str(tmp_path)!r} + f"/arg{{i}}.npy") for i in range({len(args)})]
try:
    relax.VirtualMachine(lib, dev)["forward"](*[tvm.runtime.tensor(a, dev) for a in args])
    raise SystemExit("ran without kiln's runtime registered")
except SystemExit:
    raise
except Exception as e:
    assert "opencl" in str(e), e
kiln.tvm.register_device_api("opencl")
out = relax.VirtualMachine(lib, dev)["forward"](*[tvm.runtime.tensor(a, dev) for a in args])
want = np.load({str(tmp_path)!r} + "/want.npy")
err = float(np.abs(out.numpy() - want).max() / np.abs(want).max())
assert err <= 1e-5, err
print("ok", err)
"""
    r = run_python("-c", script)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_kiln_tune_model_on_opencl_then_compile_with_the_records(tmp_path, cpu_refs):
    """The device twin of the CPU test above: `kiln tune --model --target opencl` over
    `ex.kiln_ir`, then `kiln.tvm.compile(..., "opencl", db=)`; outputs still agree."""
    opencl_or_skip()
    mod, args, want = cpu_refs["mlp"]
    ex = kiln.tvm.compile(mod, "opencl")
    ir = tmp_path / "mlp_cl.json"
    ir.write_text(json.dumps(ex.kiln_ir))
    db = tmp_path / "mlp_cl.jsonl"
    r = run_python("-m", "kiln", "tune", str(ir), "--model", "--trials", "3",
                   "--target", "opencl", "--db", str(db), "-q")
    assert r.returncode == 0, r.stderr
    tuned = kiln.tvm.compile(mod, "opencl", db=db)
    notes = tuned.kiln_report["tuning"]
    assert len(notes) == len(ex.kiln_report["kiln"]), notes
    assert all("tuning record applied" in n or "the default build is kept" in n
               for n in notes), notes
    assert_close(run_vm_on(tuned, args, tvm.opencl()), want)


def test_registering_over_another_opencl_runtime_is_refused():
    """A TVM built with OpenCL has its own `device_api.opencl`: kiln does not replace it (its
    tensors would not be kiln's), and says so."""
    script = """
import tvm_ffi, kiln.tvm
tvm_ffi.register_global_func("device_api.opencl", lambda: None)
try:
    kiln.tvm.register_device_api("opencl")
except RuntimeError as e:
    assert "another runtime" in str(e), e
    print("refused")
"""
    r = run_python("-c", script)
    assert r.returncode == 0 and "refused" in r.stdout, r.stdout + r.stderr


def test_an_opencl_primfunc_kiln_cannot_build_is_an_error_without_a_fallback():
    """TVM's GPU sort is a hand-lowered kernel (`T.launch_thread`), which the bridge does not
    take: the error names it, and offers no fallback (there is none for OpenCL)."""
    from tvm.relax.frontend import nn

    class Sort(nn.Module):
        def forward(self, x):
            return nn.op.sort(x, axis=1)

    mod, _ = Sort().export_tvm({"forward": {"x": nn.spec.Tensor((4, 64), "float32")}})
    with pytest.raises(kiln.UnsupportedFunctionError) as e:
        kiln.tvm.compile(mod, "opencl")
    assert "sort" in e.value.failures and "thread_extent" in str(e.value)
    assert "no fallback for `opencl`" in str(e.value) and "fallback=True" not in str(e.value)


def test_without_a_cxx_compiler_registering_says_what_is_missing(tmp_path):
    """kiln's TVM DeviceAPI is compiled on first use: with no C++ compiler (and nothing
    cached) registering is an error naming the compiler, not a crash."""
    script = f"""
import os
os.environ["CXX"] = {str(tmp_path / "no-such-cxx")!r}
os.environ["KILN_CACHE_DIR"] = {str(tmp_path / "cache")!r}
import kiln.tvm
try:
    kiln.tvm.register_device_api("opencl")
except RuntimeError as e:
    assert "C++ compiler" in str(e) and "no-such-cxx" in str(e) and "not found" in str(e), e
    print("refused")
"""
    r = run_python("-c", script)
    assert r.returncode == 0 and "refused" in r.stdout, r.stdout + r.stderr
