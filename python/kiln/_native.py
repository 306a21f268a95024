"""Loading kiln's native library (`libkiln_python.so`, built from python/native) with tvm-ffi.

The library is found, in order, at `$KILN_NATIVE_LIB` (a development build, as the tests use)
or beside this file (`_libkiln.so`, where `pip install` puts it). It is loaded once, with
`tvm_ffi.load_module`: its functions are tvm-ffi packed functions, the same ABI as the kernels
kiln builds, so no binding layer sits between Python and Rust.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()
_LIB = None

LIBRARY_NAME = "_libkiln.so"

# Read once, when the package is imported: a relative path means the directory of that moment.
_ENV_PATH = os.environ.get("KILN_NATIVE_LIB")
_ENV_PATH = os.path.abspath(_ENV_PATH) if _ENV_PATH else None


def library_path() -> Path:
    """Where the native library is looked for (see the module doc)."""
    if _ENV_PATH:
        return Path(_ENV_PATH)
    return Path(__file__).resolve().parent / LIBRARY_NAME


def lib():
    """The loaded native library (a `tvm_ffi.Module`), loaded on first use."""
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is None:
            import tvm_ffi

            path = library_path()
            if not path.is_file():
                raise ImportError(
                    f"kiln's native library is missing: expected {path} "
                    "(install the package with `pip install .` from a kiln clone, or set "
                    "KILN_NATIVE_LIB to a `libkiln_python.so` built by "
                    "`cargo build -p kiln-python`)"
                )
            _LIB = tvm_ffi.load_module(str(path))
    return _LIB
