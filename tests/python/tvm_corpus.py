"""TVM 0.27's operators (TOPI) through kiln: converted by python/kiln_tvm.py, built by `kiln build`,
run through tvm_ffi on random inputs, and compared with TVM's own build of the same PrimFunc.

Usage: tvm_corpus.py KILN_BINARY WORKDIR [--only NAME,...] [--kiln-target JSON]
       tvm_corpus.py --emit WORKDIR [--tvm-mcpu CPU] [--only NAME,...]

With `--emit` (for `cargo bench --bench tvm_build`), it only converts each operator into
WORKDIR/<name>.json and times `tvm.compile` of it, and `tvm.compile` followed by
`export_library` to a `.so` (5 builds each in this process), and writes WORKDIR/index.json:
[{"op", "file", "tvm_build_s": [times], "tvm_so_s": [times]}].

Prints one line per operator and a final coverage line; exits 1 unless every operator agrees.
Times: `kiln build` of the converted module (the whole command, process start included; also
kiln's own figure for code generation and linking, and the time of `to_kiln`) against
`tvm.compile(func, target)`, and the run time of the unscheduled operator (median of repeated
calls) of kiln's build against TVM's, both for the host CPU (kiln's default target
`{"kind": "llvm", "mcpu": "native"}`; TVM gets the CPU name kiln resolves `native` to).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import tvm
import tvm_ffi
from tvm import te, topi

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import kiln_tvm  # noqa: E402

# Imported (python/bench_corpus.py reads `corpus()`), the command line is not this module's.
_CLI = __name__ == "__main__"
EMIT = _CLI and len(sys.argv) > 1 and sys.argv[1] == "--emit"
KILN = None if EMIT or not _CLI else sys.argv[1]
WORK = sys.argv[2] if _CLI else None
ONLY = None
if _CLI and "--only" in sys.argv:
    ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(","))
# The target kiln builds for (`--kiln-target JSON`, e.g. with an "opt-level"); TVM always gets
# the host CPU at its default level.
KILN_TARGET = '{"kind": "llvm", "mcpu": "native"}'
if _CLI and "--kiln-target" in sys.argv:
    KILN_TARGET = sys.argv[sys.argv.index("--kiln-target") + 1]
RNG = np.random.default_rng(0)
# The value every symbolic dimension takes in the run.
SYMBOLIC_EXTENT = 37


def dims(shape):
    return [int(s) if isinstance(s, (int, tvm.tirx.IntImm)) else SYMBOLIC_EXTENT for s in shape]


def ph(shape, name, dtype="float32"):
    return te.placeholder(shape, name=name, dtype=dtype)


def gelu(x):
    return te.compute(
        x.shape, lambda *i: 0.5 * x(*i) * (1.0 + te.erf(x(*i) * 0.7071067811865476)), name="gelu"
    )


def requantize(x):
    # int8 -> int32 accumulate, fixed-point multiply by 1.5 (3 >> 1) with rounding, clamp to int8.
    def f(*i):
        v = x(*i).astype("int32") * 3
        r = (v + (1 << 0)) >> 1
        return te.max(te.min(r, 127), -128).astype("int8")

    return te.compute(x.shape, f, name="requant")


def int_bits(x):
    return te.compute(
        x.shape,
        lambda *i: ((x(*i) << 3) ^ (x(*i) >> 2)) & 0x7FF | (x(*i) % 7),
        name="bits",
    )


def corpus():
    """(name, inputs, outputs) for every operator."""
    A = ph((64, 48), "A")
    B = ph((64, 48), "B")
    X = ph((2, 8, 16, 16), "X")
    W = ph((16, 8, 3, 3), "W")
    ops = []

    def add(name, ins, outs):
        ops.append((name, ins, outs if isinstance(outs, (list, tuple)) else [outs]))

    add("add", [A, B], topi.add(A, B))
    # A symbolic shape: `n` rows, bound from the tensors at run time (SYMBOLIC_EXTENT here).
    n = te.var("n")
    An, Bn = ph((n, 48), "An"), ph((n, 48), "Bn")
    add("add_symbolic_rows", [An, Bn], topi.add(An, Bn))
    add("multiply", [A, B], topi.multiply(A, B))
    bc = ph((64, 1), "C")
    add("broadcast_add", [A, bc], topi.add(A, bc))
    R = ph((48,), "R")
    add("broadcast_sub_row", [A, R], topi.subtract(A, R))
    add("relu", [A], topi.nn.relu(A))
    add("sigmoid", [A], topi.sigmoid(A))
    add("tanh", [A], topi.tanh(A))
    add("erf", [A], topi.erf(A))
    add("gelu", [A], gelu(A))
    add("clip", [A], topi.clip(A, -0.5, 0.5))
    add("cast_int32", [A], topi.cast(A, "int32"))
    add("where", [A, B], topi.where(topi.greater(A, B), A, B))
    P = ph((64, 48), "P")
    add("power", [P, B], topi.power(P, B))
    add("exp", [A], topi.exp(A))
    add("sqrt", [P], topi.sqrt(P))
    add("abs_negative", [A], topi.abs(topi.negative(A)))
    add("sum", [A], topi.sum(A, axis=1))
    add("max", [A], topi.max(A, axis=0))
    add("min", [A], topi.min(A, axis=1, keepdims=True))
    add("argmax", [A], topi.argmax(A, axis=1))
    # TOPI 0.27 has no `mean`; Relax lowers it to a sum and a division, as here.
    add("mean", [A], topi.divide(topi.sum(A, axis=1), tvm.tirx.const(48.0, "float32")))
    add("softmax", [A], topi.nn.softmax(A, axis=1))
    add("log_softmax", [A], topi.nn.log_softmax(A, axis=1))
    G = ph((48,), "G")
    Bt = ph((48,), "Bt")
    add("layer_norm", [A, G, Bt], topi.nn.layer_norm(A, G, Bt, axis=[1], epsilon=1e-5))
    mean, var, gam, bet = (ph((8,), n) for n in ["mu", "var", "gamma", "beta"])
    bn = topi.nn.batch_norm(X, gam, bet, mean, var, axis=1, epsilon=1e-5)
    add("batch_norm_inference", [X, gam, bet, mean, var], bn[0])
    Wd = ph((32, 48), "Wd")
    add("dense", [A, Wd], topi.nn.dense(A, Wd))
    Bm = ph((48, 40), "Bm")
    add("matmul", [A, Bm], topi.matmul(A, Bm))
    BA, BB = ph((3, 16, 24), "BA"), ph((3, 20, 24), "BB")
    add("batch_matmul", [BA, BB], topi.nn.batch_matmul(BA, BB))
    add("conv2d_nchw_pad", [X, W], topi.nn.conv2d_nchw(X, W, 1, 1, 1))
    add("conv2d_nchw_stride_dilation", [X, W], topi.nn.conv2d_nchw(X, W, 2, 2, 2))
    Wg = ph((16, 2, 3, 3), "Wg")
    add("group_conv2d_nchw", [X, Wg], topi.nn.group_conv2d_nchw(X, Wg, 1, 1, 1, 4))
    Wdw = ph((8, 1, 3, 3), "Wdw")
    add("depthwise_conv2d_nchw", [X, Wdw], topi.nn.depthwise_conv2d_nchw(X, Wdw, 1, 1, 1))
    Xh, Wh = ph((2, 16, 16, 8), "Xh"), ph((3, 3, 8, 16), "Wh")
    add("conv2d_nhwc", [Xh, Wh], topi.nn.conv2d_nhwc(Xh, Wh, 1, 1, 1))
    add("max_pool2d_pad", [X], topi.nn.pool2d(X, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW"))
    add("avg_pool2d_pad", [X], topi.nn.pool2d(X, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "avg", layout="NCHW", count_include_pad=False))
    add("global_avg_pool", [X], topi.nn.global_pool(X, "avg", layout="NCHW"))
    add("transpose", [X], topi.transpose(X, (0, 2, 3, 1)))
    add("reshape", [X], topi.reshape(X, (4, 4, 256)))
    add("concatenate", [A, B], topi.concatenate([A, B], axis=1))
    add("split", [A], list(topi.split(A, 3, axis=1)))
    I = ph((10,), "I", "int32")
    add("take", [A, I], topi.take(A, I, axis=0, mode="clip"))
    add("strided_slice", [X], topi.strided_slice(X, [0, 1, 2, 0], [2, 8, 14, 16], [1, 2, 3, 1]))
    add("pad", [A], topi.nn.pad(A, [1, 2], [3, 4], pad_value=0.5))
    add("resize_nearest", [X], topi.image.resize2d(X, [0.0] * 4, (24, 20), layout="NCHW", method="nearest_neighbor", coordinate_transformation_mode="asymmetric"))
    add("resize_bilinear", [X], topi.image.resize2d(X, [0.0] * 4, (24, 20), layout="NCHW", method="linear", coordinate_transformation_mode="half_pixel"))
    add("one_hot", [I], topi.one_hot(I, tvm.tirx.const(1.0, "float32"), tvm.tirx.const(0.0, "float32"), 12, -1, "float32"))
    add("cumsum", [A], topi.cumsum(A, axis=1))
    Q = ph((64, 48), "Q", "int8")
    add("requantize_int8", [Q], requantize(Q))
    Z = ph((64, 48), "Z", "int32")
    add("int32_bits_shifts", [Z], int_bits(Z))
    return ops


def random_input(t):
    shape = dims(t.shape)
    dt = str(t.dtype)
    name = t.op.name
    if dt.startswith("float"):
        if name in ("P", "var"):
            return RNG.uniform(0.5, 2.0, shape).astype(dt)
        return RNG.uniform(-2.0, 2.0, shape).astype(dt)
    if dt == "int8":
        return RNG.integers(-128, 128, shape).astype(dt)
    if name == "I":
        return RNG.integers(-3, 70, shape).astype(dt)
    return RNG.integers(-1000, 1000, shape).astype(dt)


def aligned(x):
    """A 64-byte-aligned copy of `x`: TVM's code assumes its buffers' 64-byte alignment (aligned
    vector loads), kiln's only the element alignment."""
    raw = np.empty(x.nbytes + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def median_time(f, args, reps):
    f(*args)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f(*args)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def host_cpu():
    out = subprocess.run(
        [KILN, "target", '{"kind": "llvm", "mcpu": "native"}', "--resolve"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)["mcpu"]


def emit():
    """Converted modules and tvm.compile times, for the in-process build benchmark."""
    os.makedirs(WORK, exist_ok=True)
    cpu = sys.argv[sys.argv.index("--tvm-mcpu") + 1] if "--tvm-mcpu" in sys.argv else None
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu} if cpu else {"kind": "llvm"})
    index = []
    for name, ins, outs in corpus():
        if ONLY and name not in ONLY:
            continue
        func = te.create_prim_func(list(ins) + list(outs)).with_attr("global_symbol", name)
        mod = kiln_tvm.to_kiln(func)
        path = os.path.join(WORK, f"{name}.json")
        with open(path, "w") as fh:
            json.dump(mod, fh)
        times, so_times = [], []
        for _ in range(5):
            t = time.perf_counter()
            lib = tvm.compile(tvm.IRModule({name: func}), target=target)
            times.append(time.perf_counter() - t)
            # The same build to a shared library, as `kiln build` writes one.
            lib_path = os.path.join(WORK, f"{name}.tvm.so")
            lib.export_library(lib_path)
            so_times.append(time.perf_counter() - t)
        index.append({"op": name, "file": path, "tvm_build_s": times, "tvm_so_s": so_times})
    with open(os.path.join(WORK, "index.json"), "w") as fh:
        json.dump(index, fh)


