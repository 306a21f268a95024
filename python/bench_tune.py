"""`kiln tune` on matmuls of six shapes, against numpy (OpenBLAS), on this machine.

    python python/bench_tune.py [--kiln target/release/kiln] [--mcpu haswell] \\
        [--trials 200] [--seconds 120] [--shapes 512x512x512,...] [--rounds 15]

Per shape (M x N x K, float32, C = A @ B): the matmul as TVM writes it (`te.compute` with
`te.sum`, converted by `kiln.to_kiln`: no kiln hand schedule in it), tuned by `kiln tune
--target {"kind": "llvm", "mcpu": MCPU}` with at most `--trials` candidates or `--seconds`
seconds (`--huge-pages`: on inputs in huge pages, as numpy's arrays are), built with `kiln
build --db`, loaded with `tvm_ffi.load_module`, and timed against
`np.matmul` on the same 64-byte-aligned arrays in interleaved rounds (kiln first in odd rounds,
numpy first in even; each block a few calls after a warm-up block, started once the other
side's thread pool has gone idle, `bench_util.quiesce`). Reported per shape: each
side's median time per call with its quartiles, the median of the per-round ratios numpy /
kiln (above 1: kiln is faster) with their spread, and the tuning's trials and seconds.

`--mcpu haswell` tunes for an AVX2-only CPU; run it with `OPENBLAS_CORETYPE=Haswell` so that
numpy uses OpenBLAS's AVX2 kernels too (the comparison an AVX2-only machine would give).
Thread counts: the machine's cores on every side. KILN_NUM_THREADS and TVM_NUM_THREADS are set
before TVM is imported (for `kiln.to_kiln`): once TVM's runtime is in the process, kiln's
libraries run their parallel loops on TVM's pool, which defaults to one thread on a 2-vCPU VM.
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

from bench_util import (  # noqa: E402
    aligned, block, cpu_name, quartiles, quiesce, te_matmul, tune_and_build,
)

SHAPES = "512x512x512,1024x1024x1024,2048x2048x2048,1000x1000x1000,64x4096x4096,4096x64x4096"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    ap.add_argument("--mcpu", default="native")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    import tvm_ffi

    import kiln

    target = json.dumps({"kind": "llvm", "mcpu": a.mcpu})
    print(f"CPU: {cpu_name()}; kiln target {target}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(default)')}; numpy {np.__version__}; "
          f"budget {a.trials} trials or {a.seconds:.0f} s per shape; {a.rounds} rounds")
    print("| M x N x K | kiln tuned, ms [q1, q3] | numpy, ms [q1, q3] | numpy / kiln [q1, q3] "
          "| trials, tuning s |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for shape in a.shapes.split(","):
            m, n, k = (int(x) for x in shape.split("x"))
            mod = os.path.join(d, f"mm_{shape}.json")
            with open(mod, "w") as fh:
                json.dump(kiln.to_kiln(te_matmul(m, n, k)), fh)
            db, so = os.path.join(d, f"db_{shape}.jsonl"), os.path.join(d, f"mm_{shape}.so")
            # Tuned on inputs in huge pages: the kernel runs on numpy's arrays, which numpy
            # advises into them (a streamed `B` ranks its candidates differently on 4 KiB pages).
            trials, tune_s, why = tune_and_build(a.kiln, mod, "matmul", target, a.trials,
                                                 a.seconds, db, so, huge_pages=True)
            if why:
                print(f"| {shape} | {why} | | | |")
                ok = False
                continue
            f = tvm_ffi.load_module(so)["matmul"]
            A, B, C = aligned((m, k)), aligned((k, n)), aligned((m, n))
            A[:] = rng.standard_normal((m, k), dtype=np.float32)
            B[:] = rng.standard_normal((k, n), dtype=np.float32)
            ta, tb, tc = (tvm_ffi.from_dlpack(x) for x in (A, B, C))
            C[:] = np.nan
            f(ta, tb, tc)
            want = A.astype(np.float64) @ B.astype(np.float64)
            err = np.abs(C - want).max() / max(np.abs(want).max(), 1e-30)
            if not err < 1e-4:
                print(f"| {shape} | kiln's result is wrong: max rel err {err:.2e} | | | |")
                ok = False
                continue
            D = aligned((m, n))
            flops = 2.0 * m * n * k
            calls = max(3, min(50, int(0.1 / max(flops / 200e9, 1e-6))))
            ks, ns, ratios = [], [], []
            for r in range(a.rounds):
                sides = [("k", lambda: block(f, (ta, tb, tc), calls)),
                         ("n", lambda: block(lambda: np.matmul(A, B, out=D), (), calls))]
                if r % 2:
                    sides.reverse()
                got = {}
                for name, run in sides:
                    quiesce()  # the other side's pool idle again
                    run()  # warm-up
                    got[name] = run()
                ks.append(got["k"])
                ns.append(got["n"])
                ratios.append(got["n"] / got["k"])
            km, nm, rm = (statistics.median(x) for x in (ks, ns, ratios))
            (kq1, kq3), (nq1, nq3), (rq1, rq3) = quartiles(ks), quartiles(ns), quartiles(ratios)
            print(f"| {shape} | {km * 1e3:.3f} [{kq1 * 1e3:.3f}, {kq3 * 1e3:.3f}] "
                  f"| {nm * 1e3:.3f} [{nq1 * 1e3:.3f}, {nq3 * 1e3:.3f}] "
                  f"| {rm:.2f}x [{rq1:.2f}, {rq3:.2f}] | {trials}, {tune_s:.0f} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
