#!/usr/bin/env python3
"""Control-plane throughput: VDI creates through the admin API with many requests in
flight (issue 15 measured 620-1,520 creates/s on main 59820b0, 3 nodes, 32 in flight).

    drove up --nodes 3 --dir /tmp/cp --base-port 17000 --detach
    python3 bench/control.py --admin 127.0.0.1:17000,127.0.0.1:17010,127.0.0.1:17020
    drove down --dir /tmp/cp

Requests go round-robin to the nodes given (followers forward to the leader). Prints
creates/s and latency percentiles; --json for a machine-readable line.
"""
import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def create(admin, name):
    body = json.dumps({"name": name, "size": 1 << 30}).encode()
    req = urllib.request.Request(f"http://{admin}/api/vdis", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        ok = r.status == 200
    return ok, time.monotonic() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin", required=True, help="comma-separated admin addresses")
    p.add_argument("--count", type=int, default=2000, help="VDIs to create")
    p.add_argument("--inflight", type=int, default=32, help="requests in flight")
    p.add_argument("--prefix", default=f"cp{int(time.time())}-", help="VDI name prefix")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    admins = a.admin.split(",")
    start = time.monotonic()
    with ThreadPoolExecutor(a.inflight) as ex:
        res = list(ex.map(lambda i: create(admins[i % len(admins)], f"{a.prefix}{i}"), range(a.count)))
    took = time.monotonic() - start
    lat = sorted(r[1] for r in res)
    failed = sum(1 for r in res if not r[0])
    out = {
        "creates": a.count, "failed": failed, "seconds": round(took, 2),
        "per_second": round(a.count / took), "inflight": a.inflight,
        "p50_ms": round(lat[len(lat) // 2] * 1000, 1), "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 1),
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{out['creates']} creates ({failed} failed) in {out['seconds']} s: {out['per_second']}/s "
              f"with {a.inflight} in flight; latency p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms")


if __name__ == "__main__":
    main()
