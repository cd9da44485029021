#!/usr/bin/env python3
"""Import circles between the top-level modules of each crate (issue 38's measure).

Reads crates/*/src (test modules and #[cfg(test)] tails left out), takes every
`crate::<module>` a module names as an edge, and prints each strongly connected
group of two or more modules: modules that import each other, directly or round a
ring. A child module counts as its parent (parent and child aside). Usage:

    python3 scripts/import-circles.py [REPO]      # default: the current directory
"""
import os
import re
import sys


def modules(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            parts = os.path.relpath(path, src)[:-3].split("/")
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]) or parts[-1].endswith("_tests") or parts[-1] == "tests":
                continue
            text = open(path).read().split("#[cfg(test)]")[0]
            top = parts[0]
            refs = set(re.findall(r"crate::([a-z_0-9]+)", text))
            mods.setdefault(top, set()).update(r for r in refs if r != top)
    return mods


def circles(mods):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in mods.get(v, ()):
            if w not in mods:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return found


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    total = 0
    for crate in sorted(os.listdir(os.path.join(repo, "crates"))):
        src = os.path.join(repo, "crates", crate, "src")
        if not os.path.isdir(src):
            continue
        for group in circles(modules(src)):
            total += 1
            print(f"{crate}: {len(group)} modules: {' '.join(group)}")
    print(f"{total} circles")


if __name__ == "__main__":
    main()
