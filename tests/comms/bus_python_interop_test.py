#!/usr/bin/python3
"""Python client generated from comms/proto/bus.proto talks to the C++ broker.

Runs under Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools).
Starts the real agentrt-bus, then: Python publishes (with a retried sequence,
stored once) and subscribes in order; a C++ client (agentrt-bus publish/fetch)
reads what Python published and publishes what Python reads; a wrong token is
UNAUTHENTICATED and an ACL violation PERMISSION_DENIED. Exit 0 = pass.
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import Failure, agent_token as token, check, run_scenarios, test_plan  # noqa: E402

import grpc
from grpc_tools import protoc

SRC = os.environ.get("AGENTRT_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ["AGENTRT_BIN_DIR"]
DEADLINE_S = 10


def fail(msg):
    raise Failure(msg)


def interop(work):
    gen = os.path.join(work, "gen")
    os.makedirs(gen)
    rc = protoc.main(["grpc_tools.protoc", "-I" + SRC, "--python_out=" + gen, "--grpc_python_out=" + gen,
                      os.path.join(SRC, "comms/proto/bus.proto")])
    check(rc == 0, "grpc_tools.protoc failed on comms/proto/bus.proto")
    sys.path.insert(0, gen)
    from comms.proto import bus_pb2, bus_pb2_grpc  # noqa: E402  (generated just now)

    secret = os.urandom(32)
    secret_file = os.path.join(work, "bus.secret")
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secret)
    os.close(fd)
    plan = test_plan("interop", ["py-pub", "py-sub", "cxx-agent"],
                     [("interop", ["py-pub", "cxx-agent"], ["py-sub", "cxx-agent"])])
    plan_file = os.path.join(work, "plan.json")
    with open(plan_file, "w") as f:
        json.dump(plan, f)
    address_file = os.path.join(work, "bus.address")
    broker = subprocess.Popen([os.path.join(BIN, "agentrt-bus"), "--plan", plan_file, "--secret-file", secret_file,
                               "--host", "127.0.0.1", "--port", "0", "--address-file", address_file])
    try:
        end = time.time() + 30
        while not os.path.exists(address_file):
            check(time.time() < end, "agentrt-bus did not write its address file within 30 s")
            check(broker.poll() is None, "agentrt-bus exited early with %s" % broker.returncode)
            time.sleep(0.05)
        with open(address_file) as f:
            address = f.read().strip()
        run(address, secret, work, bus_pb2, bus_pb2_grpc)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            check(broker.wait(timeout=20) == 0, "agentrt-bus did not exit 0 on SIGTERM")
        except subprocess.TimeoutExpired:
            broker.kill()
            fail("agentrt-bus did not stop within 20 s of SIGTERM")
    print("PASS: python client interoperates with the C++ broker and client")


def md(secret, agent):
    return (("x-agentrt-agent", agent), ("x-agentrt-token", token(secret, agent)))


def write_token_file(work, agent, secret):
    path = os.path.join(work, agent + ".token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps({"agent": agent, "token": token(secret, agent)}).encode())
    os.close(fd)
    return path


def run(address, secret, work, bus_pb2, bus_pb2_grpc):
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
    stub = bus_pb2_grpc.BusStub(channel)
    n = 1000
    pid = 0x5eed
    # Python publishes 1000 messages; message 500 is sent twice (a retry).
    for i in range(n):
        req = bus_pb2.PublishRequest(topic="interop", payload=str(i).encode(), content_type="text/plain",
                                     publisher_id=pid, sequence=i + 1)
        resp = stub.Publish(req, metadata=md(secret, "py-pub"), timeout=DEADLINE_S)
        check(resp.offset == i and not resp.duplicate, "publish %d got offset %d" % (i, resp.offset))
        if i == 500:
            again = stub.Publish(req, metadata=md(secret, "py-pub"), timeout=DEADLINE_S)
            check(again.duplicate and again.offset == 500, "a retried publish was not recognised as a duplicate")

    # Subscribe from the earliest offset and read them back in order.
    start = bus_pb2.StartAt(earliest=True)
    stream = stub.Subscribe(bus_pb2.SubscribeRequest(topic="interop", start=start),
                            metadata=md(secret, "py-sub"), timeout=DEADLINE_S)
    got = []
    header = None
    for resp in stream:
        if resp.HasField("header"):
            header = resp.header
        got.extend(resp.messages)
        if len(got) >= n:
            break
    stream.cancel()
    check(header is not None and header.start_offset == 0, "the stream did not start with its header")
    check([m.payload.decode() for m in got] == [str(i) for i in range(n)], "python subscriber saw gaps or reorders")
    check(all(m.publisher == "py-pub" for m in got), "publisher not stamped")

    # C++ client reads what Python published and publishes to Python.
    cxx_token = write_token_file(work, "cxx-agent", secret)
    fetched = subprocess.run([os.path.join(BIN, "agentrt-bus"), "fetch", "--bus", address, "--token-file", cxx_token,
                              "interop", "--from", "998", "--max", "2"], capture_output=True, text=True, timeout=30)
    check(fetched.returncode == 0, "C++ fetch failed: " + fetched.stderr)
    lines = [json.loads(l) for l in fetched.stdout.splitlines()]
    check([(m["offset"], m["payload"], m["publisher"]) for m in lines] == [(998, "998", "py-pub"), (999, "999", "py-pub")],
          "C++ client read %r" % lines)
    published = subprocess.run([os.path.join(BIN, "agentrt-bus"), "publish", "--bus", address, "--token-file", cxx_token,
                                "interop", "from C++"], capture_output=True, text=True, timeout=30)
    check(published.returncode == 0 and published.stdout.strip() == "1000", "C++ publish: " + published.stderr)
    stream = stub.Subscribe(bus_pb2.SubscribeRequest(topic="interop", start=bus_pb2.StartAt(offset=1000)),
                            metadata=md(secret, "py-sub"), timeout=DEADLINE_S)
    from_cxx = None
    for resp in stream:
        if resp.messages:
            from_cxx = resp.messages[0]
            break
    stream.cancel()
    check(from_cxx is not None and from_cxx.payload == b"from C++" and from_cxx.publisher == "cxx-agent",
          "python did not receive the C++ message")

    # Refusals carry the right codes.
    try:
        stub.Publish(bus_pb2.PublishRequest(topic="interop", payload=b"x"),
                     metadata=(("x-agentrt-agent", "py-pub"), ("x-agentrt-token", "0" * 64)), timeout=DEADLINE_S)
        fail("a wrong token was accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAUTHENTICATED, "wrong token gave %s" % e.code())
    try:
        stub.Publish(bus_pb2.PublishRequest(topic="interop", payload=b"x"), metadata=md(secret, "py-sub"),
                     timeout=DEADLINE_S)
        fail("a subscriber-only agent could publish")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.PERMISSION_DENIED, "ACL violation gave %s" % e.code())
    stats = stub.Stats(bus_pb2.StatsRequest(), metadata=md(secret, "py-sub"), timeout=DEADLINE_S)
    check(stats.messages_published == n + 1 and stats.duplicates_dropped == 1, "stats: %s" % stats)


if __name__ == "__main__":
    # The work folder goes on success and stays (named) on failure.
    sys.exit(run_scenarios({"interop": interop}, "interop", "agentrt-bus-py"))
