#!/usr/bin/env python3
"""The layers of crates/rowbus/src, checked: no module imports from a layer above its own,
and no two top-level modules import each other, directly or in a circle.

Each file belongs to a unit, its top-level module (lib.rs is `root`), and each unit to a
layer (LAYERS below). A reference is a `use` (grouped forms over several lines included,
`pub use` too), or a path in code starting with `crate::`, `$crate::`, `super::` or
`self::`; comments, doc comments and string literals are not code, and a `#[cfg(test)]`
item (a test module, inline or in its own file) may import anything. A path through the
crate root's re-exports (`crate::Error`, or `super::Error` from a top-level module) is a
reference to `root`: import from the module that defines the item.

It fails on a reference to a unit of a higher layer, and on a circle between units. A
circle is looked for among the references that are not upward (an upward one is reported
already, and any circle through it needs it), so it is between units of one layer.

    python3 scripts/check-imports.py                  # crates/rowbus/src of this checkout
    python3 scripts/check-imports.py --root DIR --layer db=1
    CHECK_IMPORTS_LAYERS=db=1,table=4 python3 scripts/check-imports.py
    python3 scripts/check-imports.py --self-test
"""

import argparse
import os
import re
import sys
import tempfile

# Unit -> layer; a higher number is a higher layer. A new top-level module goes here.
LAYERS = {
    "root": 5,
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
    """Parses a use tree from toks[i]; appends each leaf path (a list of (segment, line)) to
    `out`; returns the index after the tree."""
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
            out.append(segs)
            return i + 1
        if is_ident(tok):
            if not (tok == "self" and segs):  # `a::{self, B}`: `a` itself
                segs = segs + [(tok, line)]
            i += 1
            if i < n and toks[i][0] == "::":
                i += 1
                continue
            if i < n and toks[i][0] == "as":
                i += 2
            out.append(segs)
            return i
        return i + 1  # something unexpected: give the tree up here
    return i


def resolve(mod, segs, top_modules):
    """The absolute module path a reference names (a list), or None when it is not in this
    crate (an external crate, or a name the check does not follow: the same unit)."""
    names = [s for s, _ in segs]
    if not names:
        return None
    first = names[0]
    if first in ("crate", "$crate"):
        return names[1:]
    if first == "super":
        base, k = list(mod), 0
        while k < len(names) and names[k] == "super":
            if not base:
                return None
            base, k = base[:-1], k + 1
        return base + names[k:]
    if first == "self":
        return list(mod) + names[1:]
    if not mod and first in top_modules:  # lib.rs: `pub use backend::X`
        return names
    return None


def report_line(segs):
    """The line to report a reference at: its first segment after the prefix keywords."""
    for s, line in segs:
        if s not in PREFIXES:
            return line
    return segs[-1][1]


def references(rel, text, top_modules):
    """(absolute path, line) of each reference of one file, and the names of its
    out-of-line test modules."""
    toks = tokens(strip(text))
    base = module_path(rel)
    found, test_mods = [], []
    inline = []  # (name, brace depth at its `{`)
    depth = 0
    i, n = 0, len(toks)
    while i < n:
        tok, line = toks[i]
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
        if tok == "mod" and i + 2 < n and is_ident(toks[i + 1][0]) and toks[i + 2][0] == "{":
            inline.append((toks[i + 1][0], depth))
            depth += 1
            i += 3
            continue
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if inline and inline[-1][1] == depth:
                inline.pop()
        mod = base + [name for name, _ in inline]
        if tok == "use" and (i == 0 or toks[i - 1][0] != "::"):
            leaves = []
            i = parse_use_tree(toks, i + 1, [], leaves)
            for segs in leaves:
                target = resolve(mod, segs, top_modules)
                if target is not None:
                    found.append((target, report_line(segs)))
            continue
        if tok in PREFIXES and i + 1 < n and toks[i + 1][0] == "::" and (i == 0 or toks[i - 1][0] != "::"):
            # A visibility, `pub(in crate::a)`, names no import.
            if i >= 2 and toks[i - 1][0] == "in" and toks[i - 2][0] == "(":
                i += 1
                continue
            segs = [(tok, line)]
            j = i + 1
            while j + 1 < n and toks[j][0] == "::" and is_ident(toks[j + 1][0]):
                segs.append(toks[j + 1])
                j += 2
            target = resolve(mod, segs, top_modules)
            if target is not None:
                found.append((target, report_line(segs)))
            i = j
            continue
        i += 1
    return found, test_mods


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


def check(root, layers):
    """Returns (findings, files checked, references); a finding is a tuple, ('unknown',
    unit, file, line: where it is first met, line 0 for its own file), ('upward', file,
    line, unit, layer, target, target layer) or ('circle', [units...], [(file, line) per
    edge])."""
    files = rust_files(root)
    top_modules = {module_path(f)[0] for f in files if module_path(f)}
    texts = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            texts[f] = fh.read()
    if "lib.rs" in texts:  # modules declared inline in lib.rs
        toks = tokens(strip(texts["lib.rs"]))
        for k in range(len(toks) - 2):
            if toks[k][0] == "mod" and toks[k + 2][0] == "{":
                top_modules.add(toks[k + 1][0])

    parsed, excluded = {}, set()
    for f in files:
        parsed[f] = references(f, texts[f], top_modules)
        for name in parsed[f][1]:
            d = child_dir(f)
            excluded.add(os.path.normpath(os.path.join(d, name + ".rs")).replace(os.sep, "/"))
            excluded.add(os.path.normpath(os.path.join(d, name)).replace(os.sep, "/") + "/")

    def is_excluded(f):
        return f in excluded or any(f.startswith(e) for e in excluded if e.endswith("/"))

    findings, unknown, edges, count, checked = [], {}, {}, 0, 0
    for f in files:
        if is_excluded(f):
            continue
        checked += 1
        unit = unit_of(module_path(f))
        if unit not in layers:
            unknown.setdefault(unit, (f, 0))
            continue
        seen = set()
        for target, line in parsed[f][0]:
            count += 1
            to = target[0] if target and target[0] in top_modules else "root"
            if to == unit:
                continue
            if to not in layers:
                unknown.setdefault(to, (f, line))
                continue
            if layers[to] > layers[unit]:
                if (line, to) not in seen:
                    findings.append(("upward", f, line, unit, layers[unit], to, layers[to]))
                    seen.add((line, to))
                continue
            edges.setdefault((unit, to), (f, line))
    findings[:0] = [("unknown", unit, f, line) for unit, (f, line) in sorted(unknown.items())]
    findings.extend(circles(edges))
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
        [("circle", ["broker", "deploy", "broker"], [("broker/mod.rs", 3), ("deploy.rs", 2)])],
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
        [("upward", "listener/mod.rs", 1, "listener", 3, "broker", 4), ("upward", "sql/mod.rs", 1, "sql", 2, "root", 5)],
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
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.normpath(args.root)
    if not os.path.isdir(root):
        sys.exit(f"check-imports: no folder {root}")
    layers = layer_overrides([os.environ.get("CHECK_IMPORTS_LAYERS", "")] + args.layer)
    findings, files, count = check(root, layers)
    for finding in findings:
        print(describe(finding, root))
    if findings:
        upward = sum(1 for f in findings if f[0] == "upward")
        circle = sum(1 for f in findings if f[0] == "circle")
        unknown = len(findings) - upward - circle
        print(
            f"check-imports: {files} files, {count} references: {upward} upward, {circle} circles,"
            f" {unknown} units not in the table",
            file=sys.stderr,
        )
        return 1
    print(f"check-imports: {files} files, {count} references, layers and units acyclic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
