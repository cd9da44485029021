#!/usr/bin/env python3
"""Control-plane throughput through the admin API (issue 15: 620-1,520 VDI creates/s on
main 59820b0, 3 nodes, 32 in flight).

    drove up --nodes 3 --dir /tmp/cp --base-port 17000 --detach
    python3 bench/control.py --dir /tmp/cp                    # every operation, 1/32/256 in flight
    python3 bench/control.py --admin 127.0.0.1:17000 --ops create --inflight 32
    drove down --dir /tmp/cp

Operations, each --count times at each --inflight, against the metadata leader and a
follower (which forwards changes to the leader):
  create    POST /api/vdis (1 GiB, nothing written)
  snapshot  POST /api/vdis/NAME/snapshot (of each VDI created above, unattached)
  clone     POST /api/vdis/SNAP/clone (of one snapshot)
  delete    DELETE /api/vdis/NAME (of the VDIs created above)
  list      GET /api/vdis (the whole table, however large it has grown)
Prints ops/s and latency percentiles per operation, in-flight level and target; --json
for one machine-readable line per measurement.
"""
import argparse
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def call(admin, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{admin}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            ok = 200 <= r.status < 300
    except (urllib.error.URLError, OSError):
        ok = False
    return ok, time.monotonic() - t


def leader_and_follower(admins):
    with urllib.request.urlopen(f"http://{admins[0]}/api/status", timeout=10) as r:
        s = json.load(r)
    leader = s["map"]["nodes"][str(s["leader"])]["admin_addr"]
    followers = [n["admin_addr"] for n in s["map"]["nodes"].values() if n["admin_addr"] != leader]
    return leader, (followers[0] if followers else None)


def measure(op, admin, prefix, count, inflight):
    if op == "create":
        work = lambda i: call(admin, "POST", "/api/vdis", {"name": f"{prefix}{i}", "size": 1 << 30})
    elif op == "snapshot":
        work = lambda i: call(admin, "POST", f"/api/vdis/{prefix}{i}/snapshot", {"snap": f"{prefix}s{i}"})
    elif op == "clone":
        work = lambda i: call(admin, "POST", f"/api/vdis/{prefix}gold/clone", {"names": [f"{prefix}c{i}"]})
    elif op == "delete":
        work = lambda i: call(admin, "DELETE", f"/api/vdis/{prefix}{i}")
    elif op == "list":
        work = lambda i: call(admin, "GET", "/api/vdis")
    else:
        raise SystemExit(f"unknown operation {op}")
    start = time.monotonic()
    with ThreadPoolExecutor(inflight) as ex:
        res = list(ex.map(work, range(count)))
    took = time.monotonic() - start
    lat = sorted(r[1] for r in res)
    return {
        "op": op, "inflight": inflight, "count": count,
        "failed": sum(1 for r in res if not r[0]), "seconds": round(took, 2),
        "per_second": round(count / took), "p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="the cluster's directory (drove up --dir): its admin addresses")
    p.add_argument("--admin", help="comma-separated admin addresses (instead of --dir)")
    p.add_argument("--ops", default="create,snapshot,clone,list,delete")
    p.add_argument("--count", type=int, default=1000, help="operations per measurement")
    p.add_argument("--inflight", default="1,32,256", help="requests in flight, comma-separated")
    p.add_argument("--targets", default="leader,follower")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.dir:
        admins = [n["admin"] for n in json.load(open(os.path.join(a.dir, "cluster.json")))["nodes"]]
    elif a.admin:
        admins = a.admin.split(",")
    else:
        raise SystemExit("give --dir or --admin")
    leader, follower = leader_and_follower(admins)
    run = f"cp{int(time.time())}"
    for target in a.targets.split(","):
        admin = leader if target == "leader" else follower
        if admin is None:
            continue
        for inflight in [int(x) for x in a.inflight.split(",")]:
            prefix = f"{run}-{target[0]}{inflight}-"
            if "clone" in a.ops:
                call(admin, "POST", "/api/vdis", {"name": f"{prefix}base", "size": 1 << 30})
                call(admin, "POST", f"/api/vdis/{prefix}base/snapshot", {"snap": f"{prefix}gold"})
            for op in a.ops.split(","):
                r = measure(op, admin, prefix, a.count, inflight)
                r["target"] = target
                if a.json:
                    print(json.dumps(r), flush=True)
                else:
                    print(f"{target:8} {op:8} {inflight:4} in flight: {r['per_second']:6}/s "
                          f"({r['failed']} failed of {r['count']}), p50 {r['p50_ms']} ms, "
                          f"p99 {r['p99_ms']} ms", flush=True)


if __name__ == "__main__":
    main()
