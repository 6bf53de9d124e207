#!/usr/bin/env python3
"""The layers of crates/rowbus/src, checked: no module imports from a layer above its own,
no two top-level modules import each other, directly or in a circle, and no two files do.

Each file belongs to a unit, its top-level module (lib.rs is `root`), and each unit to a
layer (LAYERS below). A reference is a `use` (grouped forms over several lines included,
`pub use` too), or a path in code starting with `crate::`, `$crate::`, `super::`, `self::`,
a child module of the module it is written in (`child::f()` in a mod.rs, in lib.rs or in
any file with child modules) or a module the file imported by `use`; comments, doc comments
and string literals are not code, and a `#[cfg(test)]` item (a test module, inline or in its
own file) may import anything. For the units, a path through the crate root's re-exports
(`crate::Error`, or `super::Error` from a top-level module) is a reference to `root`:
import from the module that defines the item.

It fails on a reference to a unit of a higher layer, and on a circle between units. A
circle is looked for among the references that are not upward (an upward one is reported
already, and any circle through it needs it), so it is between units of one layer.

It fails too on a circle between files. A reference is an edge to the file that defines
what it names: through re-exports and imports (`crate::sql::TableSql`, with sql/mod.rs's
`pub(crate) use table::TableSql`, leads to sql/table.rs); a module's path leads to the
module's file. A file's own `pub use` of its descendants (a mod.rs's surface) is no edge,
unless the file's code uses a name so re-exported (sql/mod.rs: `pub use naming::Naming;`
and `pub trait Db: Naming`): then the edge is at that use. Circles are reported per group
of files that reach each other (a strongly connected component), with one shortest circle
through it, FILE:LINE per edge.

    python3 scripts/check-imports.py                  # crates/rowbus/src of this checkout
    python3 scripts/check-imports.py --root DIR --layer db=1
    CHECK_IMPORTS_LAYERS=db=1,table=4 python3 scripts/check-imports.py
    python3 scripts/check-imports.py --edges          # also every file-to-file edge
    python3 scripts/check-imports.py --self-test
"""

import argparse
import os
import re
import sys
import tempfile

# Unit -> layer; a higher number is a higher layer. A new top-level module goes here.
LAYERS = {
    "root": 6,
    "workflow": 5,
    "deploy": 4,
    "broker": 4,
    "listener": 3,
    "notify": 3,
    "sql": 2,
    "error": 1,
    "backend": 1,
    "hosts": 1,
    "driver": 1,
    "names": 1,
}

DEFAULT_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "rowbus", "src")

PREFIXES = ("crate", "$crate", "super", "self")


# --- reading a file -------------------------------------------------------------------


def strip(text):
    """The text with comments and string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(?:br|rb|r)(#*)"', text[i:])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + m.end())
                j = n if j < 0 else j + len(end)
                out.append(blank(text[i:j]))
                i = j
            else:
                out.append(c)
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(blank(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'); otherwise a lifetime or label.
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)
                j = n if j < 0 else j + 1
                out.append(blank(text[i:j]))
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                out.append(blank(text[i : i + 3]))
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN = re.compile(r"\$?[A-Za-z_][A-Za-z0-9_]*|::|\S")


def tokens(text):
    """(token, line) pairs of stripped text."""
    result = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        for m in TOKEN.finditer(line):
            result.append((m.group(0), line_no))
    return result


def is_ident(tok):
    return bool(re.match(r"\$?[A-Za-z_]", tok))


def module_path(rel):
    """The module a file is, as a list: lib.rs [], broker/mod.rs ['broker'], sql/mysql/keys.rs
    ['sql', 'mysql', 'keys']."""
    parts = rel.replace(os.sep, "/")[: -len(".rs")].split("/")
    if parts[-1] in ("mod", "lib") and (parts[-1] == "mod" or len(parts) == 1):
        parts = parts[:-1]
    return parts


def unit_of(mod):
    return mod[0] if mod else "root"


def skip_item(toks, i):
    """The index after the item that starts at toks[i] (past its attributes)."""
    n = len(toks)
    while i < n and toks[i][0] == "#":  # further attributes
        i = match_close(toks, i + 1, "[", "]")
    j = i
    while j < n and toks[j][0] in ("pub", "(", "crate", "super", "self", "in", ")"):
        j += 1
    if j < n and toks[j][0] == "use":
        while j < n and toks[j][0] != ";":
            j += 1
        return j + 1
    depth = 0
    while j < n:
        t = toks[j][0]
        if t in "([":
            depth += 1
        elif t in ")]":
            depth -= 1
        elif t == ";" and depth == 0:
            return j + 1
        elif t == "{" and depth == 0:
            return match_close(toks, j, "{", "}")
        j += 1
    return n


def match_close(toks, i, open_, close):
    """toks[i] is `open_`: the index after its matching `close`."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j][0] == open_:
            depth += 1
        elif toks[j][0] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


