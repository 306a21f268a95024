"""Calls kiln-exported libraries through tvm_ffi with every case TVM 0.27 recorded.

usage: abi_conformance.py <dir with <kernel>.so> <tvm027_packed_abi_errors.jsonl>
Prints one line per failure and a closing 'N passed, M failed' line; exits 1 on any failure.
Inputs are numpy arrays (filled with index + 1 for floats, 0, 1, 2... for ints), passed directly.
"""
import json
import os
import sys

import numpy as np
import tvm_ffi

# Deliberate differences from TVM, documented in tests/abi_conformance.rs.
DEVIATIONS = {("add16", "shape_object_arg"), ("add_n", "ok_n0")}


def make_tensor(spec, index):
    shape = tuple(spec["shape"])
    dtype = np.dtype(spec["dtype"])
    strides = spec["strides"]
    if strides is None or all(d > 0 for d in shape) and list(strides) == list(np.empty(shape, dtype).strides[i] // dtype.itemsize for i in range(len(shape))):
        base = np.empty(shape, dtype)
        flat = base.reshape(-1)
    else:
        span = sum((d - 1) * s for d, s in zip(shape, strides)) + 1 if all(d > 0 for d in shape) else 1
        flat = np.empty(max(span, 1), dtype)
        base = np.lib.stride_tricks.as_strided(flat, shape=shape, strides=[s * dtype.itemsize for s in strides])
    if dtype.kind == "f":
        flat[...] = index + 1
    else:
        flat[...] = np.arange(flat.size, dtype=dtype)
    return base


def make_arg(a, index):
    if isinstance(a, dict) and "tensor" in a:
        return make_tensor(a["tensor"], index)
    if a == "(16,)":
        return tvm_ffi.Shape((16,))
    return a


def main():
    libdir, data = sys.argv[1], sys.argv[2]
    modules = {}
    passed = failed = 0
    for line in open(data):
        if not line.strip():
            continue
        case = json.loads(line)
        kernel, name = case["kernel"], case["case"]
        if kernel not in modules:
            modules[kernel] = tvm_ffi.load_module(os.path.join(libdir, kernel + ".so"))
        f = modules[kernel][case["symbol"]]
        args = [make_arg(a, i) for i, a in enumerate(case["args"])]
        try:
            result = f(*args)
            err = None
        except Exception as e:  # noqa: BLE001 - any error is data here
            result, err = None, (type(e).__name__, str(e))
        want = case["error"]
        ok = True
        if (kernel, name) in DEVIATIONS:
            ok = True
        elif want is not None:
            ok = err is not None and err[0] == want["type"] and err[1] == want["message"]
        else:
            ok = err is None
            if ok and case["result"] is not None:
                ok = result == case["result"]
            if ok and case.get("last_arg_after") is not None:
                ok = np.array_equal(np.asarray(args[-1]), np.array(case["last_arg_after"]))
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {kernel}/{name}: got {err or result!r}, want {want or case.get('result')!r}")
    print(f"abi conformance through tvm_ffi: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
