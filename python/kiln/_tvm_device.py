"""kiln's device runtimes inside TVM's runtime: `device_api.<name>` for TVM's C++ side.

TVM's runtime (its tensors, the Relax VM's memory) reaches a device type through the global
function `device_api.<name>`, which returns a pointer to a C++ `DeviceAPI`. kiln's kernels
check their buffers against kiln's own allocations, so for TVM's VM to run them on a device,
TVM's tensors of that device must be kiln's. This module compiles `_tvm_device.cc` (a
`DeviceAPI` whose methods call kiln's C table, `tvm_device_table` of the native library)
against the installed TVM's own headers, so the class layout is that TVM's, caches the result,
loads it, and registers it.

The compiled file is cached in kiln's cache directory (`$KILN_CACHE_DIR`, else
`$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`), keyed by the
source, TVM's version and the compiler; building it takes about 2 s once. It needs a C++
compiler (`$CXX`, else `c++`), as TVM's `export_library` does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from . import _native

_LOCK = threading.Lock()
_SHIM: ctypes.CDLL | None = None
_REGISTERED: set[str] = set()

# The DLPack codes of the device runtimes kiln registers in TVM: only those run end to end
# (OpenCL on PoCL in the tests). CUDA's kernels never ran through TVM's VM on a GPU.
DEVICE_CODES = {"opencl": 4}

SOURCE = Path(__file__).resolve().parent / "_tvm_device.cc"


def _cache_dir() -> Path:
    """kiln's cache directory, as the compile cache finds it: `$KILN_CACHE_DIR`, else
    `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`."""
    d = os.environ.get("KILN_CACHE_DIR")
    if d:
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kiln"


def _compile_shim() -> Path:
    import tvm
    import tvm_ffi

    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"kiln.tvm: running kiln's device kernels in TVM's VM needs a C++ compiler to build "
            f"kiln's TVM DeviceAPI against the installed TVM's headers; `{cxx}` was not found "
            "(install g++, or set CXX)"
        )
    tvm_dir = Path(tvm.__file__).resolve().parent
    ffi_dir = Path(tvm_ffi.__file__).resolve().parent
    includes = [tvm_dir / "include", ffi_dir / "include"]
    for inc in includes:
        if not (inc / "tvm").is_dir() and not (inc / "dlpack").is_dir():
            raise RuntimeError(f"kiln.tvm: TVM's C++ headers are missing: expected {inc}")
    lib_dirs = [tvm_dir / "lib", ffi_dir / "lib"]
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, tvm.__version__.encode(), str(tvm_dir).encode(), cxx.encode()])
    ).hexdigest()[:16]
    out = _cache_dir() / f"tvm_device_{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
    cmd += [f"-I{i}" for i in includes]
    for d in lib_dirs:
        cmd += [f"-L{d}", f"-Wl,-rpath,{d}"]
    cmd += ["-ltvm_runtime", "-ltvm_ffi"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(
            "kiln.tvm: building kiln's TVM DeviceAPI against the installed TVM failed "
            f"({' '.join(cmd)}):\n{r.stderr[-4000:]}"
        )
    os.replace(tmp, out)  # atomic: a concurrent process sees the whole file or none
    return out


def register(name: str) -> None:
    """Makes kiln's runtime of device `name` (`"opencl"`) TVM's `device_api.<name>`, so that
    `tvm.runtime.tensor(x, tvm.opencl())` and the Relax VM allocate in kiln's memory.

    Idempotent. Raises `NotImplementedError` for a device kiln does not register in TVM, and
    `RuntimeError` when another runtime of that device (TVM's own) is already in the process:
    its tensors are not kiln's, and kiln's kernels would refuse them.
    """
    global _SHIM
    if name not in DEVICE_CODES:
        raise NotImplementedError(
            f"kiln.tvm: kiln registers its runtime in TVM for {sorted(DEVICE_CODES)}, "
            f"not `{name}`"
        )
    with _LOCK:
        if name in _REGISTERED:
            return
        if _SHIM is None:
            _SHIM = ctypes.CDLL(str(_compile_shim()))
            _SHIM.kiln_tvm_register_device_api.argtypes = [
                ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p,
            ]
            _SHIM.kiln_tvm_register_device_api.restype = ctypes.c_int
        table = int(_native.lib().tvm_device_table())
        rc = _SHIM.kiln_tvm_register_device_api(table, DEVICE_CODES[name], name.encode())
        if rc == 1:
            raise RuntimeError(
                f"kiln.tvm: TVM's global `device_api.{name}` is another runtime's (TVM's own "
                f"{name} runtime is in this process); kiln's kernels run on tensors in kiln's "
                "memory, so kiln cannot register its runtime there"
            )
        if rc != 0:
            raise RuntimeError(
                f"kiln.tvm: the compiled DeviceAPI does not match this kiln's native library "
                f"(code {rc}); remove {_cache_dir()} and retry"
            )
        _REGISTERED.add(name)