def test_attribute(toks, i):
    """toks[i] is `#`: (is it #[cfg(...test...)] without not(..), index after it)."""
    if i + 1 >= len(toks) or toks[i + 1][0] != "[":
        return False, i + 1
    end = match_close(toks, i + 1, "[", "]")
    inner = [t for t, _ in toks[i + 2 : end - 1]]
    is_test = bool(inner) and inner[0] == "cfg" and "test" in inner and "not" not in inner
    return is_test, end


def parse_use_tree(toks, i, prefix, out):
    """Parses a use tree from toks[i]; appends each leaf to `out` as (path: a list of
    (segment, line), the name it is bound to under `as` or None, is it a glob); returns the
    index after the tree."""
    segs = list(prefix)
    n = len(toks)
    if i < n and toks[i][0] == "::":  # a leading `::`: an external crate
        segs.append(("::", toks[i][1]))
        i += 1
    while i < n:
        tok, line = toks[i]
        if tok == "{":
            i += 1
            while i < n and toks[i][0] != "}":
                i = parse_use_tree(toks, i, segs, out)
                if i < n and toks[i][0] == ",":
                    i += 1
            return i + 1
        if tok == "*":
            out.append((segs, None, True))
            return i + 1
        if is_ident(tok):
            if not (tok == "self" and segs):  # `a::{self, B}`: `a` itself
                segs = segs + [(tok, line)]
            i += 1
            if i < n and toks[i][0] == "::":
                i += 1
                continue
            alias = None
            if i + 1 < n and toks[i][0] == "as":
                alias = toks[i + 1][0]
                i += 2
            out.append((segs, alias, False))
            return i
        return i + 1  # something unexpected: give the tree up here
    return i


def report_line(segs):
    """The line to report a reference at: its first segment after the prefix keywords."""
    for s, line in segs:
        if s not in PREFIXES:
            return line
    return segs[-1][1]


ITEM_KEYWORDS = ("fn", "struct", "enum", "trait", "type", "const", "static", "union")
KEYWORDS = set(ITEM_KEYWORDS) | {"mod", "use", "pub", "let", "mut", "ref", "impl", "for", "where", "as",
                                 "in", "dyn", "unsafe", "async", "extern", "crate", "super", "self", "Self"}


def new_module(rel):
    return {"file": rel, "children": set(), "imports": {}, "globs": [], "items": set()}


def is_pub(toks, i):
    """Is the `use` at toks[i] a `pub`, `pub(crate)`, `pub(super)` or `pub(in ..)` one?"""
    k = i - 1
    if k >= 0 and toks[k][0] == ")":
        while k >= 0 and toks[k][0] != "(":
            k -= 1
        k -= 1
    return k >= 0 and toks[k][0] == "pub"


