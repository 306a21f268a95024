"""TIR's scalar language checked against numpy: kiln IR using the float functions, bitwise
operations, shifts, clz/popcount, reinterpret and if_then_else is built by `kiln build`, loaded
with `tvm_ffi.load_module` and run on numpy arrays; every result is compared with numpy's.

Usage: tir_scalar_numpy.py KILN_BINARY WORKDIR      (prints 'N passed, M failed'; exits 1 on a failure)
"""

import json
import os
import subprocess
import sys

import numpy as np
import tvm_ffi

KILN, WORK = sys.argv[1], sys.argv[2]
N = 256
rng = np.random.default_rng(1)


def ld(buf):
    return {"op": "load", "buffer": buf, "indices": [{"var": "i"}]}


def func(name, dtype, value, out_dtype=None):
    return {
        "name": name,
        "params": [
            {"kind": "buffer", "name": "A", "dtype": dtype, "shape": [N]},
            {"kind": "buffer", "name": "B", "dtype": dtype, "shape": [N]},
            {"kind": "buffer", "name": "C", "dtype": out_dtype or dtype, "shape": [N]},
        ],
        "body": {
            "stmt": "for", "var": {"name": "i", "dtype": "int64"},
            "min": {"const": 0, "dtype": "int64"}, "extent": {"const": N, "dtype": "int64"}, "kind": "serial",
            "body": {"stmt": "store", "buffer": "C", "indices": [{"var": "i"}], "value": value},
        },
    }


def un(op):
    return {"op": op, "args": [ld("A")]}


def bi(op):
    return {"op": op, "args": [ld("A"), ld("B")]}


a = rng.uniform(-3, 3, N).astype(np.float32)
b = rng.uniform(-3, 3, N).astype(np.float32)
pos = rng.uniform(0.01, 3, N).astype(np.float32)
ia = rng.integers(-(2**31), 2**31, N).astype(np.int32)
ib = rng.integers(-40, 40, N).astype(np.int32)
ua = rng.integers(0, 2**32, N).astype(np.uint32)


def clz32(x):
    return np.array([32 - int(v).bit_length() for v in x.astype(np.uint32)], dtype=np.int32)


def popcount32(x):
    return np.array([bin(int(v)).count("1") for v in x.astype(np.uint32)], dtype=np.int32)


# name, dtype, IR value, inputs (A, B), numpy result, tolerance in ulp (None: exact)
F = "float32"
CASES = [
    ("sin", F, un("sin"), (a, b), np.sin(a), 4),
    ("cos", F, un("cos"), (a, b), np.cos(a), 4),
    ("tan", F, un("tan"), (a, b), np.tan(a), 4),
    ("atan", F, un("atan"), (a, b), np.arctan(a), 4),
    ("atan2", F, bi("atan2"), (a, b), np.arctan2(a, b), 4),
    ("hypot", F, bi("hypot"), (a, b), np.hypot(a, b), 4),
    ("sinh", F, un("sinh"), (a, b), np.sinh(a), 4),
    ("cosh", F, un("cosh"), (a, b), np.cosh(a), 4),
    ("tanh", F, un("tanh"), (a, b), np.tanh(a), 4),
    ("asinh", F, un("asinh"), (a, b), np.arcsinh(a), 4),
    ("log1p", F, un("log1p"), (pos, b), np.log1p(pos), 4),
    ("log2", F, un("log2"), (pos, b), np.log2(pos), 4),
    ("log10", F, un("log10"), (pos, b), np.log10(pos), 4),
    ("expm1", F, un("expm1"), (a, b), np.expm1(a), 4),
    ("exp2", F, un("exp2"), (a, b), np.exp2(a), 4),
    ("exp10", F, un("exp10"), (a, b), np.power(np.float32(10), a), 4),
    ("copysign", F, bi("copysign"), (a, b), np.copysign(a, b), None),
    ("trunc", F, un("trunc"), (a, b), np.trunc(a), None),
    ("nearbyint", F, un("nearbyint"), (a * 3, b), np.rint(a * 3), None),
    ("fast_exp", F, un("fast_exp"), (a, b), np.exp(a), 2),
    ("bitwise_and", "int32", bi("bitwise_and"), (ia, ib), ia & ib, None),
    ("bitwise_or", "int32", bi("bitwise_or"), (ia, ib), ia | ib, None),
    ("bitwise_xor", "int32", bi("bitwise_xor"), (ia, ib), ia ^ ib, None),
    ("bitwise_not", "int32", un("bitwise_not"), (ia, ib), ~ia, None),
    # Shift amounts are taken modulo the width (docs/ir.md); numpy's are not: compare on the
    # reduced amounts.
    ("shift_left", "int32", bi("shift_left"), (ia, ib), np.left_shift(ia, ib & 31), None),
    ("shift_right", "int32", bi("shift_right"), (ia, ib), np.right_shift(ia, ib & 31), None),
    ("shift_right_u", "uint32", bi("shift_right"), (ua, (ib & 63).astype(np.uint32)), np.right_shift(ua, (ib & 31).astype(np.uint32)), None),
    ("popcount", "int32", un("popcount"), (ia, ib), popcount32(ia), None),
    ("clz", "int32", un("clz"), (ia, ib), clz32(ia), None),
]


