"""`kiln.build`, `kiln.export`, `kiln.Target`, `kiln.devices`: the package's core, over the
native library's packed functions (`_native.py`)."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Union

from . import _native

#: The target `kiln.build` uses when none is given: this machine's CPU, as `kiln build` does.
DEFAULT_TARGET = '{"kind": "llvm", "mcpu": "native"}'

TargetLike = Union["Target", str, dict, None, Any]
IRLike = Union[dict, str, bytes, "os.PathLike[str]", Any]


class Target:
    """A target, checked and canonicalized by kiln exactly as TVM 0.27 does.

    Takes a JSON target string (`'{"kind": "llvm", "mcpu": "znver3"}'`), the legacy form
    (`"llvm -mcpu=znver3"`), a tag (`"nvidia/nvidia-h100"`), a dict, a `tvm.target.Target`, or
    another `kiln.Target`; `None` is `DEFAULT_TARGET`. A malformed target raises `ValueError`
    with kiln's message (what was expected, what was found, where).

    >>> kiln.Target("llvm -mcpu=haswell").json
    '{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"haswell"}'
    """

    __slots__ = ("_given", "_json")

    def __init__(self, spec: TargetLike = None):
        self._given = _target_text(spec)
        self._json = _native.lib().target_canonical(self._given)

    @property
    def json(self) -> str:
        """The canonical export as one line of JSON (TVM 0.27's `Target.export()`)."""
        return self._json

    def export(self) -> dict:
        """The canonical export as a dict."""
        return json.loads(self._json)

    @property
    def kind(self) -> str:
        """The target kind (`llvm`, `opencl`, `cuda`, ...)."""
        return self.export()["kind"]

    @property
    def keys(self) -> list:
        """The target's keys (`["cpu"]`, `["cuda", "gpu"]`, ...)."""
        return list(self.export().get("keys", []))

    def describe(self) -> str:
        """What the target gives on this machine (the CPU `native` resolves to, vector width,
        float semantics), as `kiln build` prints it."""
        return _native.lib().target_describe(self._given)

    def __str__(self) -> str:
        return self._json

    def __repr__(self) -> str:
        return f"kiln.Target({self._json})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Target) and other._json == self._json

    def __hash__(self) -> int:
        return hash(self._json)


def _target_text(spec: TargetLike) -> str:
    if spec is None:
        return DEFAULT_TARGET
    if isinstance(spec, Target):
        return spec._given
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict):
        return json.dumps(spec)
    export = getattr(spec, "export", None)
    if callable(export) and type(spec).__module__.startswith("tvm"):
        return json.dumps(_plain(export()))
    raise TypeError(
        "a target must be a str (JSON, legacy or tag), a dict, a kiln.Target or a "
        f"tvm.target.Target, found {type(spec).__name__}"
    )


def _plain(v: Any) -> Any:
    """TVM's containers as plain JSON values."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "items"):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "__iter__"):
        return [_plain(x) for x in v]
    return str(v)


def _is_tvm(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "tvm"


def _ir_text(obj: IRLike) -> str:
    """kiln IR JSON text for a dict, JSON text, a `.json` path, or a TVM PrimFunc/IRModule."""
    if isinstance(obj, dict):
        return json.dumps(obj)
    if isinstance(obj, bytes):
        obj = obj.decode("utf-8")
    if isinstance(obj, str):
        if obj.lstrip().startswith("{"):
            return obj
        raise ValueError(
            "kiln IR as a str must be JSON text starting with `{` (a kiln-ir/1 module); "
            f"found {obj[:40]!r} (for a file, pass a pathlib.Path)"
        )
    if isinstance(obj, os.PathLike):
        return Path(obj).read_text()
    if _is_tvm(obj):
        return json.dumps(to_kiln(obj))
    raise TypeError(
        "kiln.build takes kiln IR (a dict, JSON text or a pathlib.Path to a .json file), a "
        f"tvm.tirx.PrimFunc or a tvm.IRModule of PrimFuncs, found {type(obj).__name__}"
    )


def to_kiln(prim_func: Any) -> dict:
    """A TVM `PrimFunc` or `IRModule` of PrimFuncs as a kiln-ir/1 module (a dict), through
    TVM 0.27's own lowering (docs/tvm.md). Needs `apache-tvm`; TIR kiln does not cover raises
    `kiln.BridgeError` naming the construct."""
    from . import bridge

    _refuse_relax(prim_func)
    return bridge.to_kiln(prim_func)


def _refuse_relax(obj: Any) -> None:
    functions = getattr(obj, "functions", None)
    if functions is None:
        return
    relax = [gv.name_hint for gv, f in functions.items() if type(f).__module__.startswith("tvm.relax")]
    if relax:
        raise TypeError(
            f"the IRModule holds Relax functions ({', '.join(sorted(relax))}): kiln.build takes "
            "PrimFuncs; build a Relax model with kiln.tvm.compile(mod, target)"
        )


_COUNTER = itertools.count()
_SCRATCH: Path | None = None


def _scratch() -> Path:
    """The process's directory for intermediate files (removed at exit)."""
    global _SCRATCH
    if _SCRATCH is None:
        d = Path(tempfile.mkdtemp(prefix="kiln-"))
        atexit.register(shutil.rmtree, d, True)
        _SCRATCH = d
    return _SCRATCH