def scan(rel, text):
    """One file read: its modules (the file's own and its inline ones: children declared,
    module-level imports, globs and items), its references and its bare identifiers.

    A reference is a dict: kind 'use' (a leaf of a use tree; `pub` says whether it is a
    re-export) or 'path' (a path in code), segs [(segment, line)], mod (the module it is
    written in), alias, glob. A path in code is any `a::b` not preceded by `::` or `.`; which
    of them name this crate is decided once every file is read."""
    toks = tokens(strip(text))
    base = tuple(module_path(rel))
    modules = {base: new_module(rel)}
    refs, code, test_mods = [], [], []
    inline = []  # (name, brace depth at its `{`)
    depth = 0
    i, n = 0, len(toks)
    while i < n:
        tok, line = toks[i]
        mod = base + tuple(name for name, _ in inline)
        top = depth == (inline[-1][1] + 1 if inline else 0)  # at the module's own level
        if tok == "#":
            is_test, after = test_attribute(toks, i)
            if is_test:
                j = after
                while j < n and toks[j][0] == "#":
                    _, j = test_attribute(toks, j)
                k = j
                while k < n and toks[k][0] in ("pub", "(", "crate", "super", "self", "in", ")"):
                    k += 1
                if k + 2 < n and toks[k][0] == "mod" and toks[k + 2][0] == ";":
                    test_mods.append(toks[k + 1][0])
                i = skip_item(toks, j)
                continue
            i = after
            continue
        if tok == "mod" and i + 2 < n and is_ident(toks[i + 1][0]) and toks[i + 2][0] in ("{", ";"):
            name = toks[i + 1][0]
            modules[mod]["children"].add(name)
            if toks[i + 2][0] == "{":
                inline.append((name, depth))
                depth += 1
                modules[mod + (name,)] = new_module(rel)
            i += 3
            continue
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if inline and inline[-1][1] == depth:
                inline.pop()
        if tok == "use" and (i == 0 or toks[i - 1][0] != "::"):
            pub = is_pub(toks, i)
            leaves = []
            i = parse_use_tree(toks, i + 1, [], leaves)
            for segs, alias, glob in leaves:
                if not segs:
                    continue
                refs.append({"kind": "use", "pub": pub, "segs": segs, "mod": mod, "alias": alias, "glob": glob})
                if top and glob:
                    modules[mod]["globs"].append(([s for s, _ in segs], mod))
                elif top and alias != "_":
                    modules[mod]["imports"][alias or segs[-1][0]] = ([s for s, _ in segs], mod)
            continue
        if top and tok in ITEM_KEYWORDS and i + 1 < n and is_ident(toks[i + 1][0]) and toks[i + 1][0] not in KEYWORDS:
            modules[mod]["items"].add(toks[i + 1][0])
        elif top and tok == "macro_rules" and i + 2 < n and toks[i + 1][0] == "!":
            modules[mod]["items"].add(toks[i + 2][0])
        after_sep = i > 0 and toks[i - 1][0] in ("::", ".")
        if is_ident(tok) and not after_sep and i + 1 < n and toks[i + 1][0] == "::":
            # A visibility, `pub(in crate::a)`, names no import.
            if i >= 2 and toks[i - 1][0] == "in" and toks[i - 2][0] == "(":
                i += 1
                continue
            code.append((i, mod))
            segs = [(tok, line)]
            j = i + 1
            while j + 1 < n and toks[j][0] == "::" and is_ident(toks[j + 1][0]):
                segs.append(toks[j + 1])
                j += 2
            refs.append({"kind": "path", "pub": False, "segs": segs, "mod": mod, "alias": None, "glob": False})
            i = j
            continue
        if is_ident(tok) and not after_sep:
            code.append((i, mod))
        i += 1
    return {"modules": modules, "refs": refs, "code": code, "toks": toks, "test_mods": test_mods}


# --- the crate's modules: where a path leads -----------------------------------------


