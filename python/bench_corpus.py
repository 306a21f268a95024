"""The TOPI corpus (tests/python/tvm_corpus.py, 50 operators) built in this process by kiln
(`kiln.build`, JIT) and by TVM 0.27 (`tvm.compile`) for this machine's CPU, and their run times
compared: per operator TVM time / kiln time (above 1: kiln is faster), interleaved rounds, the
median of each side's per-call times.

Each side is timed by TVM's own timer (`Module.time_evaluator`: a loop of calls in C, at least
5 ms a round), both on the same arrays: the time of a call of a 12 KiB operator moves by up to
10 % with where its arrays lie relative to each other (4 KiB aliasing), which separate arrays
would charge to one side, and a call from Python adds about 0.3 us to both sides.

    KILN_NATIVE_LIB=target/release/libkiln_python.so PYTHONPATH=python \\
        .venv/bin/python python/bench_corpus.py [--rounds 5] [--auto-parallel] [--mcpu haswell]
        [--tune 64] [--only a,b]

With `--tune N`, the operators are first tuned by `kiln tune --model` (N candidates each, in
one run over a module of all of them) and kiln builds each with its record (`kiln.build(...,
db=...)`); TVM's side stays its untuned `tvm.compile` build.

TVM gets LLVM's name for the host CPU (or `--mcpu`); kiln gets `native` (or `--mcpu`), since
its LLVM 14 may not know the name TVM's LLVM uses. Outputs are checked against TVM's first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

# Both sides on every core: TVM's pool (which kiln's builds also run on once TVM's runtime is in
# the process) defaults to fewer threads than cores on some VMs.
for _var in ("KILN_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(_var, str(len(os.sched_getaffinity(0))))

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import te  # noqa: E402

import kiln  # noqa: E402
import tvm_corpus as corpus  # noqa: E402
from bench_util import cpu_name  # noqa: E402


def timer(mod, name):
    """TVM's timer for `mod[name]`: one call returns the mean time of a loop of calls run in C
    that lasts at least 5 ms."""
    return mod.time_evaluator(name, tvm.cpu(), number=1, repeat=1, min_repeat_ms=5)


def tune_all(a, ktarget, only):
    """Tunes every selected operator with `kiln tune --model`; returns the database's path."""
    import json
    import subprocess
    import tempfile

    d = tempfile.mkdtemp(prefix="kiln-corpus-tune-")
    funcs = {}
    for name, ins, outs in corpus.corpus():
        if only and name not in only:
            continue
        funcs[name] = te.create_prim_func(list(ins) + list(outs)).with_attr("global_symbol", name)
    mod = kiln.to_kiln(tvm.IRModule(funcs))
    path = os.path.join(d, "corpus.json")
    with open(path, "w") as fh:
        json.dump(mod, fh)
    db = os.path.join(d, "tuning.jsonl")
    t = time.perf_counter()
    p = subprocess.run([a.kiln, "tune", path, "--model", "--trials", str(a.tune), "--target",
                        json.dumps(ktarget), "--db", db, "-q"], capture_output=True, text=True)
    print(p.stdout[p.stdout.find("| function"):] if "| function" in p.stdout else p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"kiln tune --model failed: {p.stderr[-2000:]}")
    print(f"tuned {len(funcs)} operators in {time.perf_counter() - t:.0f} s; records in {db}")
    if not os.path.exists(db):
        open(db, "w").close()
    return db


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--auto-parallel", action="store_true")
    ap.add_argument("--mcpu", help="the CPU for both sides (default: this machine's)")
    ap.add_argument("--only", help="comma-separated operator names")
    ap.add_argument("--tune", type=int, metavar="N", help="tune each operator with N trials first")
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"),
                    help="the kiln binary `--tune` runs")
    a = ap.parse_args()
    os.environ["KILN_CACHE"] = "off"
    tvm_cpu = a.mcpu or tvm.target.codegen.llvm_get_system_cpu()
    ttarget = tvm.target.Target({"kind": "llvm", "mcpu": tvm_cpu})
    ktarget = {"kind": "llvm", "mcpu": a.mcpu or "native"}
    print(f"CPU: {cpu_name()}; TVM mcpu {tvm_cpu}, kiln {ktarget}; auto_parallel "
          f"{a.auto_parallel}; {a.rounds} interleaved rounds")
    only = set(a.only.split(",")) if a.only else None
    db = None
    if a.tune:
        db = tune_all(a, ktarget, only)
    ratios = []
    for name, ins, outs in corpus.corpus():
        if only and name not in only:
            continue
        func = te.create_prim_func(list(ins) + list(outs)).with_attr("global_symbol", name)
        km = kiln.build(func, target=ktarget, auto_parallel=a.auto_parallel, db=db)
        if db:
            applied = [n for n in km.kiln_info["tuning"] if "applied" in n]
            print(f"{name}: {'tuned' if applied else 'no record (the default was fastest)'}")
        tm = tvm.compile(tvm.IRModule({name: func}), target=ttarget)
        inputs = [corpus.random_input(t) for t in ins]
        shapes = [(corpus.dims(o.shape), str(o.dtype)) for o in outs]

        def fresh():
            return [tvm_ffi.from_dlpack(corpus.aligned(x)) for x in inputs] + [
                tvm_ffi.from_dlpack(corpus.aligned(np.zeros(s, dtype=d))) for s, d in shapes
            ]

        ka, ta = fresh(), fresh()
        kf, tf = km[name], tm[name]
        kiln.wait_optimized()  # kiln's O3 code, not the JIT's quick first tier
        kf(*ka)
        tf(*ta)
        for k in range(len(outs)):
            got, want = np.from_dlpack(ka[len(ins) + k]), np.from_dlpack(ta[len(ins) + k])
            ok = (np.allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
                  if got.dtype.kind == "f" else np.array_equal(got, want))
            if not ok:
                print(f"{name}: output {k} differs from TVM's")
        kev, tev = timer(km, name), timer(tm.mod, name)
        kt, tt = [], []
        for _ in range(a.rounds):
            kt.append(kev(*ka).mean)
            tt.append(tev(*ka).mean)
        kmed, tmed = statistics.median(kt), statistics.median(tt)
        r = tmed / kmed
        ratios.append((r, name))
        print(f"{name:24} kiln {kmed * 1e6:9.2f} us [{min(kt) * 1e6:.2f}, {max(kt) * 1e6:.2f}]"
              f"   tvm {tmed * 1e6:9.2f} us [{min(tt) * 1e6:.2f}, {max(tt) * 1e6:.2f}]   {r:5.2f}x",
              flush=True)
    ratios.sort()
    rs = [r for r, _ in ratios]
    print(f"\nTVM time / kiln time over {len(rs)} operators: median {statistics.median(rs):.2f}x, "
          f"min {rs[0]:.2f}x, max {rs[-1]:.2f}x; below 0.9x: "
          + (", ".join(f"{n} {r:.2f}" for r, n in ratios if r < 0.9) or "none"))


if __name__ == "__main__":
    main()
