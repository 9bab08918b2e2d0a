#!/usr/bin/python3
"""gRPC's own log lines never carry a stranger's raw bytes to the terminal.

A peer that sends terminal escapes instead of the HTTP/2 preface makes gRPC log
"Connect string mismatch ... got '<byte>'"; agentrt-bus routes gRPC's logging
through its own (comms/grpc_log.h), which escapes every non-printable byte.
With gRPC's own logger the ESC byte reaches stderr raw."""
import os
import re
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import Failure, check, wait_for  # noqa: E402

BIN = os.environ["AGENTRT_BIN_DIR"]

HOSTILE = b"\x1b[31mEVIL\x07\x00\xff\x1b]0;owned\x07"


def main():
    work = tempfile.mkdtemp(prefix="agentrt-bus-log.")
    secret = os.path.join(work, "bus.secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    address_file = os.path.join(work, "bus.address")
    err_path = os.path.join(work, "stderr")
    env = dict(os.environ, GRPC_VERBOSITY="debug", GRPC_TRACE="tcp")
    with open(err_path, "wb") as err:
        broker = subprocess.Popen([os.path.join(BIN, "agentrt-bus"), "--open", "--secret-file", secret,
                                   "--host", "127.0.0.1", "--port", "0", "--address-file", address_file],
                                  stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_for("agentrt-bus's address file",
                 lambda: os.path.exists(address_file) or broker.poll() is not None, 30)
        check(broker.poll() is None, "agentrt-bus is running (rc %s)" % broker.returncode)
        with open(address_file) as f:
            host, port = f.read().strip().rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(HOSTILE)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            while s.recv(4096):  # the broker closes the connection after the bad preface
                pass

        def logged():
            with open(err_path, "rb") as f:
                text = f.read()
            return text if b"Connect string mismatch" in text else None
        text = wait_for("gRPC's log of the bad preface", logged, 15)
    finally:
        broker.terminate()
        try:
            broker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            broker.kill()
    line = [ln for ln in text.split(b"\n") if b"Connect string mismatch" in ln][0]
    print("logged: %s" % line[:300].decode("ascii", "replace"))
    check(line.startswith(b"agentrt: grpc "), "the line went through agentrt's logger")
    raw = sorted(set(re.findall(rb"[\x00-\x08\x0b-\x1f\x7f-\xff]", text)))
    check(not raw, "no raw control or non-ASCII byte reached stderr (found %r)" % raw)
    check(b"\\x1b" in line, "the peer's ESC byte is shown escaped")
    print("PASS: gRPC's log lines are escaped")


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        print("FAILED: %s" % e)
        sys.exit(1)
