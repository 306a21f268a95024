"""`kiln tune --target opencl` (or `cuda`) on the four benchmark kernels, against kiln's hand
schedules for that device and the default device schedule, on this machine's device 0.

    python python/bench_tune_device.py [--kiln target/release/kiln] [--target opencl] \\
        [--trials 64] [--seconds 120] [--rounds 7] [--only vadd,matmul,rowsum,softmax]

Per kernel: the function as written before any schedule (vadd, rowsum and the 1024³ matmul as
TVM writes them, `te.compute`, converted by `kiln.to_kiln`; softmax as kiln's algorithm,
`examples/kernels/plain/softmax_4096x4096.json`, the algorithm of the hand schedule) is tuned by
`kiln tune --target T`. Then three builds are timed with `kiln run --repeat 10` (device time
between two events, median of the 10 calls), in interleaved rounds (the order rotates each
round): the function as written (the default device schedule), the same with the tuning record
(`--db`), and kiln's hand schedule of the kernel for that device
(`examples/kernels/<kind>/<kernel>.json`, same shape). Reported: each one's median over the
rounds with its quartiles, the ratios default / tuned and hand / tuned (above 1: the tuned
kernel is faster), and the tuning's candidates and seconds.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)

from bench_util import cpu_name, quartiles, te_matmul  # noqa: E402


def te_vadd(n):
    from tvm import te

    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute((n,), lambda i: a[i] + b[i], name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "vadd")


def te_rowsum(rows, cols):
    from tvm import te

    a = te.placeholder((rows, cols), name="A")
    k = te.reduce_axis((0, cols), name="k")
    b = te.compute((rows,), lambda i: te.sum(a[i, k], axis=k), name="B")
    return te.create_prim_func([a, b]).with_attr("global_symbol", "rowsum")


def hand_shape(path, name):
    """The parameter shapes of function `name` in the kiln-ir/1 module at `path`."""
    with open(path) as fh:
        m = json.load(fh)
    f = next(f for f in m["functions"] if f["name"] == name)
    return [p.get("shape") for p in f["params"]]


def plain_module(kernel, shapes, d):
    """The kernel as written before any schedule, in a file: TVM's form where TVM writes it."""
    path = os.path.join(d, f"{kernel}.json")
    if kernel == "softmax":
        return os.path.join(ROOT, "examples", "kernels", "plain", "softmax_4096x4096.json")
    import kiln

    if kernel == "vadd":
        n = shapes[0][0]
        if not isinstance(n, int):
            n = 1 << 20
        f = te_vadd(n)
    elif kernel == "rowsum":
        f = te_rowsum(*shapes[0])
    else:
        m, k = shapes[0]
        n = shapes[1][1]
        f = te_matmul(m, n, k)
    with open(path, "w") as fh:
        json.dump(kiln.to_kiln(f), fh)
    return path


def run_time(kiln, out, module, name, target, db=None, args=()):
    cmd = [kiln, "run", module, name, *args, "--target", target, "--repeat", "10",
           "--out", out]
    if db:
        cmd += ["--db", db]
    p = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"device time median ([\d.]+) ms", p.stdout)
    if p.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)}: {(p.stderr + p.stdout).strip()[-400:]}")
    # A record applies, or its pairing with the default lost and the default build is kept
    # (then "tuned" is the default build, as a user of the database gets it).
    if db and "tuning record applied" not in p.stderr and "default build is kept" not in p.stderr:
        raise RuntimeError(f"the record was not applied: {p.stderr.strip()[-400:]}")
    return float(found.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--target", default="opencl")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="vadd,matmul,rowsum,softmax")
    a = ap.parse_args()
    kind = json.loads(a.target)["kind"] if a.target.startswith("{") else a.target
    os.environ.setdefault("KILN_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    print(f"host CPU: {cpu_name()}; target {a.target}; "
          f"{a.trials} trials or {a.seconds:.0f} s per kernel; {a.rounds} rounds")
    print()
    print("| kernel | default, ms [q1, q3] | hand schedule, ms [q1, q3] | tuned, ms [q1, q3] "
          "| default / tuned | hand / tuned | candidates, s |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    devices = []
    with tempfile.TemporaryDirectory() as d:
        for kernel in a.only.split(","):
            hand = os.path.join(ROOT, "examples", "kernels", kind, f"{kernel}.json")
            shapes = hand_shape(hand, kernel)
            plain = plain_module(kernel, shapes, d)
            # vadd's hand schedule has a symbolic length: give it the tuned kernel's.
            args = []
            if kernel == "vadd":
                n = 1 << 20
                args = [f"rand:{n}", f"rand:{n}", f"zeros:{n}"]
            db = os.path.join(d, f"{kernel}.jsonl")
            t0 = time.perf_counter()
            p = subprocess.run([a.kiln, "tune", plain, kernel, "--target", a.target,
                                "--trials", str(a.trials), "--seconds", str(a.seconds),
                                "--db", db], capture_output=True, text=True)
            tune_s = time.perf_counter() - t0
            if p.returncode != 0 or not os.path.exists(db):
                print(f"| {kernel} | kiln tune found nothing or failed: "
                      f"{(p.stderr + p.stdout).strip()[-300:]} | | | | | |")
                ok = False
                continue
            if not devices:
                with open(db) as fh:
                    devices.append(json.loads(fh.readline())["device"])
            found = re.search(r"(\d+) candidates in ([\d.]+) s", p.stdout + p.stderr)
            trials = found.group(1) if found else "?"
            paired = re.search(r"paired:  ([\d.]+x) the default \[([\d.]+), ([\d.]+)\]",
                               p.stdout)
            if paired:
                trials += f" (paired {paired.group(1)} [{paired.group(2)}, {paired.group(3)}])"
            times = {"default": [], "hand": [], "tuned": []}
            out = os.path.join(d, "out")
            runs = {
                "default": lambda: run_time(a.kiln, out, plain, kernel, a.target, args=args),
                "hand": lambda: run_time(a.kiln, out, hand, kernel, a.target, args=args),
                "tuned": lambda: run_time(a.kiln, out, plain, kernel, a.target, db=db,
                                          args=args),
            }
            order = list(runs)
            try:
                for r in range(a.rounds):
                    for name in order[r % 3:] + order[:r % 3]:
                        times[name].append(runs[name]())
            except RuntimeError as e:
                print(f"| {kernel} | {e} | | | | | |")
                ok = False
                continue
            med = {k: statistics.median(v) for k, v in times.items()}
            cell = {k: "%.3f [%.3f, %.3f]" % (med[k], *quartiles(v)) for k, v in times.items()}
            size = "1048576" if kernel == "vadd" else "x".join(str(x) for x in shapes[0])
            print(f"| {kernel} {size} | {cell['default']} "
                  f"| {cell['hand']} | {cell['tuned']} "
                  f"| {med['default'] / med['tuned']:.2f}x | {med['hand'] / med['tuned']:.2f}x "
                  f"| {trials}, {tune_s:.0f} |", flush=True)
    print(f"\ndevice: {devices[0] if devices else kind}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
