"""tandem serve --device and its CUDA MPS control daemon, without a GPU.

The supervisor runs a copy of the tandem binary in a folder of its own, beside stand-in
services (kvd, verifyd, draftd: shell scripts that record their arguments and MPS variables,
then wait for SIGTERM), so that what it hands each service can be read back. A stand-in
nvidia-cuda-mps-control, first on PATH, records each call (`-d`, or the command read on its
stdin) with its environment into one events file, which the stand-in services append to when
they stop: the order of the lines is the order of the events.
"""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
BUILD = pathlib.Path(os.environ.get("TANDEM_BUILD_DIR") or ROOT / "build")
SERVICES = ["kvd", "verifyd", "draftd"]
WARNING = ("verifyd and draftd each hold their own GPU context, so every draft/verify round trip "
           "pays a GPU context switch (about 290 us measured on an H200, against about 10 us "
           "under MPS)")

FAKE_SERVICE = r"""#!/bin/sh
PATH=/usr/bin:/bin
name=$(basename "$0")
trap 'echo "$name stopped" >> "$FAKE_REC/events"; exit 0' TERM
{ echo "pid $$"; echo "argv $*"
  echo "pipe ${CUDA_MPS_PIPE_DIRECTORY-<unset>}"; echo "log ${CUDA_MPS_LOG_DIRECTORY-<unset>}"
} > "$FAKE_REC/$name.tmp" && mv "$FAKE_REC/$name.tmp" "$FAKE_REC/$name.txt"
while :; do sleep 0.05 & wait $!; done
"""

FAKE_MPS = r"""#!/usr/bin/env python3
# As the real control program: -d starts a daemon that listens on <pipe>/control and writes
# <pipe>/nvidia-cuda-mps-control.pid; a command read on stdin goes to it over the socket; on
# "quit" the daemon removes its pid file and exits, leaving its socket file behind.
import os, socket, sys, time
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "<unset>")
env = f"pipe={pipe} log={os.environ.get('CUDA_MPS_LOG_DIRECTORY', '<unset>')}"
rec = os.environ["FAKE_REC"]
sock_path = os.path.join(pipe, "control")
pid_path = os.path.join(pipe, "nvidia-cuda-mps-control.pid")

def note(path, line):
    with open(os.path.join(rec, path), "a") as f:
        f.write(line + "\n")

def daemon():
    time.sleep(float(os.environ.get("FAKE_MPS_LATE", "0")))  # seconds before it comes up
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # as the real daemon's
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    s.bind(sock_path)
    s.listen(8)
    with open(pid_path + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(pid_path + ".tmp", pid_path)
    note("daemons", str(os.getpid()))
    while True:
        c, _ = s.accept()
        c.settimeout(5)
        try:
            cmd = c.recv(64).decode().strip()
        except OSError:
            cmd = ""
        c.close()
        if cmd == "quit" and not os.environ.get("FAKE_MPS_STUCK"):
            os.unlink(pid_path)
            os._exit(0)

if sys.argv[1:] == ["-d"]:
    note("events", f"start {env}")
    if os.environ.get("FAKE_MPS_RC", "0") != "0":
        print("fake mps: cannot start", file=sys.stderr)
        sys.exit(int(os.environ["FAKE_MPS_RC"]))
    if os.environ.get("FAKE_MPS_NO_DAEMON"):
        sys.exit(0)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            daemon()
        os._exit(0)
    sys.exit(0)
cmd = sys.stdin.readline().strip()
note("events", f"{cmd} {env}")
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sock_path)
s.sendall(cmd.encode() + b"\n")
s.close()
"""


def write_exe(path, text):
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def tandem():
    exe = (BUILD / "tandem").resolve()
    assert exe.is_file(), f"no tandem binary at {exe} (set TANDEM_BUILD_DIR)"
    return exe


