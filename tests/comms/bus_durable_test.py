#!/usr/bin/python3
"""The bus outlives its broker: kill -9 of a real agentrt-bus during a publish storm, a new one on
the same log, and every acknowledged message is there exactly once, at the offset its
acknowledgement named; a subscriber resumes from its saved position without gap or duplicate and is
not told the broker restarted (the incarnation is the log's). One scenario per durability mode."""
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import StandaloneBus, check, scenarios_main, wait_for  # noqa: E402

import agentrt  # noqa: E402  (PYTHONPATH: <build>/python, set by CTest)


def storm(work, durability):
    log_dir = os.path.join(work, "buslog")
    flags = ["--log-dir", log_dir, "--durability", durability, "--fsync-interval-ms", "100"]
    bus = StandaloneBus(work, flags=flags)
    acked = {}  # payload -> offset, for every acknowledged publish
    stop = threading.Event()
    try:
        sub = agentrt.Bus.connect(bus.address, "sub", bus.token("sub"))
        pub = agentrt.Bus.connect(bus.address, "pub", bus.token("pub"))
        pub.wait_ready(10)
        for i in range(200):
            acked[b"warm%d" % i] = pub.publish("storm", b"warm%d" % i)
        # The subscriber reads the first 200 and saves its position (as a checkpoint would).
        s = sub.subscribe("storm", start=0)
        seen = [s.next(10) for _ in range(200)]
        check(all(m is not None for m in seen) and [m.offset for m in seen] == list(range(200)),
              "the subscriber read offsets 0..199 before the crash")
        saved, incarnation = wait_for("the subscriber's position", lambda: (lambda p: p if p[0].get("storm") == 200
                                                                          else None)(sub.positions()), 10)
        s.close()

        def publisher():
            i = 0
            while not stop.is_set():
                payload = b"storm%d" % i
                try:
                    acked[payload] = pub.publish("storm", payload)
                except agentrt.BusError:
                    return  # the broker is gone: what was acknowledged is what counts
                i += 1
        t = threading.Thread(target=publisher)
        t.start()
        wait_for("a publish storm under way", lambda: len(acked) > 1200 or None, 30, 0.01)
        bus.kill()  # kill -9 mid-storm
        stop.set()
        t.join(30)
        check(not t.is_alive(), "the publisher noticed the broker was gone")
        pub.close()
        sub.close()
    except Exception:
        bus.kill()
        raise
    print("acknowledged %d messages before kill -9 (%s)" % (len(acked), durability))

    with StandaloneBus(work, flags=flags) as again:
        reader = agentrt.Bus.connect(again.address, "sub", again.token("sub"))
        everything = reader.subscribe("storm", start=0, incarnation=incarnation)
        got = []
        while True:
            m = everything.next(2)
            if m is None:
                break
            got.append(m)
        check([m.offset for m in got] == list(range(len(got))), "the log has no gap: offsets 0..%d" % (len(got) - 1))
        payloads = [m.payload for m in got]
        check(len(set(payloads)) == len(payloads), "no message is stored twice")
        where = {m.payload: m.offset for m in got}
        missing = [p for p in acked if p not in where]
        moved = [p for p, o in acked.items() if p in where and where[p] != o]
        check(not missing, "every acknowledged message survived kill -9 (%d missing, e.g. %s)" %
              (len(missing), missing[:3]))
        check(not moved, "each at the offset its acknowledgement named (%d moved)" % len(moved))
        check(not any(e["kind"] == "broker_restarted" for e in everything.events()),
              "a reader of the old incarnation is not told the broker restarted: the log is the same")
        everything.close()
        # The saved position resumes exactly where it was.
        resumed = reader.subscribe("storm", start=saved["storm"], incarnation=incarnation)
        first = resumed.next(10)
        check(first is not None and first.offset == 200 and first.payload == got[200].payload,
              "the saved position resumes at offset 200 (no gap, no duplicate)")
        check(not any(e["kind"] == "broker_restarted" for e in resumed.events()), "with no restart event")
        resumed.close()
        # And the log goes on from its end.
        pub = agentrt.Bus.connect(again.address, "pub", again.token("pub"))
        check(pub.publish("storm", b"after") == len(got), "a new publish continues at offset %d" % len(got))
        pub.close()
        reader.close()


