"""The model corpus (python/tests/models.py) built by kiln (`kiln.tvm.compile`) and by TVM 0.27
(`tvm.compile`), for the same targets: build time and run time in the Relax VM, measured in
this one process, interleaved, with medians and their spread.

    KILN_NATIVE_LIB=target/release/libkiln_python.so PYTHONPATH=python \\
        .venv/bin/python python/bench_models.py [--quick] [--targets default,host,haswell]

(or with the package installed: `python python/bench_models.py`). Targets:
- `default`: `{"kind": "llvm"}`, what `tvm.compile(mod, "llvm")` builds for (TVM's default: a
  generic x86-64, no -mcpu), the same target for both;
- `host`: this machine's CPU: TVM gets `mcpu` = LLVM's name for it (TVM links a newer LLVM);
  kiln gets the same name, or `native` when its LLVM 14 does not know the name;
- `haswell`: an AVX2-only CPU, the same target for both.

Build time is from the Relax module to a runnable executable (`ex.jit()`: kiln's kernels are
compiled in memory, as TVM's llvm module is; neither links anything), with kiln's compile cache
off. Run time is `vm["forward"](*args)` per call.
Outputs are compared (max relative error) before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_util import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tests"))

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import kiln  # noqa: E402
import kiln.tvm  # noqa: E402
import models  # noqa: E402




def kiln_knows(target) -> bool:
    """Whether kiln's LLVM 14 compiles for `target` (a CPU newer than it is refused)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            kiln.export({"format": "kiln-ir/1", "functions": []}, Path(d) / "probe.ll", target)
            return True
        except RuntimeError:
            return False


def targets(names):
    system = tvm.target.codegen.llvm_get_system_cpu()
    out = {}
    for n in names:
        if n == "default":
            out[n] = ({"kind": "llvm"}, None)
        elif n == "host":
            tt = {"kind": "llvm", "mcpu": system}
            out[n] = (tt, None if kiln_knows(tt) else {"kind": "llvm", "mcpu": "native"})
        else:
            out[n] = ({"kind": "llvm", "mcpu": n}, None)
    return out


def spread(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[0], xs[-1]


def fmt(t):
    m, lo, hi = t
    return f"{m * 1e3:8.3f} ms [{lo * 1e3:.3f}, {hi * 1e3:.3f}]"


def build_kiln(mod, tt, kt, auto_parallel=True):
    ex = kiln.tvm.compile(mod, tvm.target.Target(tt), kiln_target=kt, auto_parallel=auto_parallel)
    ex.jit()
    return ex


def build_tvm(mod, tt):
    ex = tvm.compile(mod, tvm.target.Target(tt))
    ex.jit()
    return ex


def outputs(ex, args):
    out = relax.VirtualMachine(ex, tvm.cpu())["forward"](*args)
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return [o.numpy() for o in outs]


def calls_per_sample(f, budget=0.02):
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            f()
        if time.perf_counter() - t > budget or n >= 1 << 16:
            return n
        n *= 2


def main():
    # Cold builds on both sides: kiln's compile cache would serve every build after the first.
    os.environ["KILN_CACHE"] = "off"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(models.MODELS))
    ap.add_argument("--targets", default="default,host,haswell")
    ap.add_argument("--builds", type=int, default=5, help="interleaved builds per side")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved run samples per side")
    ap.add_argument("--quick", action="store_true", help="3 builds, 7 rounds")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--serial", action="store_true",
                    help="kiln on one thread (auto_parallel=False), as TVM's default build runs")
    a = ap.parse_args()
    if a.quick:
        a.builds, a.rounds = 3, 7
    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); TVM {tvm.__version__}; "
          f"kiln {kiln.version()}; medians [min, max]; kiln "
          f"{'serial (auto_parallel=False)' if a.serial else 'auto_parallel'}")
    results = []
    for tname, (tt, kt) in targets(a.targets.split(",")).items():
        print(f"\n== target {tname}: TVM {json.dumps(tt)}, kiln {json.dumps(kt or tt)}")
        print(f"{'model':13} {'side':5} {'build':>32} {'run (per call)':>34} {'kiln speedup':>13}")
        for name in a.models.split(","):
            mod, inputs, weights = models.export(name)
            args = [tvm.runtime.tensor(x) for x in inputs + weights]
            bk, bt = [], []
            for _ in range(a.builds):
                t = time.perf_counter()
                exk = build_kiln(mod, tt, kt, auto_parallel=not a.serial)
                bk.append(time.perf_counter() - t)
                # kiln's optimizing tier finishes in the background; it must not overlap the
                # next build (TVM's, or kiln's own) on the same cores, and the run times below
                # are of its O3 code, not the JIT's quick first tier.
                kiln.wait_optimized()
                t = time.perf_counter()
                ext = build_tvm(mod, tt)
                bt.append(time.perf_counter() - t)
            ok, ot = outputs(exk, args), outputs(ext, args)
            err = max(
                float(np.abs(k.astype("float64") - t).max()) / max(float(np.abs(t).max()), 1e-30)
                for k, t in zip(ok, ot)
            )
            fk = relax.VirtualMachine(exk, tvm.cpu())["forward"]
            ft = relax.VirtualMachine(ext, tvm.cpu())["forward"]
            for f in (fk, ft):
                f(*args)
            nk, nt = calls_per_sample(lambda: fk(*args)), calls_per_sample(lambda: ft(*args))
            rk, rt = [], []
            for _ in range(a.rounds):
                t = time.perf_counter()
                for _ in range(nk):
                    fk(*args)
                rk.append((time.perf_counter() - t) / nk)
                t = time.perf_counter()
                for _ in range(nt):
                    ft(*args)
                rt.append((time.perf_counter() - t) / nt)
            sbk, sbt, srk, srt = spread(bk), spread(bt), spread(rk), spread(rt)
            print(f"{name:13} kiln  {fmt(sbk):>32} {fmt(srk):>34} "
                  f"run {srt[0] / srk[0]:5.2f}x")
            print(f"{'':13} tvm   {fmt(sbt):>32} {fmt(srt):>34} "
                  f"build {sbt[0] / sbk[0]:5.2f}x   (max rel err {err:.2g})")
            results.append({
                "target": tname, "model": name, "max_rel_err": err,
                "build_s": {"kiln": sbk, "tvm": sbt}, "run_s": {"kiln": srk, "tvm": srt},
            })
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
