#!/usr/bin/env python3
"""Plays every systemd unit of docs/operations.md under a real systemd, each for what it promises.

systemd (Debian's package) boots as PID 1 of a PID and mount namespace of its own (`unshare`),
with a private /run (and /tmp and /var/lib, unless the checkout is there), and a target with no dependencies: nothing of the machine's
own boot runs (tmpfiles would empty the machine's /tmp). The units go in as written; the only
drop-ins are not semantic: `DefaultDependencies=no` (no sysinit.target to pull in) and a log file.
Binaries are this build's: `planned-stop` for /usr/local/bin/planned-stop and myapp (the reference
service), the restart_in_place example for myweb; port 8080 becomes a free one.

The plays, each checked against systemd's own view (`systemctl show`):
- myapp (Type=notify, then Type=exec): `systemctl stop` is a planned stop (exit 0, Result=success,
  not restarted); `stop --restart` exits 75 and systemd starts it again; a SIGKILL (a crash) and
  `systemctl kill` (a bare SIGTERM: unexpected, exit 1) are restarted;
- myweb, restart in place: `systemctl reload` under a load of fresh connections exits 0, refuses
  nothing, and at TimeoutStopSec + 5 s the unit is active with the successor as its main process,
  `NRestarts=0`, `Result=success`;
- mysock.socket + mysock.service: `systemctl restart` under load refuses nothing.

Usage (root): python3 ci/systemd_play.py docs/operations.md PLANNED_STOP_BIN RESTART_IN_PLACE_BIN
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

RELOAD_SETTLE = 5  # seconds past TimeoutStopSec at which the reloaded unit is judged


def fail(message):
    print(f"systemd play: {message}", file=sys.stderr)
    sys.exit(1)


def units(markdown):
    """The ```ini blocks, as (file name, text), in order."""
    found = []
    for block in re.findall(r"```ini\n(.*?)```", markdown, re.S):
        first = block.splitlines()[0]
        found.append((first.split("/")[-1].strip(), block))
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Systemd:
    """systemd as PID 1 of its own PID and mount namespace."""

    BOOT = r"""
set -e
mount --make-rprivate /
mount -t proc proc /proc
for d in /run $PRIVATE; do mount -t tmpfs tmpfs "$d"; done
mkdir -p /run/systemd/system /run/ci-logs
printf '[Unit]\nDescription=planned-stop CI\nDefaultDependencies=no\n' > /run/systemd/system/ci.target
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-clean.timer systemd-remount-fs.service \
         systemd-sysctl.service systemd-sysusers.service systemd-modules-load.service; do
  ln -s /dev/null "/run/systemd/system/$u"
done
exec env -i container=docker PATH=/usr/sbin:/usr/bin:/sbin:/bin /lib/systemd/systemd --system \
  --unit=ci.target --log-target=null
"""

    def __init__(self, keep):
        # /tmp and /var/lib are private too, unless they hold what must stay visible (`keep`: the
        # binaries, when the checkout itself is under /tmp).
        private = [d for d in ("/tmp", "/var/lib") if not any(k.startswith(d + "/") for k in keep)]
        self.unshare = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", self.BOOT],
            stdin=subprocess.DEVNULL, env={**os.environ, "PRIVATE": " ".join(private)},
        )
        self.pid = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.pid is None:
            children = f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children"
            try:
                pids = open(children).read().split()
            except OSError:
                pids = []
            if pids and open(f"/proc/{pids[0]}/comm").read().strip() == "systemd":
                self.pid = int(pids[0])
            else:
                time.sleep(0.05)
        if self.pid is None:
            fail("systemd did not boot")
        self.wait(lambda: self.run("systemctl", "is-system-running", check=False).stdout.strip()
                  in ("running", "degraded"), 30, "systemd to reach its target")

    def run(self, *argv, check=True, stdin=None, timeout=120):
        done = subprocess.run(["nsenter", "-t", str(self.pid), "-p", "-m", "--", *argv],
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            fail(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
        return done

    def show(self, unit):
        out = self.run("systemctl", "show", unit, "-p",
                       "ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStatus").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait(self, predicate, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        fail(f"timed out waiting for {what}")

    def install(self, name, text):
        self.run("sh", "-c", f"cat > /run/systemd/system/{name}", stdin=text)
        base = name.rsplit(".", 1)[0]
        dropin = "[Unit]\nDefaultDependencies=no\n"
        if name.endswith(".service"):
            dropin += f"[Service]\nStandardOutput=append:/run/ci-logs/{base}.log\nStandardError=append:/run/ci-logs/{base}.log\n"
        self.run("sh", "-c", f"mkdir -p /run/systemd/system/{name}.d && cat > /run/systemd/system/{name}.d/ci.conf",
                 stdin=dropin)
        self.run("systemctl", "daemon-reload")

    def log(self, base):
        return self.run("cat", f"/run/ci-logs/{base}.log", check=False).stdout

    def stop(self):
        os.kill(self.pid, signal.SIGKILL)
        self.unshare.wait(timeout=30)


class Load:
    """Fresh connections to 127.0.0.1:port, each `GET /` with `Connection: close`, from a few
    threads until stopped: how many were answered 200, refused, reset, or answered otherwise."""

    def __init__(self, port, threads=4):
        self.port = port
        self.counts = {"ok": 0, "refused": 0, "reset": 0, "other": 0}
        self.lock = threading.Lock()
        self.running = True
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def one(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
            return "ok" if data.startswith(b"HTTP/1.1 200") else "other"
        except ConnectionRefusedError:
            return "refused"
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        except OSError:
            return "other"

    def loop(self):
        while self.running:
            kind = self.one()
            with self.lock:
                self.counts[kind] += 1

    def end(self):
        self.running = False
        for t in self.threads:
            t.join()
        return dict(self.counts)


class Pool:
    """A keep-alive pool of `conns` connections to 127.0.0.1:port that writes its next `GET /` the
    moment an answer ends (no idle gap) and opens a new connection when an answer says
    `Connection: close`: how many were answered 200, and how many were lost after being written
    (an end of file or a reset instead of the answer)."""

    def __init__(self, port, conns=8):
        self.port = port
        self.counts = {"ok": 0, "lost": 0, "refused": 0, "other": 0}
        self.lock = threading.Lock()
        self.running = True
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(conns)]
        for t in self.threads:
            t.start()

    def answer(self, f):
        status = f.readline()
        if not status:
            return None
        close, length = False, 0
        while (line := f.readline()) not in (b"\r\n", b""):
            lower = line.lower()
            close |= lower.startswith(b"connection: close")
            if lower.startswith(b"content-length:"):
                length = int(lower.split(b":")[1])
        body = f.read(length)
        return (status.startswith(b"HTTP/1.1 200") and len(body) == length), close

    def connection(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except ConnectionRefusedError:
            return "refused"
        with s, s.makefile("rb") as f:
            while self.running:
                try:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    got = self.answer(f)
                except OSError:
                    got = None
                if got is None:
                    return "lost"
                with self.lock:
                    self.counts["ok" if got[0] else "other"] += 1
                if got[1]:
                    return None
        return None

    def loop(self):
        while self.running:
            kind = self.connection()
            if kind:
                with self.lock:
                    self.counts[kind] += 1

    def end(self):
        self.running = False
        for t in self.threads:
            t.join()
        return dict(self.counts)


def measure(sd, text, reloads):
    """The restart-in-place unit through `reloads` reloads in a row under fresh connections and a
    pool with no idle gap: one table row for docs/performance.md."""
    port = free_port()
    sd.install("myweb.service", text.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    sd.run("systemctl", "start", "myweb")
    sd.wait(lambda: sd.show("myweb")["ActiveState"] == "active", 30, "myweb active")
    load, pool = Load(port), Pool(port)
    times = []
    started = time.monotonic()
    for _ in range(reloads):
        time.sleep(0.05)
        old = sd.show("myweb")["MainPID"]
        began = time.monotonic()
        reload = sd.run("systemctl", "reload", "myweb", check=False)
        check_quiet = reload.returncode == 0
        if not check_quiet:
            fail(f"reload failed: {reload.stderr}")
        sd.wait(lambda: not os.path.exists(f"/proc/{sd.pid}/root/proc/{old}"), 60, "the old process to exit")
        times.append(time.monotonic() - began)
    fresh, pooled = load.end(), pool.end()
    secs = time.monotonic() - started
    now = sd.show("myweb")
    sd.run("systemctl", "stop", "myweb")
    times.sort()
    pct = lambda p: times[round((len(times) - 1) * p)] * 1000
    print("| variant | reloads | answered 200 | 200/s | not 200 | refused | reset (new) | lost (pooled) | NRestarts | Result | restart p50 | restart p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = fresh["ok"] + pooled["ok"]
    print(f"| systemctl reload (myweb.service) | {reloads} | {ok} | {ok / secs:.0f} | {fresh['other'] + pooled['other']} "
          f"| {fresh['refused'] + pooled['refused']} | {fresh['reset']} | {pooled['lost']} | {now['NRestarts']} "
          f"| {now['Result']} | {pct(0.5):.0f} ms | {pct(0.99):.0f} ms |")


def check(what, condition, detail=""):
    if not condition:
        fail(f"{what}: {detail}")
    print(f"  ok: {what}")


def planned_stop_and_restarts(sd, text, label, bin_):
    """The plain units: a planned stop, a restart by 75, a crash and `systemctl kill`."""
    print(f"== {label}")
    sd.install("myapp.service", text)
    sd.run("systemctl", "start", "myapp")
    sd.wait(lambda: sd.show("myapp")["ActiveState"] == "active", 30, "myapp active")
    first = sd.show("myapp")["MainPID"]
    sd.run("systemctl", "stop", "myapp")
    now = sd.show("myapp")
    check(f"{label}: systemctl stop is a planned stop",
          now["ActiveState"] == "inactive" and now["Result"] == "success" and now["ExecMainStatus"] == "0", now)

    sd.run("systemctl", "start", "myapp")
    sd.wait(lambda: sd.show("myapp")["ActiveState"] == "active", 30, "myapp active")
    main = sd.show("myapp")["MainPID"]
    check(f"{label}: a new start is a new process", main != first, main)
    restarts = int(sd.show("myapp")["NRestarts"])
    sd.run(bin_, "stop", "--restart", "--pid", main, "--dir", "/run/myapp", "--wait", "30")

    def restarted(after):
        now = sd.show("myapp")
        return (now["ActiveState"] == "active" and now["MainPID"] not in ("0", after)
                and int(now["NRestarts"]) == restarts + 1)

    sd.wait(lambda: restarted(main), 30, "the restart by 75")
    check(f"{label}: stop --restart exits 75 and systemd starts it again", sd.show("myapp")["Result"] == "success")

    for how, signal_name, code in (("a crash (SIGKILL)", "KILL", None), ("systemctl kill (SIGTERM, no marker)", "TERM", "1")):
        main = sd.show("myapp")["MainPID"]
        restarts = int(sd.show("myapp")["NRestarts"])
        sd.run("systemctl", "kill", "-s", signal_name, "myapp")
        if code is not None:
            sd.wait(lambda: sd.show("myapp")["SubState"] == "auto-restart", 30, f"{how}: the exit")
            check(f"{label}: {how} exits {code}", sd.show("myapp")["ExecMainStatus"] == code, sd.show("myapp"))
        sd.wait(lambda: restarted(main), 30, f"{how}: the restart")
        check(f"{label}: {how} is restarted", True)
    sd.run("systemctl", "stop", "myapp")


def restart_in_place(sd, text, bin_):
    """`systemctl reload` under load: the successor becomes the unit's main process."""
    print("== restart in place (myweb.service, systemctl reload)")
    port = free_port()
    sd.install("myweb.service", text.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    stop_timeout = int(re.search(r"^TimeoutStopSec=(\d+)", text, re.M).group(1))
    sd.run("systemctl", "start", "myweb")
    sd.wait(lambda: sd.show("myweb")["ActiveState"] == "active", 30, "myweb active")
    for round_ in (1, 2):
        old = sd.show("myweb")["MainPID"]
        load = Load(port)
        began = time.monotonic()
        reload = sd.run("systemctl", "reload", "myweb", check=False)
        check(f"reload {round_} exits 0", reload.returncode == 0, reload.stderr + sd.log("myweb")[-3000:])
        successor = sd.show("myweb")["MainPID"]
        check(f"reload {round_}: the successor is the main process", successor not in ("0", old), successor)
        sd.wait(lambda: not os.path.exists(f"/proc/{sd.pid}/root/proc/{old}"), 60, "the old process to exit")
        if round_ == 1:
            # Past the point where systemd would have timed the unit out and killed the successor.
            time.sleep(max(0.0, stop_timeout + RELOAD_SETTLE - (time.monotonic() - began)))
        counts = load.end()
        now = sd.show("myweb")
        check(f"reload {round_}: active, same successor, NRestarts=0, Result=success",
              now["ActiveState"] == "active" and now["SubState"] == "running" and now["MainPID"] == successor
              and now["NRestarts"] == "0" and now["Result"] == "success", now)
        check(f"reload {round_}: nothing refused or reset under load ({counts})",
              counts["refused"] == 0 and counts["reset"] == 0 and counts["other"] == 0 and counts["ok"] > 0, counts)
    sd.run("systemctl", "stop", "myweb")
    now = sd.show("myweb")
    check("myweb: systemctl stop is a planned stop", now["Result"] == "success" and now["ExecMainStatus"] == "0",
          f"{now}\n{sd.log('myweb')[-4000:]}")


def socket_activated(sd, socket_text, service_text):
    """`systemctl restart` of a service whose socket systemd holds: nothing refused."""
    print("== socket activation (mysock.socket, systemctl restart)")
    port = free_port()
    sd.install("mysock.socket", socket_text.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    sd.install("mysock.service", service_text)
    sd.run("systemctl", "start", "mysock.socket")
    sd.run("systemctl", "start", "mysock.service")
    sd.wait(lambda: sd.show("mysock.service")["ActiveState"] == "active", 30, "mysock active")
    old = sd.show("mysock.service")["MainPID"]
    load = Load(port)
    time.sleep(0.5)  # some load before the restart, so the counts cover both lives
    sd.run("systemctl", "restart", "mysock.service")
    sd.wait(lambda: sd.show("mysock.service")["ActiveState"] == "active", 30, "mysock active again")
    time.sleep(0.5)
    counts = load.end()
    now = sd.show("mysock.service")
    check("socket: the restart is a new process", now["MainPID"] not in ("0", old), now)
    check(f"socket: nothing refused or reset across the restart ({counts})",
          counts["refused"] == 0 and counts["reset"] == 0 and counts["other"] == 0 and counts["ok"] > 0, counts)
    sd.run("systemctl", "stop", "mysock.service", "mysock.socket")


def main():
    reloads = None
    if len(sys.argv) == 6 and sys.argv[4] == "--measure":
        reloads = int(sys.argv.pop())
        sys.argv.pop()
    if len(sys.argv) != 4:
        fail("usage: systemd_play.py docs/operations.md PLANNED_STOP_BIN RESTART_IN_PLACE_BIN [--measure RELOADS]")
    doc, bin_, web = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    found = []
    for name, text in units(open(doc).read()):
        text = (text.replace("/usr/local/bin/planned-stop", bin_).replace("/usr/local/bin/myapp", bin_)
                .replace("/usr/local/bin/myweb", web))
        found.append((name, text))
    names = [name for name, _ in found]
    if names.count("myapp.service") != 2 or not {"myweb.service", "mysock.socket", "mysock.service"} <= set(names):
        fail(f"expected two myapp.service units, myweb.service and mysock.socket/.service, found {names}")
    sd = Systemd([bin_, web])
    if reloads is not None:
        try:
            measure(sd, dict(found)["myweb.service"], reloads)
        finally:
            sd.stop()
        return
    try:
        plain = [text for name, text in found if name == "myapp.service"]
        planned_stop_and_restarts(sd, plain[0], "myapp (Type=notify)", bin_)
        planned_stop_and_restarts(sd, plain[1], "myapp (Type=exec)", bin_)
        restart_in_place(sd, dict(found)["myweb.service"], bin_)
        socket_activated(sd, dict(found)["mysock.socket"], dict(found)["mysock.service"])
    finally:
        sd.stop()
    print(f"systemd play: {len(found)} units played under systemd "
          f"{subprocess.run(['systemctl', '--version'], capture_output=True, text=True).stdout.split()[1]}")


if __name__ == "__main__":
    main()
