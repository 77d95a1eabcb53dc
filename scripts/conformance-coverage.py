#!/usr/bin/env python3
"""Count which conformance-matrix rows the tests name.

Usage: scripts/conformance-coverage.py [--kind "wire format"] [--matrix PATH] [--list-missing]

A row counts as covered when its id (e.g. MPA-11, IBT-C9-2, EXT-ROCE-02) appears in a
test source under crates/ or fuzz/ (in a test name with '-' written as '_', or in a comment).
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def matrix_rows(path):
    rows = []
    for line in path.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| Id") or line.startswith("| Protocol"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 6 or not re.match(r"^[A-Z]+(-[A-Za-z0-9.]+)+$", cells[0]):
            continue
        rows.append({"id": cells[0], "kind": cells[4], "test": cells[5]})
    return rows


def variants(rid):
    # MPA-11 -> MPA-11, mpa_11 ; IBT-C9-2 -> ibt_c9_2 ; IBT-o9-3.a1 -> ibt_o9_3_a1
    under = re.sub(r"[-.]", "_", rid).lower()
    return [rid, under]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default=None)
    ap.add_argument("--matrix", default=str(ROOT / "docs/spec/conformance-matrix.md"))
    ap.add_argument("--list-missing", action="store_true")
    a = ap.parse_args()
    rows = matrix_rows(pathlib.Path(a.matrix))
    if a.kind:
        rows = [r for r in rows if r["kind"] == a.kind]
    text = "\n".join(
        p.read_text(errors="replace")
        for d in ("crates", "fuzz")
        for p in (ROOT / d).rglob("*.rs")
        if "target" not in p.parts
    )
    covered, missing = [], []
    for r in rows:
        hit = False
        for v in variants(r["id"]):
            # whole-token match so MPA-1 does not match MPA-11
            if re.search(r"(?<![A-Za-z0-9_])" + re.escape(v) + r"(?![0-9])", text, re.I):
                hit = True
                break
        (covered if hit else missing).append(r)
    by_proto = {}
    for r in rows:
        p = r["id"].split("-")[0]
        c = by_proto.setdefault(p, [0, 0])
        c[1] += 1
        if r in covered:
            c[0] += 1
    for p, (c, t) in sorted(by_proto.items()):
        print(f"{p:8} {c:4}/{t:<4}")
    print(f"{'total':8} {len(covered):4}/{len(rows):<4}")
    if a.list_missing:
        for r in missing:
            print(f"missing {r['id']:14} {r['test'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
