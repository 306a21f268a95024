"""numpy and TVM 0.27 timings of the kiln benchmark kernels, for `cargo bench --bench kernels`.

Usage: bench_tvm.py DIR [--quick]

DIR holds the inputs and kiln's outputs written by the Rust harness (`<kernel>_a.bin`,
`<kernel>_b.bin`, `<kernel>_out.bin`, raw little-endian float32). It also holds kiln's kernels
exported as `<kernel>.so`, which are loaded with `tvm_ffi.load_module` like any tvm-ffi library.
Prints one JSON object: {"<kernel>": {"numpy": {"median": s, "min": s, "max": s, "x": r, "x_q1":
r, "x_q3": r, "rounds": n}, "tvm": {...}, "kiln_ffi": {...}, "tvm_schedule": "...",
"kiln_max_abs_err": e, ...}, "note": "..."}, where "x" is the paired ratio other time / kiln
time (see `interleaved`).

numpy, TVM and kiln-through-tvm_ffi are timed in interleaved blocks (11 rounds, 5 with --quick;
in each, a block of calls of each, in an order that rotates from round to round, with a pause
after each block so that thread pools stop spinning), so load from other processes on this
shared machine hits all of them alike. TVM is skipped (with a note) when `tvm` does not import.

TVM's side is its strongest schedule, not a handy one: each kernel is written as TVM's own
tutorials schedule it for a CPU (constant shapes; parallel, vectorized; `B` packed and register
tiles for matmul; both reductions of softmax and rowsum's sum in vector lanes by `rfactor`), and
where there is more than one reasonable schedule (matmul: 4 x 16 tiles for 16 vector registers,
8 x 32 for 32, the tutorial's 64-row blocks), all are built, checked, and the fastest on this
machine is the one timed (`tvm_schedule` names it). Each is compiled for the target kiln's
kernels are built for, `{"kind": "llvm", "mcpu": KILN_TVM_MCPU, "num-cores":
KILN_TVM_NUM_CORES}` without fast math (the harness passes the CPU name LLVM resolves `native`
to, or the `KILN_BENCH_MCPU` it was given); `KILN_TVM_FAST_MATH=1` adds `"fast-math": true`.
All inputs are 64-byte aligned.
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


def tvm_vadd(n=1 << 24):
    """Parallel chunks of 4096 elements, each in vectors of 16: the shape of TVM's own
    tutorials for an elementwise kernel. The length is constant (a symbolic `n` would leave a
    bounds guard in the vector loop)."""
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = s_tir.Schedule(te.create_prim_func([A, B, C]))
    (i,) = s.get_loops(s.get_sblock("C"))
    io, _, iv = s.split(i, factors=[None, 4096 // 16, 16])
    s.parallel(io)
    s.vectorize(iv)
    return {"par4096+vec16": s.mod}


def packed_matmul(n, nr):
    """`C = A @ B` with `B` packed into `nr`-column panels (`packedB[n / nr, n, nr]`), as a
    schedule, and the loops of `C`'s block."""
    k = te.reduce_axis((0, n), "k")
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    packed = te.compute((n // nr, n, nr), lambda x, y, z: B[y, x * nr + z], name="packedB")
    C = te.compute(
        (n, n),
        lambda x, y: te.sum(A[x, k] * packed[y // nr, k, te.indexmod(y, nr)], axis=k),
        name="C",
    )
    s = s_tir.Schedule(te.create_prim_func([A, B, C]))
    blk = s.get_sblock("C")
    return s, blk, s.get_loops(blk)


def finish_packed_matmul(s, blk, xo, xi, yi, kk):
    """The register tile of `packed_matmul`: `C`'s `xi x yi` tile accumulated in `local`
    (`cache_write` written back at `xo`), rows unrolled and columns vectorized, the
    initialization apart from the reduction; the packing in parallel, vectorized."""
    s.unroll(xi)
    s.vectorize(yi)
    cc = s.cache_write(blk, 0, "local")
    s.reverse_compute_at(cc, xo)
    s.decompose_reduction(blk, kk)
    s.vectorize(s.get_loops(cc)[-1])
    px, _, pz = s.get_loops(s.get_sblock("packedB"))
    s.parallel(px)
    s.vectorize(pz)
    return s.mod


def tvm_matmul_tiled(n, mr, nr):
    """`B` packed into `nr`-column panels, an `mr x nr` register tile over the whole `k`, the
    column panels in parallel."""
    s, blk, (x, y, kk) = packed_matmul(n, nr)
    xo, xi = s.split(x, factors=[None, mr])
    yo, yi = s.split(y, factors=[None, nr])
    s.reorder(yo, xo, kk, xi, yi)
    s.parallel(yo)
    return finish_packed_matmul(s, blk, xo, xi, yi, kk)


def tvm_matmul_blocked(n, bn=32, mr=8):
    """The schedule of TVM's CPU matmul tutorial: `B` packed into 32-column panels, 8 x 32
    register tiles in 64-row blocks, the row blocks in parallel."""
    s, blk, (x, y, kk) = packed_matmul(n, bn)
    xb, xo, xi = s.split(x, factors=[None, 64 // mr, mr])
    yo, yi = s.split(y, factors=[None, bn])
    s.reorder(xb, yo, xo, kk, xi, yi)
    s.parallel(xb)
    return finish_packed_matmul(s, blk, xo, xi, yi, kk)


def tvm_matmul(n=1024):
    """Three schedules; the fastest on this machine is TVM's side (`pick_fastest`): 4 x 16
    tiles fit AVX2's 16 registers, 8 x 32 AVX-512's 32."""
    return {
        "packed4x16+par": tvm_matmul_tiled(n, 4, 16),
        "packed8x32+par": tvm_matmul_tiled(n, 8, 32),
        "tutorial 8x32 in 64-row blocks": tvm_matmul_blocked(n),
    }


def tvm_rowsum(n=4096):
    """Each row's sum in 16 lanes (`rfactor` into a `local` vector), rows in parallel."""
    k = te.reduce_axis((0, n), "k")
    A = te.placeholder((n, n), name="A")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = s_tir.Schedule(te.create_prim_func([A, B]))
    blk = s.get_sblock("B")
    _, kk = s.get_loops(blk)
    _, ki = s.split(kk, factors=[None, 16])
    rf = s.rfactor(ki, 1)
    i_rf, ko_rf, ki_rf = s.get_loops(rf)
    s.reverse_compute_at(s.get_sblock("B"), i_rf)
    s.vectorize(ki_rf)
    s.parallel(i_rf)
    s.set_scope(rf, 0, "local")
    s.decompose_reduction(rf, ko_rf)
    return {"rfactor16+vec+par": s.mod}


def tvm_softmax(n=4096, lanes=16):
    """TOPI's `fast_softmax`, a row at a time: every stage computed at the row loop (parallel),
    both row reductions (max, sum of exponentials) in `lanes` lanes by `rfactor` into `local`
    vectors, the exponentials and the normalization in vectors of `lanes`."""
    from tvm import topi

    A = te.placeholder((n, n), name="A")
    B = topi.nn.fast_softmax(A, axis=1)
    s = s_tir.Schedule(te.create_prim_func([A, B]))
    s.compute_inline(s.get_sblock("T_softmax_delta"))
    (exp_blk,) = s.get_producers(s.get_sblock("T_softmax_expsum"))
    exp_name = s.get(exp_blk).name_hint
    rfs = []
    for name in ("T_softmax_maxelem", "T_softmax_expsum"):
        _, ki = s.split(s.get_loops(s.get_sblock(name))[-1], factors=[None, lanes])
        rfs.append(s.rfactor(ki, 1))
    row = s.get_loops(s.get_sblock("T_softmax_norm"))[0]
    for name in ("T_softmax_expsum", "T_softmax_expsum_rf", exp_name, "T_softmax_maxelem", "T_softmax_maxelem_rf"):
        s.compute_at(s.get_sblock(name), row)
    s.parallel(row)
    for rf in rfs:
        lo = s.get_loops(rf)
        s.reorder(lo[-1], lo[-2])
        lo = s.get_loops(rf)
        s.vectorize(lo[-1])
        s.set_scope(rf, 0, "local")
        s.decompose_reduction(rf, lo[-2])
    for name in (exp_name, "T_softmax_norm"):
        _, v = s.split(s.get_loops(s.get_sblock(name))[-1], factors=[None, lanes])
        s.vectorize(v)
    return {"fast_softmax rows-par+rfactor16+vec16": s.mod}


def pick_fastest(built, args, calls=5):
    """The fastest of several TVM builds of one kernel ({schedule: function}) on `args`: each
    warmed up, then timed twice in alternation (the median of `calls` calls each time); returns
    (schedule, function, {schedule: seconds})."""
    best = {name: float("inf") for name in built}
    for _ in range(2):
        for name, f in built.items():
            f(*args)
            t = []
            for _ in range(calls):
                s = time.perf_counter()
                f(*args)
                t.append(time.perf_counter() - s)
            best[name] = min(best[name], sorted(t)[len(t) // 2])
            time.sleep(0.25)
    name = min(best, key=best.get)
    return name, built[name], best


def interleaved(fns, warm, reps, rounds=None, base="kiln_ffi"):
    """Times the callables of `fns` in `rounds` rounds; in each round every callable runs a block
    of calls (`reps / 5` timed ones, at least 3, after `warm` untimed ones), then the process
    sleeps so that its thread pool stops spinning before the next one starts (OpenBLAS, TVM and
    kiln workers spin after a call and would slow whatever runs next; OpenBLAS's spin outlasts
    50 ms). The order of the blocks rotates from round to round, so no callable always follows
    the same one. Returns {name: {"median", "min", "max"}} over all calls, and for each callable
    other than `base` its paired ratio to `base` ("x": the median over rounds of its block median
    / `base`'s block median in the same round, with the quartiles "x_q1", "x_q3"): pairing the
    blocks of one round cancels the machine's slow phases, which two medians over the whole run
    do not."""
    rounds = rounds or (5 if QUICK else 11)
    per = max(3, (reps if not QUICK else reps // 4) // 5)
    times = {k: [] for k in fns}
    blocks = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f = fns[k]
            for _ in range(warm):
                f()
            block = []
            for _ in range(per):
                s = time.perf_counter()
                f()
                block.append(time.perf_counter() - s)
            times[k] += block
            blocks[k].append(sorted(block)[len(block) // 2])
            time.sleep(0.25)
    out = {}
    for k, t in times.items():
        t.sort()
        out[k] = {"median": t[len(t) // 2], "min": t[0], "max": t[-1]}
        if k != base and base in blocks:
            x = sorted(o / b for o, b in zip(blocks[k], blocks[base]))
            n = len(x)
            out[k].update(x=x[n // 2], x_q1=x[n // 4], x_q3=x[(3 * n) // 4], rounds=n)
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
            # TVM's side is the fastest of its schedules for this kernel (one for most), each
            # checked against the float64 reference first: a wrong one is dropped with a note.
            tol = 1e-6 if name == "softmax" else 1e-4 * float(np.abs(ref).max())
            built, errs = {}, {}
            ts = [tvm.runtime.tensor(x) for x in (*ins, aligned(out_shape))]
            for sched, mod in tvm_builders[name]().items():
                try:
                    f = tvm.compile(mod, target=tvm_target())["main"]
                    ts[-1].copyfrom(np.full(out_shape, np.nan, dtype="float32"))
                    f(*ts)
                    err = float(np.abs(ts[-1].numpy() - ref).max())
                    if not err <= tol:
                        NOTES.append(f"TVM {name} ({sched}) is wrong: max abs error {err:.1e}; dropped")
                        continue
                    built[sched], errs[sched] = f, err
                except Exception as e:  # noqa: BLE001 - report and go on with the other kernels
                    NOTES.append(f"TVM {name} ({sched}) failed: {type(e).__name__}: {str(e)[:300]}")
            if built:
                sched, f, cand = pick_fastest(built, ts)
                OUT[name]["tvm_schedule"] = sched
                OUT[name]["tvm_max_abs_err"] = errs[sched]
                if len(cand) > 1:
                    OUT[name]["tvm_candidates"] = cand
                fns["tvm"] = lambda f=f, a=ts: f(*a)
        OUT[name].update(interleaved(fns, 2, reps))

    OUT["note"] = "; ".join(NOTES)
    print(json.dumps(OUT))


if __name__ == "__main__":
    main()
