"""numpy and TVM 0.27 timings of the kiln benchmark kernels, for `cargo bench --bench kernels`.

Usage: bench_tvm.py DIR [--quick]

DIR holds the inputs and kiln's outputs written by the Rust harness (`<kernel>_a.bin`,
`<kernel>_b.bin`, `<kernel>_out.bin`, raw little-endian float32). Prints one JSON object:
{"<kernel>": {"numpy": {"median": s, "min": s, "max": s}, "tvm": {...},
"kiln_max_abs_err": e}, "note": "..."}. TVM is skipped (with a note) when `tvm` does not import.
TVM kernels use their best hand schedules (the same tiling ideas as kiln's) and are compiled for
the host CPU with fast math; inputs are 64-byte aligned.
"""

import json
import os
import sys
import time

import numpy as np

QUICK = "--quick" in sys.argv
DIR = sys.argv[1] if len(sys.argv) > 1 else "."
OUT = {}
NOTES = []


def timeit(f, warm, reps):
    for _ in range(warm):
        f()
    t = []
    for _ in range(reps if not QUICK else max(3, reps // 4)):
        s = time.perf_counter()
        f()
        t.append(time.perf_counter() - s)
    t.sort()
    return {"median": t[len(t) // 2], "min": t[0], "max": t[-1]}


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
    # TVM's LLVM rejects -mcpu=native with its conda triple: name the host CPU instead.
    cpu = os.environ.get("KILN_TVM_MCPU", "znver5")
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "fast-math": True})


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
    names = [s.get(b).name_hint for b in s.get_child_blocks(s.get_sblock("root"))]
    last = s.get_sblock(names[-1])
    row = s.get_loops(last)[0]
    for nm in reversed(names[:-1]):
        s.compute_at(s.get_sblock(nm), row)
    s.parallel(row)
    for nm in names:
        loops = s.get_loops(s.get_sblock(nm))
        if len(loops) >= 2:
            try:
                lo, li = s.split(loops[-1], factors=[None, 16])
                s.vectorize(li)
            except Exception:  # noqa: BLE001 - a reduction block cannot be vectorized directly
                pass
    return s.mod


def tvm_time(name, mod, args, out_idx, check, warm, reps):
    lib = tvm.compile(mod, target=tvm_target())
    f = lib["main"]
    ts = [tvm.runtime.tensor(x) for x in args]
    f(*ts)
    err = check(ts[out_idx].numpy())
    OUT[name]["tvm"] = timeit(lambda: f(*ts), warm, reps)
    OUT[name]["tvm_max_abs_err"] = float(err)




def main():
    inputs = {}
    N = 1 << 24
    a, b = load("vadd_a.bin", (N,)), load("vadd_b.bin", (N,))
    c = aligned((N,))
    OUT["vadd"] = {"numpy": timeit(lambda: np.add(a, b, out=c), 3, 40)}
    OUT["vadd"]["kiln_max_abs_err"] = float(np.abs(load("vadd_out.bin", (N,)) - (a + b)).max())
    inputs["vadd"] = (a, b)

    M = 1024
    a, b = load("matmul_a.bin", (M, M)), load("matmul_b.bin", (M, M))
    c = aligned((M, M))
    OUT["matmul"] = {"numpy": timeit(lambda: np.matmul(a, b, out=c), 3, 30)}
    ref = a.astype(np.float64) @ b.astype(np.float64)
    OUT["matmul"]["kiln_max_abs_err"] = float(np.abs(load("matmul_out.bin", (M, M)) - ref).max())
    inputs["matmul"] = (a, b)

    R = 4096
    a = load("rowsum_a.bin", (R, R))
    c = aligned((R,))
    OUT["rowsum"] = {"numpy": timeit(lambda: np.sum(a, axis=1, out=c), 3, 40)}
    ref = a.astype(np.float64).sum(axis=1)
    OUT["rowsum"]["kiln_max_abs_err"] = float(np.abs(load("rowsum_out.bin", (R,)) - ref).max())
    inputs["rowsum"] = (a,)

    a = load("softmax_a.bin", (R, R))
    OUT["softmax"] = {"numpy": timeit(lambda: softmax_np(a), 2, 10)}
    ref = softmax_np(a.astype(np.float64))
    OUT["softmax"]["kiln_max_abs_err"] = float(np.abs(load("softmax_out.bin", (R, R)) - ref).max())
    inputs["softmax"] = (a,)

    if tvm is not None:
        import logging

        logging.disable(logging.WARNING)
        jobs = [
            ("vadd", tvm_vadd, lambda: (*inputs["vadd"], aligned((N,))), 2,
             lambda out: np.abs(out - (inputs["vadd"][0] + inputs["vadd"][1])).max(), 3, 40),
            ("matmul", tvm_matmul, lambda: (*inputs["matmul"], aligned((M, M))), 2,
             lambda out: np.abs(out - inputs["matmul"][0] @ inputs["matmul"][1]).max(), 3, 30),
            ("rowsum", tvm_rowsum, lambda: (inputs["rowsum"][0], aligned((R,))), 1,
             lambda out: np.abs(out - inputs["rowsum"][0].sum(axis=1)).max(), 3, 40),
            ("softmax", tvm_softmax, lambda: (inputs["softmax"][0], aligned((R, R))), 1,
             lambda out: np.abs(out - softmax_np(inputs["softmax"][0])).max(), 2, 20),
        ]
        for name, build, args, out_idx, check, warm, reps in jobs:
            try:
                tvm_time(name, build(), args(), out_idx, check, warm, reps)
            except Exception as e:  # noqa: BLE001 - report and go on with the other kernels
                NOTES.append(f"TVM {name} failed: {type(e).__name__}: {str(e)[:300]}")

    OUT["note"] = "; ".join(NOTES)
    print(json.dumps(OUT))


if __name__ == "__main__":
    main()
