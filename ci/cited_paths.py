#!/usr/bin/env python3
"""Fails when a repository path cited in README.md, docs/ or a crate's README does not exist.

A citation is a `code span` that names a file of this repository: a path under a top-level
directory (`src/runner/guard.rs`, `tests/cli.rs`), which must exist as written, or a path or
bare file name ending in .rs, .md, .py, .sh or .toml (`runner/process_end.rs`, `handover.rs`),
which must be the end of some tracked file's path. Relative links and `../` paths count from the document's own directory. Spans with
placeholders or absolute paths are not citations.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
).stdout.split()
TOP = {f.split("/")[0] for f in FILES if "/" in f}
SUFFIXES = (".rs", ".md", ".py", ".sh", ".toml")
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
NAME = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/?$")


def cited(token):
    """Whether `token` reads as a path of this repository."""
    if token.startswith("../"):
        return True
    if not NAME.match(token) or token.startswith(("/", "./")) or token.isupper():
        return False
    first = token.split("/")[0]
    return (first in TOP and "/" in token) or token.endswith(SUFFIXES)


def exists(token, doc):
    token = token.rstrip("/")
    if token.startswith("../"):
        return (ROOT / doc).parent.joinpath(token).resolve().exists()
    if (ROOT / token).exists():
        return True
    if token.split("/")[0] in TOP:
        return False  # a path from the root names exactly one file
    return any(f == token or f.endswith("/" + token) for f in FILES)


def documents():
    for f in FILES:
        if f.endswith(".md") and (f.startswith("docs/") or f.endswith("README.md")):
            yield f


def check(doc, text):
    """The citations in `text` (the document `doc`) that name no file of the repository."""
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        links = [t for t in LINK.findall(line) if "://" not in t and not t.startswith("mailto:")]
        for token in SPAN.findall(line) + links:
            if cited(token) and not exists(token, doc):
                missing.append(f"{doc}:{number}: `{token}` does not exist")
    return missing


def self_test():
    """The check is shown to fail: a path that does not exist is reported, one that does is not."""
    text = ("see `src/no_such_module.rs`, [gone](no_such.md), `src/lib.rs`, [api](api.md), "
            "`src/store/files.rs` (now `protocol/src/store/files.rs`) and `store/files.rs`\n")
    found = check("docs/selftest.md", text)
    said = " ".join(found)
    assert len(found) == 3, found
    for missing in ("`src/no_such_module.rs`", "`no_such.md`", "`src/store/files.rs`"):
        assert missing in said, found


def main():
    if "--self-test" in sys.argv:
        self_test()
    missing = []
    for doc in documents():
        missing += check(doc, (ROOT / doc).read_text(encoding="utf-8"))
    for m in missing:
        print(m)
    if missing:
        print(f"{len(missing)} cited paths do not exist", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
