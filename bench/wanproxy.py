#!/usr/bin/env python3
"""CPU cost of the WAN proxy: drove's (`drove bench wan-proxy`) against toxiproxy.

For each proxy server and each delay, pushes BYTES through one proxied connection
(several streams at once with --streams) to a sink that discards them, and prints
the proxy process's CPU seconds per GB carried and the throughput. The sender and
the sink are in this process (threads; socket calls release the GIL).

    python3 bench/wanproxy.py [--drove target/release/drove] [--toxiproxy PATH]
        [--bytes 2G] [--streams 4] [--delays 0,10]

Run on an otherwise idle machine; results in bench/results/wanproxy-DATE.md.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

CHUNK = 1 << 20


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def api(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
        return json.loads(text) if text.strip().startswith("{") else text


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sink_server():
    """A listener whose connections are read to the end; (port, totals dict)."""
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 0))
    l.listen(64)
    got = {"bytes": 0}
    lock = threading.Lock()

    def serve(c):
        n = 0
        while True:
            b = c.recv(CHUNK)
            if not b:
                break
            n += len(b)
        with lock:
            got["bytes"] += n
        c.close()

    def accept():
        while True:
            c, _ = l.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return l.getsockname()[1], got


def push(listen, nbytes, streams):
    host, port = listen.rsplit(":", 1)
    per = nbytes // streams
    buf = os.urandom(CHUNK)

    def one():
        s = socket.create_connection((host, int(port)))
        left = per
        while left > 0:
            n = min(left, CHUNK)
            s.sendall(buf[:n])
            left -= n
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        s.close()

    ts = [threading.Thread(target=one) for _ in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return per * streams


def start(kind, drove, toxi):
    port = free_port()
    if kind == "builtin":
        cmd = [drove, "bench", "wan-proxy", "--api", f"127.0.0.1:{port}"]
    else:
        cmd = [toxi, "-host", "127.0.0.1", "-port", str(port), "-proxy-metrics"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            api(base, "GET", "/version")
            return p, base
        except OSError:
            time.sleep(0.05)
    p.kill()
    sys.exit(f"{kind} did not start")


def measure(kind, drove, toxi, delay, nbytes, streams):
    p, base = start(kind, drove, toxi)
    try:
        sink_port, got = sink_server()
        v = api(base, "POST", "/proxies",
                {"name": "p", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{sink_port}"})
        if delay:
            for stream in ("upstream", "downstream"):
                api(base, "POST", "/proxies/p/toxics",
                    {"name": f"latency_{stream}", "type": "latency", "stream": stream,
                     "toxicity": 1.0, "attributes": {"latency": delay, "jitter": 0}})
        c0, t0 = cpu_seconds(p.pid), time.monotonic()
        sent = push(v["listen"], nbytes, streams)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(p.pid) - c0
        return {"proxy": kind, "delay_ms": delay, "streams": streams, "bytes": sent,
                "wall_s": wall, "proxy_cpu_s": cpu, "mb_s": sent / wall / 1e6,
                "cpu_s_per_gb": cpu / (sent / 1e9)}
    finally:
        p.kill()
        p.wait()


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drove", default=os.environ.get("DROVE_BIN", "target/release/drove"))
    ap.add_argument("--toxiproxy", default=os.environ.get(
        "TOXIPROXY_SERVER", os.path.expanduser("~/go/bin/server")))
    ap.add_argument("--bytes", default="2G")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--delays", default="0,10")
    a = ap.parse_args()
    for b in (a.drove, a.toxiproxy):
        if not (os.path.isfile(b) or shutil.which(b)):
            sys.exit(f"Not found: {b}")
    rows = []
    for delay in [int(d) for d in a.delays.split(",")]:
        for kind in ("toxiproxy", "builtin"):
            r = measure(kind, a.drove, a.toxiproxy, delay, parse_size(a.bytes), a.streams)
            rows.append(r)
            print(f"{kind:9} delay {delay:3} ms: {r['mb_s']:8.1f} MB/s, proxy CPU "
                  f"{r['cpu_s_per_gb']:.3f} s per GB ({r['proxy_cpu_s']:.2f} s for "
                  f"{r['bytes'] / 1e9:.2f} GB)", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
