"""kiln from Python: build kernels in-process and run them with tvm-ffi.

kiln is a TVM-style backend stack written in Rust. This package calls its compiler in the same
process (no subprocess, no files but the library it writes) and returns `tvm_ffi.Module`s:

    import numpy as np, kiln
    mod = kiln.build(ir)                       # kiln IR (dict or JSON), or a TVM PrimFunc/IRModule
    a = np.random.rand(1000).astype("float32")
    c = np.empty_like(a)
    mod.vadd(a, a, c)                          # numpy arrays, DLPack tensors, TVM tensors
    mod.export_library("vadd.so")              # loads again in tvm_ffi.load_module

`kiln.tvm.compile(relax_mod, target)` is `tvm.compile` with every PrimFunc built by kiln.

Errors raised by kiln's Rust side arrive as `ValueError` (a malformed target or IR),
`TypeError` (arguments of the wrong kind) or `RuntimeError` (a module that does not compile),
with kiln's message. TIR kiln does not convert raises `kiln.BridgeError`.
"""

from __future__ import annotations

from .core import (
    DEFAULT_TARGET,
    Target,
    build,
    devices,
    empty,
    export,
    ir_text,
    numpy,
    tensor,
    to_kiln,
    version,
    wait_optimized,
)
from .errors import BridgeError, UnsupportedFunctionError

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TARGET",
    "BridgeError",
    "Target",
    "UnsupportedFunctionError",
    "build",
    "devices",
    "empty",
    "export",
    "ir_text",
    "numpy",
    "tensor",
    "to_kiln",
    "version",
    "wait_optimized",
]
