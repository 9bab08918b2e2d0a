#!/usr/bin/python3
"""gRPC's own log lines never carry a stranger's raw bytes to the terminal, and a
burst of them is one line and a count.

A peer that sends terminal escapes instead of the HTTP/2 preface makes gRPC log
"Connect string mismatch ... got '<byte>'"; agentrt-bus routes gRPC's logging
through its own (comms/grpc_log.h), which escapes every non-printable byte.
With gRPC's own logger the ESC byte reaches stderr raw.

Thirty plaintext clients at a TLS bus each fail their handshake; gRPC logs an
error for each, and agentrt prints the first and then how many more there were."""
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import check, run_scenarios, wait_for  # noqa: E402

BIN = os.environ["AGENTRT_BIN_DIR"]

HOSTILE = b"\x1b[31mEVIL\x07\x00\xff\x1b]0;owned\x07"


def escapes(work):
    secret = os.path.join(work, "bus.secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    escaped(work, secret)
    burst(work, secret)


@contextlib.contextmanager
def broker(work, name, secret, flags=(), env=None):
    """An agentrt-bus on loopback, its stderr in WORK/NAME.stderr: yields (host, port, that path);
    terminated on the way out."""
    address_file = os.path.join(work, name + ".address")
    err_path = os.path.join(work, name + ".stderr")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([os.path.join(BIN, "agentrt-bus"), "--open", "--secret-file", secret,
                                 "--host", "127.0.0.1", "--port", "0", "--address-file", address_file] + list(flags),
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_for("%s's address file" % name, lambda: os.path.exists(address_file) or proc.poll() is not None, 30)
        check(proc.poll() is None, "%s is running (rc %s)" % (name, proc.returncode))
        with open(address_file) as f:
            host, port = f.read().strip().rsplit(":", 1)
        yield host, int(port), err_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def logged(path, needle):
    with open(path, "rb") as f:
        text = f.read()
    return text if needle in text else None


def burst(work, secret):
    if not shutil.which("openssl"):
        print("SKIPPED: the handshake burst needs openssl to make a certificate")
        return
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key",
                    "-out", "tls.pem", "-days", "1", "-subj", "/CN=127.0.0.1"],
                   cwd=work, check=True, capture_output=True, timeout=60)
    clients = 30
    tls = ["--tls-cert", os.path.join(work, "tls.pem"), "--tls-key", os.path.join(work, "tls.key")]
    with broker(work, "tls-bus", secret, tls) as (host, port, err_path):
        for _ in range(clients):  # plaintext HTTP/2 where TLS is expected
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                s.settimeout(10)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        wait_for("gRPC's handshake errors", lambda: logged(err_path, b"andshake"), 15)
    with open(err_path, "rb") as f:
        lines = f.read().decode("utf-8", "replace").splitlines()
    print("\n".join(lines[:6]))
    sites = {}
    for ln in lines:
        m = re.match(r"agentrt: grpc (?:error|info) \(([^)]+)\)", ln)
        if m:
            sites[m.group(1)] = sites.get(m.group(1), 0) + 1
    counted = {}
    for ln in lines:
        m = re.match(r"agentrt: grpc \(([^)]+)\): (\d+) more lines? like the last from here", ln)
        if m:
            counted[m.group(1)] = counted.get(m.group(1), 0) + int(m.group(2))
    check(sites and max(sites.values()) <= 2,
          "each place in gRPC printed at most 2 lines for %d bad clients: %s" % (clients, sites))
    check(any(sites.get(site, 0) + n >= clients for site, n in counted.items()),
          "and a count says how many more there were: %s" % counted)
    print("PASS: %d failed handshakes made %d lines" % (clients, len(lines)))


def escaped(work, secret):
    env = dict(os.environ, GRPC_VERBOSITY="debug", GRPC_TRACE="tcp")
    with broker(work, "bus", secret, env=env) as (host, port, err_path):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(HOSTILE)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            while s.recv(4096):  # the broker closes the connection after the bad preface
                pass
        text = wait_for("gRPC's log of the bad preface", lambda: logged(err_path, b"Connect string mismatch"), 15)
    line = [ln for ln in text.split(b"\n") if b"Connect string mismatch" in ln][0]
    print("logged: %s" % line[:300].decode("ascii", "replace"))
    check(line.startswith(b"agentrt: grpc "), "the line went through agentrt's logger")
    raw = sorted(set(re.findall(rb"[\x00-\x08\x0b-\x1f\x7f-\xff]", text)))
    check(not raw, "no raw control or non-ASCII byte reached stderr (found %r)" % raw)
    check(b"\\x1b" in line, "the peer's ESC byte is shown escaped")
    print("PASS: gRPC's log lines are escaped")


if __name__ == "__main__":
    # The work folder goes on success and stays (named) on failure.
    sys.exit(run_scenarios({"escapes": escapes}, "escapes", "agentrt-bus-log"))