@pytest.fixture
def world(tandem):
    """Folders of one test: bin/ (tandem copy and stand-in services), fake/ (the stand-in MPS
    program), rec/ (records), rt/ (the runtime directory, short for its socket paths)."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="tmps", dir="/tmp"))
    w = {k: top / k for k in ["bin", "fake", "rec", "rt", "empty"]}
    for d in w.values():
        d.mkdir(mode=0o700)
    shutil.copy2(tandem, w["bin"] / "tandem")
    for name in SERVICES:
        write_exe(w["bin"] / name, FAKE_SERVICE)
    write_exe(w["fake"] / "nvidia-cuda-mps-control", FAKE_MPS)
    (top / "m.gguf").write_bytes(b"")
    (top / "draft").mkdir()
    w["top"], w["procs"] = top, []
    yield w
    for p in w["procs"]:
        if p.poll() is None:
            p.kill()
            p.wait()
    for name in SERVICES:  # stand-ins a killed supervisor left behind
        rec = w["rec"] / f"{name}.txt"
        if rec.exists():
            kill(read_record(rec)["pid"])
    for pid in daemons(w):  # stand-in daemons that were not told to quit
        kill(pid)
    shutil.rmtree(top, ignore_errors=True)


def kill(pid):
    try:
        os.kill(int(pid), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
        pass


def alive(pid):
    """Whether pid runs (a zombie nobody has reaped yet does not)."""
    try:
        stat = pathlib.Path(f"/proc/{int(pid)}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def daemons(w):
    """Pids of the stand-in daemons started so far."""
    path = w["rec"] / "daemons"
    return path.read_text().split() if path.exists() else []


def base_env(w, path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")
           and k not in ("TANDEM_DEVICE", "TANDEM_RUNTIME_DIR", "TANDEM_LOG")}
    env["PATH"] = path if path is not None else \
        f"{w['fake']}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env["FAKE_REC"] = str(w["rec"])
    return env


def start_serve(w, *args, env=None):
    env = env or base_env(w)
    log = open(w["top"] / "serve.log", "ab")
    p = subprocess.Popen([str(w["bin"] / "tandem"), "serve", "--runtime-dir", str(w["rt"]),
                          "--no-gateway", "--model", str(w["top"] / "m.gguf"),
                          "--draft", str(w["top"] / "draft"), *args],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    w["procs"].append(p)
    return p


def serve_log(w):
    return (w["top"] / "serve.log").read_text()


def read_record(path):
    rec = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        rec[key] = value
    return rec


def wait_services(w, p, timeout=20.0):
    """The records of the three stand-in services, once each has started."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert p.poll() is None, f"tandem serve exited with {p.returncode}:\n{serve_log(w)}"
        if all((w["rec"] / f"{n}.txt").exists() for n in SERVICES):
            return {n: read_record(w["rec"] / f"{n}.txt") for n in SERVICES}
        time.sleep(0.05)
    pytest.fail(f"the services did not start:\n{serve_log(w)}")


def stop_serve(w, p, sig=signal.SIGTERM):
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    assert rc == 0, serve_log(w)


def events(w):
    path = w["rec"] / "events"
    return path.read_text().splitlines() if path.exists() else []


def status(w):
    r = subprocess.run([str(w["bin"] / "tandem"), "status", "--runtime-dir", str(w["rt"])],
                       capture_output=True, text=True, timeout=30, env=base_env(w))
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["sigterm", "sigint", "sighup"])
def test_cuda_services_are_clients_of_a_private_mps_daemon_stopped_after_them(world, sig):
    w = world
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    p = start_serve(w, "--device", "cuda:1")
    recs = wait_services(w, p)
    assert events(w) == [f"start pipe={pipe} log={log}"]
    assert (pipe.stat().st_mode & 0o777, log.stat().st_mode & 0o777) == (0o700, 0o700)
    for name, rec in recs.items():
        assert "--device cuda:1" in rec["argv"], (name, rec)
        assert (rec["pipe"], rec["log"]) == (str(pipe), str(log)), name
    out = status(w)
    assert "device: cuda:1" in out
    assert f"mps: in use: control daemon started by tandem serve, pipes in {pipe}" in out
    stop_serve(w, p, sig)
    ev = events(w)
    assert ev[0] == f"start pipe={pipe} log={log}"
    assert sorted(ev[1:4]) == sorted(f"{n} stopped" for n in SERVICES)  # clients go first
    assert ev[4:] == [f"quit pipe={pipe} log={log}"]
    [daemon] = daemons(w)
    assert not alive(daemon)  # gone before serve exits, and its leftover socket with it
    assert not (pipe / "nvidia-cuda-mps-control.pid").exists()
    assert not (pipe / "control").exists()
    assert "MPS control daemon stopped" in serve_log(w)
    assert not (w["rt"] / "serve-info.txt").exists()


def test_cpu_services_get_no_mps_daemon_and_no_mps_variables(world):
    w = world
    p = start_serve(w)  # --device defaults to cpu
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert "--device cpu" in rec["argv"], (name, rec)
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    out = status(w)
    assert "device: cpu" in out
    assert "mps: not used (the services run on the CPU)" in out
    stop_serve(w, p)
    assert sorted(events(w)) == sorted(f"{n} stopped" for n in SERVICES)
    assert not (w["rt"] / "mps").exists()
    assert "running without MPS" not in serve_log(w)


