#!/usr/bin/env python3
"""file_cycles.py NM LIB... — no call cycle between the files of a library (test_file_cycles).

Inside one folder's library, calls go one way: a lower file exports, a higher one calls, and a
helper that two files need lives below both (STYLE.md: one-way dependencies; issue 24). This reads
each static library's members with `NM -A -P` (the POSIX format: `lib[member]: name type ...`),
draws an edge a.o -> b.o for every symbol a.o leaves undefined that b.o defines, and fails on every
strongly connected set of two or more members, naming each edge's symbols:

    file_cycles: libqcdist.a: a cycle between comm.c.o, nccl.c.o
      comm.c.o -> nccl.c.o: dist_nccl_abort, dist_nccl_async_error
      nccl.c.o -> comm.c.o: dist_now

A library whose members define nothing is an error too, and so are libraries with no edge
between members at all (nm read nothing, or the wrong files): the check must not pass on an
empty graph.
Exit 0: no cycle; 1: a cycle or a library that could not be read.
"""
import re
import subprocess
import sys
from collections import defaultdict

LINE = re.compile(r"^(?P<lib>.*)\[(?P<member>[^\]]+)\]: (?P<name>\S+) (?P<type>\S)")


def read_graph(nm, lib):
    out = subprocess.run([nm, "-A", "-P", lib], check=True, capture_output=True, text=True).stdout
    defs = {}
    undef = defaultdict(set)
    members = set()
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        member, name, kind = m["member"], m["name"], m["type"]
        members.add(member)
        if kind == "U":
            undef[member].add(name)
        elif kind in "TDBRCVWGSu":  # global definitions (text, data, bss, read-only, weak, ...)
            defs[name] = member
    edges = defaultdict(lambda: defaultdict(list))  # a -> b -> [symbols]
    for a, names in undef.items():
        for s in sorted(names):
            b = defs.get(s)
            if b is not None and b != a:
                edges[a][b].append(s)
    return members, defs, edges


def cycles(members, edges):
    """Tarjan's strongly connected components with more than one member."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(members):
        if v not in index:
            visit(v)
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    nm, libs = argv[1], argv[2:]
    bad = 0
    total_edges = 0
    for lib in libs:
        name = lib.rsplit("/", 1)[-1]
        members, defs, edges = read_graph(nm, lib)
        nedges = sum(len(b) for b in edges.values())
        total_edges += nedges
        if not defs:
            print(f"file_cycles: {lib}: {len(members)} members, no definitions: nothing to "
                  f"check (is it a static library, read by {nm}?)")
            bad += 1
            continue
        found = cycles(members, edges)
        for comp in found:
            print(f"file_cycles: {name}: a cycle between {', '.join(comp)}")
            for a in comp:
                for b in comp:
                    if b in edges.get(a, {}):
                        print(f"  {a} -> {b}: {', '.join(edges[a][b])}")
        bad += len(found)
        print(f"{name}: {len(members)} files, {nedges} file-to-file dependencies, "
              f"{len(found)} cycles")
    if total_edges == 0:
        print(f"file_cycles: no file of {len(libs)} libraries calls another: nothing was checked")
        bad += 1
    if bad:
        print("hint: move the helper both files need down (into the lower file, a new file below "
              "both, or a static inline in the folder's internal header)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
