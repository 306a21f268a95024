"""Helpers the Python benches share: the CPU's name, 64-byte-aligned arrays, timing blocks
with their medians and quartiles, waiting for the process's other threads to go idle, and the
matmul as TVM writes it."""

import os
import platform
import statistics
import threading
import time

import numpy as np


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo`), for every figure a bench prints."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def aligned(shape, align=64):
    """An uninitialized float32 array of `shape` whose data starts at a multiple of `align`
    bytes (TVM's kernels assume 64)."""
    n = int(np.prod(shape))
    raw = np.empty(n * 4 + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n * 4].view(np.float32).reshape(shape)


def block(f, args, calls):
    """The median time of `calls` calls of `f(*args)`, one by one."""
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        f(*args)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _other_threads_cpu_s():
    """CPU seconds the process's threads other than this one have run (`/proc`, Linux)."""
    me = threading.get_native_id()
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass  # the thread ended, or no schedstat: counted as idle
    return total


def quiesce(window=0.02, busy=0.1, limit=2.0):
    """Waits until the process's other threads (thread pools: kiln's, TVM's, OpenBLAS's) run
    less than `busy` of a `window`, or `limit` seconds have passed; returns the seconds waited.

    On a machine with few cores, a pool that spins after its call (OpenBLAS's workers poll for
    a while) takes a core from the next library timed: a 64 x 4096 x 4096 matmul timed in blocks
    of 5 calls alternating with numpy's measured 28-33 ms against 18-19 ms timed alone, on a
    2-core Zen 3. Call it before each side's block."""
    if not os.path.isdir("/proc/self/task"):
        time.sleep(0.2)
        return 0.2
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        before = _other_threads_cpu_s()
        time.sleep(window)
        if _other_threads_cpu_s() - before < busy * window:
            break
    return time.perf_counter() - start


def quartiles(v):
    """The first and third quartiles of `v`, within its range (numpy's default, linear
    interpolation between the samples; the exclusive method extrapolated past the smallest and
    largest sample when there were few, and printed a negative quartile for two)."""
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0]] * 3
    return q[0], q[2]


def te_matmul(m, n, k):
    """`C = A @ B` (float32, `A[m, k]`, `B[k, n]`) as TVM writes it: `te.compute` with `te.sum`,
    a PrimFunc named `matmul`."""
    from tvm import te

    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "matmul")


def tune_and_build(kiln_bin, module, func, target, trials, seconds, db, so, keep_default=False,
                   huge_pages=False):
    """`kiln tune` of `func` in the kiln-ir file `module` for `target` (at most `trials`
    candidates or `seconds` seconds, records into `db`; with `huge_pages`, measured on inputs in
    transparent huge pages, where numpy keeps its arrays of 4 MiB or more), then `kiln build
    --db` into `so`.
    Returns (candidates measured, as text, tuning seconds, None), or (None, None, why) when a
    step failed or the build did not apply a record (with `keep_default`, a record that keeps
    the default build, because no candidate beat it, counts as applied)."""
    import re
    import subprocess

    t0 = time.perf_counter()
    p = subprocess.run([kiln_bin, "tune", module, func, "--target", target, "--trials",
                        str(trials), "--seconds", str(seconds), "--db", db]
                       + (["--huge-pages"] if huge_pages else []),
                       capture_output=True, text=True)
    tune_s = time.perf_counter() - t0
    if p.returncode != 0:
        return None, None, f"kiln tune failed: {p.stderr.strip()[-300:]}"
    found = re.search(r"(\d+) candidates in ([\d.]+) s", p.stdout + p.stderr)
    p = subprocess.run([kiln_bin, "build", module, "-o", so, "--target", target, "--db", db],
                       capture_output=True, text=True)
    out = p.stderr + p.stdout
    applied = r"tuning record applied|the default build is kept" if keep_default else \
        r"tuning record applied"
    if p.returncode != 0 or not re.search(applied, out):
        return None, None, f"kiln build --db did not apply the record: {out.strip()[-300:]}"
    return (found.group(1) if found else "?"), tune_s, None
