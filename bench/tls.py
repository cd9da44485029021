#!/usr/bin/env python3
"""TLS on against TLS off, in one run (issue 14's benchmark).

Starts two local 3-node clusters, one with `drove up` (certificates, the default: peer traffic over
mutual TLS, NBD over TCP requiring TLS) and one without, each with a copies=3 VDI
prefilled once, and measures with fio (ioengine=nbd):

  randwrite-4k   4 KiB random writes, 32 in flight, through node 1's unix socket:
                 the client side is the same in both; TLS is on the peer traffic
                 to the two other replicas
  write-1m       1 MiB sequential writes, 4 in flight, same path
  read-4k-tcp    the whole disk read in 4 KiB requests, 32 in flight, over NBD
                 TCP (nbds:// with the cluster's client certificate when TLS is on):
                 `nbdcopy URI null:` (sequential; fio's NBD engine cannot take the
                 certificates: libnbd refuses a URI's local files unless the caller
                 allows them, and fio does not)

The repeats alternate between the clusters (on, off, on, off, ...) so both see the
same machine; the median of each is kept and the ratio on/off printed.

    python3 bench/tls.py [--drove target/release/drove] [--runtime 20] [--repeat 3]
        [--size 1G] [--out bench/results/tls-DATE.md]

Run on an otherwise idle machine.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

JOBS = [
    # name, rw, bs, iodepth, over
    ("randwrite-4k", "randwrite", "4k", 32, "unix"),
    ("write-1m", "write", "1M", 4, "unix"),
    ("read-4k-tcp", "read", "4k", 32, "tcp"),
]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


class Cluster:
    def __init__(self, drove, tls, size):
        self.drove = drove
        self.tls = tls
        self.dir = tempfile.mkdtemp(prefix="drove-tls-bench-" if tls else "drove-plain-bench-")
        cmd = [drove, "up", "--detach", "--base-port", "0", "--nodes", "3",
               "--zones", "3", "--dir", self.dir, "--no-auth"]
        if not tls:
            cmd.append("--no-tls")
        run(cmd)
        with open(os.path.join(self.dir, "cluster.json")) as f:
            self.nodes = json.load(f)["nodes"]
        self.admin = self.nodes[0]["admin"]
        cmd = [drove, "vdi", "create", "b", size, "--copies", "3", "--cluster", self.admin]
        if tls:
            # The admin API speaks HTTPS only when the nodes have certificates.
            cmd += ["--ca", os.path.join(self.dir, "tls")]
        run(cmd)

    def uri(self):
        return f"nbd+unix:///b?socket={self.nodes[0]['nbd_unix']}"

    def read_tcp(self, depth, size_bytes):
        """The whole disk read over NBD TCP in 4 KiB requests: (IOPS, bytes/s)."""
        tcp = self.nodes[0]["nbd_tcp"]
        if self.tls:
            certs = os.path.join(self.dir, "tls")
            uri = tcp.replace("nbd://", "nbds://", 1) + f"/b?tls-certificates={certs}"
        else:
            uri = tcp + "/b"
        t = time.monotonic()
        run(["nbdcopy", "--request-size=4096", f"--requests={depth}", "--connections=1",
             uri, "null:"])
        secs = time.monotonic() - t
        return size_bytes / 4096 / secs, size_bytes / secs

    def down(self):
        subprocess.run([self.drove, "down", "--dir", self.dir], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def fio(uri, rw, bs, iodepth, size, runtime):
    cmd = ["fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
           f"--bs={bs}", f"--iodepth={iodepth}", f"--size={size}",
           "--output-format=json"]
    if runtime:
        cmd += ["--time_based", f"--runtime={runtime}"]
    out = run(cmd)
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw.endswith("read") else j["write"]
    return side["iops"], side["bw_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drove", default="target/release/drove")
    ap.add_argument("--runtime", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--out", default=time.strftime("bench/results/tls-%Y-%m-%d.md"))
    a = ap.parse_args()
    for tool in ("fio", "nbdcopy"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed")
    started = time.time()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size_bytes = int(a.size[:-1]) * units[a.size[-1].upper()] if a.size[-1].isalpha() else int(a.size)
    clusters = {}
    try:
        for tls in (True, False):
            c = Cluster(a.drove, tls, a.size)
            clusters[tls] = c
            # Prefill once, so reads read written data.
            fio(c.uri(), "write", "1M", 4, a.size, 0)
        got = {(name, tls): [] for name, *_ in JOBS for tls in (True, False)}
        for rep in range(a.repeat):
            for name, rw, bs, depth, over in JOBS:
                for tls in (True, False):
                    if over == "tcp":
                        iops, bw = clusters[tls].read_tcp(depth, size_bytes)
                    else:
                        iops, bw = fio(clusters[tls].uri(), rw, bs, depth, a.size, a.runtime)
                    got[(name, tls)].append((iops, bw))
                    print(f"repeat {rep + 1}/{a.repeat} {name} tls={'on' if tls else 'off'}: "
                          f"{iops:.0f} IOPS, {bw / 1e6:.1f} MB/s", file=sys.stderr, flush=True)
    finally:
        for c in clusters.values():
            c.down()
    rows = []
    for name, rw, bs, depth, over in JOBS:
        on = statistics.median(x[1] for x in got[(name, True)])
        off = statistics.median(x[1] for x in got[(name, False)])
        on_iops = statistics.median(x[0] for x in got[(name, True)])
        off_iops = statistics.median(x[0] for x in got[(name, False)])
        ratio = on / off if off else float("nan")
        rows.append((name, over, on_iops, off_iops, on, off, ratio))
    cmd = " ".join(["python3", "bench/tls.py"] + sys.argv[1:])
    lines = [
        f"# TLS on against off ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `{cmd}`; took {time.time() - started:.0f} s. Two local 3-node clusters "
        "(copies 3), one `drove up` (TLS), one `drove up --no-tls`; fio ioengine=nbd through node 1's "
        f"unix socket ({a.runtime} s per run) and nbdcopy over NBD TCP (the whole "
        f"{a.size} disk in 4 KiB requests), {a.repeat} repeats alternating between "
        "the clusters, medians.",
        "",
        "| job | client path | IOPS on | IOPS off | MB/s on | MB/s off | on / off |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, over, on_i, off_i, on, off, ratio in rows:
        path = "unix socket (peer TLS)" if over == "unix" else "NBD TCP (NBD TLS + peer TLS)"
        lines.append(f"| {name} | {path} | {on_i:.0f} | {off_i:.0f} | {on / 1e6:.1f} | "
                     f"{off / 1e6:.1f} | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
