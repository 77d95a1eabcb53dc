#!/usr/bin/env python3
"""The files of this workspace an RDMA Write's code runs in, from a callgrind profile.

Reads a callgrind output file (a run under `--toggle-collect` of the example's probe with
`--separate-callers`, so that a function called on two paths is two nodes; see
scripts/write-path.sh) and builds the call graph of the workspace's functions:
a call through code outside the workspace (std, parking_lot, a closure run by an iterator)
is an edge between the workspace functions at its two ends. For each entry point (a
regular expression searched in a function's path, e.g. `Qp::post_send$`) it prints the workspace files reached
from it, nearest first, and the file-level calls that go back to a file the path already
passed: edges inside a cycle of the file graph (a callback, a helper in a file left
earlier).

Usage: scripts/write-path.py CALLGRIND_OUT ENTRY [ENTRY ...] [--root DIR] [--crate softrdma]
       scripts/write-path.py --self-test
"""

import argparse
import re
import sys
from collections import defaultdict, deque

NAME_RE = re.compile(r"^\((\d+)\)(?: (.*))?$")
ESCAPES = {"$LT$": "<", "$GT$": ">", "$RF$": "&", "$BP$": "*", "$C$": ",", "$SP$": "@",
           "$u20$": " ", "$u27$": "'", "$u5b$": "[", "$u5d$": "]", "$u7b$": "{",
           "$u7d$": "}", "$u7e$": "~", "$u3b$": ";", "$u2b$": "+", "$u22$": '"'}


def demangle(name):
    """A legacy-mangled Rust symbol (`_ZN...E`, the profile is run with `--demangle=no`
    so that each instantiation keeps its own hash) as a path; other names unchanged."""
    # `--separate-callers`: the function, then its callers, apostrophe-separated.
    name = re.sub(r"\.llvm\.\d+$", "", name.split("'")[0])
    if not name.startswith("_ZN") or not name.endswith("E"):
        return name
    body, segs, i = name[3:-1], [], 0
    while i < len(body):
        j = i
        while j < len(body) and body[j].isdigit():
            j += 1
        if j == i:
            return name
        n = int(body[i:j])
        seg = body[j : j + n]
        # A segment that starts with an escape is written with a leading underscore.
        segs.append(seg[1:] if seg.startswith("_$") else seg)
        i = j + n
    if segs and re.fullmatch(r"h[0-9a-f]{16}", segs[-1]):
        segs.pop()
    out = "::".join(segs)
    for k, v in ESCAPES.items():
        out = out.replace(k, v)
    return out.replace("..", "::")


def parse(lines):
    """Functions' files, calls between functions and inlined files, from callgrind text."""
    names = {"fl": {}, "fn": {}}
    fn_file = {}
    calls = defaultdict(set)
    inlined = defaultdict(set)
    fl = fn = None
    cur_file = None

    def name(kind, text):
        m = NAME_RE.match(text)
        if not m:
            return text
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), text)

    for line in lines:
        line = line.rstrip("\n")
        key, _, val = line.partition("=")
        if key == "fl":
            fl = name("fl", val)
        elif key in ("fi", "fe"):
            cur_file = name("fl", val)
            if fn is not None and cur_file != fl:
                inlined[fn].add(cur_file)
        elif key == "fn":
            fn = name("fn", val)
            fn_file.setdefault(fn, fl)
            cur_file = fl
        elif key in ("cfi", "cfl"):
            name("fl", val)
        elif key == "cfn":
            callee = name("fn", val)
            if fn is not None:
                calls[fn].add(callee)
    return fn_file, calls, inlined


def project_file(path, root):
    """The workspace-relative path of a file under `root`'s crates/, else None."""
    if path is None:
        return None
    p = path
    if p.startswith(root.rstrip("/") + "/"):
        p = p[len(root.rstrip("/")) + 1 :]
    if p.startswith("crates/") and "/examples/" not in p:
        return p
    return None


def collapse(fn_file, calls, root):
    """Workspace function -> workspace functions it reaches through non-workspace code."""
    out = {}
    for f in fn_file:
        if project_file(fn_file.get(f), root) is None:
            continue
        seen, todo, reach = {f}, deque(calls.get(f, ())), set()
        while todo:
            g = todo.popleft()
            if g in seen:
                continue
            seen.add(g)
            if project_file(fn_file.get(g), root) is not None:
                reach.add(g)
            else:
                todo.extend(calls.get(g, ()))
        out[f] = reach
    return out


def sccs(nodes, edges):
    """Strongly connected components (Tarjan, iterative)."""
    index, low, on, stack, comps, n = {}, {}, set(), [], [], [0]

    for v in nodes:
        if v in index:
            continue
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            u, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[u] = min(low[u], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[u])
                if low[u] == index[u]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == u:
                            break
                    comps.append(comp)
    return comps