class Crate:
    """Every module of the crate (files and inline modules), to follow a path to the file
    that defines what it names."""

    def __init__(self, scans):
        self.modules = {}
        for rel in sorted(scans):
            for path, m in scans[rel]["modules"].items():
                if path in self.modules:  # both a.rs and a/mod.rs: the first one
                    continue
                self.modules[path] = m
        for path in list(self.modules):  # a file is a child of its parent whether declared or not
            if path:
                parent = self.modules.get(path[:-1])
                if parent is not None:
                    parent["children"].add(path[-1])

    def children(self, mod):
        m = self.modules.get(tuple(mod))
        return m["children"] if m else set()

    def absolute(self, names, mod, hops=0):
        """The path from the crate root a path written in module `mod` means (a list), or
        None when it is not this crate's (an external crate, a local name, a prelude type)."""
        if not names or hops > 16:
            return None
        first = names[0]
        if first in ("crate", "$crate"):
            return list(names[1:])
        if first == "super":
            base, k = list(mod), 0
            while k < len(names) and names[k] == "super":
                if not base:
                    return None
                base, k = base[:-1], k + 1
            return base + list(names[k:])
        if first == "self":
            if len(names) > 1 and names[1] == "super":  # `self::super::x`
                return self.absolute(names[1:], mod, hops + 1)
            return list(mod) + list(names[1:])
        m = self.modules.get(tuple(mod))
        if m is None:
            return None
        if first in m["children"]:
            return list(mod) + list(names)
        if first in m["imports"]:  # a name this module imported: `use crate::a::b;` ... `b::c`
            segs, at = m["imports"][first]
            target = self.absolute(segs, at, hops + 1)
            return None if target is None else target + list(names[1:])
        return None

    def locate(self, path, hops=0):
        """(the file that defines what an absolute path names, does it name a module): a
        re-export or an import on the way is followed to where the item is defined."""
        mod = ()
        for k, name in enumerate(path):
            m = self.modules.get(mod)
            if m is None:  # a module declared without its file
                return None, False
            if name in m["children"]:
                mod = mod + (name,)
                continue
            if name in m["items"] or hops > 16:
                return m["file"], False
            if name in m["imports"]:
                segs, at = m["imports"][name]
                target = self.absolute(segs, at)
                if target is None:  # an external item, re-exported
                    return None, False
                return self.locate(target + list(path[k + 1 :]), hops + 1)
            for segs, at in m["globs"]:
                target = self.absolute(segs, at)
                if target is not None and self.has(target, name):
                    return self.locate(target + list(path[k:]), hops + 1)
            return m["file"], False
        m = self.modules.get(mod)
        return (m["file"] if m else None), True

    def has(self, mod, name):
        m = self.modules.get(tuple(mod))
        return bool(m) and (name in m["children"] or name in m["items"] or name in m["imports"])

    def names_of(self, mod):
        m = self.modules.get(tuple(mod))
        return (m["children"] | m["items"] | set(m["imports"])) if m else set()


# --- the check ------------------------------------------------------------------------


def rust_files(root):
    files = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs"):
                files.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(files)


def child_dir(rel):
    """The folder a file's out-of-line child modules are in."""
    d, name = os.path.split(rel)
    if name in ("mod.rs", "lib.rs"):
        return d
    return os.path.join(d, name[: -len(".rs")])


def mentions(toks, code, mod, names):
    """(name, line) of each mention in code of module `mod` of one of `names` as an item of
    its own: a type or constant anywhere (not a field, not after `.`, `::` or a keyword that
    defines a name), a function only where it is called (`name(`, `name!`, `name::<`)."""
    found = []
    for i, m in code:
        tok = toks[i][0]
        if m != mod or tok not in names:
            continue
        prev = toks[i - 1][0] if i > 0 else ""
        nxt = toks[i + 1][0] if i + 1 < len(toks) else ""
        if prev in ITEM_KEYWORDS or prev in ("mod", "let", "mut", "ref", "macro_rules", "!", "'"):
            continue
        if nxt == ":":  # a field or a binding with its type
            continue
        if tok[0].islower() or tok[0] == "_":
            after = toks[i + 2][0] if i + 2 < len(toks) else ""
            if not (nxt in ("(", "!") or (nxt == "::" and after == "<")):
                continue
        found.append((tok, toks[i][1]))
    return found


