#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a cycle.

For every crate under crates/, each source file is a module (`a.rs` or `a/mod.rs` is `a`,
`a/b.rs` is `a::b`). A reference to `crate::x::y::...` (in a `use` or in a path) or to
`super::x` is an edge from the referencing module to the module it names. Edges are
compared between siblings: `a::b` naming `a::c` is an edge b -> c inside `a`; `a::b`
naming `d::e` is an edge a -> d at the crate's top level. A child using its parent (or the
parent its child) is not an edge: a child module is part of its parent's implementation.
Test modules (`tests`, files under a `tests/` directory) are left out.

Floors: LAYERS names, per crate, modules that must not name others at all (an edge from
the first group to the second fails, cycle or not): the verbs API of `softrdma` speaks to
its transports through `provider` only; the drivers are chosen in `device`.

Usage: scripts/module-cycles.py [ROOT]   (exit 1 and a report when a cycle exists)
       scripts/module-cycles.py --self-test
"""

import re
import sys
from pathlib import Path

PATH_RE = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super)::\{", re.S)


LAYERS = {
    "softrdma": [(("qp", "cm", "mr", "srq", "cq"), ("tcp", "roce"))],
}


def module_of(src: Path, f: Path) -> tuple:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def group_heads(text: str, start: int) -> list:
    """The first path segment of each item of a `use x::{a, b::c, ...}` group."""
    depth, i, item, heads = 1, start, "", []
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if depth == 1 and c == ",":
            heads.append(item)
            item = ""
        elif depth >= 1 and not (depth == 1 and c == "{"):
            item += c
        i += 1
    heads.append(item)
    out = []
    for h in heads:
        h = h.strip().lstrip("{").strip()
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", h)
        if m:
            out.append(m.group(0))
    return out


def edges_of(mod: tuple, text: str, modules: set) -> set:
    refs = []
    for m in PATH_RE.finditer(text):
        base = () if m.group(1) == "crate" else mod[:-1]
        segs = [s for s in m.group(2).split("::") if s]
        if m.group(1) == "super":
            # `super::super::x`
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
        refs.append(base + tuple(segs))
    for m in USE_GROUP_RE.finditer(text):
        base = () if m.group(1) == "crate" else mod[:-1]
        for head in group_heads(text, m.end()):
            refs.append(base + (head,))
    out = set()
    for r in refs:
        # The longest module that prefixes the path.
        target = None
        for k in range(len(r), 0, -1):
            if r[:k] in modules:
                target = r[:k]
                break
        if target is None or target == mod:
            continue
        # Compare at the first level where the two differ.
        k = 0
        while k < min(len(mod), len(target)) and mod[k] == target[k]:
            k += 1
        if k == len(mod) or k == len(target):
            continue  # parent and child
        out.add((mod[: k + 1], target[: k + 1]))
    return out


def find_cycle(graph: dict):
    state, stack = {}, []

    def dfs(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if state.get(m) is None:
                c = dfs(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if state.get(n) is None:
            c = dfs(n)
            if c:
                return c
    return None


def self_test() -> int:
    """The check finds a cycle it is shown, through `use` groups and `super::`, and passes
    parent/child references."""
    import tempfile

    cases = {
        "cycle": ({"lib.rs": "mod a; mod b;", "a.rs": "use crate::{b::X};",
                   "b.rs": "fn f() { crate::a::g() }"}, True),
        "nested": ({"lib.rs": "mod d;", "d/mod.rs": "mod x; mod y;",
                    "d/x.rs": "use super::y::T;", "d/y.rs": "use super::x::U;"}, True),
        "parent-child": ({"lib.rs": "mod p;", "p.rs": "mod c; use c::Q; use crate::p::c::R;",
                          "p/c.rs": "use super::S; use crate::p::T;"}, False),
        "layered": ({"lib.rs": "mod a; mod b; mod c;", "a.rs": "use crate::b::X;",
                     "b.rs": "use crate::c::Y; // use crate::a::Z;", "c.rs": ""}, False),
        "api-to-driver": ({"lib.rs": "mod qp; mod tcp;", "qp.rs": "fn f() { crate::tcp::conn::g() }",
                           "tcp/mod.rs": "mod conn;", "tcp/conn.rs": ""}, True, "softrdma"),
        "api-to-provider": ({"lib.rs": "mod qp; mod provider; mod tcp;", "qp.rs": "use crate::provider::Ops;",
                             "tcp.rs": "use crate::provider::Ops;", "provider.rs": ""}, False, "softrdma"),
    }
    failed = 0
    for name, (files, want, *krate) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "crates" / (krate[0] if krate else "k") / "src"
            for rel, text in files.items():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                (src / rel).write_text(text)
            got = check(Path(d), quiet=True) != 0
            if got != want:
                print(f"self-test {name}: expected cycle={want}, got {got}")
                failed += 1
    print(f"module-cycles self-test: {len(cases) - failed} of {len(cases)} cases right")
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    return check(root)


def check(root: Path, quiet: bool = False) -> int:
    bad = 0
    crates = sorted(p.parent for p in root.glob("crates/*/src"))
    for crate in crates:
        src = crate / "src"
        files = [
            f
            for f in src.rglob("*.rs")
            if "tests" not in f.relative_to(src).parts[:-1] and f.stem != "tests"
        ]
        modules = {module_of(src, f) for f in files}
        graph = {}
        for f in files:
            mod = module_of(src, f)
            for a, b in edges_of(mod, strip_comments(f.read_text()), modules):
                graph.setdefault(a, set()).add(b)
        for api, drivers in LAYERS.get(crate.name, []):
            for a in api:
                for b in sorted(graph.get((a,), ())):
                    if b[0] in drivers:
                        bad += 1
                        if not quiet:
                            print(f"{crate.name}: {a} names the driver {b[0]} (floors: {a} speaks to providers)")
        cycle = find_cycle(graph)
        if cycle:
            bad += 1
            names = [("::".join(m) or "crate") for m in cycle]
            if not quiet:
                print(f"{crate.name}: module cycle: {' -> '.join(names)}")
        elif not quiet:
            print(f"{crate.name}: {len(modules)} modules, no cycle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
