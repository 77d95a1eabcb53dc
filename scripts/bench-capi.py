#!/usr/bin/env python3
"""bench-capi.py - Debian's perftest through the drop-in C ABI beside `softrdma perf` natively
(issue 43, Done-when 5), both transports, over loopback.

Per run and transport, interleaved: `ib_write_bw` (64 KiB, BW average) and `ib_send_lat` (2 B,
t_typical) as a pair of processes under `softrdma run` (iWARP through rdma_cm, `-R`; RoCE on the
127.0.0.1 device, QPs brought up out of band), and `softrdma perf` natively with the same size:
`--loopback` (one process) blocking (its default) and busy-polling (`--busy`, as perftest polls),
and a `perf --server` and a `perf` client as two processes busy-polling, as the perftest pair
runs. Prints the medians and the ratios C ABI / native. A benchmark: it asserts nothing.

    scripts/bench-capi.py [--runs N] [--only iwarp|roce] [--no-build] [--iters-bw N] [--iters-lat N]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    out = subprocess.run(["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True).stdout
    return bool(out.strip())


def served(what, port, server_cmd, client_cmd):
    """Starts `server_cmd`, runs `client_cmd` once the server listens on TCP `port`, and lets
    the server end; the client's result."""
    server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while not listening(port) and server.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    client = subprocess.run(client_cmd, capture_output=True, text=True, timeout=300)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    if client.returncode != 0:
        sys.stderr.write(f"{what} failed, again:\n{client.stdout}{client.stderr}\n")
    return client


def pair(sr, transport, prog, args):
    """Runs `prog args` as server and client through `softrdma run`; the client's output.
    Both kinds of server listen on TCP: rdma_cm over iWARP, perftest's own exchange on RoCE."""
    for _attempt in range(5):
        port = str(free_port())
        run = [sr, "run", "--transport", transport, "--"]
        client = served(f"{prog} {args}", port, run + [prog, *args, "-p", port],
                        run + [prog, *args, "-p", port, "127.0.0.1"])
        if client.returncode == 0:
            return client.stdout
    raise SystemExit(f"{prog} {args}: five failures")


def row(out, size):
    for line in out.splitlines():
        f = line.split()
        if len(f) > 4 and f[0] == str(size) and re.fullmatch(r"\d+", f[1]):
            return [float(x) for x in f[2:] if re.fullmatch(r"[\d.]+", x)]
    raise SystemExit(f"no row for {size} octets in:\n{out}")


def native(sr, transport, extra):
    out = subprocess.run([sr, "perf", "--loopback", "--json", "--transport", transport, *extra],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"perf {extra}: {out.stderr}")
    return json.loads(out.stdout)


def native_pair(sr, transport, extra):
    """`perf --server --once` and a `perf` client (from 127.0.0.3) as two processes; the
    client's JSON report."""
    for _attempt in range(5):
        port = str(free_port())
        roce = []
        if transport == "roce":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", 0))
                roce = ["--roce-port", str(u.getsockname()[1])]
        out = served(f"perf pair {extra}", port,
                     [sr, "perf", "--transport", transport, "--server", "--once",
                      "-B", "127.0.0.1", "-p", port, *roce, *extra],
                     [sr, "perf", "--transport", transport, "127.0.0.1", "-p", port,
                      "-B", "127.0.0.3", *roce, "--json", *extra])
        if out.returncode == 0:
            return json.loads(out.stdout)
    raise SystemExit(f"perf pair {extra}: five failures")


def roce_device(sr):
    out = subprocess.run([sr, "run", "--", "ibv_devinfo", "-v"], capture_output=True, text=True).stdout
    dev = None
    for line in out.splitlines():
        m = re.match(r"hca_id:\s*(\S+)", line)
        if m:
            dev = m.group(1)
        if dev and "GID[" in line and "::ffff:127.0.0.1" in line:
            return dev
    raise SystemExit(f"no RoCE device on 127.0.0.1:\n{out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=["iwarp", "roce"])
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--iters-bw", type=int, default=5000)
    ap.add_argument("--iters-lat", type=int, default=10000)
    a = ap.parse_args()
    os.chdir(ROOT)
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "softrdma-cli", "-p", "softrdma-capi"],
                       check=True)
    sr = os.path.abspath("target/release/softrdma")
    os.environ.setdefault("SOFTRDMA_LIB", os.path.abspath("target/release"))
    transports = [a.only] if a.only else ["iwarp", "roce"]
    cells = {}

    def add(k, v):
        cells.setdefault(k, []).append(v)

    for i in range(a.runs):
        for t in transports:
            if t == "iwarp":
                base = ["-R", "-d", "softrdma_tcp0"]
            else:
                base = ["-d", roce_device(sr), "-x", "0"]
            bw = ["-s", "65536"]
            out = pair(sr, t, "ib_write_bw", base + bw + ["-n", str(a.iters_bw)])
            add((t, "write_bw", "capi"), row(out, 65536)[1])
            out = pair(sr, t, "ib_send_lat", base + ["-s", "2", "-n", str(a.iters_lat)])
            add((t, "send_lat", "capi"), row(out, 2)[2])
            for mode, run, extra in [("native", native, []), ("native --busy", native, ["--busy"]),
                                     ("2 procs --busy", native_pair, ["--busy"])]:
                j = run(sr, t, extra + ["--op", "write", "--bw", "-s", "65536", "-n", str(a.iters_bw)])
                # MB/s of 2^20 octets, as perftest's column.
                add((t, "write_bw", mode), j["bw"][0]["rdma"]["mbyte_s"])
                j = run(sr, t, extra + ["--op", "send", "--lat", "-s", "2", "-n", str(a.iters_lat)])
                add((t, "send_lat", mode), j["lat"][0]["rdma"]["t_typical"])
        sys.stderr.write(f"run {i + 1} of {a.runs} done\n")
    print(f"medians of {a.runs} runs; write_bw in MB/s (BW average), send_lat in µs (t_typical)")
    print("native: perf --loopback (one process); busy: the same, --busy; 2p busy: perf --server "
          "and a perf client, two processes, --busy")
    print(f"{'transport':9} {'test':9} {'C ABI':>9} {'native':>9} {'ratio':>6} {'busy':>9} {'ratio':>6}"
          f" {'2p busy':>9} {'ratio':>6}  runs (C ABI)")
    for t in transports:
        for test in ["write_bw", "send_lat"]:
            c = statistics.median(cells[(t, test, "capi")])
            n = statistics.median(cells[(t, test, "native")])
            b = statistics.median(cells[(t, test, "native --busy")])
            p = statistics.median(cells[(t, test, "2 procs --busy")])
            runs = " ".join(f"{x:.1f}" for x in cells[(t, test, "capi")])
            print(f"{t:9} {test:9} {c:9.2f} {n:9.2f} {c / n:6.2f} {b:9.2f} {c / b:6.2f}"
                  f" {p:9.2f} {c / p:6.2f}  {runs}")


if __name__ == "__main__":
    main()
