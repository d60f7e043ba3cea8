#!/usr/bin/env python3
"""The library's public surface, one line an item, from rustdoc's JSON.

Usage: public_api.py RUSTDOC_JSON... [EXPECTED]

Prints every item an application can name — modules, types, functions with their signatures,
fields, variants, trait methods, the associated items of inherent impls, and the traits each
public type implements by hand — reached from the crate root through public modules and
re-exports, each under the path a user writes; one JSON a library crate, all in one list. With
EXPECTED (`docs/public-api.txt`, any argument not ending in `.json`), compares
instead and exits 1 on any difference, printing it: the surface changes only on purpose, with
the file updated in the same commit and the reason given there and in `docs/api.md`.

What cargo-semver-checks and cargo-public-api read (rustdoc's JSON, unstable, which CI asks of
stable rustdoc with RUSTC_BOOTSTRAP=1, as cargo-semver-checks does); written here because
neither installs within CI's time (a build from source of minutes on two cores) and
cargo-public-api needs a nightly toolchain. `--self-test` shows that a removed, an added and a
changed line are each reported.
"""

import difflib
import json
import sys


def ty(t):
    """A type as a person writes it, from rustdoc's JSON."""
    if t is None:
        return "()"
    (kind, v), = t.items()
    if kind == "resolved_path":
        return v["path"].split("::")[-1] + args(v.get("args"))
    if kind == "primitive":
        return v
    if kind == "generic":
        return v
    if kind == "borrowed_ref":
        life = f"'{v['lifetime'].lstrip(chr(39))} " if v.get("lifetime") else ""
        return "&" + life + ("mut " if v["is_mutable"] else "") + ty(v["type"])
    if kind == "raw_pointer":
        return ("*mut " if v["is_mutable"] else "*const ") + ty(v["type"])
    if kind == "tuple":
        return "(" + ", ".join(ty(x) for x in v) + ")"
    if kind == "slice":
        return "[" + ty(v) + "]"
    if kind == "array":
        return "[" + ty(v["type"]) + "; " + v["len"] + "]"
    if kind in ("impl_trait", "dyn_trait"):
        bounds = v if kind == "impl_trait" else v["traits"]
        names = []
        for b in bounds:
            b = b.get("trait_bound", b)
            trait = b.get("trait") or b
            if "path" in trait:
                names.append(trait["path"].split("::")[-1] + args(trait.get("args")))
        return ("impl " if kind == "impl_trait" else "dyn ") + " + ".join(names)
    if kind == "qualified_path":
        return ty(v["self_type"]) + "::" + v["name"]
    if kind == "function_pointer":
        sig = v["sig"]
        return "fn(" + ", ".join(ty(i[1]) for i in sig["inputs"]) + ") -> " + ty(sig["output"])
    return kind


def args(a):
    if not a or "angle_bracketed" not in a:
        if a and "parenthesized" in a:
            p = a["parenthesized"]
            return "(" + ", ".join(ty(x) for x in p["inputs"]) + ") -> " + ty(p.get("output"))
        return ""
    out = []
    for g in a["angle_bracketed"]["args"]:
        (kind, v), = g.items()
        if kind == "type":
            out.append(ty(v))
        elif kind == "lifetime":
            out.append(v)
        elif kind == "const":
            out.append(str(v.get("expr", "_")))
    for c in a["angle_bracketed"].get("constraints", []):
        binding = c.get("binding", {})
        if "equality" in binding and "type" in binding["equality"]:
            out.append(c["name"] + " = " + ty(binding["equality"]["type"]))
    return "<" + ", ".join(out) + ">" if out else ""


def signature(f):
    sig = f["sig"]
    header = f["header"]
    inputs = ", ".join(name if name == "self" else f"{name}: {ty(t)}" for name, t in sig["inputs"])
    output = "" if sig["output"] is None else " -> " + ty(sig["output"])
    prefix = ("const " if header["is_const"] else "") + ("async " if header["is_async"] else "") \
        + ("unsafe " if header["is_unsafe"] else "")
    return f"{prefix}fn({inputs}){output}"


