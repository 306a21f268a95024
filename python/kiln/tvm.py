"""`kiln.tvm.compile`: TVM's `tvm.compile` with every PrimFunc built by kiln.

TVM runs its own Relax pipeline (legalization, fusion, VM lowering) exactly as `tvm.compile`
does; then, instead of `tvm.tirx.build`, each PrimFunc goes through kiln's bridge
(`kiln.to_kiln`) and kiln's code generator:

- to run in this process, kiln's JIT compiles them in memory and registers them as tvm-ffi
  system-library symbols; that module is the VM executable's kernel library, as TVM's own JIT
  module would be. Nothing is written to disk and nothing is linked.
- `ex.export_library(path)` builds them again into one relocatable object, which TVM links into
  the `.so` as a static library (`tvm.runtime.load_static_library`), the way it links any
  external module; `tvm.runtime.load_module` loads that `.so` again.

The result is a `tvm.runtime.Executable` like TVM's own: it runs in
`tvm.relax.VirtualMachine(ex, tvm.cpu())`.

A PrimFunc kiln cannot build is an error naming the function and the construct
(`kiln.UnsupportedFunctionError`), unless the caller passes `fallback=True`: then TVM builds
those functions and `ex.kiln_report["tvm"]` says which and why.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import tvm
from tvm import relax, tirx

from . import _tvm_device, core, legalize
from .errors import BridgeError, UnsupportedFunctionError

__all__ = ["compile", "register_device_api"]

_CPU_KINDS = ("llvm",)


def _tvm_target(target: Any) -> tvm.target.Target:
    if target is None:
        current = tvm.target.Target.current(allow_none=True)
        return current if current is not None else tvm.target.Target("llvm")
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, core.Target):
        return tvm.target.Target(target.export())
    if isinstance(target, dict):
        return tvm.target.Target(target)
    return tvm.target.Target(target)


def _kiln_target(target: tvm.target.Target) -> str:
    """The kiln target for TVM's: the same JSON (kiln reads TVM 0.27's targets)."""
    export = core._plain(target.export())
    export.pop("host", None)
    return json.dumps(export)


def register_device_api(device: str = "opencl") -> None:
    """Makes kiln's runtime of `device` TVM's runtime of it in this process (TVM's global
    `device_api.opencl`), so that `tvm.runtime.tensor(x, tvm.opencl())`, the Relax VM and the
    kernels `kiln.tvm.compile` builds for that device share kiln's device memory.

    `kiln.tvm.compile` calls it for a device target; call it yourself before loading an
    exported library (`tvm.runtime.load_module`) in a new process. The first call compiles a
    small C++ `DeviceAPI` against the installed TVM's headers (about 2 s, then cached; needs a
    C++ compiler). Idempotent. Raises `NotImplementedError` for a device kiln does not register
    (only `opencl` has run through TVM's VM) and `RuntimeError` when TVM's own runtime of that
    device is already in the process.
    """
    _tvm_device.register(device)


def _device_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    """TVM's Relax pipeline for a GPU target (`tvm.compile`'s default there: the generic GPU
    backend's dispatch, legalization and fusion, dataflow lowering and finalization), less
    DLight's scheduling: kiln schedules the device kernels itself (each fused PrimFunc's loop
    nests become kernels, `kiln::schedule::auto::device_default`)."""
    from tvm.relax import pipeline as p

    legalize = [q for q in p.legalize_passes(target) if q.info.name != "ApplyDefaultSchedule"]
    passes = (
        p.library_dispatch_passes(target)
        + legalize
        + p.dataflow_lower_passes(target)
        + p.finalize_passes(target)
    )
    return tvm.transform.Sequential(passes)


def _convert(name: str, func: tirx.PrimFunc) -> dict:
    """One PrimFunc as a kiln function (the bridge's output for a one-function module)."""
    from . import bridge

    mod = bridge.to_kiln(tvm.IRModule({name: func}))
    (kfunc,) = mod["functions"]
    return kfunc


def _convert_all(prim_funcs: dict) -> tuple[list, dict]:
    """The PrimFuncs `{name: func}` as kiln functions, in name order, and `{name: reason}` for
    those the bridge cannot convert. TVM's lowering passes run once over all of them (a Relax
    LSTM cell's nine: 2 ms instead of 10 one at a time); should that raise, each function is
    lowered and converted on its own, so the error names the function it is about."""
    from . import bridge

    names = sorted(prim_funcs)
    try:
        lowered = bridge.lower(tvm.IRModule({n: prim_funcs[n] for n in names}))
        funcs = {gv.name_hint: f for gv, f in lowered.functions.items()}
    except Exception:  # noqa: BLE001 - the one-at-a-time path reports it per function
        funcs = None
    kiln_funcs, failures = [], {}
    for n in names:
        try:
            if funcs is None or n not in funcs:
                kiln_funcs.append(_convert(n, prim_funcs[n]))
            else:
                kiln_funcs.append(bridge.convert_lowered(n, funcs[n]))
        except BridgeError as e:
            failures[n] = str(e)
    return kiln_funcs, failures


def compile(  # noqa: A001 - tvm.compile's name, on purpose
    mod: Any,
    target: Any = None,
    *,
    relax_pipeline: tvm.transform.Pass | Callable | str | None = "default",
    tir_pipeline: tvm.transform.Pass | Callable | str | None = "default",
    fallback: bool = False,
    exec_mode: str = "bytecode",
    kiln_target: Any = None,
    auto_parallel: bool = True,
    db: Any = None,
    any_cpu: bool = False,
) -> tvm.runtime.Executable:
    """Compiles a Relax `IRModule` (or a PrimFunc / IRModule of PrimFuncs) like
    `tvm.compile(mod, target)`, with every PrimFunc built by kiln.

    `target` is anything `tvm.target.Target` takes (or a `kiln.Target`); `None` is the current
    target, else `llvm`. kiln builds for the target TVM is given, so both builds see the same
    CPU; `kiln_target` (anything `kiln.Target` takes) overrides that, e.g. `{"kind": "llvm",
    "mcpu": "native"}` where TVM names a CPU newer than kiln's LLVM 14 knows. `relax_pipeline`
    is passed to TVM as `tvm.compile` does. `tir_pipeline` only applies to the functions TVM
    builds under `fallback=True` (kiln lowers PrimFuncs itself).

    `auto_parallel` (default on): Relax's PrimFuncs are plain serial loops, which TVM's default
    build runs on one thread; kiln runs each function's outermost loop whose iterations are
    provably independent, and that is large enough, on its thread pool
    (`kiln::schedule::auto`). `ex.kiln_report["parallel"]` names those loops.

    `db` (a path; default: `KILN_TUNING_DB`) is a tuning database of `kiln tune` (e.g. `kiln
    tune --model` over `kiln.to_kiln` of the model's PrimFuncs): each PrimFunc with a record
    for this target and CPU (any CPU with `any_cpu=True`) is scheduled by its best record
    before `auto_parallel` looks at it; `ex.kiln_report["tuning"]` says what was applied.
    `ex.kiln_ir` is the kiln-ir/1 module of the PrimFuncs kiln built, as converted (before any
    schedule): write it to a file and `kiln tune FILE --model` tunes every kernel of the model.

    Returns a `tvm.runtime.Executable` (a `relax.VMExecutable` for Relax modules) whose
    `kiln_report` is `{"kiln": [names], "tvm": {name: reason}, "kiln_build_ms": ...,
    "tvm_build_ms": ...}`. Its kernels are compiled in memory for this process;
    `ex.export_library(path)` compiles them again into the `.so`.

    Raises `kiln.UnsupportedFunctionError` (a `kiln.BridgeError`) naming every PrimFunc kiln
    cannot build and why, unless `fallback=True` (never available for `opencl`, whose kernels
    and tensors are kiln's); `NotImplementedError` for a target kind other than `llvm` and
    `opencl` (kiln's CUDA kernels never ran in TVM's VM); `ValueError` for
    `exec_mode="compiled"`.
    """
    args = dict(
        target=target,
        relax_pipeline=relax_pipeline,
        tir_pipeline=tir_pipeline,
        fallback=fallback,
        exec_mode=exec_mode,
        kiln_target=kiln_target,
        auto_parallel=auto_parallel,
        db=db,
        any_cpu=any_cpu,
    )
    ex = _compile(mod, jit=True, **args)

    def export_library(file_name, **kwargs):
        """Builds the kernels again into an object file and writes one `.so` with TVM's
        `export_library` (which `tvm.runtime.load_module` loads)."""
        return _compile(mod, jit=False, **args).export_library(file_name, **kwargs)

    ex.export_library = export_library
    return ex


def _compile(
    mod: Any,
    *,
    target: Any,
    relax_pipeline: Any,
    tir_pipeline: Any,
    fallback: bool,
    exec_mode: str,
    kiln_target: Any,
    auto_parallel: bool,
    jit: bool,
    db: Any = None,
    any_cpu: bool = False,
) -> tvm.runtime.Executable:
    tgt = _tvm_target(target)
    kind = tgt.kind.name
    device = kind in _tvm_device.DEVICE_CODES
    if kind not in _CPU_KINDS and not device:
        raise NotImplementedError(
            f"kiln.tvm.compile builds PrimFuncs for CPU targets (llvm) and OpenCL (opencl); "
            f"target kind `{kind}` is not done yet (kiln's kernels for it never ran in TVM's "
            "VM): use tvm.compile, or kiln.build for a kernel on its own"
        )
    if device and fallback:
        raise ValueError(
            f"kiln.tvm.compile: fallback=True is not available for `{kind}`: TVM's {kind} "
            "kernels need TVM's own device runtime, and in this process that device's tensors "
            "are kiln's (kiln.tvm registers kiln's runtime as TVM's `device_api."
            f"{kind}`)"
        )
    if device:
        _tvm_device.register(kind)
    if exec_mode != "bytecode":
        raise ValueError(
            f"kiln.tvm.compile supports exec_mode='bytecode' (the default), found {exec_mode!r}"
        )
    is_relax = isinstance(mod, tvm.IRModule) and any(
        isinstance(f, relax.Function) for _, f in mod.functions_items()
    )
    if isinstance(mod, tirx.PrimFunc):
        attrs = mod.attrs
        name = str(attrs["global_symbol"]) if attrs and "global_symbol" in attrs else "main"
        mod = tvm.IRModule({name: mod})
    elif not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"kiln.tvm.compile takes a tvm.IRModule or a tirx.PrimFunc, found {type(mod).__name__}"
        )

    builder = None
    params: dict = {}
    ext_libs: list = []
    if is_relax:
        if relax_pipeline is not None:
            if isinstance(relax_pipeline, str):
                if device and relax_pipeline == "default":
                    relax_pipeline = _device_pipeline(tgt)
                else:
                    relax_pipeline = relax.get_pipeline(relax_pipeline)
            with tgt:
                mod = relax_pipeline(legalize.legalize(mod))
        attrs = dict(mod.attrs) if mod.attrs else {}
        ext_libs = list(attrs.get("external_mods", []))
        params.update(dict(attrs.get("const_name_to_constant", {})))
        builder = relax.ExecBuilder()
        mod = relax.vm_build._vmcodegen(builder, mod, exec_mode)

    prim_funcs = {
        gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)
    }
    kiln_funcs, failures = _convert_all(prim_funcs)
    if failures and not fallback:
        lines = "\n".join(f"  {n}: {why}" for n, why in failures.items())
        remedy = (
            f"there is no fallback for `{kind}`: TVM's kernels would need TVM's own {kind} "
            "runtime" if device else "pass fallback=True to have TVM build them"
        )
        raise UnsupportedFunctionError(
            f"kiln cannot build {len(failures)} of {len(prim_funcs)} PrimFunc(s) "
            f"({remedy}):\n{lines}",
            failures,
        )

    report: dict = {
        "kiln": [f["name"] for f in kiln_funcs],
        "tvm": dict(failures),
        "parallel": {},
        "tuning": [],
    }
    t0 = time.perf_counter()
    kiln_lib = None
    if kiln_funcs:
        ir = json.dumps({"format": "kiln-ir/1", "functions": kiln_funcs})
        ktarget = _kiln_target(tgt) if kiln_target is None else core._target_text(kiln_target)
        if jit:
            kiln_lib, info = core._jit(ir, ktarget, auto_parallel, db, any_cpu)
        else:
            obj = core._scratch() / f"relax{next(core._COUNTER)}.o"
            info = core._build_file(ir, ktarget, obj, auto_parallel, db, any_cpu)
            kiln_lib = tvm.runtime.load_static_library(str(obj), report["kiln"])
        report["parallel"] = info.get("parallel", {})
        report["tuning"] = info.get("tuning", [])
    report["kiln_build_ms"] = (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    lib = None
    if failures:
        tvm_mod = tvm.IRModule({n: prim_funcs[n] for n in failures})
        lib = tvm.tirx.build(tvm_mod, target=tgt, pipeline=tir_pipeline)
    report["tvm_build_ms"] = (time.perf_counter() - t0) * 1e3

    # The kernel library: TVM's module importing kiln's, or kiln's alone. In memory (jit) it is
    # the executable's own library, so nothing needs linking; a static library is an external
    # module that export_library links.
    if lib is None and kiln_lib is not None and jit:
        lib, kiln_lib = kiln_lib, None
    extra = [kiln_lib] if kiln_lib is not None else []
    if builder is None:
        if lib is None:
            lib, extra = extra[0], []
        for m in extra:
            lib.import_module(m)
        ex = tvm.runtime.Executable(lib)
    else:
        exe = relax.vm_build._ffi_api.VMLink(builder, tgt, lib, ext_libs + extra, params)
        ex = relax.VMExecutable(exe)
    ex.kiln_report = report
    ex.kiln_ir = {"format": "kiln-ir/1", "functions": kiln_funcs}
    return ex
