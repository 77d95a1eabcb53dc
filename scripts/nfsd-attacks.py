#!/usr/bin/env python3
"""nfsd-attacks.py - a hostile client of `softrdma nfsd`, for soaks (issue 41): every attack
class of the hardening review, in a loop, each bounded in count and time.

    scripts/nfsd-attacks.py --target 127.0.0.1 --export /path [--minutes M] [--rdma-port P]
                            [--tcp-port P] [--only a,b,...] [--once]

Attacks (threads, each repeating until the time is up):
  nonreader   two connections pipeline 16 READs of 1 MiB each and never read (held 40 s)
  partial     200 connections each send a 1 MiB record mark and half of it (held 20 s)
  churn       2,000 connections opened and closed at once
  idle        100 connections that say nothing (held 30 s)
  halfopen    300 silent TCP connections to the NFS/RDMA port (held 15 s)
  readchunk   4 raw iWARP requesters (MPA rev 1) send 8 WRITEs each whose data is a Read
              chunk, and never answer the RDMA Reads (held until closed, at most 60 s)
  mnt         5,000 MNTs of the export, pipelined
  readdir     2 connections pipeline 64 READDIRPLUS of the export's directory `bigdir`
  garbage     unknown procedures, unknown programs, garbage records, bad handles
It needs the export to hold `big` (at least 1 MiB) and `bigdir/` (soak-nfsd.sh makes them).
Only loopback (127.0.0.0/8) or the interop VM's networks (10.77.0.0/16) are accepted as a
target. Prints one line per attack round and a summary of rounds; exit 0 unless the target
was never reachable.
"""
import argparse
import ipaddress
import os
import socket
import struct
import sys
import threading
import time

NFS, MOUNT = 100003, 100005
STOP = threading.Event()
COUNTS = {}
LOCK = threading.Lock()


def note(name, ok=True):
    with LOCK:
        c = COUNTS.setdefault(name, [0, 0])
        c[0 if ok else 1] += 1


def xdr_opaque(b):
    return struct.pack(">I", len(b)) + b + b"\0" * ((4 - len(b) % 4) % 4)


def auth_sys():
    body = struct.pack(">I", 1) + xdr_opaque(b"attacker") + struct.pack(">III", 0, 0, 0)
    return struct.pack(">I", 1) + xdr_opaque(body)


def call(xid, prog, vers, proc, args=b""):
    return (struct.pack(">IIIIII", xid, 0, 2, prog, vers, proc) + auth_sys()
            + struct.pack(">II", 0, 0) + args)


def record(msg):
    return struct.pack(">I", 0x80000000 | len(msg)) + msg


def read_record(s):
    out = b""
    while True:
        hdr = recv_exact(s, 4)
        n = struct.unpack(">I", hdr)[0]
        out += recv_exact(s, n & 0x7FFFFFFF)
        if n & 0x80000000:
            return out


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise ConnectionError("closed")
        b += chunk
    return b


def results(reply):
    """The results of an accepted, successful reply (after the verifier and status)."""
    xid, mtype, stat = struct.unpack(">III", reply[:12])
    if mtype != 1 or stat != 0:
        raise ValueError("denied")
    flavor, ln = struct.unpack(">II", reply[12:20])
    at = 20 + ln + (4 - ln % 4) % 4
    accept = struct.unpack(">I", reply[at:at + 4])[0]
    if accept != 0:
        raise ValueError(f"accept status {accept}")
    return reply[at + 4:]


