#!/usr/bin/env python3
"""Validates the Kubernetes manifests in docs/operations.md, offline.

kubectl's own validation downloads the API's OpenAPI document from a cluster, and kubeconform
downloads its schemas; neither works offline. So this checks each manifest against a strict JSON
Schema of the apps/v1 Deployment subset the recipes use (ci/k8s-deployment.schema.json: required
fields and types as the Kubernetes API reference gives them, and no unknown field, so a typo such
as `lifecyle` fails), then the rules a schema cannot say: the selector matches the template's
labels, every volume mount names a declared volume, the preStop hook does not `--wait` (it would be
killed with PID 1), the marker and state directories are subdirectories of their volumes (a volume
itself is 0777 or group-writable, and refused), and terminationGracePeriodSeconds covers the stop's
bound: drain deadline + 0.3 s + persist deadline (10 s) + overrun grace (5 s).

Usage: python3 ci/k8s_recipes.py docs/operations.md ci/k8s-deployment.schema.json
"""

import json
import re
import sys

import jsonschema
import yaml

PERSIST_S = 10
OVERRUN_S = 5
ANSWER_GRACES_S = 0.3


def fail(message):
    print(f"k8s recipe: {message}", file=sys.stderr)
    sys.exit(1)


def manifests(markdown):
    section = markdown[markdown.index("## Kubernetes") :]
    section = section[: section.index("\n## ", 3)]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def drain_seconds(container, comment_lines):
    args = container.get("args", [])
    if "--drain-ms" in args:
        return int(args[args.index("--drain-ms") + 1]) / 1000
    # An application of its own: its drain deadline is given in a comment of the manifest.
    for line in comment_lines:
        found = re.search(r"drain(?:_deadline| deadline)? (\d+)\s*s", line)
        if found:
            return int(found.group(1))
    return 10  # the library's default


def check(doc, raw, schema, where):
    jsonschema.validate(doc, schema)
    spec = doc["spec"]
    template = spec["template"]
    labels = template["metadata"]["labels"]
    for key, value in spec["selector"]["matchLabels"].items():
        if labels.get(key) != value:
            fail(f"{where}: selector {key}={value} does not match the template's labels {labels}")
    pod = template["spec"]
    volumes = {v["name"] for v in pod.get("volumes", [])}
    mounts = {}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                fail(f"{where}: mount {mount['name']} names no declared volume")
            mounts[mount["mountPath"].rstrip("/")] = mount["name"]
        args = container.get("args", [])
        hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if "--wait" in hook:
            fail(f"{where}: the preStop hook waits; it is killed when PID 1 exits")
        for flag in ("--dir", "--state"):
            for command in (args, hook):
                if flag in command:
                    path = command[command.index(flag) + 1].rstrip("/")
                    if path in mounts:
                        fail(f"{where}: {flag} {path} is a volume itself; use a subdirectory")
        comments = [line for line in raw.splitlines() if "#" in line]
        bound = drain_seconds(container, comments) + ANSWER_GRACES_S + PERSIST_S + OVERRUN_S
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < bound:
            fail(f"{where}: terminationGracePeriodSeconds {grace} < the stop's bound {bound:.1f} s")


def main():
    markdown = open(sys.argv[1], encoding="utf-8").read()
    schema = json.load(open(sys.argv[2], encoding="utf-8"))
    raws = re.findall(r"```yaml\n(.*?)```", markdown[markdown.index("## Kubernetes") :], re.S)
    docs = manifests(markdown)
    if not docs:
        fail("no manifests found")
    for index, (doc, raw) in enumerate(zip(docs, raws)):
        try:
            check(doc, raw, schema, f"manifest {index + 1} ({doc.get('metadata', {}).get('name')})")
        except jsonschema.ValidationError as e:
            fail(f"manifest {index + 1}: {e.message} at {'/'.join(map(str, e.absolute_path))}")
    print(f"{len(docs)} Kubernetes manifests valid")


if __name__ == "__main__":
    main()