def path_from(entry_fns, fn_file, collapsed, inlined, root):
    """(`inlined`: function -> files whose code was inlined into it; empty to count calls
    only.)"""
    """Files reached from `entry_fns` (breadth first) and the file graph's back edges."""
    pf = lambda f: project_file(fn_file.get(f), root)  # noqa: E731
    order, seen_f, todo = [], set(entry_fns), deque(entry_fns)
    fedges = defaultdict(set)
    why = defaultdict(set)
    while todo:
        f = todo.popleft()
        a = pf(f)
        if a not in order:
            order.append(a)
        for i in sorted(inlined.get(f, ())):
            b = project_file(i, root)
            if b and b != a:
                fedges[a].add(b)
                if b not in order:
                    order.append(b)
        for g in sorted(collapsed.get(f, ())):
            b = pf(g)
            if b != a:
                fedges[a].add(b)
                why[(a, b)].add((demangle(f), demangle(g)))
            if g not in seen_f:
                seen_f.add(g)
                todo.append(g)
    comps = [c for c in sccs(order, fedges) if len(c) > 1]
    returns = sorted(
        (a, b) for c in comps for a in c for b in fedges.get(a, ()) if b in c
    )
    return order, returns, why


def report(out, entries, root, crate, verbose=False, with_inlined=False):
    with open(out, encoding="utf-8", errors="replace") as fh:
        fn_file, calls, inlined = parse(fh)
    if not with_inlined:
        inlined = {}
    collapsed = collapse(fn_file, calls, root)
    ok = True
    union = []
    for e in entries:
        fns = [f for f in collapsed if re.search(e, demangle(f))]
        if not fns:
            print(f"{e}: not in the profile")
            ok = False
            continue
        order, returns, why = path_from(fns, fn_file, collapsed, inlined, root)
        mine = [f for f in order if f.startswith(f"crates/{crate}/")]
        union += [f for f in order if f not in union]
        print(f"from {e}: {len(order)} files of the workspace, {len(mine)} of crates/{crate}")
        for f in order:
            print(f"  {f}")
        print(f"  file-level calls back into a file already passed: {len(returns)}")
        for a, b in returns:
            print(f"    {a} -> {b}")
            if verbose:
                for f, g in sorted(why[(a, b)]):
                    print(f"        {f}  ->  {g}")
    if len(entries) > 1:
        mine = [f for f in union if f.startswith(f"crates/{crate}/")]
        print(f"all together: {len(union)} files of the workspace, {len(mine)} of crates/{crate}")
    return ok


SAMPLE = """\
fl=(1) /w/crates/a/src/qp.rs
fn=(1) a::qp::post
5 10
cfl=(2) /usr/lib/rust/std.rs
cfn=(2) std::thing
calls=1 0
5 3
cfl=(3) /w/crates/a/src/tx.rs
cfn=(3) a::tx::send
calls=1 0
6 4
fl=(2)
fn=(2)
1 1
cfl=(4) /w/crates/a/src/cq.rs
cfn=(4) a::cq::push
calls=1 0
1 1
fl=(3)
fn=(3)
2 2
cfl=(1)
cfn=(5) a::qp::helper
calls=1 0
2 1
fl=(4)
fn=(4)
3 3
fl=(1)
fn=(5)
4 4
"""


def self_test():
    fn_file, calls, inlined = parse(SAMPLE.splitlines())
    collapsed = collapse(fn_file, calls, "/w")
    assert collapsed["a::qp::post"] == {"a::cq::push", "a::tx::send"}, collapsed
    assert demangle("_ZN8softrdma2qp2Qp9post_send17h891370d1a8016c83E") == "softrdma::qp::Qp::post_send"
    assert demangle(
        "_ZN8softrdma3tcp2qp5TcpQp14post_send_list28_$u7b$$u7b$closure$u7d$$u7d$17hfe73c181f0847b3cE"
    ) == "softrdma::tcp::qp::TcpQp::post_send_list::{{closure}}"
    assert demangle("_ZN8softrdma4roce2rx8hand_out17h7dff5b9fc79ce04bE.llvm.98317") == (
        "softrdma::roce::rx::hand_out"
    )
    order, returns, _ = path_from(["a::qp::post"], fn_file, collapsed, inlined, "/w")
    assert order == ["crates/a/src/qp.rs", "crates/a/src/cq.rs", "crates/a/src/tx.rs"], order
    assert returns == [
        ("crates/a/src/qp.rs", "crates/a/src/tx.rs"),
        ("crates/a/src/tx.rs", "crates/a/src/qp.rs"),
    ], returns
    # Without the helper call back into qp.rs there is no cycle.
    calls["a::tx::send"].clear()
    collapsed = collapse(fn_file, calls, "/w")
    _, returns, _ = path_from(["a::qp::post"], fn_file, collapsed, inlined, "/w")
    assert returns == [], returns
    print("write-path self-test: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("entries", nargs="*")
    ap.add_argument("--root", default=".")
    ap.add_argument("--crate", default="softrdma")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--why", action="store_true", help="the function calls behind each")
    ap.add_argument(
        "--inlined",
        action="store_true",
        help="count files whose code was inlined too (an optimised build's line tables "
        "attribute instructions loosely; by default only calls count)",
    )
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.out or not a.entries:
        ap.error("CALLGRIND_OUT and at least one ENTRY")
    import os

    return 0 if report(a.out, a.entries, os.path.abspath(a.root), a.crate, a.why, a.inlined) else 1


if __name__ == "__main__":
    sys.exit(main())