def _options(auto_parallel: bool, db=None, any_cpu: bool = False) -> str:
    if db is None:
        db = os.environ.get("KILN_TUNING_DB") or None
    if db is not None and not os.path.exists(db):
        raise FileNotFoundError(f"kiln build: the tuning database `{os.fspath(db)}` does not exist")
    return json.dumps({"auto_parallel": bool(auto_parallel),
                       "db": None if db is None else os.fspath(db),
                       "any_cpu": bool(any_cpu)})


def _jit(ir: str, target_text: str, auto_parallel: bool = False, db=None, any_cpu=False):
    """Compiles `ir` in memory and returns `(module, info)`: the functions registered as the
    tvm-ffi system-library symbols of a fresh prefix, and the module `tvm_ffi.system_lib` gives
    for it."""
    import tvm_ffi

    prefix = f"kiln{os.getpid()}_{next(_COUNTER)}."
    options = _options(auto_parallel, db, any_cpu)
    info = json.loads(_native.lib().jit(ir, target_text, prefix, options))
    return tvm_ffi.system_lib(prefix), info


def _build_file(ir: str, target_text: str, path: Path, auto_parallel: bool = False, db=None,
                any_cpu: bool = False) -> dict:
    options = _options(auto_parallel, db, any_cpu)
    return json.loads(_native.lib().build(ir, target_text, str(path), options))


def build(obj: IRLike, target: TargetLike = None, *, auto_parallel: bool = False, db=None,
          any_cpu: bool = False):
    """Compiles `obj` for `target` in this process and returns a `tvm_ffi.Module` (a
    `tvm.runtime.Module` once `tvm` is imported) with one function per IR function.

    `obj` is kiln IR (a dict, JSON text, or a `pathlib.Path` to a `.json` file), a TVM
    `PrimFunc`, or a TVM `IRModule` of PrimFuncs. `target` is anything `kiln.Target` takes;
    `None` is this machine's CPU (`DEFAULT_TARGET`).

    The code is compiled in memory by kiln's JIT (callable after its quick first tier; the O3
    code replaces it in the background) and stays for the life of the process. Its parallel
    loops run on kiln's thread pool. The functions take numpy arrays, DLPack tensors and TVM
    tensors, write their outputs in place, and check every argument (a wrong shape or dtype
    raises, never crashes). For a device target (`opencl`, `cuda`) the functions take tensors
    in kiln's memory of that device: `kiln.tensor(array, "opencl")`, `kiln.empty(...)`, and
    `kiln.numpy(t)` to read one back (a host or TVM array raises `ValueError` naming the
    device expected).

    With `auto_parallel=True`, each function's outermost loop whose iterations are provably
    independent (and large enough) runs on the thread pool (`kiln::schedule::auto`): for
    unscheduled TIR such as TVM's operators. `mod.kiln_info["parallel"]` names those loops.

    `db` (a path; default: the `KILN_TUNING_DB` environment variable) is a tuning database
    written by `kiln tune` (docs/tune.md): each function with a record for the same workload,
    this target and this machine's CPU (any CPU with `any_cpu=True`) is scheduled by its best
    record first. `mod.kiln_info["tuning"]` says what was applied and what was skipped (a
    stale or corrupt record is skipped, never applied blindly); a missing database raises
    `FileNotFoundError`.

    `mod.export_library(path)` compiles the same module into a shared library (which
    `tvm_ffi.load_module` loads again); `mod.kiln_info` holds the function names, the canonical
    target and the build time in milliseconds.
    """
    ir = _ir_text(obj)
    target_text = _target_text(target)
    mod, info = _jit(ir, target_text, auto_parallel, db, any_cpu)
    _attach(mod, ir, target_text, info, auto_parallel, db, any_cpu)
    return mod


