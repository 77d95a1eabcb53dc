#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, cut from the bundled Linux captures.

Usage: scripts/fuzz-seeds.py   (writes fuzz/corpus/<target>/, which git ignores)
"""
import hashlib
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAPS = ROOT / "fixtures" / "captures"
OUT = ROOT / "fuzz" / "corpus"


def frames(path):
    data = path.read_bytes()
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def save(target, blob, seen):
    key = (target, hashlib.sha1(blob).hexdigest())
    if key in seen or not blob:
        return
    seen.add(key)
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / key[1]).write_bytes(blob)


# iwarp_engine input (see fuzz/fuzz_targets/iwarp_engine.rs): a configuration octet, then
# records led by a little-endian u16: a ULPDU (length, STag patch, no-drain bit) or a local
# action (0x8000 | kind << 11 | flags, then 8 octets of parameters).
IW_CONF = 0x3F  # default MULPDU, IRD = ORD = 16, RV 1, region B plain


def iw_ulpdu(u, patch=0, drain=True):
    assert len(u) <= 0x7FF
    return struct.pack("<H", len(u) | patch << 11 | (0 if drain else 0x2000)) + u


def iw_action(kind, flags=0, x=0):
    return struct.pack("<HQ", 0x8000 | kind << 11 | flags, x)


def iw_recv(off=0, length=0xFFF):
    return iw_action(0, 0, off | length << 12)


def iw_untagged(op, qn, msn, body=b"", stag=0, mo=0, last=True):
    return bytes([0x41 if last else 0x01, 0x40 | op]) + struct.pack(">IIII", stag, qn, msn, mo) + body


def iw_tagged(op, stag, to, payload, last=True):
    return bytes([0xC1 if last else 0x81, 0x40 | op]) + struct.pack(">IQ", stag, to) + payload


def iw_atomic_req(msn, aop, ident, to, data, mask, cmp_data, cmp_mask):
    body = struct.pack(">IIIQQQQQ", aop, ident, 0, to, data, mask, cmp_data, cmp_mask)
    return iw_untagged(0xA, 1, msn, body)


def iwarp_engine_seeds(seen):
    """Hand-made exchanges (RFC 5040 and RFC 7306), then the ULPDUs of the siw captures."""
    pay = bytes(range(256))
    imm = lambda msn, val, word, se=False: iw_untagged(0x9 if se else 0x8, 0, msn, struct.pack(">II", val, word))
    hand = [
        # Send into a posted receive, two segments.
        iw_recv() + iw_ulpdu(iw_untagged(0x3, 0, 1, pay[:100], last=False))
        + iw_ulpdu(iw_untagged(0x3, 0, 1, pay[:60], mo=100)),
        # RDMA Write into region A, then a Send with SE.
        iw_recv() + iw_ulpdu(iw_tagged(0x0, 0, 0x100, pay[:64]), patch=1)
        + iw_ulpdu(iw_untagged(0x5, 0, 1, pay[:8])),
        # Read Request from region A (two of them before any drain), answered.
        iw_ulpdu(iw_untagged(0x1, 1, 1, struct.pack(">IQIIQ", 0x1234, 0, 300, 0, 0x80)), patch=1, drain=False)
        + iw_ulpdu(iw_untagged(0x1, 1, 2, struct.pack(">IQIIQ", 0x1234, 512, 8, 0, 0)), patch=1),
        # Atomic Requests: FetchAdd, then CmpSwap (all-ones masks), then a Swap (refused).
        iw_ulpdu(iw_atomic_req(1, 0, 1, 0x10, 5, 0, 0, 0), patch=1)
        + iw_ulpdu(iw_atomic_req(2, 2, 2, 0x10, 9, (1 << 64) - 1, 5, (1 << 64) - 1), patch=1)
        + iw_ulpdu(iw_atomic_req(3, 1, 3, 0x18, 1, 0, 0, 0), patch=1),
        # Send with immediate: Immediate Data (Send follows), then the Send.
        iw_recv() + iw_ulpdu(imm(1, 0xDEADBEEF, 0x8000_0000)) + iw_ulpdu(iw_untagged(0x3, 0, 2, pay[:32])),
        # Write with immediate: the Write, then Immediate Data with SE carrying its length.
        iw_recv() + iw_ulpdu(iw_tagged(0x0, 0, 0x200, pay[:48]), patch=1) + iw_ulpdu(imm(1, 7, 48, se=True)),
        # Local RDMA Read of 256 octets into A at 0, answered by a Read Response.
        iw_action(6, 1, 256 << 12 | 0x77 << 32) + iw_ulpdu(iw_tagged(0x2, 0, 0, pay[:200], last=False), patch=1)
        + iw_ulpdu(iw_tagged(0x2, 0, 200, pay[:56]), patch=1),
        # Local FetchAdd and CmpSwap, answered by Atomic Responses on QN 3.
        iw_action(7, 1, 0x10 | 8 << 12 | 0x77 << 32) + iw_action(8, 1, 0x18 | 8 << 12 | 0x77 << 32)
        + iw_ulpdu(iw_untagged(0xB, 3, 1, struct.pack(">IQ", 1, 41)))
        + iw_ulpdu(iw_untagged(0xB, 3, 2, struct.pack(">IQ", 2, 42))),
        # Local Send, Write, Send with immediate, Write with immediate.
        iw_action(3, 1, 0x40 << 12) + iw_action(5, 1, 0x300 << 12 | 0x77 << 32)
        + iw_action(9, 1, 0x10 << 12 | 0x1234 << 32) + iw_action(10, 1, 0x20 << 12 | 0x77 << 32),
        # Send with Invalidate of region B (fast-registered), then a Write to it.
        iw_recv() + iw_ulpdu(iw_untagged(0x4, 0, 1, pay[:16]), patch=2)
        + iw_ulpdu(iw_tagged(0x0, 0, 0x10000, pay[:16]), patch=2),
        # A Terminate from the peer (RFC 5040 layout: RDMAP, Remote Protection, Invalid STag;
        # no headers).
        iw_action(3, 1, 0x40 << 12) + iw_ulpdu(iw_untagged(0x7, 2, 1, bytes([0x01, 0x00, 0, 0]))),
    ]
    for i, blob in enumerate(hand):
        conf = IW_CONF | (0x80 if i == 9 else 0)
        save("iwarp_engine", bytes([conf]) + blob, seen)

    # Captured siw traffic, one direction of one stream at a time, 32 ULPDUs per seed.
    for cap in sorted(CAPS.glob("*siw*.pcap")):
        flows = {}
        for fr in frames(cap):
            if len(fr) < 34 or fr[12:14] != b"\x08\x00":
                continue
            ip = fr[14:]
            ihl = (ip[0] & 0xF) * 4
            ip = ip[:struct.unpack(">H", ip[2:4])[0]]
            if ip[9] != 6:
                continue
            l4 = ip[ihl:]
            if len(l4) < 20:
                continue
            payload = l4[(l4[12] >> 4) * 4:]
            if len(payload) < 8 or payload.startswith(b"MPA ID Re"):
                continue
            n = struct.unpack(">H", payload[:2])[0]
            if n > 0x7FF or 2 + n > len(payload):
                continue
            flows.setdefault((ip[12:20], l4[:4]), []).append(payload[2:2 + n])
        for ulpdus in flows.values():
            for start in range(0, min(len(ulpdus), 128), 32):
                blob = bytes([IW_CONF]) + iw_recv() * 4
                for u in ulpdus[start:start + 32]:
                    blob += iw_ulpdu(u, patch=1)
                save("iwarp_engine", blob, seen)


def main():
    seen = set()
    for cap in sorted(CAPS.glob("*.pcap")):
        for fr in frames(cap):
            if len(fr) < 34 or fr[12:14] != b"\x08\x00":
                continue
            ip = fr[14:]
            ihl = (ip[0] & 0xF) * 4
            total = struct.unpack(">H", ip[2:4])[0]
            ip = ip[:total]
            proto = ip[9]
            l4 = ip[ihl:]
            if proto == 17 and len(l4) >= 8 and struct.unpack(">H", l4[2:4])[0] == 4791:
                save("rocev2", ip, seen)
                save("roce_endpoint", ip, seen)
                transport = l4[8:-4]
                save("ib_packet", transport, seen)
                # A UD Send to QP1 (BTH, DETH, then the 256-octet MAD): the CM's input.
                if len(transport) >= 20 + 256 and transport[5:8] == b"\x00\x00\x01":
                    save("ib_cm", transport[20:20 + 256], seen)
                if len(transport) > 12 and transport[0] in (0x00, 0x04, 0x05, 0x17):
                    save("rpcrdma", transport[12:], seen)
                    save("onc_rpc", transport[12 + 28:], seen)
            elif proto == 6 and len(l4) >= 20:
                doff = (l4[12] >> 4) * 4
                payload = l4[doff:]
                if payload.startswith(b"MPA ID Re"):
                    save("mpa_frame", payload, seen)
                elif len(payload) >= 8:
                    save("mpa_fpdu", b"\x00\x00\x00\x00\x00" + payload, seen)
                    save("ddp_rdmap", payload[2:], seen)
                    if len(payload) > 20 + 28:
                        save("rpcrdma", payload[20:], seen)
    iwarp_engine_seeds(seen)
    # Whole small captures for the decoder target (mode octet 0 = pcap as-is).
    for cap in sorted(CAPS.glob("*.pcap")):
        blob = cap.read_bytes()
        if len(blob) <= 16384:
            save("decode_capture", b"\x00" + blob, seen)
    for t in sorted({t for t, _ in seen}):
        print(t, len(list((OUT / t).iterdir())))


if __name__ == "__main__":
    main()
