"""`kiln build` output in tvm_ffi, and `kiln run` on .npy files written by numpy.

usage: cli_roundtrip.py <kiln binary> <vadd.json> <workdir>
"""
import os
import subprocess
import sys

import numpy as np
import tvm_ffi

kiln, module, work = sys.argv[1], sys.argv[2], sys.argv[3]
so = os.path.join(work, "vadd.so")
subprocess.run([kiln, "build", module, "-o", so], check=True)
mod = tvm_ffi.load_module(so)
for n in (1, 7, 1000, 4097):
    a = np.random.rand(n).astype("float32")
    b = np.random.rand(n).astype("float32")
    c = np.zeros_like(a)
    mod.vadd(a, b, c)
    assert np.array_equal(c, a + b), n
# Unaligned inputs (numpy gives 16-byte alignment; slice to 4 bytes) are still correct.
big = np.random.rand(1001).astype("float32")
a, b, c = big[1:], big[:-1].copy(), np.zeros(1000, "float32")
mod.vadd(a, b, c)
assert np.array_equal(c, a + b)
# Bad calls raise Python exceptions; nothing crashes.
for args, exc in [((a, b), TypeError), ((a, b.astype("float64"), c), TypeError), ((a[:10], b, c), ValueError), ((a, b, c[::2]), ValueError), ((1, b, c), TypeError)]:
    try:
        mod.vadd(*args)
    except exc:
        pass
    else:
        raise AssertionError(f"no {exc.__name__} for {[getattr(x, 'shape', x) for x in args]}")
# kiln run on .npy files.
x = np.random.rand(333).astype("float32")
y = np.random.rand(333).astype("float32")
np.save(os.path.join(work, "x.npy"), x)
np.save(os.path.join(work, "y.npy"), y)
out = os.path.join(work, "out")
subprocess.run([kiln, "run", module, "vadd", os.path.join(work, "x.npy"), os.path.join(work, "y.npy"), "zeros:333", "--out", out], check=True)
got = np.load(os.path.join(out, "C.npy"))
assert np.array_equal(got, x + y)
print("cli roundtrip: 4 passed, 0 failed")
