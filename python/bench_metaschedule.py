"""`kiln tune` against TVM 0.27's MetaSchedule, the same trial budget, on this machine.

    python python/bench_metaschedule.py [--kiln target/release/kiln] [--trials 64] \\
        [--shapes 512x512x512] [--rounds 15] [--cost-model xgb|random]

Per matmul shape (M x N x K, float32, written once with `te.compute` and `te.sum`):
- TVM: `meta_schedule.tune_tir` with `max_trials_global` = the budget (its defaults:
  evolutionary search, the XGBoost cost model when `xgboost` is installed, local builder and
  runner), then `compile_tir` and `tvm.compile` of the best schedule;
- kiln: `kiln.to_kiln` of the same PrimFunc, `kiln tune --trials` the budget, `kiln build --db`.
Both tune for `{"kind": "llvm", "mcpu": <this CPU as LLVM names it>}` (kiln: `native`, its
LLVM 14 may not know the newer name) with this machine's cores. Reported: each tuner's wall time
and trials, and the tuned kernels (exported libraries, timed in a fresh process, both on TVM's
thread pool) in interleaved rounds on the same aligned arrays (with numpy beside them): medians
with quartiles, and the per-round ratio TVM / kiln (above 1: kiln's kernel is faster).

apache-tvm 0.27.0.post1's MetaSchedule crashes (EvolutionarySearch's constructor, in
`tvm::ffi::ToJSONGraph`) with apache-tvm-ffi 0.1.15.post2; run this in a venv with
`apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 xgboost-cpu numpy psutil cloudpickle
tornado`.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for _var in ("KILN_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(_var, str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402

from bench_util import aligned, block, cpu_name, quartiles, quiesce, te_matmul  # noqa: E402


def time_both(tso, kso, shape, rounds):
    """Times TVM's and kiln's libraries (and numpy) in interleaved rounds; prints the table's
    last four cells."""
    import tvm  # the runtime TVM's library needs
    import tvm_ffi

    m, n, k = (int(x) for x in shape.split("x"))
    tf = tvm.runtime.load_module(tso)["matmul"]
    kf = tvm_ffi.load_module(kso)["matmul"]
    rng = np.random.default_rng(0)
    A, B = aligned((m, k)), aligned((k, n))
    A[:] = rng.standard_normal((m, k), dtype=np.float32)
    B[:] = rng.standard_normal((k, n), dtype=np.float32)
    Ck, Ct, D = aligned((m, n)), aligned((m, n)), aligned((m, n))
    args_k = [tvm_ffi.from_dlpack(x) for x in (A, B, Ck)]
    args_t = [tvm_ffi.from_dlpack(x) for x in (A, B, Ct)]
    kf(*args_k)
    tf(*args_t)
    want = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(want).max()
    for who, got in (("kiln", Ck), ("TVM", Ct)):
        err = np.abs(got - want).max() / scale
        if not err < 1e-4:
            raise SystemExit(f"{who}'s result is wrong: max rel err {err:.2e}")
    calls = max(3, min(50, int(0.05 / max(2.0 * m * n * k / 200e9, 1e-6))))
    kt, tt, nt, ratios = [], [], [], []
    for r in range(rounds):
        sides = [("k", lambda: block(kf, args_k, calls)),
                 ("t", lambda: block(tf, args_t, calls)),
                 ("n", lambda: block(lambda: np.matmul(A, B, out=D), (), calls))]
        if r % 2:
            sides.reverse()
        got = {}
        for name, run in sides:
            quiesce()  # the other sides' pools idle again
            run()
            got[name] = run()
        kt.append(got["k"])
        tt.append(got["t"])
        nt.append(got["n"])
        ratios.append(got["t"] / got["k"])
    (kq1, kq3), (tq1, tq3), (rq1, rq3) = quartiles(kt), quartiles(tt), quartiles(ratios)
    print(f"{statistics.median(tt) * 1e3:.3f} [{tq1 * 1e3:.3f}, {tq3 * 1e3:.3f}] "
          f"| {statistics.median(kt) * 1e3:.3f} [{kq1 * 1e3:.3f}, {kq3 * 1e3:.3f}] "
          f"| {statistics.median(nt) * 1e3:.3f} "
          f"| {statistics.median(ratios):.2f}x [{rq1:.2f}, {rq3:.2f}]")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--time":
        tso, kso, shape = sys.argv[2:5]
        rounds = int(sys.argv[6]) if len(sys.argv) > 6 else 15
        return time_both(tso, kso, shape, rounds)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--shapes", default="512x512x512")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cost-model", default=None, help="xgb (default when installed) or random")
    a = ap.parse_args()
    import tvm
    from tvm.s_tir import meta_schedule as ms

    import kiln

    cores = len(os.sched_getaffinity(0))
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    ttarget = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})
    if a.cost_model is None:
        try:
            import xgboost  # noqa: F401

            a.cost_model = "xgb"
        except ImportError:
            a.cost_model = "random"
    print(f"CPU: {cpu_name()}; TVM target {ttarget}; kiln target llvm native; {cores} cores; "
          f"budget {a.trials} trials; MetaSchedule cost model {a.cost_model}")
    print("| M x N x K | MetaSchedule: tuning s | kiln tune: tuning s, trials | TVM tuned, ms "
          "[q1, q3] | kiln tuned, ms [q1, q3] | numpy, ms | TVM / kiln [q1, q3] |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        func = te_matmul(m, n, k)
        d = tempfile.mkdtemp(prefix="kiln-ms-")
        try:
            t0 = time.perf_counter()
            db = ms.tune_tir(func, ttarget, os.path.join(d, "ms"), max_trials_global=a.trials,
                             num_trials_per_iter=min(64, a.trials), cost_model=a.cost_model,
                             num_tuning_cores=cores)
            ms_s = time.perf_counter() - t0
            sch = ms.tir_integration.compile_tir(db, func, ttarget)
            tlib = tvm.compile(sch.mod, target=ttarget)
            tf = tlib["matmul"]
            mod = os.path.join(d, "mm.json")
            with open(mod, "w") as fh:
                json.dump(kiln.to_kiln(func), fh)
            kdb, so = os.path.join(d, "db.jsonl"), os.path.join(d, "mm.so")
            t0 = time.perf_counter()
            p = subprocess.run([a.kiln, "tune", mod, "matmul", "--trials", str(a.trials),
                                "--db", kdb, "-q"], capture_output=True, text=True)
            kiln_s = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"kiln tune failed: {p.stderr[-500:]}")
            found = re.search(r"(\d+) candidates", p.stdout)
            p = subprocess.run([a.kiln, "build", mod, "-o", so, "--db", kdb],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"kiln build failed: {p.stderr[-500:]}")
            tso = os.path.join(d, "tvm.so")
            tlib.export_library(tso)
            # Timed in a fresh process: MetaSchedule's worker pools and XGBoost's threads
            # stay behind in this one.
            p = subprocess.run([sys.executable, __file__, "--time", tso, so, shape,
                                "--rounds", str(a.rounds)], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"timing failed: {p.stderr[-1500:]}")
            print(f"| {shape} | {ms_s:.0f} | {kiln_s:.0f}, {found.group(1) if found else '?'} "
                  f"| {p.stdout.strip()} |", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
