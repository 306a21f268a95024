"""Helpers the Python benches share: the CPU's name, 64-byte-aligned arrays, timing blocks
with their medians and quartiles, and the matmul as TVM writes it."""

import platform
import statistics
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


def quartiles(v):
    """The first and third quartiles of `v`."""
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
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
