"""The stop's bound, shared by the recipe checks (ci/k8s_recipes.py, ci/systemd_recipes.py).

A service is gone, at the latest, this long after it accepted a stop (RunnerConfig::stop_bound in
src/runner/config.rs): the drain deadline, two answer graces per phase (six of 100 ms: the grace, and one more while answers still arrive), the
persist deadline (10 s), then the longer of the overrun grace (5 s: the watchdog ends a stop that
has not concluded) and the exit grace (2 s: a stop that concluded ends the process by then). A
supervisor's stop timeout (systemd's TimeoutStopSec, Kubernetes' terminationGracePeriodSeconds)
that does not cover it SIGKILLs a stop that is still within its deadlines.
"""

import re

ANSWER_GRACES_S = 0.6
PERSIST_S = 10
OVERRUN_S = 5
EXIT_GRACE_S = 2
# `planned-stop serve --drain-ms` by default, and the library's `drain_deadline` by default.
SERVE_DRAIN_S = 5
LIBRARY_DRAIN_S = 10


def drain_seconds(args, comment_lines):
    """The drain deadline of a service started with `args` (its command line after the binary):
    `--drain-ms`, else a `drain N s` in the recipe's comments (an application of its own), else
    the default of `serve` or of the library."""
    if "--drain-ms" in args:
        return int(args[args.index("--drain-ms") + 1]) / 1000
    for line in comment_lines:
        found = re.search(r"drain(?:_deadline| deadline)? (\d+)\s*s", line)
        if found:
            return int(found.group(1))
    return SERVE_DRAIN_S if args[:1] == ["serve"] else LIBRARY_DRAIN_S


def bound(drain_s):
    """The stop's bound for a drain of `drain_s` seconds (see the module docs)."""
    return drain_s + ANSWER_GRACES_S + PERSIST_S + max(OVERRUN_S, EXIT_GRACE_S)
