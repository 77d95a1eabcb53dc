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
    # Whole small captures for the decoder target (mode octet 0 = pcap as-is).
    for cap in sorted(CAPS.glob("*.pcap")):
        blob = cap.read_bytes()
        if len(blob) <= 16384:
            save("decode_capture", b"\x00" + blob, seen)
    for t in sorted({t for t, _ in seen}):
        print(t, len(list((OUT / t).iterdir())))


if __name__ == "__main__":
    main()
