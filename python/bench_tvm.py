"""numpy and TVM 0.27 timings of the kiln benchmark kernels, for `cargo bench --bench kernels`.

Usage: bench_tvm.py DIR [--quick]

DIR holds the inputs and kiln's outputs written by the Rust harness (`<kernel>_a.bin`,
`<kernel>_b.bin`, `<kernel>_out.bin`, raw little-endian float32). It also holds kiln's kernels exported
as `<kernel>.so`, which are loaded with `tvm_ffi.load_module` like any tvm-ffi library. Prints one
JSON object: {"<kernel>": {"numpy": {"median": s, "min": s, "max": s}, "tvm": {...},
"kiln_ffi": {...}, "kiln_max_abs_err": e, ...}, "note": "..."}.

numpy, TVM and kiln-through-tvm_ffi are timed in interleaved blocks (5 rounds; in each, a block of
calls of each, in an order that rotates from round to round, with a pause after each block so
that thread pools stop spinning), so load from other processes on this shared machine hits all
of them alike. TVM is skipped (with a note)
when `tvm` does not import. TVM kernels use hand schedules (packing, register tiling, rfactor,
parallel, vectorize: the same ideas as kiln's) and are compiled for the target kiln's kernels are
built for: the default target, `{"kind": "llvm", "mcpu": KILN_TVM_MCPU, "num-cores":
KILN_TVM_NUM_CORES}` without fast math (the harness passes the CPU name LLVM resolves `native` to,
or the `KILN_BENCH_MCPU` it was given); `KILN_TVM_FAST_MATH=1` adds `"fast-math": true`. All
inputs are 64-byte aligned.
"""

import json
import os
import sys
import time

import numpy as np

# TVM's runtime assumes hyper-threading on x86 and uses half the logical CPUs by default: one
# thread on this 2-core VM. Give its pool (which kiln's libraries use too once `tvm` is imported,
# through the `__TVMBackendParallelLaunch` slot) every CPU, like numpy's and kiln's.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

QUICK = "--quick" in sys.argv
DIR = sys.argv[1] if len(sys.argv) > 1 else "."
OUT = {}
NOTES = []


