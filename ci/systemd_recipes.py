#!/usr/bin/env python3
"""Checks the arithmetic of the systemd units in docs/operations.md (systemd-analyze verify, in
.ci/run, checks their syntax).

Every unit that runs a service (`[Service]` with an `ExecStart=`) must give it a `TimeoutStopSec=`
(systemd's default is 90 s) that covers the stop's bound for the drain deadline its command line
sets (ci/stop_bound.py). A `Type=notify` service extends the timeout while it stops, but a
`Type=exec` one cannot, and an extension is renewed from the event loop, which a wedge stops: the
unit's own number must cover the bound, so that systemd's SIGKILL never comes before the
service's own overrun watchdog (which logs the work it could not record).

`--self-test` shows the check failing: each unit's TimeoutStopSec lowered below its bound must be
reported.

Usage: python3 ci/systemd_recipes.py docs/operations.md [--self-test]
"""

import re
import shlex
import sys

from stop_bound import bound, drain_seconds

DEFAULT_TIMEOUT_STOP_S = 90


def units(markdown):
    """(name, text) of each ```ini block, named by its first line's comment."""
    for block in re.findall(r"```ini\n(.*?)```", markdown, re.S):
        name = block.splitlines()[0].lstrip("# ").strip()
        yield name, block


def seconds(value):
    """A systemd time span in seconds: `40`, `40s`, `1min 30s`, `500ms`, `infinity`."""
    if value.strip() == "infinity":
        return float("inf")
    total, scale = 0.0, {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * scale.get(unit or "s", 1)
    return total


def problems(markdown):
    """What is wrong with the units' stop timeouts, one line each; and how many were checked."""
    found, checked = [], 0
    for name, text in units(markdown):
        keys = dict(
            line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
        )
        if "ExecStart" not in keys:
            continue
        checked += 1
        args = shlex.split(keys["ExecStart"])[1:]
        comments = [line for line in text.splitlines() if line.startswith("#")]
        needed = bound(drain_seconds(args, comments))
        timeout = seconds(keys.get("TimeoutStopSec", str(DEFAULT_TIMEOUT_STOP_S)))
        if timeout < needed:
            found.append(f"{name}: TimeoutStopSec {timeout:g} s < the stop's bound {needed:.1f} s")
    return found, checked


def self_test(markdown):
    """Each unit with its TimeoutStopSec lowered to 1 s must be reported."""
    for name, text in units(markdown):
        if "TimeoutStopSec=" not in text:
            continue
        lowered = re.sub(r"TimeoutStopSec=.*", "TimeoutStopSec=1", text)
        found, _ = problems(markdown.replace(text, lowered))
        if not any(line.startswith(name) for line in found):
            print(f"systemd recipe self-test: a 1 s TimeoutStopSec in {name} was not reported")
            sys.exit(1)
    print("systemd recipe self-test: every lowered TimeoutStopSec was reported")


def main():
    markdown = open(sys.argv[1], encoding="utf-8").read()
    if "--self-test" in sys.argv[2:]:
        self_test(markdown)
    found, checked = problems(markdown)
    for line in found:
        print(f"systemd recipe: {line}", file=sys.stderr)
    if found or checked == 0:
        sys.exit(1)
    print(f"{checked} systemd services' stop timeouts cover their stop's bound")


if __name__ == "__main__":
    main()
