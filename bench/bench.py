#!/usr/bin/env python3
"""drove vs qemu-nbd, side by side, with fio's NBD engine.

(a) drove: a 3-node cluster (`drove up`, 3 zones), one VDI with copies=3, fio attached
    through node 1's unix socket.
(b) baseline: qemu-nbd serving a raw file in the same work directory (same disk), one
    copy, no network hop, fio attached through its unix socket.
Each workload runs A B A B (drove, baseline, drove, baseline) and the two runs of each
are averaged. The ratio drove/baseline is the figure; absolute numbers depend on the
machine. Node memory (VmRSS) is sampled every 0.2 s during the runs.
"""
import argparse, datetime, json, os, shutil, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DROVE = os.environ.get("DROVE", os.path.join(ROOT, "target/release/drove"))

WORKLOADS = [
    # name, rw, bs, iodepth
    ("seqwrite-1M-qd8", "write", "1M", 8),
    ("seqread-1M-qd8", "read", "1M", 8),
    ("randread-4k-qd1", "randread", "4k", 1),
    ("randread-4k-qd32", "randread", "4k", 32),
    ("randwrite-4k-qd1", "randwrite", "4k", 1),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
]
TARGETS = {"randread-4k-qd32": 0.7, "randwrite-4k-qd32": 0.3, "seqread-1M-qd8": 0.7}


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def fio(uri, name, rw, bs, depth, size, runtime):
    out = sh("fio", "--name=" + name, "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw,
             "--bs=" + bs, "--iodepth=" + str(depth), "--size=" + size,
             "--time_based=1", "--runtime=" + str(runtime), "--ramp_time=1",
             "--output-format=json").stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in rw else job["read"]
    lat = side["clat_ns"]
    p99 = lat.get("percentile", {}).get("99.000000", 0)
    return {"iops": side["iops"], "mbps": side["bw_bytes"] / 1e6,
            "mean_us": lat["mean"] / 1000, "p99_us": p99 / 1000}


class RssSampler(threading.Thread):
    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.max_kb, self.stop = pids, {p: 0 for p in pids}, False

    def run(self):
        while not self.stop:
            for p in self.pids:
                try:
                    for line in open(f"/proc/{p}/status"):
                        if line.startswith("VmRSS:"):
                            self.max_kb[p] = max(self.max_kb[p], int(line.split()[1]))
                except OSError:
                    pass
            time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="disk size for both sides (default 1G)")
    ap.add_argument("--runtime", type=int, default=15, help="seconds per fio run (default 15)")
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per workload (default 2)")
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = ap.parse_args()
    for tool in ("fio", "qemu-nbd", "qemu-img"):
        if shutil.which(tool) is None:
            sys.exit(f"error: {tool} not found; run make deps")
    if not os.access(DROVE, os.X_OK):
        sys.exit(f"error: {DROVE} not built; run make build")

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    cdir = os.path.join(a.work, "cluster")
    procs = []
    try:
        print("starting drove: 3 nodes, 3 zones, copies=3", flush=True)
        sh(DROVE, "up", "--nodes", "3", "--zones", "3", "--dir", cdir, "--detach", "--base-port", "0",
           "--no-tls", "--no-auth")
        cl = json.load(open(os.path.join(cdir, "cluster.json")))
        admin = cl["nodes"][0]["admin"]
        sh(DROVE, "vdi", "create", "bench", a.size, "--copies", "3", "--cluster", admin)
        drove_uri = f"nbd+unix:///bench?socket={cl['nodes'][0]['nbd_unix']}"
        pids = [n["pid"] for n in cl["nodes"]]

        raw = os.path.join(a.work, "base.raw")
        sh("qemu-img", "create", "-f", "raw", raw, a.size)
        sock = os.path.join(a.work, "qemu-nbd.sock")
        procs.append(subprocess.Popen(["qemu-nbd", "-f", "raw", "-x", "bench", "--socket=" + sock,
                                       "--persistent", "--shared=16", "--cache=writeback", raw]))
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        base_uri = f"nbd+unix:///bench?socket={sock}"

        sampler = RssSampler(pids)
        sampler.start()
        results = {}
        total = len(WORKLOADS) * a.rounds * 2
        done = 0
        for name, rw, bs, depth in WORKLOADS:
            runs = {"drove": [], "qemu-nbd": []}
            for r in range(a.rounds):
                for side, uri in (("drove", drove_uri), ("qemu-nbd", base_uri)):
                    done += 1
                    print(f"[{done}/{total}] {name} {side} round {r + 1}", flush=True)
                    runs[side].append(fio(uri, name, rw, bs, depth, a.size, a.runtime))
            results[name] = {s: {k: sum(x[k] for x in v) / len(v) for k in v[0]} for s, v in runs.items()}
        sampler.stop = True
        rss_mb = {p: kb / 1024 for p, kb in sampler.max_kb.items()}
    finally:
        for p in procs:
            p.terminate()
        subprocess.run([DROVE, "down", "--dir", cdir], capture_output=True)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    cmd = "bash bench/run.sh " + " ".join(sys.argv[1:])
    lines = [f"# drove vs qemu-nbd, {stamp}", "",
             f"Command: `{cmd.strip()}` (size {a.size}, {a.runtime} s per run, {a.rounds} rounds A B alternating, mean of rounds).",
             f"Machine: {os.cpu_count()} cores; drove = 3 nodes on this host, copies=3, fio via node 1's unix socket; "
             "baseline = qemu-nbd on a raw file in the same directory (one copy, writeback cache).", "",
             "| workload | drove IOPS | base IOPS | drove MB/s | base MB/s | drove mean/p99 µs | base mean/p99 µs | ratio | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, _, _, _ in WORKLOADS:
        d, b = results[name]["drove"], results[name]["qemu-nbd"]
        ratio = d["iops"] / b["iops"] if b["iops"] else 0
        tgt = TARGETS.get(name)
        tgt_s = f">= {tgt} {'met' if ratio >= tgt else 'MISSED'}" if tgt else ""
        lines.append(f"| {name} | {d['iops']:.0f} | {b['iops']:.0f} | {d['mbps']:.1f} | {b['mbps']:.1f} | "
                     f"{d['mean_us']:.0f} / {d['p99_us']:.0f} | {b['mean_us']:.0f} / {b['p99_us']:.0f} | {ratio:.2f} | {tgt_s} |")
    lines += ["", "Peak resident memory of each node during the runs (target < 256 MiB): " +
              ", ".join(f"{v:.0f} MiB" for v in rss_mb.values()), ""]
    text = "\n".join(lines)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, stamp + ".md")
    open(path, "w").write(text)
    print("\n" + text + f"\nwritten to {path}")


if __name__ == "__main__":
    main()
