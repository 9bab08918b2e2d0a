#!/usr/bin/python3
"""The Python package `agentrt` over the C API, against the real library and a
real agentrt-bus: env pools (zero-copy views), checkpoints (round trip, async,
fallback past a tampered one), the bus (publish, callback and pulled
subscriptions, positions with their incarnation, direct messages,
request/reply, gRPC codes), the GIL released while blocked, and bad input as
Python exceptions, never a crash. One scenario per CTest entry."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import Failure, StandaloneBus, check, scenarios_main, wait_for  # noqa: E402

import numpy as np  # noqa: E402

import agentrt  # noqa: E402  (PYTHONPATH: <build>/python, set by CTest)


def raises(exc, fn, what, contains=""):
    try:
        fn()
    except exc as e:
        check(contains in str(e), "%s: %s" % (what, e))
        return e
    raise Failure("%s: no %s raised" % (what, exc.__name__))


def scenario_envpool(work):
    pool = agentrt.EnvPool("cartpole", num_envs=64, num_threads=2, seed=3)
    check(pool.observations.shape == (64, 4) and pool.actions.shape == (64, 1),
          "cartpole pool: observations [64, 4], actions [64, 1]")
    obs = pool.reset()
    first = obs.copy()
    o2, r, term, trunc = pool.step(np.ones(64))
    check(np.shares_memory(obs, o2) and np.shares_memory(r, pool.rewards),
          "step returns views of the pool's own buffers (numpy.shares_memory)")
    check(not np.array_equal(first, o2), "the views were rewritten in place by the step")
    check(not obs.flags.writeable and pool.actions.flags.writeable,
          "observations are read-only views, actions a writable one")
    pool.actions[:] = 0
    for _ in range(200):
        pool.step()
    check(pool.episode_lengths.max() > 0, "episodes end and auto-reset (lengths recorded)")
    same = agentrt.EnvPool("cartpole", num_envs=64, num_threads=1, seed=3)
    same.reset()
    check(np.array_equal(same.observations, first), "seeded resets do not depend on the threads")
    raises(ValueError, lambda: pool.step(np.ones((64, 2))), "actions of the wrong shape",
           "this pool takes (64, 1)")
    raises(TypeError, lambda: pool.step(np.array(["a"] * 64)), "actions of the wrong dtype")
    raises(agentrt.EnvError, lambda: agentrt.EnvPool("pendulum"), "an unknown env names the known",
           "cartpole")
    raises(agentrt.EnvError, lambda: agentrt.EnvPool("cartpole", num_envs=0), "num_envs 0")
    raises(TypeError, lambda: agentrt.EnvPool("cartpole", num_envs="8"), "num_envs of the wrong type")
    multi = agentrt.EnvPool("pursuit", num_envs=8, seed=1)
    check(multi.num_agents == 3 and multi.observations.shape == (8, 3, multi.obs_size) and
          multi.active.shape == (8, 3) and multi.rewards.shape == (8, 3),
          "pursuit exposes every seat: %s" % multi.agent_names)
    multi.reset()
    ended = 0
    rng = np.random.default_rng(0)
    for _ in range(300):
        _, _, term, trunc = multi.step(rng.integers(0, 5, size=(8, 3, 1)).astype(np.float32))
        ended += int(term.sum() + trunc.sum())
    check(ended > 0, "pursuit worlds end and auto-reset (%d episodes)" % ended)
    view = pool.observations
    pool.close()
    raises(agentrt.ClosedError, lambda: pool.step(), "a closed pool refuses steps")
    raises(agentrt.ClosedError, lambda: pool.observations, "a closed pool has no buffers")
    check(float(view.sum()) == float(view.sum()), "a view taken before close still reads its memory")


def scenario_checkpoint(work):
    ck = agentrt.Checkpointer(os.path.join(work, "ck"), agent="py", interval_s=0, keep_last=2)
    r = ck.restore()
    check(r.kind == "fresh" and not r.restored, "nothing to restore at first: %s" % r.describe)
    w = np.arange(1000, dtype=np.float32)
    ids = np.arange(7, dtype=np.int64).reshape(7, 1)
    ck.save(10, {"w": w, "ids": ids, "raw": b"\x00\x01\x02"}, metadata={"lr": 0.1})
    w += 1
    ck.save(20, {"w": w, "ids": ids, "raw": b"\x00\x01\x02"}, metadata={"lr": 0.2}, wait=False)
    w[:] = -5  # async: the save copied the arrays before returning
    ck.wait()
    r = ck.restore()
    check(r.restored and r.step == 20 and r.metadata == {"lr": 0.2}, "the newest step: %s" % r.describe)
    check(np.array_equal(r["w"], np.arange(1000, dtype=np.float32) + 1),
          "async save holds the values at the call, not later ones")
    check(r["ids"].shape == (7, 1) and r["ids"].dtype == np.int64, "shape and dtype come back")
    check(r.entries["raw"]["dtype"] == "uint8" and bytes(r["raw"]) == b"\x00\x01\x02",
          "a bytes entry comes back")
    # Tamper with the newest shard: restore falls back to step 10 and says why.
    shard = os.path.join(work, "ck", "step-20", "rank-0.shard")
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    r = agentrt.Checkpointer(os.path.join(work, "ck"), agent="py").restore()
    check(r.restored and r.step == 10 and r.skipped and r.skipped[0]["step"] == 20 and
          "rank-0.shard" in r.skipped[0]["file"] and "checksum" in r.skipped[0]["reason"],
          "a tampered newest checkpoint falls back to the one before: %s" % r.describe)
    view = r["w"]
    del r
    check(view[3] == 3.0, "a restored view outlives its Restore object")
    raises(ValueError, lambda: ck.save(30, {"w": w[::2]}), "a strided array", "not C-contiguous")
    raises(TypeError, lambda: ck.save(30, {"w": object()}), "a value without a buffer")
    raises(TypeError, lambda: ck.save(30, [w]), "arrays that are not a mapping")
    raises(TypeError, lambda: ck.save(30, {"w": w}, metadata={"x": object()}), "metadata not JSON")
    raises(agentrt.CheckpointError, lambda: ck.save(-1, {"w": w}), "a negative step")
    raises(agentrt.CheckpointError, lambda: agentrt.Checkpointer(work, rank=2, world_size=2),
           "a rank outside the world", "not within world_size")
    # A checkpoint of 2 ranks restored by a world of 1: the config's fault, said so.
    two = os.path.join(work, "two")
    ranks = [agentrt.Checkpointer(two, agent="py", rank=r, world_size=2) for r in (1, 0)]
    for c in ranks:  # rank 1's shard first; rank 0 commits once it is there
        c.save(5, {"w": w})
    raises(agentrt.CheckpointShapeError, lambda: agentrt.Checkpointer(two, agent="py").restore(),
           "a checkpoint of another world size", "saved by 2 ranks")
    check(issubclass(agentrt.CheckpointShapeError, agentrt.ConfigurationError) and
          issubclass(agentrt.CheckpointShapeError, agentrt.CheckpointError),
          "which is a ConfigurationError (exit 78 under agentctl) and a CheckpointError")
    # snapshot="fork": the save returns after a fork; the arrays changed at
    # once reach the checkpoint as they were at the call.
    forking = agentrt.Checkpointer(os.path.join(work, "fork"), agent="py", snapshot="fork")
    check(forking.snapshot == "fork" and ck.snapshot == "copy", "the snapshot setting is kept")
    big = np.arange(1 << 20, dtype=np.float32)
    forking.save(7, {"big": big}, wait=False)
    big[:] = -1
    forking.wait()
    check(forking.info["last_snapshot_forked"], "the async save forked: %s" % forking.info)
    r = agentrt.Checkpointer(os.path.join(work, "fork"), agent="py").restore()
    check(r.step == 7 and np.array_equal(r["big"], np.arange(1 << 20, dtype=np.float32)),
          "a forked save holds the values at the call")
    del r
    forking.close()
    raises(agentrt.CheckpointError, lambda: setattr(ck, "snapshot", "cow"), "an unknown snapshot",
           "expected copy or fork, got 'cow'")
    ck.close()
    raises(agentrt.ClosedError, lambda: ck.save(40, {"w": w}), "a closed checkpointer")


def scenario_bus(work):
    with StandaloneBus(work) as b:
        pub = agentrt.Bus.connect(b.address, "pub", b.token("pub"))
        sub = agentrt.Bus.connect(b.address, "sub", b.token("sub"))
        pub.wait_ready(10)
        got, events = [], []
        done = threading.Event()

        def on_message(m):
            got.append(m)
            if len(got) == 100:
                done.set()
        s1 = sub.subscribe("t", on_message, on_event=events.append)
        stored = [pub.publish("t", b"m%d" % i) for i in range(50)]
        check(stored == list(range(50)), "publish returns the offset each message was stored at")
        for i in range(50, 100):
            pub.publish_async("t", np.frombuffer(b"m%d" % i, dtype=np.uint8))
        pub.flush(10)
        check(done.wait(20), "the callback got all 100 messages")
        check([m.payload for m in got] == [b"m%d" % i for i in range(100)] and
              [m.offset for m in got] == list(range(100)) and got[0].publisher == "pub",
              "in offset order, with payload and publisher")
        check(any(e["kind"] == "connected" for e in events), "the stream told it connected")
        # The position moves past a message once its callback has returned.
        offsets, incarnation = wait_for("the position past the last message",
                                        lambda: (lambda p: p if p[0] == {"t": 100} else None)(
                                            sub.positions()), 10)
        check(offsets == {"t": 100} and incarnation != 0, "positions: %s @ %d" % (offsets, incarnation))
        s1.close()
        # A pulled subscription from a saved position, and the GIL released while it waits.
        pulled = sub.subscribe("t", start=98, incarnation=incarnation)
        check([pulled.next(5).offset, pulled.next(5).offset] == [98, 99], "pulled from offset 98")
        ticks = []
        ticker = threading.Thread(target=lambda: [ticks.append(time.sleep(0.01)) for _ in range(20)])
        ticker.start()
        check(pulled.next(timeout=0.5) is None, "next() times out with None")
        ticker.join()
        check(len(ticks) == 20, "another Python thread ran while next() blocked (GIL released)")
        pub.publish("t", b"late")
        check(next(iter(pulled)).payload == b"late", "iteration yields the next message")
        pulled.close()
        # A pulled subscription's position counts only what next() took.
        p2 = sub.subscribe("t", start=0)
        wait_for("messages waiting in the queue", lambda: p2.next(5) is not None, 10)
        # (The stream's own position lags its callbacks by a moment: wait for it to pass 1.)
        check(wait_for("the position", lambda: sub.positions()[0]["t"] == 1 or None, 10),
              "positions() of a pulled subscription: the first untaken message (1), not the end "
              "of what its queue holds (100)")
        p2.close()
        # Closing a subscription from its own callback stops delivery at once; a bus
        # cannot be closed from its callbacks.
        seen, refused = [], []

        def close_self(m):
            seen.append(m.offset)
            try:
                sub.close()
            except agentrt.BusError as e:
                refused.append(e)
            own.close()
        own = sub.subscribe("t", close_self)
        wait_for("the self-closing callback ran", lambda: seen or None, 10)
        pub.publish("t", b"after")
        check(refused and refused[0].code_name == "FAILED_PRECONDITION",
              "close() of the bus from its callback is refused: %s" % refused[:1])
        check(own.closed and seen == [0], "a subscription closed from its callback gets nothing more: %s" % seen)
        check(not sub.closed, "and the bus is still open")
        # Closing the bus while another thread waits in next(): that thread gets ClosedError.
        other = agentrt.Bus.connect(b.address, "sub", b.token("sub"))
        waiting = other.subscribe("nothing-here")
        outcome = []

        def wait_next():
            try:
                waiting.next(timeout=30)
                outcome.append("returned")
            except agentrt.ClosedError:
                outcome.append("closed")
        waiter = threading.Thread(target=wait_next)
        waiter.start()
        time.sleep(0.3)  # let it block inside next()
        other.close()
        waiter.join(10)
        check(outcome == ["closed"], "a next() blocked while the bus closes raises ClosedError: %s" % outcome)
        # Direct messages and request/reply.
        inbox = sub.receive()
        pub.send("sub", b"hello")
        m = inbox.next(5)
        check(m.payload == b"hello" and m.publisher == "pub", "a direct message reaches the inbox")
        inbox.close()

        def serve(m):
            if m.request_id:
                sub.reply(m.request_id, b"pong:" + m.payload)
        connected = threading.Event()
        server = sub.receive(serve, start="latest",
                             on_event=lambda e: e["kind"] == "connected" and connected.set())
        # A stream from "latest" starts where the log is when it connects: wait for that.
        check(connected.wait(10), "the server's inbox stream connected")
        reply = pub.request("sub", b"ping", timeout=10)
        check(reply.payload == b"pong:ping" and reply.publisher == "sub", "request/reply")
        server.close()
        # Errors carry the gRPC code.
        bad = agentrt.Bus.connect(b.address, "pub", "0" * 64)
        e = raises(agentrt.BusError, lambda: bad.publish("t", b"x"), "a wrong token is refused")
        check(e.code_name == "UNAUTHENTICATED" and e.grpc_code == 16, "with UNAUTHENTICATED (16)")
        bad.close()
        raises(agentrt.BusError, lambda: pub.publish("@bad", b"x"), "an invalid topic", "topic")
        raises(TypeError, lambda: pub.publish("t", 12), "a payload that is not bytes-like")
        raises(TypeError, lambda: sub.subscribe("t", start="middle"), "a start that is not one")
        raises(agentrt.BusError, lambda: pub.request("nobody", b"x", timeout=0.3),
               "a request nobody answers times out", "DEADLINE_EXCEEDED")
        pub.close()
        sub.close()
        raises(agentrt.ClosedError, lambda: pub.publish("t", b"x"), "a closed bus")
    with StandaloneBus(work) as b2:  # another broker: a saved offset of the old one
        pub = agentrt.Bus.connect(b2.address, "pub", b2.token("pub"))
        pub.publish("t", b"new0")
        sub = agentrt.Bus.connect(b2.address, "sub", b2.token("sub"))
        resumed = sub.subscribe("t", start=100, incarnation=incarnation)
        m = resumed.next(10)
        check(m is not None and m.payload == b"new0" and m.offset == 0,
              "a position of a broker that is gone reads the new log from its start")
        check(any(e["kind"] == "broker_restarted" for e in resumed.events()),
              "and the subscription was told the broker restarted")
        resumed.close()
        sub.close()
        pub.close()


def scenario_outside_agentctl(work):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_") or k in
           ("AGENTRT_BIN_DIR", "AGENTRT_SOURCE_DIR")}
    e = raises(agentrt.AssignmentError, lambda: agentrt.Runtime(), "Runtime() outside agentctl",
               "AGENTRT_RUN_DIR")
    check(e.code_name == "NOT_FOUND", "with NOT_FOUND")
    raises(agentrt.BusError, agentrt.Bus.from_environment, "Bus.from_environment() outside agentctl")
    check(env is not None, "the test ran without the agent contract")
    import subprocess
    bad = subprocess.run([sys.executable, "-c", "import agentrt; agentrt.EnvPool('cartpole')"],
                         env=dict(os.environ, AGENTRT_C_LIBRARY="/nonexistent/libagentrt_c.so"),
                         capture_output=True, text=True, timeout=60)
    # An explicit path that does not load falls back to the package's own library.
    check(bad.returncode == 0, "a wrong AGENTRT_C_LIBRARY falls back to the library next to the package")
    help_text = subprocess.run([sys.executable, "-c", "import agentrt; help(agentrt.Checkpointer)"],
                               capture_output=True, text=True, timeout=60, env=dict(os.environ, PAGER="cat"))
    check("Sharded, atomic, verified checkpoints" in help_text.stdout and "save_due" in help_text.stdout,
          "help(agentrt.Checkpointer) reads as documentation")


def scenario_stubs(work):
    """Every public class, function and method of the package has its entry in the .pyi stubs."""
    import ast
    import inspect
    pkg = os.path.dirname(agentrt.__file__)
    for mod in ("runtime", "checkpoint", "bus", "envs", "errors", "torch", "weights"):
        path = os.path.join(pkg, mod + ".pyi")
        check(os.path.exists(path), "%s.pyi is installed next to %s.py" % (mod, mod))
        with open(path) as f:
            tree = ast.parse(f.read())
        stub = {n.name: {m.name if isinstance(m, ast.FunctionDef) else m.target.id for m in n.body
                         if isinstance(m, (ast.FunctionDef, ast.AnnAssign))}
                for n in tree.body if isinstance(n, ast.ClassDef)}
        funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if mod == "torch":
            try:
                import agentrt.torch as module
            except ImportError:
                continue
        else:
            module = getattr(agentrt, mod)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj):
                check(name in stub, "%s.%s has a stub" % (mod, name))
                for attr, v in vars(obj).items():
                    if not attr.startswith("_") and (callable(v) or isinstance(v, (property, classmethod))):
                        check(attr in stub[name], "%s.%s.%s has a stub" % (mod, name, attr))
            elif inspect.isfunction(obj):
                check(name in funcs, "%s.%s() has a stub" % (mod, name))


def main():
    return scenarios_main(globals(), "agentrt-py")


if __name__ == "__main__":
    sys.exit(main())