class Surface:
    def __init__(self, doc):
        self.index = doc["index"]
        self.root = doc["root"]
        self.lines = set()
        self.seen = set()

    def item(self, i):
        return self.index.get(str(i))

    def walk_module(self, module, path):
        for i in module["inner"]["module"]["items"]:
            self.visit(i, path, None)

    def visit(self, i, path, name):
        it = self.item(i)
        if it is None or it["visibility"] != "public":
            return
        (kind, v), = it["inner"].items()
        if kind != "use" and hidden(it):
            return  # `#[doc(hidden)]`: public for the crate's own siblings, not an API
        if kind == "use":
            target = self.item(v["id"]) if v.get("id") is not None else None
            if v["is_glob"]:
                if target and "module" in target["inner"]:
                    self.walk_module(target, path)
                return
            if target is None:  # a re-export of another crate's item
                self.lines.add(f"{path}::{v['name']}: re-export of {v['source']}")
                return
            self.visit(v["id"], path, v["name"])
            return
        name = name or it["name"]
        full = f"{path}::{name}"
        if (i, full) in self.seen:
            return
        self.seen.add((i, full))
        self.describe(kind, v, full, it)

    def describe(self, kind, v, full, it):
        if kind == "module":
            self.lines.add(f"{full}: mod")
            self.walk_module(it, full)
        elif kind == "function":
            self.lines.add(f"{full}: {signature(v)}")
        elif kind in ("struct", "enum", "trait", "type_alias", "constant", "static", "union"):
            self.lines.add(f"{full}: {kind.replace('_', ' ')}" + self.shape(kind, v))
            self.members(kind, v, full)
        else:
            self.lines.add(f"{full}: {kind}")

    def shape(self, kind, v):
        if kind == "constant":
            return " " + ty(v["type"])
        if kind == "type_alias":
            return " = " + ty(v["type"])
        return ""

    def members(self, kind, v, full):
        if kind == "struct":
            fields = v["kind"].get("plain", {}).get("fields", []) if isinstance(v["kind"], dict) else []
            for fid in fields:
                f = self.item(fid)
                if f and f["visibility"] == "public":
                    self.lines.add(f"{full}.{f['name']}: field {ty(f['inner']['struct_field'])}")
            if isinstance(v["kind"], dict) and "plain" in v["kind"] \
                    and v["kind"]["plain"].get("has_stripped_fields"):
                self.lines.add(f"{full}: and private fields")
        if kind == "enum":
            for vid in v["variants"]:
                var = self.item(vid)
                if var:
                    self.lines.add(f"{full}::{var['name']}: variant")
        if kind == "trait":
            for mid in v["items"]:
                m = self.item(mid)
                if m and "function" in m["inner"]:
                    self.lines.add(f"{full}::{m['name']}: trait {signature(m['inner']['function'])}")
        for iid in v.get("impls", []):
            self.impl(self.item(iid), full)

    def impl(self, imp, full):
        if imp is None:
            return
        v = imp["inner"]["impl"]
        if v["is_synthetic"] or v.get("blanket_impl") is not None:
            return
        if v["trait"] is not None:
            if v["trait"]["path"].split("::")[-1] in HIDDEN_TRAITS:
                return
            self.lines.add(f"{full}: impl {v['trait']['path'].split('::')[-1]}{args(v['trait'].get('args'))}")
            return
        for mid in v["items"]:
            m = self.item(mid)
            if m is None or m["visibility"] != "public" or hidden(m):
                continue
            (kind, mv), = m["inner"].items()
            if kind == "function":
                self.lines.add(f"{full}::{m['name']}: {signature(mv)}")
            elif kind == "assoc_const":
                self.lines.add(f"{full}::{m['name']}: const {ty(mv['type'])}")


# The standard library's own hidden traits, which --document-hidden-items shows on derived impls
# (`TrivialClone` beside every derived `Copy`): nothing a user names.
HIDDEN_TRAITS = {"TrivialClone"}


def hidden(it):
    """Whether an item is `#[doc(hidden)]` (rustdoc lists it only with --document-hidden-items,
    which CI passes so that re-exports out of hidden modules resolve)."""
    return any("doc(hidden)" in (a if isinstance(a, str) else json.dumps(a)) for a in it.get("attrs", []))


def surface(doc):
    s = Surface(doc)
    root = s.item(s.root)
    s.walk_module(root, root["name"])
    return sorted(s.lines)


def compare(expected, actual):
    return list(difflib.unified_diff(expected, actual, "expected (docs/public-api.txt)",
                                     "this build", lineterm="", n=0))


def self_test(lines):
    """A removed, an added and a changed line are each reported."""
    assert len(lines) > 3, "too small a surface to test with"
    removed = lines[1:]
    added = lines + ["planned_stop::made_up: fn()"]
    changed = [lines[0] + " (changed)"] + lines[1:]
    for name, variant in (("removed", removed), ("added", added), ("changed", changed)):
        if not compare(variant, lines):
            sys.exit(f"self-test: a {name} line was not reported")
    if compare(lines, lines):
        sys.exit("self-test: an unchanged surface was reported")


def main():
    argv = [a for a in sys.argv[1:] if a != "--self-test"]
    docs = [a for a in argv if a.endswith(".json")]
    expected_file = next((a for a in argv if not a.endswith(".json")), None)
    lines = sorted(line for d in docs for line in surface(json.load(open(d))))
    if "--self-test" in sys.argv:
        self_test(lines)
    if expected_file is None:
        print("\n".join(lines))
        return
    argv = [None, expected_file]
    expected = open(argv[1]).read().splitlines()
    expected = [l for l in expected if l and not l.startswith("#")]
    diff = compare(expected, lines)
    if diff:
        print("\n".join(diff))
        sys.exit(f"the public surface differs from {argv[1]}: if on purpose, regenerate it "
                 "(just public-api) and say why in the commit and in docs/api.md")
    print(f"public surface: {len(lines)} lines, as {argv[1]} says")


if __name__ == "__main__":
    main()