class Target:
    def __init__(self, a):
        self.host, self.tcp, self.rdma, self.export = a.target, a.tcp_port, a.rdma_port, a.export
        self.root = self.big = self.bigdir = None

    def conn(self, timeout=10):
        s = socket.create_connection((self.host, self.tcp), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def rpc(self, prog, vers, proc, args=b""):
        with self.conn() as s:
            s.sendall(record(call(0x4000, prog, vers, proc, args)))
            return results(read_record(s))

    def handles(self):
        r = self.rpc(MOUNT, 3, 1, xdr_opaque(self.export.encode()))
        st, ln = struct.unpack(">II", r[:8])
        if st != 0:
            raise ValueError(f"MNT status {st}")
        self.root = r[8:8 + ln]
        self.big = self.lookup(b"big")
        self.bigdir = self.lookup(b"bigdir")

    def lookup(self, name):
        r = self.rpc(NFS, 3, 3, xdr_opaque(self.root) + xdr_opaque(name))
        st, ln = struct.unpack(">II", r[:8])
        if st != 0:
            raise ValueError(f"LOOKUP {name} status {st}")
        return r[8:8 + ln]


def hold(seconds):
    STOP.wait(seconds)


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def a_nonreader(t):
    socks = []
    for c in range(2):
        s = t.conn()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        args = xdr_opaque(t.big) + struct.pack(">QI", 0, 1 << 20)
        s.sendall(b"".join(record(call(c << 16 | i, NFS, 3, 6, args)) for i in range(16)))
        socks.append(s)
    hold(40)
    close_all(socks)


def a_partial(t):
    socks = []
    half = b"\xee" * (512 << 10)
    for _ in range(200):
        if STOP.is_set():
            break
        try:
            s = t.conn()
            s.sendall(struct.pack(">I", 0x80000000 | (1 << 20)) + half)
            socks.append(s)
        except OSError:
            pass
    hold(20)
    close_all(socks)


def a_churn(t):
    for _ in range(2000):
        if STOP.is_set():
            break
        try:
            t.conn().close()
        except OSError:
            pass


def a_idle(t):
    socks = []
    for _ in range(100):
        try:
            socks.append(t.conn())
        except OSError:
            pass
    hold(30)
    close_all(socks)


def a_halfopen(t):
    socks = []
    for _ in range(300):
        if STOP.is_set():
            break
        try:
            socks.append(socket.create_connection((t.host, t.rdma), timeout=5))
        except OSError:
            pass
    if not socks:
        raise ConnectionError("no TCP listener on the RDMA port (RoCE?)")
    hold(15)
    close_all(socks)


def mpa_rev1(t):
    s = socket.create_connection((t.host, t.rdma), timeout=60)
    s.sendall(b"MPA ID Req Frame" + bytes([0, 1, 0, 0]))
    rep = recv_exact(s, 20)
    if rep[:16] != b"MPA ID Rep Frame" or rep[16] & 0x20:
        raise ConnectionError("MPA rejected")
    recv_exact(s, struct.unpack(">H", rep[18:20])[0])
    return s, bool(rep[16] & 0x40)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def fpdu(ulpdu, with_crc):
    f = struct.pack(">H", len(ulpdu)) + ulpdu
    f += b"\0" * ((4 - len(f) % 4) % 4)
    crc = crc32c(f) if with_crc else 0
    return f + struct.pack("<I", crc)


def a_readchunk(t):
    peers = []
    for p in range(4):
        try:
            s, crc = mpa_rev1(t)
        except (OSError, ConnectionError):
            continue
        for i in range(8):
            xid = 0x7000_0000 | p << 8 | i
            head = xdr_opaque(t.big) + struct.pack(">QII", 0, 1 << 20, 2) + struct.pack(">I", 1 << 20)
            msg = call(xid, NFS, 3, 7, head)
            pos = len(msg)
            rdma = struct.pack(">IIII", xid, 1, 32, 0)
            rdma += struct.pack(">IIIIQ", 1, pos, 0x12345678 + i, 1 << 20, 0)
            rdma += struct.pack(">III", 0, 0, 0)
            ddp = bytes([0x41, 0x43]) + struct.pack(">IIII", 0, 0, i + 1, 0)
            s.sendall(fpdu(ddp + rdma + msg, crc))
        peers.append(s)
    if not peers:
        raise ConnectionError("no iWARP listener on the RDMA port (RoCE?)")
    end = time.time() + 60
    for s in peers:
        s.settimeout(1)
        while time.time() < end and not STOP.is_set():
            try:
                if not s.recv(65536):
                    break
            except socket.timeout:
                continue
            except OSError:
                break
    close_all(peers)


def a_mnt(t):
    with t.conn(timeout=60) as s:
        args = xdr_opaque(t.export.encode())
        wire = b"".join(record(call(i, MOUNT, 3, 1, args)) for i in range(5000))
        sender = threading.Thread(target=lambda: s.sendall(wire))
        sender.start()
        for _ in range(5000):
            read_record(s)
        sender.join()


def a_readdir(t):
    socks = []
    args = xdr_opaque(t.bigdir) + struct.pack(">Q", 0) + b"\0" * 8 + struct.pack(">II", 65536, 262144)
    for c in range(2):
        s = t.conn(timeout=120)
        s.sendall(b"".join(record(call(c << 16 | i, NFS, 3, 17, args)) for i in range(64)))
        socks.append(s)
    for s in socks:
        try:
            for _ in range(64):
                read_record(s)
        except (OSError, ConnectionError):
            pass
    close_all(socks)


def a_garbage(t):
    with t.conn() as s:
        bad = [
            call(1, NFS, 3, 22), call(2, NFS, 3, 0xFFFFFFFF, b"\xff" * 64),
            call(3, 0x12345, 1, 0), call(4, NFS, 9, 1),
            call(5, NFS, 3, 1, xdr_opaque(b"\x01" * 64)),
            call(6, NFS, 3, 6, xdr_opaque(b"\x00" * 8) + struct.pack(">QI", 2 ** 63, 0xFFFFFFFF)),
        ]
        for m in bad:
            s.sendall(record(m))
            read_record(s)
        s.sendall(record(b"junk" * 3) + struct.pack(">I", 0x7FFFFFFF))


ATTACKS = {
    "nonreader": a_nonreader, "partial": a_partial, "churn": a_churn, "idle": a_idle,
    "halfopen": a_halfopen, "readchunk": a_readchunk, "mnt": a_mnt, "readdir": a_readdir,
    "garbage": a_garbage,
}


def loop(name, f, t, once):
    while not STOP.is_set():
        try:
            f(t)
            note(name)
        except (OSError, ConnectionError, ValueError, struct.error) as e:
            note(name, False)
            print(f"{name}: {e}", file=sys.stderr)
            hold(1)
        if once:
            return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="127.0.0.1")
    ap.add_argument("--export", required=True)
    ap.add_argument("--tcp-port", type=int, default=2049)
    ap.add_argument("--rdma-port", type=int, default=20049)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--only", default="")
    ap.add_argument("--once", action="store_true")
    a = ap.parse_args()
    ip = ipaddress.ip_address(a.target)
    if not (ip.is_loopback or ip in ipaddress.ip_network("10.77.0.0/16")):
        sys.exit(f"{ip}: only loopback or the interop VM's networks are targets")
    t = Target(a)
    for _ in range(50):
        try:
            t.handles()
            break
        except (OSError, ConnectionError, ValueError) as e:
            err = e
            time.sleep(0.2)
    else:
        sys.exit(f"the target is not reachable: {err}")
    names = [n for n in a.only.split(",") if n] or list(ATTACKS)
    threads = [threading.Thread(target=loop, args=(n, ATTACKS[n], t, a.once), daemon=True) for n in names]
    for th in threads:
        th.start()
    end = time.time() + a.minutes * 60
    while time.time() < end and any(th.is_alive() for th in threads):
        time.sleep(1)
    STOP.set()
    for th in threads:
        th.join(timeout=90)
    for n in names:
        ok, bad = COUNTS.get(n, [0, 0])
        print(f"attack {n}: {ok} rounds done, {bad} refused or cut short")
    os._exit(0)


if __name__ == "__main__":
    main()