def test_missing_mps_program_gives_a_warning_and_services_without_mps(world):
    w = world
    p = start_serve(w, "--device", "cuda", env=base_env(w, path=str(w["empty"])))
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert "--device cuda:0" in rec["argv"], (name, rec)
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    text = serve_log(w)
    assert f"running without MPS (nvidia-cuda-mps-control is not on PATH): {WARNING}" in text
    assert ("mps: off (nvidia-cuda-mps-control is not on PATH): each draft/verify round trip "
            "pays a GPU context switch") in status(w)
    stop_serve(w, p)
    assert sorted(events(w)) == sorted(f"{n} stopped" for n in SERVICES)


def test_mps_daemon_that_exits_non_zero_gives_a_warning_and_is_not_told_to_quit(world):
    w = world
    env = base_env(w)
    env["FAKE_MPS_RC"] = "3"
    p = start_serve(w, "--device", "cuda:0", env=env)
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    mps_log = w["rt"] / "logs" / "mps.log"
    assert (f"running without MPS (nvidia-cuda-mps-control -d exited with status 3; its output "
            f"is in {mps_log}): {WARNING}") in serve_log(w)
    assert mps_log.read_text() == "fake mps: cannot start\n"
    stop_serve(w, p)
    ev = events(w)
    assert ev[0] == f"start pipe={pipe} log={log}"
    assert sorted(ev[1:]) == sorted(f"{n} stopped" for n in SERVICES)  # no quit


def test_mps_daemon_that_never_listens_gives_a_warning_and_services_without_mps(world):
    w = world
    env = base_env(w)
    env["FAKE_MPS_NO_DAEMON"] = "1"
    p = start_serve(w, "--device", "cuda:0", env=env)
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    mps_log = w["rt"] / "logs" / "mps.log"
    assert (f"running without MPS (nvidia-cuda-mps-control -d left no daemon listening on "
            f"{pipe}/control in 5000 ms; see {mps_log} and {log}/control.log): {WARNING}"
            in serve_log(w))
    stop_serve(w, p)
    ev = events(w)
    assert ev[0] == f"start pipe={pipe} log={log}"
    assert sorted(ev[1:]) == sorted(f"{n} stopped" for n in SERVICES)


def test_daemon_that_comes_up_too_late_runs_no_client_and_is_told_to_quit(world):
    w = world
    env = base_env(w)
    env["FAKE_MPS_LATE"] = "6"
    p = start_serve(w, "--device", "cuda:0", env=env)
    recs = wait_services(w, p, timeout=30)
    for name, rec in recs.items():
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    assert f"-d left no daemon listening on {pipe}/control in 5000 ms" in serve_log(w)
    end = time.monotonic() + 20
    while not daemons(w) and time.monotonic() < end:
        time.sleep(0.05)
    [late] = daemons(w)
    stop_serve(w, p)
    assert (f"the MPS control daemon of {pipe} came up after serve went on without it; "
            f"telling it to quit") in serve_log(w)
    assert "MPS control daemon stopped" in serve_log(w)
    assert events(w)[-1] == f"quit pipe={pipe} log={log}"
    assert not alive(late)
    assert not (pipe / "control").exists()


def test_no_mps_starts_no_daemon_and_drops_inherited_mps_variables(world):
    w = world
    env = base_env(w)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(w["top"] / "elsewhere")
    env["CUDA_MPS_LOG_DIRECTORY"] = str(w["top"] / "elsewhere-log")
    p = start_serve(w, "--device", "cuda:0", "--no-mps", env=env)
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert "--device cuda:0" in rec["argv"], (name, rec)
        assert (rec["pipe"], rec["log"]) == ("<unset>", "<unset>"), name
    assert f"running without MPS (--no-mps): {WARNING}" in serve_log(w)
    assert ("mps: off (--no-mps): each draft/verify round trip pays a GPU context switch"
            in status(w))
    stop_serve(w, p)
    assert sorted(events(w)) == sorted(f"{n} stopped" for n in SERVICES)


def user_env(w, user_pipe):
    env = base_env(w)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(user_pipe)
    env["CUDA_MPS_LOG_DIRECTORY"] = str(w["top"] / "user-log")
    return env


def test_users_own_mps_daemon_is_used_and_left_running(world):
    w = world
    user_pipe = w["top"] / "user-pipe"
    user_pipe.mkdir()
    listener = socket.socket(socket.AF_UNIX)  # the user's daemon, as far as serve can tell
    listener.bind(str(user_pipe / "control"))
    listener.listen(8)
    p = start_serve(w, "--device", "cuda:2", env=user_env(w, user_pipe))
    recs = wait_services(w, p)
    for name, rec in recs.items():
        assert (rec["pipe"], rec["log"]) == (str(user_pipe), str(w["top"] / "user-log")), name
    assert f"mps: in use: the user's control daemon, pipes in {user_pipe}" in status(w)
    stop_serve(w, p)
    assert sorted(events(w)) == sorted(f"{n} stopped" for n in SERVICES)  # no start, no quit
    assert (user_pipe / "control").exists()
    assert not (w["rt"] / "mps").exists()
    listener.close()