def check(root, layers):
    """Returns (findings, files checked, references); a finding is a tuple, ('unknown',
    unit, file, line: where it is first met, line 0 for its own file), ('upward', file,
    line, unit, layer, target, target layer), ('circle', [units...], [(file, line) per
    edge]) or ('files', [the files of a strongly connected component], [(file, line) per
    edge of one of its shortest circles])."""
    files = rust_files(root)
    top_modules = {module_path(f)[0] for f in files if module_path(f)}
    scans = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            scans[f] = scan(f, fh.read())
    crate = Crate(scans)
    top_modules |= crate.children(())

    excluded = set()
    for f in files:
        for name in scans[f]["test_mods"]:
            d = child_dir(f)
            excluded.add(os.path.normpath(os.path.join(d, name + ".rs")).replace(os.sep, "/"))
            excluded.add(os.path.normpath(os.path.join(d, name)).replace(os.sep, "/") + "/")

    def is_excluded(f):
        return f in excluded or any(f.startswith(e) for e in excluded if e.endswith("/"))

    findings, unknown, edges, count, checked = [], {}, {}, 0, 0
    file_edges = {}  # (file, file) -> the first line of the first file that makes it

    def file_edge(f, g, line):
        if g is None or g == f or is_excluded(g):
            return
        if (f, g) not in file_edges or line < file_edges[(f, g)]:
            file_edges[(f, g)] = line

    for f in files:
        if is_excluded(f):
            continue
        checked += 1
        fmod = tuple(module_path(f))
        unit = unit_of(list(fmod))
        known = unit in layers
        if not known:
            unknown.setdefault(unit, (f, 0))
        seen = set()
        reexported = {}  # module -> {name: file}: this file's re-exports of its descendants
        for ref in scans[f]["refs"]:
            names = [s for s, _ in ref["segs"]]
            first = names[0]
            if first not in PREFIXES and first not in crate.children(ref["mod"]):
                # Through a name this module imported: only a module's name makes a path here.
                head = crate.absolute([first], ref["mod"])
                if head is None or not crate.locate(head)[1]:
                    continue
            target = crate.absolute(names, ref["mod"])
            if target is None:
                continue
            line = report_line(ref["segs"])
            count += 1
            to = target[0] if target and target[0] in top_modules else "root"
            upward = False
            if known and to != unit:
                if to not in layers:
                    unknown.setdefault(to, (f, line))
                elif layers[to] > layers[unit]:
                    upward = True
                    if (line, to) not in seen:
                        findings.append(("upward", f, line, unit, layers[unit], to, layers[to]))
                        seen.add((line, to))
                else:
                    edges.setdefault((unit, to), (f, line))
            if upward:  # reported already; a circle through it needs it
                continue
            g, _ = crate.locate(target)
            if ref["kind"] == "use" and ref["pub"] and len(target) > len(fmod) \
                    and tuple(target[: len(fmod)]) == fmod and target[len(fmod)] in crate.children(fmod):
                # The module's surface: a re-export of one of its descendants.
                if g is not None and g != f:
                    introduced = crate.names_of(target) if ref["glob"] else {ref["alias"] or names[-1]}
                    for name in introduced - {"_"}:
                        reexported.setdefault(ref["mod"], {})[name] = g
                continue
            file_edge(f, g, line)
        for mod, names in reexported.items():
            # The module's own code using a name it has only through its re-export.
            for name, line in mentions(scans[f]["toks"], scans[f]["code"], mod, names):
                file_edge(f, names[name], line)
    findings[:0] = [("unknown", unit, f, line) for unit, (f, line) in sorted(unknown.items())]
    findings.extend(circles(edges))
    findings.extend(file_circles(file_edges))
    check.file_edges = file_edges  # for --edges
    return findings, checked, count


