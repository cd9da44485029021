#!/usr/bin/env python3
"""Attach under contention (issue 15): many qemu-io processes attach VDIs through one
node, write 4 KiB, and detach, with several writers per VDI racing each other's lock
release, and readers beside them. Counts every failed cycle; the target is 0.

    drove up --nodes 3 --dir /tmp/att --base-port 17000 --detach --no-tls --no-auth
    python3 bench/attach.py --dir /tmp/att --cycles 1000 --vdis 32
    drove down --dir /tmp/att

Creates VDIs att-0 .. att-(N-1) (64 MiB) through node 1, runs --writers writers and
--readers readers per VDI (each a loop of qemu-io processes) until --cycles write
cycles are done, then prints cycles, failures (with the first messages) and cycle
latency; --json for a machine-readable line.
"""
import argparse
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def drove(*args):
    return subprocess.run(["drove", *args], capture_output=True, text=True)


def cycle(uri, pattern, write):
    if write:
        cmd = ["qemu-io", "-f", "raw", "-c", f"write -P {pattern} {pattern * 4096} 4k", uri]
    else:
        cmd = ["qemu-io", "-r", "-f", "raw", "-c", "read 0 4k", uri]
    t = time.monotonic()
    o = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - t
    out = o.stdout + o.stderr
    ok = o.returncode == 0 and "failed" not in out.lower() and "error" not in out.lower()
    return ok, took, out.strip()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="the cluster's directory (drove up --dir)")
    p.add_argument("--cycles", type=int, default=1000, help="write cycles in all")
    p.add_argument("--vdis", type=int, default=32)
    p.add_argument("--writers", type=int, default=2, help="writers per VDI")
    p.add_argument("--readers", type=int, default=1, help="readers per VDI")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    cluster = json.load(open(os.path.join(a.dir, "cluster.json")))
    node = cluster["nodes"][0]
    admin = node["admin"]
    sock = node["nbd_unix"]
    for i in range(a.vdis):
        o = drove("vdi", "create", f"att-{i}", "64M", "--cluster", admin)
        if o.returncode != 0 and "exists" not in o.stderr:
            raise SystemExit(f"vdi create att-{i} failed: {o.stderr}")
    lock = threading.Lock()
    state = {"left": a.cycles, "writes": [], "reads": [], "failures": []}

    def take():
        with lock:
            if state["left"] <= 0:
                return False
            state["left"] -= 1
            return True

    def worker(vdi, write, pattern):
        uri = f"nbd+unix:///att-{vdi}?socket={sock}"
        # Everyone starts together: threads made one after another while the first
        # ones already spawn qemu-io start late (the readers got 20 cycles in before).
        go.wait()
        while (take() if write else state["left"] > 0):
            ok, took, out = cycle(uri, pattern, write)
            with lock:
                state["writes" if write else "reads"].append(took)
                if not ok:
                    state["failures"].append(("write" if write else "read", f"att-{vdi}", out[-300:]))

    jobs = [(v, True, w + 1) for v in range(a.vdis) for w in range(a.writers)]
    jobs += [(v, False, 0) for v in range(a.vdis) for _ in range(a.readers)]
    go = threading.Barrier(len(jobs))
    start = time.monotonic()
    with ThreadPoolExecutor(len(jobs)) as ex:
        list(ex.map(lambda j: worker(*j), jobs))
    took = time.monotonic() - start
    w = sorted(state["writes"])
    fails = state["failures"]
    out = {
        "write_cycles": len(w), "read_cycles": len(state["reads"]),
        "failed_writes": sum(1 for f in fails if f[0] == "write"),
        "failed_reads": sum(1 for f in fails if f[0] == "read"),
        "vdis": a.vdis, "writers_per_vdi": a.writers, "readers_per_vdi": a.readers,
        "seconds": round(took, 1),
        "write_p50_ms": round(w[len(w) // 2] * 1000) if w else None,
        "write_p99_ms": round(w[int(len(w) * 0.99)] * 1000) if w else None,
        "first_failures": fails[:5],
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{out['write_cycles']} write cycles ({out['failed_writes']} failed) and "
              f"{out['read_cycles']} read cycles ({out['failed_reads']} failed) over {a.vdis} VDIs "
              f"({a.writers} writers, {a.readers} readers each) in {out['seconds']} s; "
              f"write cycle p50 {out['write_p50_ms']} ms, p99 {out['write_p99_ms']} ms")
        for f in fails[:5]:
            print("  failed:", f)
    raise SystemExit(1 if fails else 0)


if __name__ == "__main__":
    main()
