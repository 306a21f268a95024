"""kiln's RPC server against TVM's own, driven by the same TVM 0.27 client over loopback.

    python python/bench_rpc.py [--kiln target/release/kiln] [--rounds 7] [--calls 2000]

Measures, per server, interleaved round by round (kiln first in odd rounds, TVM first in even):
- the cost of one remote call of a 1-element kernel (`f(a, b, c)` from Python, round trip);
- copies of 64 MiB to (`tvm.runtime.tensor(x, remote.cpu())`) and from (`.numpy()`) the
  remote CPU, in GB/s;
and then kiln's server alone under TVM's tracker: 100 sequential sessions and 8 concurrent
clients, with its resident memory and its session directories before and after.

Both servers load the same library, built and exported by TVM. Needs apache-tvm 0.27, numpy,
tornado and cloudpickle (TVM's tracker and server), and a built `kiln` binary
(`cargo build --release`).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from bench_util import cpu_name
import tvm
from tvm import rpc, te


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, limit=30):
    start = time.time()
    while time.time() - start < limit:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")




def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def build_lib(path):
    n = 1
    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C")
    f = te.create_prim_func([a, b, c]).with_attr("global_symbol", "add1")
    tvm.compile(f, target="llvm").export_library(path)


def measure(port, lib, calls, big):
    remote = rpc.connect("127.0.0.1", port)
    remote.upload(lib, target="add1.so")
    f = remote.load_module("add1.so")["add1"]
    dev = remote.cpu(0)
    a, b, c = (tvm.runtime.tensor(np.ones(1, dtype="float32"), dev) for _ in range(3))
    for _ in range(200):
        f(a, b, c)
    assert c.numpy()[0] == 2.0
    t0 = time.perf_counter()
    for _ in range(calls):
        f(a, b, c)
    call_us = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    t = tvm.runtime.tensor(big, dev)
    to_gbs = big.nbytes / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    back = t.numpy()
    from_gbs = big.nbytes / (time.perf_counter() - t0) / 1e9
    assert np.array_equal(back, big)
    del t, a, b, c, f
    remote._sess.get_function("CloseRPCConnection")()
    return call_us, to_gbs, from_gbs


def summary(xs):
    return f"{statistics.median(xs):8.2f} [{min(xs):.2f}, {max(xs):.2f}]"


def sessions_through_tracker(kiln, lib, sequential, concurrent):
    tracker_port = free_port()
    tracker = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
         "--port", str(tracker_port), "--port-end", str(tracker_port + 1)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    workroot = tempfile.mkdtemp(prefix="kiln-rpc-bench-")
    server = None
    try:
        wait_port(tracker_port, tracker, "TVM's tracker")
        server = subprocess.Popen(
            [kiln, "rpc-server", "--port", "0", "--tracker", f"127.0.0.1:{tracker_port}",
             "--key", "bench", "--workdir", workroot, "--quiet"],
            stderr=subprocess.DEVNULL,
        )
        tr = rpc.connect_tracker("127.0.0.1", tracker_port)

        def one_session(tag):
            remote = tr.request("bench", priority=1, session_timeout=60) if tag is None else \
                rpc.connect_tracker("127.0.0.1", tracker_port).request("bench", session_timeout=60)
            remote.upload(lib, target="add1.so")
            f = remote.load_module("add1.so")["add1"]
            dev = remote.cpu(0)
            a = tvm.runtime.tensor(np.ones(1, dtype="float32"), dev)
            big = tvm.runtime.tensor(np.zeros(1 << 20, dtype="float32"), dev)
            f(a, a, a)
            assert a.numpy()[0] == 2.0
            del big, a, f, remote

        rss = []
        failures = 0
        t0 = time.time()
        for i in range(sequential):
            try:
                one_session(None)
            except Exception as e:  # noqa: BLE001
                failures += 1
                print(f"  session {i}: {e}")
            if i in (9, sequential - 1):
                time.sleep(0.3)
                rss.append(rss_kib(server.pid))
        seq_s = time.time() - t0
        errors = []

        def worker(i):
            try:
                one_session(i)
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrent)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conc_s = time.time() - t0
        time.sleep(0.5)
        rss.append(rss_kib(server.pid))
        left = os.listdir(workroot)
        return failures, errors, rss, left, seq_s, conc_s
    finally:
        for p in (server, tracker):
            if p is not None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "target",
                                                   "release", "kiln"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--no-sessions", action="store_true",
                    help="skip the tracker part (sessions, RSS)")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    if not os.path.exists(kiln):
        raise SystemExit(f"{kiln} not found: cargo build --release")

    tmp = tempfile.mkdtemp()
    lib = os.path.join(tmp, "add1.so")
    build_lib(lib)
    big = np.random.default_rng(0).integers(0, 255, size=64 << 20, dtype="uint8")

    kport, tport = free_port(), free_port()
    kproc = subprocess.Popen([kiln, "rpc-server", "--port", str(kport), "--quiet"],
                             stderr=subprocess.DEVNULL)
    tproc = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
         "--port", str(tport), "--port-end", str(tport + 1), "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    results = {"kiln": [], "tvm": []}
    try:
        wait_port(kport, kproc, "kiln rpc-server")
        wait_port(tport, tproc, "TVM's rpc_server")
        for r in range(args.rounds):
            order = [("kiln", kport), ("tvm", tport)]
            if r % 2:
                order.reverse()
            for name, port in order:
                results[name].append(measure(port, lib, args.calls, big))
    finally:
        for p in (kproc, tproc):
            p.kill()
            p.wait()

    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); TVM {tvm.__version__}; "
          f"{args.rounds} rounds, interleaved; median [min, max]")
    cols = ["call of a 1-element kernel (us)", "64 MiB to remote (GB/s)",
            "64 MiB from remote (GB/s)"]
    for i, col in enumerate(cols):
        k = [x[i] for x in results["kiln"]]
        t = [x[i] for x in results["tvm"]]
        if i == 0:
            ratio = statistics.median(t) / statistics.median(k)
            note = f"kiln costs {1 / ratio:.2f}x TVM's time"
        else:
            ratio = statistics.median(k) / statistics.median(t)
            note = f"kiln reaches {ratio:.2f}x TVM's bandwidth"
        print(f"  {col:34s} kiln {summary(k)}   TVM {summary(t)}   {note}")

    if args.no_sessions:
        return
    failures, errors, rss, left, seq_s, conc_s = sessions_through_tracker(
        kiln, lib, args.sessions, args.concurrent)
    print(f"  tracker: {args.sessions} sequential sessions in {seq_s:.1f} s, {failures} failed; "
          f"{args.concurrent} concurrent clients in {conc_s:.1f} s, {len(errors)} failed")
    print(f"  kiln server RSS (KiB): after 10 sessions {rss[0]}, after {args.sessions} {rss[1]}, "
          f"after the concurrent clients {rss[2]}; session directories left: {len(left)}")
    if failures or errors or left:
        raise SystemExit(f"failures: {errors} {left}")


if __name__ == "__main__":
    main()