def circles(edges):
    """Every elementary circle of the unit graph, each once (started at its least unit)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found = []
    for start in sorted(graph):

        def walk(path):
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == start:
                    cycle = path + [start]
                    where = [edges[(cycle[k], cycle[k + 1])] for k in range(len(cycle) - 1)]
                    found.append(("circle", cycle, where))
                elif nxt > start and nxt not in path:
                    walk(path + [nxt])

        walk([start])
    return found


def file_circles(edges):
    """Per strongly connected component of the file graph with more than one file: its
    files and one of its shortest circles (the least file's, if several are as short)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []

    def strong(v):  # Tarjan's
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    sys.setrecursionlimit(limit)

    found = []
    for scc in sorted(sccs):
        members, best = set(scc), None
        for start in scc:  # breadth first, back to the start
            parent, queue, cycle = {start: None}, [start], None
            while queue and cycle is None:
                nxt_queue = []
                for v in queue:
                    for w in sorted(graph[v] & members):
                        if w == start:
                            cycle = [v]
                            while parent[cycle[-1]] is not None:
                                cycle.append(parent[cycle[-1]])
                            cycle.reverse()
                            break
                        if w not in parent:
                            parent[w] = v
                            nxt_queue.append(w)
                    if cycle is not None:
                        break
                queue = nxt_queue
            if cycle is not None and (best is None or len(cycle) < len(best)):
                best = cycle
        where = [(best[k], edges[(best[k], best[(k + 1) % len(best)])]) for k in range(len(best))]
        found.append(("files", scc, where))
    return found


def show(path, root):
    full = os.path.join(root, path)
    rel = os.path.relpath(full)
    return full if rel.startswith("..") else rel


def describe(finding, root):
    kind = finding[0]
    if kind == "unknown":
        _, unit, f, line = finding
        where = f"{show(f, root)}:{line}" if line else show(f, root)
        return f"{where}: unit {unit!r} is not in the layer table: add it to the table (or --layer {unit}=N)"
    if kind == "upward":
        _, f, line, unit, layer, to, to_layer = finding
        return f"{show(f, root)}:{line}: {unit} (layer {layer}) imports {to} (layer {to_layer}) above it"
    if kind == "files":
        _, scc, where = finding
        example = " -> ".join(f"{f}:{line}" for f, line in where) + f" -> {where[0][0]}"
        return f"files in a circle ({len(scc)}): {', '.join(scc)}; e.g. {example}"
    _, cycle, where = finding
    edges = "; ".join(
        f"{cycle[k]} -> {cycle[k + 1]}: {show(f, root)}:{line}" for k, (f, line) in enumerate(where)
    )
    return f"circle: {' -> '.join(cycle)} ({edges})"


# --- the self-test --------------------------------------------------------------------

BASE_TREE = {
    "lib.rs": "mod broker;\nmod deploy;\nmod error;\nmod listener;\nmod sql;\npub use broker::Queue;\n",
    "error.rs": "pub struct Error;\n",
    "broker/mod.rs": "use crate::error::Error;\nuse crate::sql::Db;\npub struct Queue;\n",
    "deploy.rs": "use crate::sql::Db;\n",
    "listener/mod.rs": "use crate::error::Error;\npub struct Event;\n",
    "listener/pg.rs": "use super::Event;\n",
    "sql/mod.rs": "use crate::error::Error;\npub trait Db {}\n",
}

SELF_TESTS = [
    (
        "a clean tree",
        {},
        [],
    ),
    (
        "an upward import, by use, by a path in code and in a macro",
        {"sql/mod.rs": "use crate::error::Error;\nuse crate::broker::Queue;\n"
         "fn f() { let _ = crate::listener::Event; }\npub trait Db {}\n"
         "macro_rules! m {\n    () => { $crate::broker::Queue };\n}\n"},
        [("upward", "sql/mod.rs", 2, "sql", 2, "broker", 4), ("upward", "sql/mod.rs", 3, "sql", 2, "listener", 3),
         ("upward", "sql/mod.rs", 6, "sql", 2, "broker", 4)],
    ),
    (
        "a circle between two units of one layer",
        {"deploy.rs": "use crate::sql::Db;\nuse crate::broker::Queue;\n",
         "broker/mod.rs": "use crate::error::Error;\n\nuse crate::deploy::deploy;\npub struct Queue;\n"},
        [("circle", ["broker", "deploy", "broker"], [("broker/mod.rs", 3), ("deploy.rs", 2)]),
         ("files", ["broker/mod.rs", "deploy.rs"], [("broker/mod.rs", 3), ("deploy.rs", 2)])],
    ),
    (
        "a grouped use over several lines",
        {"listener/mod.rs": "use crate::{\n    error::Error,\n    sql::{\n        Db,\n    },\n    broker::{\n"
         "        Queue as Q, Broker,\n    },\n};\npub struct Event;\n"},
        [("upward", "listener/mod.rs", 6, "listener", 3, "broker", 4)],
    ),
    (
        "super:: in a mod.rs is the folder's parent; the root's re-export counts as root",
        {"listener/mod.rs": "use super::broker::Queue;\nuse super::error::Error;\npub struct Event;\n",
         "sql/mod.rs": "use super::Queue;\npub trait Db {}\n",
         "listener/pg.rs": "use super::Event;\nuse super::super::error::Error;\n"},
        [("upward", "listener/mod.rs", 1, "listener", 3, "broker", 4), ("upward", "sql/mod.rs", 1, "sql", 2, "root", 6)],
    ),
    (
        "test modules, comments, strings and visibilities do not count",
        {"sql/mod.rs": "use crate::error::Error;\n// use crate::broker::Queue;\n/// [`crate::broker::Queue`]\n"
         "pub(in crate::sql) fn f() -> &'static str { \"crate::broker::Queue\" }\npub trait Db {}\n"
         "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::broker::Queue;\n"
         "    fn t() { let _ = crate::Queue; let c = '{'; }\n}\n#[cfg(test)]\nmod more;\n"
         "fn g() { let _ = crate::error::Error; }\n",
         "sql/more.rs": "use crate::broker::Queue;\n"},
        [],
    ),
    (
        "an inline module's super, and a unit not in the table",
        {"sql/mod.rs": "pub trait Db {}\nmod inner {\n    use super::super::broker::Queue;\n}\n",
         "extra.rs": "use crate::error::Error;\n"},
        [("upward", "sql/mod.rs", 3, "sql", 2, "broker", 4), ("unknown", "extra", "extra.rs", 0)],
    ),
    (
        "two files of one unit importing each other, by use and by a path in code",
        {"sql/mod.rs": "use crate::error::Error;\nmod a;\nmod b;\npub trait Db {}\n",
         "sql/a.rs": "use super::b::g;\npub fn f() {}\n",
         "sql/b.rs": "pub fn g() {}\nfn h() { super::a::f(); }\n"},
        [("files", ["sql/a.rs", "sql/b.rs"], [("sql/a.rs", 1), ("sql/b.rs", 2)])],
    ),
    (
        "a mod.rs re-exporting a child that imports the mod.rs's own item is no circle",
        {"sql/mod.rs": "mod naming;\npub use naming::Naming;\npub(crate) use naming::quoted;\npub trait Db {}\n"
         "fn f(s: &S) -> u8 { let quoted = s.quoted(); quoted }\nstruct S { quoted: u8 }\n",
         "sql/naming.rs": "use super::Db;\npub trait Naming {}\npub fn quoted() {}\n"},
        [],
    ),
    (
        "a mod.rs whose own code uses the name it re-exports from the child",
        {"sql/mod.rs": "mod naming;\npub use naming::Naming;\npub(crate) use naming::quoted;\n"
         "pub trait Db {}\nfn f() { quoted(); }\npub trait Both: Db + Naming {}\n",
         "sql/naming.rs": "use super::Db;\npub trait Naming {}\npub fn quoted() {}\n"},
        [("files", ["sql/mod.rs", "sql/naming.rs"], [("sql/mod.rs", 5), ("sql/naming.rs", 1)])],
    ),
    (
        "a path through re-exports leads to the file that defines the item",
        {"sql/mod.rs": "mod inner;\nmod other;\npub use inner::TableSql;\npub trait Db {}\n",
         "sql/inner/mod.rs": "mod table;\npub(crate) use self::table::TableSql;\n",
         "sql/inner/table.rs": "use crate::sql::other::helper;\npub struct TableSql;\n",
         "sql/other.rs": "pub fn helper() {}\nfn f() -> crate::sql::TableSql { todo!() }\n"},
        [("files", ["sql/inner/table.rs", "sql/other.rs"], [("sql/inner/table.rs", 1), ("sql/other.rs", 2)])],
    ),
    (
        "test modules importing in a circle do not count",
        {"sql/mod.rs": "mod a;\nmod b;\npub trait Db {}\n",
         "sql/a.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::super::b::g;\n}\n"
         "#[cfg(test)]\nmod more;\n",
         "sql/a/more.rs": "use crate::sql::b::g;\n",
         "sql/b.rs": "use super::a::f;\npub fn g() {}\n"},
        [],
    ),
    (
        "relative paths in a file with child modules; a group of three, one shortest circle",
        {"sql/mod.rs": "mod mysql;\npub trait Db {}\n",
         "sql/mysql.rs": "mod dedup;\nmod keys;\nuse keys::Key;\nconst SHORT: u8 = 1;\n"
         "fn f() { dedup::State::new(); }\n",
         "sql/mysql/dedup.rs": "pub struct State;\nfn g() -> u8 { super::SHORT }\n",
         "sql/mysql/keys.rs": "use super::dedup::State;\npub struct Key;\n"},
        [("files", ["sql/mysql.rs", "sql/mysql/dedup.rs", "sql/mysql/keys.rs"],
          [("sql/mysql.rs", 5), ("sql/mysql/dedup.rs", 2)])],
    ),
]


def self_test():
    failed = 0
    for name, changes, expected in SELF_TESTS:
        tree = dict(BASE_TREE)
        tree.update(changes)
        with tempfile.TemporaryDirectory() as root:
            for rel, text in tree.items():
                path = os.path.join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
            findings, _, _ = check(root, LAYERS)
        got = sorted(map(repr, findings))
        want = sorted(map(repr, (tuple(e) for e in expected)))
        if got == want:
            print(f"ok: {name}")
        else:
            failed += 1
            print(f"FAILED: {name}\n  expected {want}\n  got      {got}")
    print(f"check-imports self-test: {len(SELF_TESTS) - failed} of {len(SELF_TESTS)} passed")
    return 1 if failed else 0


# --- the command ----------------------------------------------------------------------


def layer_overrides(specs):
    layers = dict(LAYERS)
    for spec in specs:
        for item in filter(None, (s.strip() for s in spec.split(","))):
            unit, _, layer = item.partition("=")
            if not layer.isdigit():
                sys.exit(f"check-imports: expected UNIT=LAYER, got {item!r}")
            layers[unit] = int(layer)
    return layers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="the source folder (default: crates/rowbus/src)")
    parser.add_argument("--layer", action="append", default=[], metavar="UNIT=N",
                        help="put a unit in a layer, beyond the table (repeatable; also CHECK_IMPORTS_LAYERS)")
    parser.add_argument("--self-test", action="store_true", help="check the checker on small trees")
    parser.add_argument("--edges", action="store_true", help="also print every file-to-file edge, FILE:LINE -> FILE")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.normpath(args.root)
    if not os.path.isdir(root):
        sys.exit(f"check-imports: no folder {root}")
    layers = layer_overrides([os.environ.get("CHECK_IMPORTS_LAYERS", "")] + args.layer)
    findings, files, count = check(root, layers)
    if args.edges:
        for (f, g), line in sorted(check.file_edges.items()):
            print(f"edge: {f}:{line} -> {g}")
    for finding in findings:
        print(describe(finding, root))
    if findings:
        upward = sum(1 for f in findings if f[0] == "upward")
        circle = sum(1 for f in findings if f[0] == "circle")
        in_circles = sum(1 for f in findings if f[0] == "files")
        unknown = sum(1 for f in findings if f[0] == "unknown")
        print(
            f"check-imports: {files} files, {count} references: {upward} upward, {circle} circles between units,"
            f" {in_circles} groups of files in a circle, {unknown} units not in the table",
            file=sys.stderr,
        )
        return 1
    print(f"check-imports: {files} files, {count} references; layers, units and files acyclic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
