"""`kiln tune` on kernels kiln has no hand schedule for (batched matmuls and convolutions), against
the strongest baseline this machine has for each, in one process.

    KILN_NATIVE_LIB=target/release/libkiln_python.so PYTHONPATH=python \\
        .venv/bin/python python/bench_tune_ops.py [--kiln target/release/kiln] [--mcpu haswell] \\
        [--trials 64] [--seconds 120] [--only bmm_nn_16x256,...] [--rounds 11]

Each kernel is written as TVM writes it (`te.compute` with `te.sum`; TOPI's `conv2d_nchw` and
`batch_matmul`), converted by `kiln.to_kiln`, tuned by `kiln tune` with at most `--trials`
candidates or `--seconds` seconds, built with `kiln build --db` and loaded with
`tvm_ffi.load_module`. It is checked against float64 numpy and timed on the same 64-byte-aligned
arrays, in interleaved rounds, against:

- the baseline, the strongest available: `np.matmul` (OpenBLAS, one `sgemm` per batch) for a
  batched matmul; for a convolution, im2col and OpenBLAS's `sgemm` (the padded input's windows
  copied into a `[C * kh * kw, H * W]` matrix each call, then one `np.matmul` with the weights:
  how Caffe and most frameworks' CPU fallbacks run a convolution; TVM 0.27 ships no x86
  convolution schedule);
- TVM 0.27's own `tvm.compile` of the same PrimFunc, untuned (what a TVM user gets without
  MetaSchedule).

Reported per kernel: each side's median time per call with quartiles, the medians of the
per-round ratios baseline / kiln and TVM / kiln (above 1: kiln is faster), and the tuning's
trials and seconds. `--mcpu haswell` tunes for an AVX2-only CPU; run it with
`OPENBLAS_CORETYPE=Haswell` so that numpy uses OpenBLAS's AVX2 kernels too.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

for _var in ("KILN_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(_var, str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402

from bench_util import aligned, block, cpu_name, quartiles, quiesce, tune_and_build  # noqa: E402


def bmm(b, m, n, k, nt):
    """`C[b] = A[b] @ B[b]` (`nt`: `B[b]` stored transposed, `[n, k]`, as TOPI's
    `batch_matmul` and attention's `Q @ K^T`)."""
    from tvm import te, topi

    a = te.placeholder((b, m, k), name="A")
    if nt:
        bb = te.placeholder((b, n, k), name="B")
        c = topi.nn.batch_matmul(a, bb)
    else:
        bb = te.placeholder((b, k, n), name="B")
        r = te.reduce_axis((0, k), name="k")
        c = te.compute((b, m, n), lambda z, i, j: te.sum(a[z, i, r] * bb[z, r, j], axis=r),
                       name="C")
    shapes = [(b, m, k), (b, n, k) if nt else (b, k, n), (b, m, n)]

    def reference(x, y):
        x, y = x.astype(np.float64), y.astype(np.float64)
        return x @ (y.transpose(0, 2, 1) if nt else y)

    def baseline(x, y, out):
        np.matmul(x, y.transpose(0, 2, 1) if nt else y, out=out)

    return [a, bb, c], shapes, reference, baseline, 2.0 * b * m * n * k


def conv(c, h, w, co, kk, stride, pad):
    """`conv2d_nchw` of a `[1, c, h, w]` input with `[co, c, kk, kk]` weights (TOPI's)."""
    from tvm import te, topi

    x = te.placeholder((1, c, h, w), name="X")
    wt = te.placeholder((co, c, kk, kk), name="W")
    y = topi.nn.conv2d_nchw(x, wt, stride, pad, 1)
    ho, wo = (h + 2 * pad - kk) // stride + 1, (w + 2 * pad - kk) // stride + 1
    shapes = [(1, c, h, w), (co, c, kk, kk), (1, co, ho, wo)]

    def im2col(xp):
        win = np.lib.stride_tricks.sliding_window_view(xp[0], (kk, kk), axis=(1, 2))
        win = win[:, ::stride, ::stride]  # [c, ho, wo, kk, kk]
        return np.ascontiguousarray(win.transpose(0, 3, 4, 1, 2)).reshape(c * kk * kk, ho * wo)

    def padded(xx):
        return np.pad(xx, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else xx

    def reference(xx, ww):
        cols = im2col(padded(xx.astype(np.float64)))
        return (ww.astype(np.float64).reshape(co, -1) @ cols).reshape(1, co, ho, wo)

    def baseline(xx, ww, out):
        np.matmul(ww.reshape(co, -1), im2col(padded(xx)), out=out.reshape(co, ho * wo))

    return [x, wt, y], shapes, reference, baseline, 2.0 * co * ho * wo * c * kk * kk


WORKLOADS = {
    "bmm_nn_16x256x256x256": lambda: bmm(16, 256, 256, 256, nt=False),
    "bmm_nn_12x128x64x128": lambda: bmm(12, 128, 64, 128, nt=False),
    "bmm_nt_12x128x128x64": lambda: bmm(12, 128, 128, 64, nt=True),
    "conv3x3_64x56x56": lambda: conv(64, 56, 56, 64, 3, 1, 1),
    "conv3x3_128x28x28": lambda: conv(128, 28, 28, 128, 3, 1, 1),
    "conv1x1_256x56x56_64": lambda: conv(256, 56, 56, 64, 1, 1, 0),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    ap.add_argument("--mcpu", default="native")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--only", help="comma-separated kernel names: " + ", ".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args()
    import tvm
    import tvm_ffi

    import kiln

    names = a.only.split(",") if a.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown kernel(s) {unknown}; expected some of {list(WORKLOADS)}")
    target = json.dumps({"kind": "llvm", "mcpu": a.mcpu})
    tvm_cpu = tvm.target.codegen.llvm_get_system_cpu() if a.mcpu == "native" else a.mcpu
    ttarget = tvm.target.Target({"kind": "llvm", "mcpu": tvm_cpu})
    print(f"CPU: {cpu_name()}; kiln target {target}, TVM mcpu {tvm_cpu}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(default)')}; numpy {np.__version__}; "
          f"budget {a.trials} trials or {a.seconds:.0f} s per kernel; {a.rounds} rounds")
    print("| kernel | kiln tuned, ms [q1, q3] | GFLOP/s | baseline, ms | baseline / kiln [q1, q3] "
          "| TVM untuned, ms | TVM / kiln | trials, tuning s |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            tensors, shapes, reference, baseline, flops = WORKLOADS[name]()
            func = tvm.te.create_prim_func(tensors).with_attr("global_symbol", "op")
            mod = os.path.join(d, f"{name}.json")
            with open(mod, "w") as fh:
                json.dump(kiln.to_kiln(func), fh)
            db, so = os.path.join(d, f"{name}.jsonl"), os.path.join(d, f"{name}.so")
            trials, tune_s, why = tune_and_build(a.kiln, mod, "op", target, a.trials, a.seconds,
                                                 db, so, keep_default=True)
            if why:
                print(f"| {name} | {why} | | | | | | |")
                ok = False
                continue
            kf = tvm_ffi.load_module(so)["op"]
            tf = tvm.compile(tvm.IRModule({"op": func}), target=ttarget)["op"]
            arrays = [aligned(s) for s in shapes]
            for x in arrays[:-1]:
                x[:] = rng.standard_normal(x.shape, dtype=np.float32)
            out = arrays[-1]
            args = [tvm_ffi.from_dlpack(x) for x in arrays]
            want = reference(*arrays[:-1])
            scale = max(np.abs(want).max(), 1e-30)
            out[:] = np.nan
            kf(*args)
            err = np.abs(out - want).max() / scale
            out[:] = np.nan
            tf(*args)
            terr = np.abs(out - want).max() / scale
            bout = aligned(shapes[-1])
            baseline(*arrays[:-1], bout)
            berr = np.abs(bout - want).max() / scale
            if not (err < 1e-4 and terr < 1e-4 and berr < 1e-4):
                print(f"| {name} | wrong results: max rel err kiln {err:.1e}, TVM {terr:.1e}, "
                      f"baseline {berr:.1e} | | | | | | |")
                ok = False
                continue
            calls = {}
            funcs = {"k": (kf, args), "b": (baseline, arrays[:-1] + [bout]), "t": (tf, args)}
            for s, (fn, xs) in funcs.items():
                # Calls per block: about 0.1 s of them (an untuned TVM kernel takes up to
                # seconds a call: 3 then).
                calls[s] = max(3, min(50, int(0.1 / max(block(fn, xs, 1), 1e-6))))
            got = {s: [] for s in funcs}
            for r in range(a.rounds):
                order = ["k", "b", "t"] if r % 2 == 0 else ["t", "b", "k"]
                for s in order:
                    fn, xs = funcs[s]
                    quiesce()  # the other side's pool idle again
                    fn(*xs)  # warm-up
                    got[s].append(block(fn, xs, calls[s]))
            ks, bs, ts = got["k"], got["b"], got["t"]
            rb = [b / k for b, k in zip(bs, ks)]
            rt = [t / k for t, k in zip(ts, ks)]
            km, bm, tm = (statistics.median(x) for x in (ks, bs, ts))
            (kq1, kq3), (rq1, rq3) = quartiles(ks), quartiles(rb)
            print(f"| {name} | {km * 1e3:.3f} [{kq1 * 1e3:.3f}, {kq3 * 1e3:.3f}] "
                  f"| {flops / km / 1e9:.0f} | {bm * 1e3:.3f} "
                  f"| {statistics.median(rb):.2f}x [{rq1:.2f}, {rq3:.2f}] | {tm * 1e3:.3f} "
                  f"| {statistics.median(rt):.2f}x | {trials}, {tune_s:.0f} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