def ulp_diff(x, y):
    x = x.astype(np.float32).view(np.int32).astype(np.int64)
    y = y.astype(np.float32).view(np.int32).astype(np.int64)
    x = np.where(x < 0, -(2**31) - x, x)
    y = np.where(y < 0, -(2**31) - y, y)
    return np.abs(x - y)


def main():
    os.makedirs(WORK, exist_ok=True)
    funcs = [func(name, dt, v) for name, dt, v, *_ in CASES]
    # reinterpret float32 -> int32, and if_then_else guarding a load past the end.
    funcs.append(func("reinterpret", F, {"op": "reinterpret", "dtype": "int32", "args": [ld("A")]}, "int32"))
    guarded = {
        "op": "if_then_else",
        "args": [
            {"op": "ge", "args": [{"var": "i"}, {"const": 1, "dtype": "int64"}]},
            {"op": "load", "buffer": "A", "indices": [{"op": "sub", "args": [{"var": "i"}, {"const": 1, "dtype": "int64"}]}]},
            {"const": 0.0, "dtype": F},
        ],
    }
    funcs.append(func("shifted", F, guarded))
    mod = {"format": "kiln-ir/1", "functions": funcs}
    path = os.path.join(WORK, "scalar.json")
    with open(path, "w") as fh:
        json.dump(mod, fh)
    lib_path = os.path.join(WORK, "scalar.so")
    r = subprocess.run([KILN, "build", path, "-o", lib_path], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAILED kiln build: {r.stderr}")
        sys.exit(1)
    lib = tvm_ffi.load_module(lib_path)
    failures = []
    checks = [(n, dt, ins, want, tol) for n, dt, _, ins, want, tol in CASES]
    checks.append(("reinterpret", F, (a, b), a.view(np.int32), None))
    checks.append(("shifted", F, (a, b), np.concatenate([[0.0], a[:-1]]).astype(np.float32), None))
    for name, dt, (x, y), want, tol in checks:
        out = np.zeros(N, dtype=want.dtype)
        lib[name](x, y.astype(x.dtype), out)
        if tol is None:
            ok = np.array_equal(out, want)
            detail = f"{int(np.sum(out != want))} mismatches"
        else:
            d = ulp_diff(out, want.astype(np.float32))
            ok = int(d.max()) <= tol
            detail = f"max {int(d.max())} ulp (allowed {tol})"
        print(f"{name}: {'ok' if ok else 'FAILED'} ({detail})")
        if not ok:
            failures.append(name)
    print(f"{len(checks) - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