def _attach(mod: Any, ir: str, target_text: str, info: dict, auto_parallel: bool, db=None,
            any_cpu: bool = False) -> None:
    def export_library(file_name: Union[str, os.PathLike], **_ignored: Any) -> None:
        """Compiles this module into the shared library `file_name` (a `.so`, which
        `tvm_ffi.load_module` and `tvm.runtime.load_module` load)."""
        dst = Path(file_name)
        _require_so(dst)
        _build_file(ir, target_text, dst, auto_parallel, db, any_cpu)

    mod.export_library = export_library
    mod.kiln_ir = ir
    mod.kiln_target = target_text
    mod.kiln_info = info


def _require_so(dst: Path) -> None:
    if dst.suffix != ".so":
        raise ValueError(
            f"a module kiln built exports as a shared library: expected a path ending in .so, "
            f"found {str(dst)!r} (kiln.export(ir, path) writes .o, .ll and .s)"
        )


def export(obj: Any, path: Union[str, os.PathLike], target: TargetLike = None, *, db=None,
           any_cpu: bool = False) -> None:
    """Writes a library: a module returned by `kiln.build` is compiled again into `path` (a
    `.so`, for the target it was built for, with its tuning records); anything `kiln.build`
    takes is compiled for `target` straight into `path`, whose extension picks the format
    (`.so`, `.o`, `.ll`, `.s`; a device target's own formats), with the records of `db` as in
    `kiln.build`."""
    path = Path(path)
    ir = getattr(obj, "kiln_ir", None)
    if ir is not None:
        if target is not None:
            raise ValueError("the module is already built: kiln.export takes no target for it")
        obj.export_library(path)
        return
    _build_file(_ir_text(obj), _target_text(target), path, db=db, any_cpu=any_cpu)


def empty(shape, dtype: str = "float32", device: str = "cpu"):
    """A tensor of `shape` and `dtype` in kiln's memory of `device` (`"cpu"`, `"opencl"`,
    `"opencl:1"`, `"cuda:0"`, a plugin's name), as a `tvm_ffi.Tensor`: what the functions
    `kiln.build` compiles for that device take. Its contents are unspecified (zeros on the
    CPU); kiln frees it when Python drops it."""
    shape = [int(d) for d in (shape if isinstance(shape, (list, tuple)) else [shape])]
    return _native.lib().tensor_empty(json.dumps(shape), str(dtype), str(device))


def tensor(array: Any, device: str = "cpu"):
    """A copy of `array` (a numpy array or anything `numpy.asarray` takes) in kiln's memory of
    `device`, as a `tvm_ffi.Tensor` (see `kiln.empty`)."""
    import numpy as np
    import tvm_ffi

    host = np.ascontiguousarray(np.asarray(array))
    out = empty(host.shape, str(host.dtype), device)
    _native.lib().tensor_copy(out, tvm_ffi.from_dlpack(host))
    return out


def numpy(t: Any):
    """A numpy copy of tensor `t` (on any device kiln runs, e.g. one from `kiln.tensor`)."""
    import numpy as np
    import tvm_ffi

    host = np.empty(tuple(int(d) for d in t.shape), dtype=str(t.dtype))
    _native.lib().tensor_copy(tvm_ffi.from_dlpack(host), t)
    return host


def ir_text(obj: IRLike) -> str:
    """The module verified by kiln and printed in kiln's text form (`kiln ir`)."""
    return _native.lib().ir_text(_ir_text(obj))


def devices(backend: str | None = None) -> dict:
    """kiln's device backends and each device's attributes (`kiln devices --json`):
    `{"backends": [{"name", "code", "devices": [...], "absent"?}], "plugins": [...]}`."""
    return json.loads(_native.lib().devices(backend or ""))


def wait_optimized() -> None:
    """Blocks until every function `kiln.build` (or `kiln.tvm.compile`) compiled so far runs its
    optimized code: the JIT returns after a quick first tier and installs the O3 code from a
    background thread. Call it before timing kernels."""
    _native.lib().wait_optimized()


def version() -> str:
    """The version of kiln's native library."""
    return _native.lib().version()
