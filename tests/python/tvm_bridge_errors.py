"""Bad input for python/kiln_tvm.py: TIR the bridge does not cover raises BridgeError naming the
node type, where it is, and its TVMScript text; it never returns a module. Exits 1 on failure.

Usage: tvm_bridge_errors.py
"""

import os
import sys

import tvm
from tvm.script import tirx as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import kiln_tvm  # noqa: E402


@T.prim_func
def with_break(A: T.Buffer((8,), "float32")):
    for i in range(8):
        if A[i] < T.float32(0):
            break
        A[i] = T.float32(1)


@T.prim_func
def with_ramp(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    B[T.Ramp(0, 1, 4)] = A[T.Ramp(0, 1, 4)]


@T.prim_func
def with_float8(A: T.Buffer((8,), "float8_e4m3fn"), B: T.Buffer((8,), "float8_e4m3fn")):
    for i in range(8):
        B[i] = A[i]


CASES = [
    (with_break, ["break_loop", "with_break.body", "T.break_loop()"]),
    (with_ramp, ["Ramp", "indices[0]", "T.Ramp(0, 1, 4)"]),
    (with_float8, ["float8_e4m3fn", "no kiln equivalent", "with_float8.params[0]"]),
]


def main():
    failures = []
    for func, needles in CASES:
        name = func.attrs["global_symbol"] if func.attrs and "global_symbol" in func.attrs else "?"
        try:
            mod = kiln_tvm.to_kiln(func)
            failures.append(f"{name}: converted to a module instead of an error: {mod}")
            continue
        except kiln_tvm.BridgeError as e:
            msg = str(e)
        for n in needles:
            if n not in msg:
                failures.append(f"{name}: the error does not mention `{n}`: {msg}")
        print(f"{name}: {msg.splitlines()[0]}")
    try:
        kiln_tvm.to_kiln("not a module")
        failures.append("a string converted")
    except kiln_tvm.BridgeError as e:
        print(f"str: {e}")
    for f in failures:
        print("FAILED " + f)
    print(f"{len(CASES) + 1 - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