def aligned(shape, src=None):
    n = int(np.prod(shape))
    raw = np.empty(n + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    a = raw[off : off + n].reshape(shape)
    if src is not None:
        a[...] = src
    else:
        a[...] = 0
    return a


def load(name, shape):
    path = os.path.join(DIR, name)
    return aligned(shape, np.fromfile(path, dtype="<f4").reshape(shape))


def softmax_np(a):
    m = a.max(axis=1, keepdims=True)
    e = np.exp(a - m)
    return e / e.sum(axis=1, keepdims=True)


# ---- TVM ---------------------------------------------------------------------------------------
try:
    import tvm
    from tvm import te
    from tvm import s_tir
except Exception as e:  # noqa: BLE001 - any import failure means "no TVM here"
    tvm = None
    NOTES.append(f"TVM not available ({type(e).__name__}: {e}); pip install apache-tvm")


def tvm_target():
    # TVM's LLVM rejects -mcpu=native with its conda triple: the harness names the CPU.
    t = {"kind": "llvm", "mcpu": os.environ.get("KILN_TVM_MCPU", "generic")}
    if "KILN_TVM_NUM_CORES" in os.environ:
        t["num-cores"] = int(os.environ["KILN_TVM_NUM_CORES"])
    if os.environ.get("KILN_TVM_FAST_MATH") == "1":
        t["fast-math"] = True
    return tvm.target.Target(t)


def tvm_vadd():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = s_tir.Schedule(te.create_prim_func([A, B, C]))
    (i,) = s.get_loops(s.get_sblock("C"))
    io, ii = s.split(i, factors=[None, 64])
    s.parallel(io)
    s.vectorize(ii)
    return s.mod


def tvm_matmul(n=1024, bn=32, mr=8):
    k = te.reduce_axis((0, n), "k")
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    packed = te.compute((n // bn, n, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute(
        (n, n),
        lambda x, y: te.sum(A[x, k] * packed[y // bn, k, te.indexmod(y, bn)], axis=k),
        name="C",
    )
    s = s_tir.Schedule(te.create_prim_func([A, B, C]))
    blk = s.get_sblock("C")
    x, y, kk = s.get_loops(blk)
    xb, xo, xi = s.split(x, factors=[None, 64 // mr, mr])
    yo, yi = s.split(y, factors=[None, bn])
    s.reorder(xb, yo, xo, kk, xi, yi)
    s.parallel(xb)
    s.unroll(xi)
    s.vectorize(yi)
    cc = s.cache_write(blk, 0, "local")
    s.reverse_compute_at(cc, xo)
    s.decompose_reduction(blk, kk)
    cl = s.get_loops(cc)
    s.vectorize(cl[-1])
    pb = s.get_sblock("packedB")
    px, py, pz = s.get_loops(pb)
    s.parallel(px)
    s.vectorize(pz)
    return s.mod


def tvm_rowsum(n=4096):
    k = te.reduce_axis((0, n), "k")
    A = te.placeholder((n, n), name="A")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = s_tir.Schedule(te.create_prim_func([A, B]))
    blk = s.get_sblock("B")
    i, kk = s.get_loops(blk)
    ko, ki = s.split(kk, factors=[None, 64])
    rf = s.rfactor(ki, 0)
    s.parallel(s.get_loops(rf)[0])
    s.vectorize(s.get_loops(rf)[-1])
    s.reverse_compute_at(s.get_sblock("B"), s.get_loops(rf)[0])
    return s.mod


def tvm_softmax(n=4096):
    from tvm import topi

    A = te.placeholder((n, n), name="A")
    B = topi.nn.fast_softmax(A, axis=1)
    s = s_tir.Schedule(te.create_prim_func([A, B]))
    # maxelem, delta, fast_exp, expsum, norm: inline delta, compute everything per row.
    s.compute_inline(s.get_sblock("T_softmax_delta"))
    row = s.get_loops(s.get_sblock("T_softmax_norm"))[0]
    for nm in ["T_softmax_expsum", "T_fast_exp", "T_softmax_maxelem"]:
        s.compute_at(s.get_sblock(nm), row)
    s.parallel(row)
    for nm in ["T_fast_exp", "T_softmax_norm"]:
        inner = s.get_loops(s.get_sblock(nm))[-1]
        _, vi = s.split(inner, factors=[None, 16])
        s.vectorize(vi)
    # The two row reductions are left to LLVM (vectorized only with fast math's reassociation).
    return s.mod


def interleaved(fns, warm, reps, rounds=5):
    """Times the callables of `fns` in `rounds` rounds; in each round every callable runs a block
    of `reps / rounds` timed calls (after `warm` untimed ones), then the process sleeps so that
    its thread pool stops spinning before the next one starts (OpenBLAS, TVM and kiln workers
    spin after a call and would slow whatever runs next; OpenBLAS's spin outlasts 50 ms). The
    order of the blocks rotates from round to round, so no callable always follows the same
    one. Interleaving the blocks spreads load from other processes over all of them. Returns
    {name: {"median", "min", "max"}}."""
    reps = reps if not QUICK else max(3, reps // 4)
    per = max(1, reps // rounds)
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f = fns[k]
            for _ in range(warm):
                f()
            for _ in range(per):
                s = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - s)
            time.sleep(0.25)
    out = {}
    for k, t in times.items():
        t.sort()
        out[k] = {"median": t[len(t) // 2], "min": t[0], "max": t[-1]}
    return out


def main():
    N, M, R = 1 << 24, 1024, 4096
    kernels = {
        "vadd": ([load("vadd_a.bin", (N,)), load("vadd_b.bin", (N,))], (N,), 40),
        "matmul": ([load("matmul_a.bin", (M, M)), load("matmul_b.bin", (M, M))], (M, M), 30),
        "rowsum": ([load("rowsum_a.bin", (R, R))], (R,), 40),
        "softmax": ([load("softmax_a.bin", (R, R))], (R, R), 20),
    }
    refs = {
        "vadd": lambda x: x[0].astype(np.float64) + x[1],
        "matmul": lambda x: x[0].astype(np.float64) @ x[1].astype(np.float64),
        "rowsum": lambda x: x[0].astype(np.float64).sum(axis=1),
        "softmax": lambda x: softmax_np(x[0].astype(np.float64)),
    }
    numpy_fns = {
        "vadd": lambda x, o: np.add(x[0], x[1], out=o),
        "matmul": lambda x, o: np.matmul(x[0], x[1], out=o),
        "rowsum": lambda x, o: np.sum(x[0], axis=1, out=o),
        "softmax": lambda x, o: softmax_np(x[0]),
    }
    tvm_builders = {}
    if tvm is not None:
        import logging

        logging.disable(logging.WARNING)
        tvm_builders = {"vadd": tvm_vadd, "matmul": tvm_matmul, "rowsum": tvm_rowsum, "softmax": tvm_softmax}
    try:
        import tvm_ffi
    except Exception as e:  # noqa: BLE001 - no tvm_ffi: no kiln-through-tvm_ffi column
        tvm_ffi = None
        NOTES.append(f"tvm_ffi not available ({e})")

    for name, (ins, out_shape, reps) in kernels.items():
        ref = refs[name](ins)
        OUT[name] = {}
        OUT[name]["kiln_max_abs_err"] = float(np.abs(load(name + "_out.bin", out_shape) - ref).max())
        fns = {}
        o_np = aligned(out_shape)
        fns["numpy"] = lambda ins=ins, o=o_np, f=numpy_fns[name]: f(ins, o)
        if tvm_ffi is not None:
            try:
                f = tvm_ffi.load_module(os.path.join(DIR, name + ".so"))[name]
                args = [tvm_ffi.from_dlpack(x) for x in (*ins, aligned(out_shape))]
                f(*args)
                OUT[name]["kiln_ffi_max_abs_err"] = float(np.abs(np.from_dlpack(args[-1]) - ref).max())
                fns["kiln_ffi"] = lambda f=f, a=args: f(*a)
            except Exception as e:  # noqa: BLE001 - report and go on
                NOTES.append(f"kiln {name} through tvm_ffi failed: {type(e).__name__}: {str(e)[:200]}")
        if name in tvm_builders:
            try:
                lib = tvm.compile(tvm_builders[name](), target=tvm_target())
                f = lib["main"]
                ts = [tvm.runtime.tensor(x) for x in (*ins, aligned(out_shape))]
                f(*ts)
                OUT[name]["tvm_max_abs_err"] = float(np.abs(ts[-1].numpy() - ref).max())
                fns["tvm"] = lambda f=f, a=ts: f(*a)
            except Exception as e:  # noqa: BLE001 - report and go on with the other kernels
                NOTES.append(f"TVM {name} failed: {type(e).__name__}: {str(e)[:300]}")
        OUT[name].update(interleaved(fns, 2, reps))

    OUT["note"] = "; ".join(NOTES)
    print(json.dumps(OUT))


if __name__ == "__main__":
    main()