def scenario_always(work):
    storm(work, "always")


def scenario_batch(work):
    # kill -9 keeps what write() handed the kernel; only a machine crash can lose the last
    # fsync_interval_ms of batch mode, so here too nothing acknowledged may be missing.
    storm(work, "batch")


def scenario_corrupt(work):
    """A corrupt record in the middle of a segment: the bus refuses to start and says which file,
    byte and offset, and exactly what its advice does; nothing is cut. Following the advice, the
    topic starts again at the segment's first offset under a new incarnation: a subscriber that
    saved a position is told (broker_restarted) and reads from the start, no offset reused."""
    log_dir = os.path.join(work, "buslog")
    flags = ["--log-dir", log_dir, "--durability", "always"]
    with StandaloneBus(work, flags=flags) as bus:
        pub = agentrt.Bus.connect(bus.address, "pub", bus.token("pub"))
        sub = agentrt.Bus.connect(bus.address, "sub", bus.token("sub"))
        reader = sub.subscribe("t")
        for i in range(20):
            pub.publish("t", b"x" * 100)
        for i in range(15):
            check(reader.next(10) is not None, "message %d read before the damage" % i)
        offsets, incarnation = sub.positions()
        check(offsets["t"] == 15, "the subscriber saved position 15 (%s)" % offsets)
        reader.close()
        sub.close()
        pub.close()
    seg_dir = os.path.join(log_dir, "logs", "t")
    seg = os.path.join(seg_dir, sorted(os.listdir(seg_dir))[0])
    with open(seg, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x5A
        f.seek(0)
        f.write(data)
    bus = os.path.join(os.environ["AGENTRT_BIN_DIR"], "agentrt-bus")
    out = subprocess.run([bus, "--secret-file", os.path.join(work, "bus.secret"), "--open",
                          "--host", "127.0.0.1", "--port", "0"] + flags,
                         capture_output=True, text=True, timeout=30)
    check(out.returncode != 0, "the bus refuses to start on a corrupt log (rc %d)" % out.returncode)
    check(seg in out.stderr and "byte " in out.stderr and "(offset " in out.stderr and "corrupt" in out.stderr,
          "its error names the file, byte and offset: %s" % out.stderr.strip())
    incarnation_file = os.path.join(log_dir, "incarnation")
    check("drops offsets 0 onward" in out.stderr and "starts again at offset 0" in out.stderr and
          ("delete " + incarnation_file) in out.stderr and "broker_restarted" in out.stderr,
          "it says what moving the file away does, and to start a new incarnation")
    with open(seg, "rb") as f:
        check(len(f.read()) == len(data), "nothing was cut from the corrupt segment")
    # The operator follows the advice.
    os.rename(seg, os.path.join(work, "damaged.segment"))
    os.unlink(incarnation_file)
    with StandaloneBus(work, flags=flags) as bus:
        pub = agentrt.Bus.connect(bus.address, "pub", bus.token("pub"))
        check(pub.publish("t", b"after") == 0, "the topic starts again at offset 0")
        sub = agentrt.Bus.connect(bus.address, "sub", bus.token("sub"))
        resumed = sub.subscribe("t", start=offsets["t"], incarnation=incarnation)
        m = resumed.next(10)
        check(m is not None and m.payload == b"after" and m.offset == 0,
              "the saved position 15 is not taken as a position in the new log: it reads from 0")
        check(any(e["kind"] == "broker_restarted" for e in resumed.events()),
              "and the subscription was told the bus is another incarnation")
        resumed.close()
        sub.close()
        pub.close()


def main():
    return scenarios_main(globals(), "bus-durable")


if __name__ == "__main__":
    sys.exit(main())
