#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, cut from the bundled Linux captures.

Usage: scripts/fuzz-seeds.py   (writes fuzz/seeds/<target>/, which git ignores; the minimised
corpora the fuzz runs grew are kept in fuzz/corpus/<target>/)
"""
import hashlib
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAPS = ROOT / "fixtures" / "captures"
OUT = ROOT / "fuzz" / "seeds"


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


# iwarp_connection input (see fuzz/fuzz_targets/iwarp_connection.rs): a configuration octet
# (bit 0 Responder, 1 CRC, 2 Markers, 3-4 mode, 5 early FPDUs, 6-7 FPDU sizing), then
# records led by a little-endian u16: the peer's stream octets (raw, or one ULPDU the target
# frames itself after a cut octet, with an STag patch) or a local action (0x8000 | kind << 11
# | flags, then 8 octets of parameters).
IC_RESPONDER, IC_CRC, IC_MARKERS, IC_EARLY = 0x01, 0x02, 0x04, 0x20
IC_P2P, IC_REV1, IC_SRQ = 1 << 3, 2 << 3, 3 << 3
IC_CHUNK = 1000


def ic_raw(octets, direct=False, hold=False):
    """Stream records of at most IC_CHUNK octets (an empty one for no octets)."""
    out = b""
    for i in range(0, max(len(octets), 1), IC_CHUNK):
        c = octets[i:i + IC_CHUNK]
        out += struct.pack("<H", len(c) | (0x2000 if direct else 0) | (0x4000 if hold else 0)) + c
    return out


def ic_ulpdu(u, patch=0, cut=0, direct=False, hold=False):
    assert len(u) <= 0x3FF
    h = len(u) | 0x400 | patch << 11 | (0x2000 if direct else 0) | (0x4000 if hold else 0)
    return struct.pack("<HB", h, cut) + u


def ic_action(kind, flags=0, x=0):
    return struct.pack("<HQ", 0x8000 | kind << 11 | flags, x)


def ic_save(conf, body, seen, both=True):
    """Saves the input; with `both` also one octet longer, the other parity: even-length
    inputs transmit into a Vec, odd-length ones through a TxBuf (a lone last octet is no
    record)."""
    blob = bytes([conf]) + body
    save("iwarp_connection", blob, seen)
    if both:
        save("iwarp_connection", blob + b"\0", seen)


def ic_sge(off=0, length=0xFFF):
    """An entry in region A (action parameters: offset bits 0-11, length bits 12-24)."""
    return off | length << 12


def ic_recv(off=0, length=0x1000):
    return ic_action(0, 0, ic_sge(off, length))


ACCEPT_16_16 = ic_action(9, 0, 3 << 16 | 3 << 32)  # no Private Data, IRD = ORD = 16


def mpa_frame(kind, flags=0x10, rev=2, word=None, pd=b""):
    """An MPA Request or Reply (RFC 5044 §7.1; RFC 6581 IRD/ORD word for Rev 2)."""
    body = (struct.pack(">HH", *word) if word is not None else b"") + pd
    key = b"MPA ID Req Frame" if kind == "req" else b"MPA ID Rep Frame"
    return key + bytes([flags, rev]) + struct.pack(">H", len(body)) + body


def tcp_streams(path):
    """The payload of each direction of each TCP connection, in sequence order, up to the
    first gap (retransmissions and reordering of the lossy captures undone)."""
    segs, syn = {}, {}
    for fr in frames(path):
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
        key = (ip[12:16], l4[0:2], ip[16:20], l4[2:4])
        seq = struct.unpack(">I", l4[4:8])[0]
        if l4[13] & 0x02:
            syn[key] = (seq + 1) & 0xFFFFFFFF
        payload = l4[(l4[12] >> 4) * 4:]
        if payload:
            segs.setdefault(key, []).append((seq, payload))
    streams = {}
    for key, lst in segs.items():
        start = syn.get(key, lst[0][0])
        stream = bytearray()
        for rel, p in sorted(((seq - start) & 0xFFFFFFFF, p) for seq, p in lst):
            if rel > len(stream):
                break
            stream += p[len(stream) - rel:]
        streams[key] = bytes(stream)
    return streams


def iwarp_connection_seeds(seen):
    """Both directions of every captured MPA connection (the Initiator's stream for our
    Responder, the Responder's for our Initiator), then hand-made exchanges."""
    for cap in sorted(CAPS.glob("*.pcap")):
        streams = tcp_streams(cap)
        for key, req in streams.items():
            rep = streams.get((key[2], key[3], key[0], key[1]), b"")
            if not req.startswith(b"MPA ID Req Frame") or not rep.startswith(b"MPA ID Rep Frame"):
                continue
            req_len, rep_len = 20 + struct.unpack(">H", req[18:20])[0], 20 + struct.unpack(">H", rep[18:20])[0]
            crc = IC_CRC if (req[16] | rep[16]) & 0x40 else 0
            p2p = req[17] == 2 and len(req) >= 24 and req[20] & 0x80
            recvs = ic_recv() * 16
            # Our Responder: the Request, our accept, then what the Initiator sent.
            mode = IC_P2P if p2p else 0
            conf = IC_RESPONDER | crc | (IC_MARKERS if rep[16] & 0x80 else 0) | mode
            body = recvs + ic_raw(req[:req_len]) + ACCEPT_16_16 + ic_raw(req[req_len:req_len + 6000])
            ic_save(conf, body, seen, both=False)
            # Our Initiator: the Reply (and the FPDUs siw sends right after it), then on.
            mode = IC_REV1 if rep[17] == 1 else (IC_P2P if p2p else 0)
            conf = crc | (IC_MARKERS if req[16] & 0x80 else 0) | mode | IC_EARLY
            ic_save(conf, recvs + ic_raw(rep[:rep_len + 6000]), seen, both=False)
            # The same, read with direct placement, in both parities.
            ic_save(conf, recvs + ic_raw(rep[:rep_len + 6000], direct=True), seen)

    pay = bytes(range(256)) * 4
    request = mpa_frame("req", 0x10, 2, (16, 16), b"hello")
    reply = mpa_frame("rep", 0x10, 2, (16, 16), b"welcome")
    # What a peer sends once connected: Sends (one of two segments), a Write and a Read
    # Request into region A, then the Read Response to a Read of ours (256 octets into A at
    # 0x800, posted first), an Atomic Request, a Send with SE.
    ours = ic_recv() * 4 + ic_action(5, 0x100 | 4, ic_sge(0x800, 256) | 0x77 << 32)

    def traffic(msn=1):
        return (
            ic_ulpdu(iw_untagged(0x3, 0, msn, pay[:100]))
            + ic_ulpdu(iw_untagged(0x3, 0, msn + 1, pay[:300], last=False), cut=7)
            + ic_ulpdu(iw_untagged(0x3, 0, msn + 1, pay[:60], mo=300), cut=1)
            + ic_ulpdu(iw_tagged(0x0, 0, 0x100, pay[:500]), patch=1, cut=64)
            + ic_ulpdu(iw_untagged(0x1, 1, 1, struct.pack(">IQIIQ", 0x1234, 0, 300, 0, 0x80)), patch=1)
            + ic_ulpdu(iw_tagged(0x2, 0, 0x800, pay[:200], last=False), patch=1)
            + ic_ulpdu(iw_tagged(0x2, 0, 0x800 + 200, pay[:56]), patch=1)
            + ic_ulpdu(iw_atomic_req(2, 0, 1, 0x10, 5, 0, 0, 0), patch=1)
            + ic_ulpdu(iw_untagged(0x5, 0, msn + 2, pay[:8]))
        )

    # Local Send, Write, Send with immediate.
    local = ic_action(2, 0x100, ic_sge(0, 0x40)) + ic_action(4, 0x100 | 2, ic_sge(0, 0x300) | 0x77 << 32) \
        + ic_action(7, 0x100, ic_sge(0, 0x10) | 0x1234 << 32)
    # A Write and a Send read with direct placement, FPDUs cut in pieces.
    direct = (
        ic_ulpdu(iw_tagged(0x0, 0, 0x200, pay[:900]), patch=1, cut=100, direct=True)
        + ic_ulpdu(iw_untagged(0x3, 0, 1, pay[:700]), cut=33, direct=True)
        + traffic(2)
    )
    rtr = ic_ulpdu(iw_tagged(0x0, 0, 0, b""))
    # A Read of 512 octets into region B, its response read straight into B, B revoked
    # before the response's last octets (held back, then sent).
    read_b = ic_action(6, 0x100, 512 << 35) + ic_ulpdu(
        iw_tagged(0x2, 0, 0x10000, pay[:512]), patch=2, cut=0x80 | 100, direct=True
    ) + ic_action(15, 3) + ic_raw(b"")
    # A Send gathered from A and B, framed but not written, then B revoked (odd-length
    # inputs: the TxBuf's reference to B fails).
    send_b = ic_action(2, 0x520, ic_sge(0, 0x10) | 0x200 << 35) + ic_action(14, 0x403) + ic_action(15, 3)
    hand = [
        (IC_RESPONDER | IC_CRC, ours + ic_raw(request) + ACCEPT_16_16 + traffic() + local + ic_action(13)),
        (IC_RESPONDER | IC_MARKERS, ours + ic_raw(request) + ACCEPT_16_16 + traffic() + local),
        (IC_RESPONDER | IC_EARLY | 0x40, ours + local + ic_raw(request[:7]) + ic_raw(request[7:]) + ACCEPT_16_16 + traffic()),
        (IC_RESPONDER | IC_CRC | 0x80, ours + ic_raw(request) + ACCEPT_16_16 + direct),
        (IC_RESPONDER | IC_P2P, ours + ic_raw(mpa_frame("req", 0x10, 2, (0x8000 | 16, 0x8000 | 16))) + ACCEPT_16_16 + rtr + traffic() + local),
        (IC_RESPONDER | IC_SRQ, ic_raw(request) + ACCEPT_16_16 + ic_ulpdu(iw_untagged(0x3, 0, 1, pay[:100]))
         + ic_action(15, 0, ic_sge(0, 0x100)) + ic_ulpdu(iw_untagged(0x3, 0, 2, pay[:50])) + ic_action(15, 0, ic_sge(0, 0x100))),
        (IC_RESPONDER | IC_REV1, ours + ic_raw(mpa_frame("req", 0x40, 1, None, b"rev1")) + ACCEPT_16_16 + traffic()),
        (IC_RESPONDER, ic_raw(request) + ic_action(10, 0, 5)),
        (IC_RESPONDER | IC_CRC, ic_raw(request[:10]) + ic_action(11, 0, 11000)),
        (IC_CRC, ours + ic_raw(reply) + traffic() + local),
        (IC_MARKERS | IC_EARLY, ours + local + ic_raw(reply) + traffic() + ic_action(12)),
        (IC_CRC | 0xC0, ours + ic_raw(reply[:3]) + ic_raw(reply[3:]) + direct),
        (IC_P2P, ours + local + ic_raw(mpa_frame("rep", 0x10, 2, (0x8000 | 16, 0x8000 | 16))) + traffic()),
        # The RTR still owed when the peer's FIN comes, or when we close.
        (IC_P2P, ic_raw(mpa_frame("rep", 0x10, 2, (0x8000 | 16, 0x8000 | 16)), hold=True) + ic_action(12)),
        (IC_P2P, ic_raw(mpa_frame("rep", 0x10, 2, (0x8000 | 16, 0x8000 | 16)), hold=True) + ic_action(13)),
        (IC_REV1 | IC_EARLY, ours + ic_raw(mpa_frame("rep", 0x00, 1, None, b"rev1")) + traffic()),
        (IC_SRQ, ic_raw(reply) + ic_ulpdu(iw_untagged(0x3, 0, 1, pay[:100])) + ic_action(15, 0, ic_sge(0, 0x100))),
        (0, ic_raw(mpa_frame("rep", 0x30, 2, (0, 0), b"no"))),
        (IC_CRC, ic_action(11, 0, 5000) + ic_action(11, 0, 6000)),
        (IC_RESPONDER | IC_CRC, ic_recv() * 4 + ic_raw(request) + ACCEPT_16_16
         + ic_ulpdu(iw_untagged(0x3, 0, 1, pay[:10])) + read_b),
        (IC_RESPONDER, ic_recv() + ic_raw(request) + ACCEPT_16_16 + ic_ulpdu(iw_untagged(0x3, 0, 1, pay[:10])) + send_b),
        (IC_CRC | IC_MARKERS, ic_recv() * 4 + ic_raw(reply) + read_b),
        (0, ic_raw(reply) + send_b + ic_ulpdu(iw_tagged(0x0, 0, 0x300, pay[:300]), patch=1, cut=0x80 | 50)
         + ic_action(13) + ic_raw(b"")),
    ]
    for conf, blob in hand:
        # Both parities; the TxBuf variant also writes 100-octet pieces at the end.
        ic_save(conf, blob, seen)
        ic_save(conf, blob + ic_action(14, 3, 100 << 16), seen)


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
    iwarp_connection_seeds(seen)
    # Whole small captures for the decoder target (mode octet 0 = pcap as-is).
    for cap in sorted(CAPS.glob("*.pcap")):
        blob = cap.read_bytes()
        if len(blob) <= 16384:
            save("decode_capture", b"\x00" + blob, seen)
    for t in sorted({t for t, _ in seen}):
        print(t, len(list((OUT / t).iterdir())))


if __name__ == "__main__":
    main()
