"""Call cost of a 1-element vadd through tvm_ffi: kiln's exported library against TVM 0.27's,
for `cargo bench --bench export_call`.

Usage:
  bench_call.py build DIR MCPU   builds TVM's vadd (`n` symbolic, parallel over blocks of 64,
                                 vectorized, as python/bench_tvm.py) for MCPU and exports it
                                 as DIR/tvm_vadd.so (needs `tvm`)
  bench_call.py time DIR [--import-tvm]
                                 times calls of DIR/kiln_vadd.so, DIR/tvm_vadd.so and
                                 DIR/tvm_serial_vadd.so (the same without the parallel loop;
                                 when present; TVM's parallel one only with --import-tvm) on
                                 64-byte-aligned 1-element numpy arrays, interleaved; with
                                 --import-tvm after `import tvm` (whose runtime then fills the
                                 libraries' thread-pool slots). Prints one JSON object:
                                 {"kiln": {"median": ns, "min": ns, "max": ns}, "tvm": {...}}
"""

import json
import os
import statistics
import sys
import time


def build(d, mcpu):
    import tvm
    from tvm import s_tir, te

    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = s_tir.Schedule(te.create_prim_func([A, B, C]).with_attr("global_symbol", "vadd"))
    (i,) = s.get_loops(s.get_sblock("C"))
    io, ii = s.split(i, factors=[None, 64])
    s.parallel(io)
    s.vectorize(ii)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    tvm.compile(s.mod, target=target).export_library(os.path.join(d, "tvm_vadd.so"))
    # The same without the parallel loop: a call's cost without TVM's thread pool.
    s = s_tir.Schedule(te.create_prim_func([A, B, C]).with_attr("global_symbol", "vadd"))
    (i,) = s.get_loops(s.get_sblock("C"))
    _, ii = s.split(i, factors=[None, 64])
    s.vectorize(ii)
    tvm.compile(s.mod, target=target).export_library(os.path.join(d, "tvm_serial_vadd.so"))


def time_calls(d, import_tvm):
    if import_tvm:
        import tvm  # noqa: F401 - its runtime registers the pool the libraries then use
    import numpy as np
    import tvm_ffi

    libs = {"kiln": tvm_ffi.load_module(os.path.join(d, "kiln_vadd.so"))}
    # TVM 0.27's parallel library called without TVM's runtime crashes the process (a
    # segfault, seen on an Intel Xeon with aligned inputs): it is timed only with `tvm`
    # imported.
    wanted = [("tvm_serial", "tvm_serial_vadd.so")]
    if import_tvm:
        wanted.insert(0, ("tvm", "tvm_vadd.so"))
    for key, name in wanted:
        if os.path.exists(os.path.join(d, name)):
            try:
                libs[key] = tvm_ffi.load_module(os.path.join(d, name))
            except Exception as e:  # noqa: BLE001 - TVM's library may need TVM's runtime
                print(f"cannot load {name}: {e}", file=sys.stderr)
    def aligned_one():
        # TVM's code assumes 64-byte-aligned data (aligned vector loads); numpy's is not.
        raw = np.zeros(32, dtype="float32")
        off = (-raw.ctypes.data % 64) // 4
        a = raw[off:off + 1]
        a[0] = 1.0
        return a

    keep = [aligned_one() for _ in range(3)]
    arrays = [tvm_ffi.from_dlpack(a) for a in keep]
    fns = {k: lib["vadd"] for k, lib in libs.items()}
    batch, rounds = 20000, 15
    times = {k: [] for k in fns}
    for _ in range(3):  # warm up
        for f in fns.values():
            f(*arrays)
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(list(fns)))
        for k in order:
            f = fns[k]
            t = time.perf_counter()
            for _ in range(batch):
                f(*arrays)
            times[k].append((time.perf_counter() - t) / batch * 1e9)
    out = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    else:
        time_calls(sys.argv[2], "--import-tvm" in sys.argv)
