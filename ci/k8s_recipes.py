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
bound (ci/stop_bound.py).

With `--simulate BINARY` (root: it makes PID namespaces) each manifest's Pod is then played: the
service (`BINARY serve` with the container's arguments, or with the hook's directory for an
application's own image; a `--records` URL left out) runs as PID 1 of its own PID namespace, and again under a `sh -c` that
does not `exec` (PID 2), on volumes made as Kubernetes makes them (an emptyDir 0777, 1777 in
memory); the preStop hook runs in the Pod through `nsenter`, as the kubelet runs it; then the
kubelet's SIGTERM goes to PID 1. The hook must exit 0 and the Pod end with 0 within its
terminationGracePeriodSeconds. `--simulate` also shows the play failing: the wrapper layout with
`--pid 1` in the hook must not stop.

Usage: python3 ci/k8s_recipes.py docs/operations.md ci/k8s-deployment.schema.json [--simulate BIN]
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import jsonschema
import yaml

from stop_bound import bound, drain_seconds


def fail(message):
    print(f"k8s recipe: {message}", file=sys.stderr)
    sys.exit(1)


def manifests(markdown):
    section = markdown[markdown.index("## Kubernetes") :]
    section = section[: section.index("\n## ", 3)]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]


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
        if "--pid" in hook:
            fail(f"{where}: the preStop hook names --pid; without it the stopper finds the service, PID 1 or not")
        for flag in ("--dir", "--state"):
            for command in (args, hook):
                if flag in command:
                    path = command[command.index(flag) + 1].rstrip("/")
                    if path in mounts:
                        fail(f"{where}: {flag} {path} is a volume itself; use a subdirectory")
        comments = [line for line in raw.splitlines() if "#" in line]
        needed = bound(drain_seconds(args, comments))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < needed:
            fail(f"{where}: terminationGracePeriodSeconds {grace} < the stop's bound {needed:.1f} s")


class Pod:
    """One play of a manifest's Pod: its volumes in a temporary directory, the service in a PID
    namespace of its own (as PID 1, or under a shell wrapper), the hook through nsenter."""

    def __init__(self, doc, binary, root):
        pod = doc["spec"]["template"]["spec"]
        self.container = pod["containers"][0]
        self.grace = pod.get("terminationGracePeriodSeconds", 30)
        self.binary, self.root = binary, root
        self.hook_said = ""
        self.mounts = {}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            in_memory = volume.get("emptyDir", {}).get("medium") == "Memory"
            path = os.path.join(root, mount["name"])
            os.mkdir(path)
            os.chmod(path, 0o1777 if in_memory else 0o777)
            self.mounts[mount["mountPath"].rstrip("/")] = path

    def host(self, word):
        """A path of the container, as this play placed it."""
        for inside, outside in self.mounts.items():
            if word == inside or word.startswith(inside + "/"):
                return outside + word[len(inside) :]
        return word

    def hook(self):
        return self.container["lifecycle"]["preStop"]["exec"]["command"]

    def service(self):
        args = self.container.get("args", [])
        if args[:1] != ["serve"]:
            hook = self.hook()
            args = ["serve", "--dir", hook[hook.index("--dir") + 1]]
        # The play is of the stop, not of the fleet's store: a `--records` URL (a database that
        # is not here, and must not be looked for) gives way to the state directory's store.
        if "--records" in args:
            at = args.index("--records")
            args = args[:at] + args[at + 2 :]
        return [self.binary] + [self.host(a) for a in args]

    def play(self, wrapper, hook, wait_s):
        """Runs the Pod and its stop; what went wrong, or None."""
        inner = self.service()
        if wrapper:
            inner = ["sh", "-c", '"$0" "$@"; exit $?'] + inner
        log = open(os.path.join(self.root, "service.log"), "w")
        pod = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc"] + inner,
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            return self.stop(pod, hook, wait_s)
        finally:
            if pod.poll() is None:
                # The Pod's PID 1 first: killing it ends every process of the namespace, where
                # killing `unshare` alone would leave the service running, orphaned.
                try:
                    for pid in open(f"/proc/{pod.pid}/task/{pod.pid}/children").read().split():
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
                pod.kill()
                pod.wait()

    def stop(self, pod, hook, wait_s):
        pid_one = wait_for(lambda: open(f"/proc/{pod.pid}/task/{pod.pid}/children").read().split())
        markers = self.host(hook[hook.index("--dir") + 1])
        wait_for(lambda: os.path.isdir(markers)
                 and any(n.endswith(".watching.json") for n in os.listdir(markers)))
        command = ["nsenter", "-t", pid_one[0], "-p", "-m", self.binary] + [self.host(a) for a in hook[1:]]
        ran = subprocess.run(command, capture_output=True, text=True, timeout=30)
        self.hook_said = ran.stdout + ran.stderr
        if ran.returncode != 0:
            return f"the hook exited {ran.returncode}: {ran.stdout}{ran.stderr}"
        # The kubelet's SIGTERM, after the hook. A hook that waited for the stop may return as
        # the service exits, before it is reaped: the signal then finds no process, as the
        # kubelet's would, and that is no failure.
        try:
            os.kill(int(pid_one[0]), signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            code = pod.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return f"the Pod did not end within {wait_s} s (the hook said: {ran.stderr.strip()})"
        return None if code == 0 else f"the Pod ended with {code}"


def wait_for(probe, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = probe()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.02)
    fail("the simulated Pod did not start")


def simulate(docs, binary):
    for index, doc in enumerate(docs):
        where = f"manifest {index + 1} ({doc['metadata']['name']})"
        for wrapper in (False, True):
            with tempfile.TemporaryDirectory() as root:
                pod = Pod(doc, binary, root)
                wrong = pod.play(wrapper, pod.hook(), pod.grace)
                layout = "under a shell wrapper" if wrapper else "as PID 1"
                if wrong:
                    log = open(os.path.join(root, "service.log")).read()[-2000:]
                    fail(f"{where}, the service {layout}: {wrong}\n{log}")
                print(f"{where}: stopped as planned by its preStop hook, the service {layout}")
    # The play must be able to fail: a hook naming --pid 1 under a wrapper stops nothing.
    with tempfile.TemporaryDirectory() as root:
        pod = Pod(docs[0], binary, root)
        hook = pod.hook()
        wrong = pod.play(True, hook[:2] + ["--pid", "1"] + hook[2:], 5)
        if wrong is None:
            fail("a preStop hook with --pid 1 under a shell wrapper stopped the service")
        print(f"and with --pid 1 under a shell wrapper, as it must not: {wrong}")
    # Why the hook does not --wait: a stopper in the Pod may die with PID 1 (the kernel kills
    # the namespace when PID 1 exits; whether the stopper's report came first is a race), so it
    # says so before it waits.
    with tempfile.TemporaryDirectory() as root:
        pod = Pod(docs[0], binary, root)
        wrong = pod.play(False, pod.hook() + ["--wait", "30"], pod.grace) or ""
        if "process 1 of this PID namespace" not in pod.hook_said:
            fail(f"a stopper waiting for PID 1 did not say it may die with it: {pod.hook_said}")
        if wrong and "exited -9" not in wrong:
            fail(f"a stopper waiting for PID 1 in its Pod: {wrong}")
        ended = "was killed with PID 1" if wrong else "answered before the kernel killed it"
        print(f"and a hook that waits said it may die with PID 1 (this time it {ended})")


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
    if "--simulate" in sys.argv:
        simulate(docs, os.path.abspath(sys.argv[sys.argv.index("--simulate") + 1]))


if __name__ == "__main__":
    main()