def test_users_pipe_directory_with_a_leftover_socket_only_gets_a_warning(world):
    w = world
    user_pipe = w["top"] / "user-pipe"
    user_pipe.mkdir()
    gone = socket.socket(socket.AF_UNIX)  # a daemon that has quit leaves its socket file
    gone.bind(str(user_pipe / "control"))
    gone.close()
    p = start_serve(w, "--device", "cuda:0", env=user_env(w, user_pipe))
    recs = wait_services(w, p)
    for name, rec in recs.items():  # still its clients: the daemon may start there later
        assert rec["pipe"] == str(user_pipe), name
    assert (f"CUDA_MPS_PIPE_DIRECTORY={user_pipe} names no running MPS control daemon (none "
            f"listens on {user_pipe}/control)") in serve_log(w)
    assert (f"mps: in use: the user's control daemon, pipes in {user_pipe} (no daemon "
            f"listened on {user_pipe}/control when serve started)") in status(w)
    stop_serve(w, p)
    assert sorted(events(w)) == sorted(f"{n} stopped" for n in SERVICES)


def test_daemon_of_a_killed_supervisor_is_told_to_quit_by_the_next_one(world):
    w = world
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    first = start_serve(w, "--device", "cuda")
    old = wait_services(w, first)
    first.kill()
    first.wait()
    for rec in old.values():  # the orphaned stand-ins, as a killed supervisor leaves them
        os.kill(int(rec["pid"]), signal.SIGKILL)
    (w["rec"] / "events").unlink()
    for name in SERVICES:
        (w["rec"] / f"{name}.txt").unlink()
    [orphan] = daemons(w)
    assert alive(orphan)
    p = start_serve(w, "--device", "cuda")
    wait_services(w, p)
    assert events(w) == [f"quit pipe={pipe} log={log}", f"start pipe={pipe} log={log}"]
    assert f"an MPS control daemon was left in {pipe}; telling it to quit" in serve_log(w)
    assert not alive(orphan)
    stop_serve(w, p)
    assert events(w)[-1] == f"quit pipe={pipe} log={log}"
    assert not any(alive(d) for d in daemons(w))


def test_socket_and_pid_file_of_a_daemon_that_is_gone_are_no_daemon(world):
    """What a daemon killed outright leaves: its socket and its pid file, naming no process."""
    w = world
    pipe, log = w["rt"] / "mps" / "pipe", w["rt"] / "mps" / "log"
    pipe.mkdir(parents=True, mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{dead.pid}\n")
    gone = socket.socket(socket.AF_UNIX)
    gone.bind(str(pipe / "control"))
    gone.close()
    p = start_serve(w, "--device", "cuda")
    recs = wait_services(w, p)
    assert events(w) == [f"start pipe={pipe} log={log}"]  # nothing told to quit
    assert "was left" not in serve_log(w)
    for name, rec in recs.items():
        assert rec["pipe"] == str(pipe), name
    stop_serve(w, p)
    assert events(w)[-1] == f"quit pipe={pipe} log={log}"
    assert not (pipe / "control").exists()


def test_daemon_that_does_not_quit_gives_a_warning(world):
    w = world
    env = base_env(w)
    env["FAKE_MPS_STUCK"] = "1"
    p = start_serve(w, "--device", "cuda", env=env)
    wait_services(w, p)
    stop_serve(w, p)
    pipe = w["rt"] / "mps" / "pipe"
    assert f"the MPS control daemon of {pipe} did not quit in 10000 ms" in serve_log(w)
    assert "MPS control daemon stopped" not in serve_log(w)
    assert (pipe / "control").exists()  # not removed under a daemon that may still use it


@pytest.mark.parametrize("device,message", [
    ("gpu", "--device: expected cpu, cuda or cuda:N, got 'gpu'"),
    ("cuda:x", "--device: bad CUDA device number in 'cuda:x'"),
])
def test_unknown_device_is_refused_before_anything_starts(world, device, message):
    w = world
    r = subprocess.run([str(w["bin"] / "tandem"), "serve", "--runtime-dir", str(w["rt"]),
                        "--device", device], capture_output=True, text=True, timeout=30,
                       env=base_env(w))
    assert r.returncode == 2
    assert f"tandem serve: {message}" in r.stderr
    assert events(w) == [] and not (w["rt"] / "mps").exists()