def main():
    if EMIT:
        emit()
        return
    os.makedirs(WORK, exist_ok=True)
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()})
    rows = []
    failures = []
    for name, ins, outs in corpus():
        if ONLY and name not in ONLY:
            continue
        row = {"op": name, "converted": False, "compiled": False, "agrees": False}
        rows.append(row)
        func = te.create_prim_func(list(ins) + list(outs)).with_attr("global_symbol", name)
        try:
            t = time.perf_counter()
            mod = kiln_tvm.to_kiln(func)
            row["to_kiln_s"] = time.perf_counter() - t
            row["converted"] = True
        except kiln_tvm.BridgeError as e:
            failures.append(f"{name}: not converted: {e}")
            continue
        path = os.path.join(WORK, f"{name}.json")
        with open(path, "w") as fh:
            json.dump(mod, fh)
        lib_path = os.path.join(WORK, f"{name}.so")
        t = time.perf_counter()
        r = subprocess.run(
            [KILN, "build", path, "-t", KILN_TARGET, "-o", lib_path], capture_output=True, text=True
        )
        row["kiln_build_s"] = time.perf_counter() - t
        if r.returncode != 0:
            failures.append(f"{name}: kiln build failed: {r.stderr.strip()[:2000]}")
            continue
        row["compiled"] = True
        # kiln's own figure: code generation and linking, without process start and parsing.
        m = re.search(r"function\(s\), ([0-9.]+) ms\)", r.stderr)
        if m:
            row["kiln_codegen_s"] = float(m.group(1)) * 1e-3
        t = time.perf_counter()
        tlib = tvm.compile(tvm.IRModule({name: func}), target=target)
        row["tvm_build_s"] = time.perf_counter() - t
        klib = tvm_ffi.load_module(lib_path)
        inputs = [random_input(t) for t in ins]
        shapes = [(dims(o.shape), str(o.dtype)) for o in outs]

        def fresh():
            return [tvm_ffi.from_dlpack(aligned(x)) for x in inputs] + [
                tvm_ffi.from_dlpack(aligned(np.zeros(s, dtype=d))) for s, d in shapes
            ]

        ka, ta = fresh(), fresh()
        try:
            klib[name](*ka)
        except Exception as e:  # noqa: BLE001 - a failing call is a disagreement
            failures.append(f"{name}: kiln's build raised {type(e).__name__}: {e}")
            continue
        tlib[name](*ta)
        ok = True
        for k in range(len(outs)):
            got = np.from_dlpack(ka[len(ins) + k])
            want = np.from_dlpack(ta[len(ins) + k])
            if got.dtype.kind == "f":
                good = np.allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
                err = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
            else:
                good = np.array_equal(got, want)
                err = int(np.sum(got != want))
            if not good:
                ok = False
                failures.append(f"{name}: output {k} differs from TVM's (max error / mismatches {err})")
        row["agrees"] = ok
        if ok:
            reps = 20
            row["kiln_run_s"] = median_time(klib[name], ka, reps)
            row["tvm_run_s"] = median_time(tlib[name], ta, reps)
        print(json.dumps(row), flush=True)
    n = len(rows)
    conv = sum(r["converted"] for r in rows)
    comp = sum(r["compiled"] for r in rows)
    agree = sum(r["agrees"] for r in rows)
    kb = [r["kiln_build_s"] for r in rows if "kiln_build_s" in r and "tvm_build_s" in r]
    tb = [r["tvm_build_s"] for r in rows if "kiln_build_s" in r and "tvm_build_s" in r]
    runs = [r["kiln_run_s"] / r["tvm_run_s"] for r in rows if "kiln_run_s" in r]
    line = f"coverage: {n} operators, {conv} converted, {comp} compiled, {agree} agree with TVM 0.27"
    if kb:
        ratio = [t / k for k, t in zip(kb, tb)]
        line += (
            f"; build median kiln {statistics.median(kb) * 1e3:.0f} ms vs tvm.compile "
            f"{statistics.median(tb) * 1e3:.0f} ms (per-operator ratio median {statistics.median(ratio):.1f}x)"
        )
        cg = [r["kiln_codegen_s"] for r in rows if "kiln_codegen_s" in r]
        tk = [r["to_kiln_s"] for r in rows if "to_kiln_s" in r]
        if cg and tk:
            line += (
                f" [of kiln's, codegen and link in process {statistics.median(cg) * 1e3:.0f} ms; "
                f"before it, to_kiln {statistics.median(tk) * 1e3:.0f} ms]"
            )
    if runs:
        line += (
            f"; run time kiln / TVM median {statistics.median(runs):.2f} "
            f"[{min(runs):.2f}-{max(runs):.2f}]"
        )
    print(line)
    for f in failures:
        print("FAILED " + f)
    sys.exit(0 if agree == n and n > 0 else 1)


if __name__ == "__main__":
    main()
