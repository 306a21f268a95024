"""The kiln package without TVM: kiln.build on kiln IR, targets, devices, export, errors and
`python -m kiln`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi

import kiln
from devices import opencl_or_skip

ROOT = Path(__file__).resolve().parents[2]
VADD = ROOT / "examples" / "kernels" / "vadd.json"
SOFTMAX = ROOT / "examples" / "kernels" / "softmax.json"


def vadd_ir():
    return json.loads(VADD.read_text())


@pytest.mark.parametrize("form", ["dict", "json", "path"])
def test_build_runs_on_numpy(form):
    ir = {"dict": vadd_ir(), "json": VADD.read_text(), "path": VADD}[form]
    mod = kiln.build(ir)
    a = np.random.rand(1000).astype("float32")
    b = np.random.rand(1000).astype("float32")
    c = np.empty_like(a)
    mod.vadd(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    assert mod.kiln_info["functions"] == ["vadd"]
    assert mod.kiln_info["target"]["mcpu"] == "native"


def test_build_runs_on_dlpack_tensors():
    mod = kiln.build(vadd_ir(), target="llvm -mcpu=x86-64-v3")
    a = tvm_ffi.from_dlpack(np.arange(16, dtype="float32"))
    c = np.zeros(16, "float32")
    mod.vadd(a, a, c)
    np.testing.assert_array_equal(c, 2 * np.arange(16, dtype="float32"))


def test_softmax_agrees_with_numpy():
    ir = json.loads(SOFTMAX.read_text())
    mod = kiln.build(ir)
    name = ir["functions"][0]["name"]
    params = ir["functions"][0]["params"]
    shapes = [p["shape"] for p in params]
    # symbolic or constant shapes: fill symbolic ones with small sizes
    dims = [[d if isinstance(d, int) else 64 for d in s] for s in shapes]
    x = np.random.rand(*dims[0]).astype("float32")
    y = np.empty(dims[1], "float32")
    mod[name](x, y) if hasattr(mod, "__getitem__") else mod.get_function(name)(x, y)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_export_library_loads_again(tmp_path):
    mod = kiln.build(vadd_ir())
    path = tmp_path / "vadd.so"
    mod.export_library(path)
    again = tvm_ffi.load_module(str(path))
    a = np.ones(4, "float32")
    c = np.zeros(4, "float32")
    again.vadd(a, a, c)
    np.testing.assert_array_equal(c, 2 * a)
    with pytest.raises(ValueError, match=r"ending in \.so"):
        mod.export_library(tmp_path / "vadd.o")


def test_kiln_export_writes_every_format(tmp_path):
    for ext in ["so", "o", "ll", "s"]:
        kiln.export(vadd_ir(), tmp_path / f"v.{ext}", target="llvm -mcpu=haswell")
        assert (tmp_path / f"v.{ext}").stat().st_size > 0
    mod = kiln.build(vadd_ir())
    kiln.export(mod, tmp_path / "copy.so")
    assert tvm_ffi.load_module(str(tmp_path / "copy.so")).vadd is not None
    with pytest.raises(ValueError, match="already built"):
        kiln.export(mod, tmp_path / "x.so", target="llvm")


def test_bad_arguments_raise_with_the_functions_message():
    mod = kiln.build(vadd_ir())
    a = np.ones(8, "float32")
    with pytest.raises(TypeError, match="Mismatched B.dtype on argument #1"):
        mod.vadd(a, a.astype("float64"), a)
    with pytest.raises(ValueError, match=r"Mismatched B.shape\[0\]"):
        mod.vadd(a, a[:3], a.copy())


def test_target():
    t = kiln.Target("llvm -mcpu=haswell")
    assert t.json == '{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"haswell"}'
    assert t.kind == "llvm" and t.keys == ["cpu"]
    assert kiln.Target({"kind": "llvm", "mcpu": "haswell"}) == t
    assert kiln.Target(t) == t
    assert "haswell" in t.describe()
    assert kiln.Target().export()["mcpu"] == "native"
    assert kiln.Target("nvidia/nvidia-h100").kind == "cuda"


@pytest.mark.parametrize(
    "spec, needle",
    [
        ('{"kind": "nope"}', 'target kind "nope" is not defined'),
        ('{"kind": "llvm", "mcpu": 3}', "mcpu"),
        ("{", "target"),
    ],
)
def test_bad_targets_raise_value_error(spec, needle):
    with pytest.raises(ValueError, match=needle):
        kiln.Target(spec)
    with pytest.raises(ValueError, match=needle):
        kiln.build(vadd_ir(), target=spec)


def test_bad_ir_raises_value_error_with_kilns_message():
    with pytest.raises(ValueError, match="kiln IR"):
        kiln.build("{")
    bad = vadd_ir()
    bad["functions"][0]["body"] = {"kind": "no_such_statement"}
    with pytest.raises(ValueError, match="kiln IR"):
        kiln.build(bad)
    with pytest.raises(ValueError, match="JSON text"):
        kiln.build("vadd.json")
    with pytest.raises(TypeError, match="kiln IR"):
        kiln.build(42)
    with pytest.raises(TypeError, match="target"):
        kiln.build(vadd_ir(), target=3.5)


def test_unwritable_output_raises_runtime_error(tmp_path):
    with pytest.raises(RuntimeError):
        kiln.export(vadd_ir(), tmp_path / "missing_dir" / "v.so")
    with pytest.raises(RuntimeError, match="expected a path ending in"):
        kiln.export(vadd_ir(), tmp_path / "v.txt")


def test_native_functions_check_their_arguments():
    from kiln import _native

    lib = _native.lib()
    with pytest.raises(TypeError, match=r"argument #0 \(kiln IR JSON\) must be a str"):
        lib.build(1, "llvm", "x.so", "{}")
    with pytest.raises(TypeError, match="takes 4 argument"):
        lib.build("{}")
    ir = VADD.read_text()
    with pytest.raises(ValueError, match="unknown option `fast`"):
        lib.jit(ir, "llvm", "bad.", '{"fast": true}')
    with pytest.raises(ValueError, match="must be a bool"):
        lib.jit(ir, "llvm", "bad.", '{"auto_parallel": 1}')
    with pytest.raises(ValueError, match="not JSON"):
        lib.jit(ir, "llvm", "bad.", "{")
    with pytest.raises(ValueError, match="JSON list"):
        lib.cli("not json")


def test_devices_lists_the_cpu():
    doc = kiln.devices()
    names = [b["name"] for b in doc["backends"]]
    assert "cpu" in names
    cpu = kiln.devices("cpu")["backends"]
    assert len(cpu) == 1 and cpu[0]["devices"]
    with pytest.raises(ValueError):
        kiln.devices("no_such_backend")


def test_ir_text_and_version():
    assert "vadd" in kiln.ir_text(vadd_ir())
    assert kiln.version() == kiln.__version__
    kiln.build(vadd_ir())
    kiln.wait_optimized()  # returns once the O3 tier is in


def run_module_cli(*args, threads=None, **kw):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if threads is not None:
        # Both pools: kiln's, and TVM's, which runs kiln's parallel loops once TVM is imported.
        env["KILN_NUM_THREADS"] = env["TVM_NUM_THREADS"] = str(threads)
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=env, **kw
    )


def test_python_m_kiln_is_the_cli(tmp_path):
    r = run_module_cli("target", "llvm -mcpu=haswell")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == '{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"haswell"}'
    out = tmp_path / "v.so"
    r = run_module_cli("build", str(VADD), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0
    r = run_module_cli("target", '{"kind": "nope"}')
    assert r.returncode == 1 and "error: target kind" in r.stderr
    r = run_module_cli("no-such-command")
    assert r.returncode == 2 and "unrecognized subcommand" in r.stderr
    r = run_module_cli("--help")
    assert r.returncode == 0 and "Usage" in r.stdout


@pytest.mark.parametrize("cpu", ["emeraldrapids", "i686"])
def test_a_cpu_llvm_14_cannot_compile_for_raises_instead_of_aborting(cpu):
    with pytest.raises(RuntimeError, match="mcpu"):
        kiln.build(vadd_ir(), target={"kind": "llvm", "mcpu": cpu})


def test_device_kernels_run_on_kiln_device_tensors():
    opencl_or_skip()
    ocl = ROOT / "examples" / "kernels" / "opencl"
    mod = kiln.build(ocl / "vadd.json", target="opencl")
    n = 100_003
    a = np.random.rand(n).astype("float32")
    b = np.random.rand(n).astype("float32")
    ta, tb, tc = kiln.tensor(a, "opencl"), kiln.tensor(b, "opencl"), kiln.empty(n, "float32", "opencl")
    assert str(ta.device) == "opencl:0" and tuple(ta.shape) == (n,)
    mod.vadd(ta, tb, tc)
    np.testing.assert_array_equal(kiln.numpy(tc), a + b)
    # Host arrays are not OpenCL memory: the wrapper says which device it expects.
    with pytest.raises(ValueError, match="device_type on argument #0"):
        mod.vadd(a, b, np.empty_like(a))
    mm = kiln.build(ocl / "matmul.json", target="opencl")
    A = np.random.rand(1024, 1024).astype("float32")
    B = np.random.rand(1024, 1024).astype("float32")
    tC = kiln.empty((1024, 1024), "float32", "opencl")
    mm.matmul(kiln.tensor(A, "opencl"), kiln.tensor(B, "opencl"), tC)
    np.testing.assert_allclose(kiln.numpy(tC), A @ B, rtol=1e-4, atol=1e-3)


def test_tensors_round_trip_and_bad_requests_raise():
    x = np.arange(12, dtype="int32").reshape(3, 4)
    np.testing.assert_array_equal(kiln.numpy(kiln.tensor(x)), x)
    assert kiln.numpy(kiln.empty((2, 2), "float64")).dtype == np.float64
    with pytest.raises(ValueError, match="unknown device `nodev`"):
        kiln.empty([4], "float32", "nodev")
    with pytest.raises(ValueError, match="not a dtype"):
        kiln.empty([4], "floaty")
    with pytest.raises(ValueError, match="negative extent"):
        kiln.empty([-1], "float32")
    from kiln import _native

    with pytest.raises(ValueError, match="rank and the dtype"):
        _native.lib().tensor_copy(kiln.empty([4], "float32"), tvm_ffi.from_dlpack(np.zeros(4, "int32")))
    with pytest.raises(TypeError, match="must be a tensor"):
        _native.lib().tensor_copy(kiln.empty([4], "float32"), 3)


def test_python_m_kiln_tune_and_build_with_its_database(tmp_path):
    """`python -m kiln tune` measures in a `python -m kiln tune-worker` process; `kiln.build`
    and `kiln.export` apply its record (`db=`), and say so; a bad database is refused or
    skipped with a warning, never applied blindly."""
    mm = ROOT / "examples" / "kernels" / "plain" / "matmul_256.json"
    db = tmp_path / "tuning.jsonl"
    # One thread: under the load of parallel tests, a 2-thread pool's candidates can measure
    # slower than the serial default, and the winner's pairing would then keep the default.
    r = run_module_cli("tune", str(mm), "matmul", "--trials", "4", "--db", str(db), "-q",
                       threads=1)
    assert r.returncode == 0, r.stderr
    assert "record written" in r.stdout, r.stdout
    mod = kiln.build(mm, db=db)
    applied = [n for n in mod.kiln_info["tuning"] if "tuning record applied" in n]
    assert len(applied) == 1, mod.kiln_info
    a = np.random.rand(256, 256).astype("float32")
    b = np.random.rand(256, 256).astype("float32")
    c = np.empty_like(a)
    mod.matmul(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # The same through the environment, and into a library.
    os.environ["KILN_TUNING_DB"] = str(db)
    try:
        assert any("applied" in n for n in kiln.build(mm).kiln_info["tuning"])
    finally:
        del os.environ["KILN_TUNING_DB"]
    kiln.export(mm, tmp_path / "mm.so", db=db)
    f = tvm_ffi.load_module(str(tmp_path / "mm.so"))["matmul"]
    c[:] = 0
    f(tvm_ffi.from_dlpack(a), tvm_ffi.from_dlpack(b), tvm_ffi.from_dlpack(c))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # With `auto_parallel`, a function a record scheduled is built as the tuner measured it:
    # no loop made parallel on top of its schedule (a serial record here, written from the real
    # one with other steps), while the same function with no record gets its parallel loop.
    serial = json.loads(db.read_text().splitlines()[-1])
    serial["steps"] = [{"split": {"loop": "k0", "factor": 4}},
                       {"kind": {"loop": "k0_i", "kind": "unrolled"}}]
    serial_db = tmp_path / "serial.jsonl"
    serial_db.write_text(json.dumps(serial) + "\n")
    tuned = kiln.build(mm, db=serial_db, auto_parallel=True)
    assert any("applied" in n for n in tuned.kiln_info["tuning"]), tuned.kiln_info
    assert "matmul" not in tuned.kiln_info["parallel"], tuned.kiln_info
    c[:] = 0
    tuned.matmul(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert "matmul" in kiln.build(mm, auto_parallel=True).kiln_info["parallel"]
    # No record for this target: nothing applied. A missing database raises; a corrupt line
    # is a warning.
    assert kiln.build(mm, target="llvm -mcpu=haswell", db=db).kiln_info["tuning"] == []
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        kiln.build(mm, db=tmp_path / "nope.jsonl")
    with open(db, "a") as fh:
        fh.write("{not a record\n")
    notes = kiln.build(mm, db=db).kiln_info["tuning"]
    assert any(n.startswith("warning:") for n in notes), notes
    assert any("applied" in n for n in notes), notes
