"""TVM 0.27's own RPC client against kiln's RPC server (driven by tests/rpc_tvm.rs).

    rpc_client.py direct  PORT KILN_LIB WORKDIR [OPENCL_LIB]
    rpc_client.py tracker TRACKER_PORT KEY KILN_LIB SEQUENTIAL CONCURRENT
    rpc_client.py metaschedule TRACKER_PORT KEY

Every check is an assert; the last line printed is `OK <what>` on success.
"""

import os
import sys
import tempfile
import threading

import numpy as np
import tvm
from tvm import rpc, te


def tvm_vadd_lib(path):
    """A vadd library built and exported by TVM itself (parallel, as TVM would schedule it)."""
    n = te.var("n")
    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C")
    f = te.create_prim_func([a, b, c]).with_attr("global_symbol", "vadd")
    tvm.compile(f, target="llvm").export_library(path)


def run_vadd(remote, lib_path, name, n=1000):
    remote.upload(lib_path, target=name)
    mod = remote.load_module(name)
    dev = remote.cpu(0)
    x = np.random.default_rng(0).standard_normal(n).astype("float32")
    y = np.arange(n, dtype="float32")
    a = tvm.runtime.tensor(x, dev)
    b = tvm.runtime.tensor(y, dev)
    c = tvm.runtime.tensor(np.zeros(n, dtype="float32"), dev)
    f = mod["vadd"]
    f(a, b, c)
    np.testing.assert_array_equal(c.numpy(), x + y)
    timer = mod.time_evaluator("vadd", dev, number=10, repeat=3)
    r = timer(a, b, c)
    assert len(r.results) == 3 and all(t > 0 for t in r.results), r.results
    return mod


def expect_error(fn, *needles):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - TVM raises its own error classes
        text = str(e)
        for needle in needles:
            assert needle in text, f"expected {needle!r} in: {text}"
        return text
    raise AssertionError(f"expected an error containing {needles}")


def opencl_vadd(remote, lib):
    """A kiln library with an OpenCL kernel, run on the server's OpenCL device: TVM's wheel has
    no OpenCL runtime, the server's kiln does."""
    remote.upload(lib, target="vadd_cl.so")
    mod = remote.load_module("vadd_cl.so")
    dev = remote.cl(0)
    assert dev.exist
    n = 1000
    x = np.random.default_rng(2).standard_normal(n).astype("float32")
    a = tvm.runtime.tensor(x, dev)
    c = tvm.runtime.tensor(np.zeros(n, dtype="float32"), dev)
    mod["vadd"](a, a, c)
    np.testing.assert_array_equal(c.numpy(), x + x)
    r = mod.time_evaluator("vadd", dev, number=5, repeat=2)(a, a, c)
    assert len(r.results) == 2


def direct(port, kiln_lib, workdir, opencl_lib=None):
    tvm_lib = os.path.join(workdir, "tvm_vadd.so")
    tvm_vadd_lib(tvm_lib)
    remote = rpc.connect("127.0.0.1", port, session_timeout=60)
    run_vadd(remote, kiln_lib, "kiln_vadd.so")
    run_vadd(remote, tvm_lib, "tvm_vadd.so")
    # Files: listdir, download, remove.
    names = remote.listdir(".")
    assert "kiln_vadd.so" in names and "tvm_vadd.so" in names, names
    blob = remote.download("tvm_vadd.so")
    assert bytes(blob) == open(tvm_lib, "rb").read()
    remote.remove("tvm_vadd.so")
    assert "tvm_vadd.so" not in remote.listdir(".")
    # Uploads that try to leave the session's directory are refused, with the reason.
    for bad in ["../escape.so", "/tmp/escape.so", "a/../../escape.so"]:
        expect_error(lambda b=bad: remote.upload(bytearray(b"x"), target=b), "session's directory")
    # A module that is not there, a function that is not there.
    expect_error(lambda: remote.load_module("missing.so"), "missing.so")
    mod = remote.load_module("kiln_vadd.so")
    expect_error(lambda: mod["no_such_function"])
    # Device attributes through the remote device.
    dev = remote.cpu(0)
    assert dev.exist
    # A 64 MiB round trip.
    big = np.random.default_rng(1).integers(0, 255, size=64 << 20, dtype="uint8")
    t = tvm.runtime.tensor(big, dev)
    np.testing.assert_array_equal(t.numpy(), big)
    # Tensors freed by the client are gone on the server: a fresh one of 4 elements works.
    small = tvm.runtime.tensor(np.ones(4, dtype="float32"), dev)
    mod["vadd"](small, small, small)
    np.testing.assert_array_equal(small.numpy(), np.full(4, 2, dtype="float32"))
    if opencl_lib:
        opencl_vadd(remote, opencl_lib)
        print("OK opencl")
    print("OK direct")


def tracker(tracker_port, key, kiln_lib, sequential, concurrent):
    tr = rpc.connect_tracker("127.0.0.1", tracker_port)
    for _ in range(sequential):
        remote = tr.request(key, priority=1, session_timeout=60)
        run_vadd(remote, kiln_lib, "lib.so", n=64)
        del remote
    errors = []

    def worker(i):
        try:
            t = rpc.connect_tracker("127.0.0.1", tracker_port)
            remote = t.request(key, priority=1, session_timeout=60)
            run_vadd(remote, kiln_lib, f"lib{i}.so", n=100 + i)
        except Exception as e:  # noqa: BLE001
            errors.append(f"client {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrent)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print(f"OK tracker {sequential} sequential, {concurrent} concurrent")


def metaschedule(tracker_port, key):
    """MetaSchedule's own builder and RPCRunner, defaults but for the tracker: the builder
    exports a `.tar` of objects, which the server links; inputs are filled remotely with
    `random_fill_for_measure`; the CPU cache is flushed before each repeat."""
    from tvm.s_tir import meta_schedule as ms

    n = 64
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    # What MetaSchedule's LocalBuilder writes (`default_build` + `default_export`: a `.tar` of
    # objects); the builder itself is not run, as pickling its input crashes TVM 0.27's
    # LocalBuilder here (a segfault in `ffi::ToJSONGraph`, client side).
    from tvm.support import tar

    artifact = os.path.join(tempfile.mkdtemp(), "candidate.tar")
    tvm.compile(mod, target=tvm.target.Target("llvm")).export_library(artifact, fcompile=tar.tar)
    runner = ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host="127.0.0.1",
            tracker_port=tracker_port,
            tracker_key=key,
            session_priority=1,
            session_timeout_sec=60,
        ),
        evaluator_config=ms.runner.EvaluatorConfig(
            number=3, repeat=2, min_repeat_ms=0, enable_cpu_cache_flush=True
        ),
        max_workers=1,
    )
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    (future,) = runner.run([ms.runner.RunnerInput(artifact, "cpu", args_info)])
    result = future.result()
    assert result.error_msg is None, result.error_msg
    secs = [float(x) for x in result.run_secs]
    assert len(secs) == 2 and all(0 < x < 1 for x in secs), secs
    print(f"OK metaschedule {secs}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "direct":
        direct(int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[5:6])
    elif mode == "tracker":
        tracker(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif mode == "metaschedule":
        metaschedule(int(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")
