#!/usr/bin/python3
"""The soaks' bus traffic: two Python agents (`import agentrt`) on a bus with `durability: always`,
and the check of what they recorded. Run as an agent:

    soak_chat.py talk   --steps N --step-ms MS --topic T --record DIR
    soak_chat.py listen --steps N --step-ms MS --topic T --record DIR

The talker publishes one message per step ("<pid>:<step>"), and "<pid>:end" once its last step is
checkpointed, and records each acknowledgement in DIR/acks ("<offset> <payload>" lines, appended). The listener reads the topic from the position its
checkpoint holds (from offset 0 the first time) and records what each process received in
DIR/heard.<pid> (a "start <offset> <bus incarnation>" line, then "<offset> <payload>" lines); it
finishes once at its steps and once it has heard the talker's end. Both checkpoint their
step (the listener also its position) at the plan's interval, resume from their newest checkpoint
and log as agentrt-test-agent does ("agent A rank R/W pid P restart N", then "resumed from step S"),
so the soaks measure them as they measure it. A bus error (a fenced launch, a bus gone) or a failed
final checkpoint ends the process with code 1: the controller restarts it; a failed periodic
checkpoint (a full disk) is said and training goes on.

check(DIR, steps) holds the records to the bus's promise: every acknowledged message is stored once,
at the offset its acknowledgement named; the talker processes' acknowledged offsets do not
interleave (a replaced launch cannot publish), and no step comes after the talker's end; every
listener process heard the topic from exactly where it restored, without a gap or a duplicate,
and together they heard every acknowledged message up to the talker's end."""
import argparse
import glob
import os
import sys
import time


def hello(rt):
    print("agent %s rank %d/%d pid %d restart %d" % (rt.agent, rt.rank, rt.world_size, os.getpid(),
                                                      rt.restart_count), flush=True)


def restore(rt):
    """(step, metadata) of the newest checkpoint, (0, {}) without one; logs which."""
    r = rt.checkpointer.restore()
    if not r.restored:
        print(r.describe, flush=True)
        return 0, {}
    step = int(r["step"][0])
    print("resumed from step %d" % step, flush=True)
    return step, dict(r.metadata)


def append(path, line):
    """One whole line, appended in one write (a killed process leaves no half line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def save(rt, step, metadata=None, final=False):
    """A checkpoint of `step`. A failed periodic save (a full disk) is said and training goes on,
    as agentrt-test-agent does; a failed final one ends the process (its restart saves again)."""
    import agentrt
    import numpy as np
    try:
        rt.checkpointer.save(step, {"step": np.array([step], dtype=np.int64)}, metadata=metadata)
    except agentrt.CheckpointError as e:
        print("soak_chat: %s" % e, file=sys.stderr, flush=True)
        if final:
            raise


def talk(rt, args):
    step, _ = restore(rt)
    bus = rt.bus
    bus.wait_ready(30)
    acks = os.path.join(args.record, "acks")
    pid = os.getpid()

    def publish(what):
        payload = "%d:%s" % (pid, what)
        append(acks, "%d %s\n" % (bus.publish(args.topic, payload), payload))
    while not rt.should_stop and step < args.steps:
        time.sleep(args.step_ms / 1000.0)
        step += 1
        publish(step)
        rt.set_step(step)
        if rt.checkpointer.save_due:
            save(rt, step)
    save(rt, step, final=True)
    if step >= args.steps:
        # Once its last step is checkpointed: a restart after this publishes no step again.
        publish("end")
    print("done at step %d" % step, flush=True)


def listen(rt, args):
    step, meta = restore(rt)
    offset, incarnation = int(meta.get("offset", 0)), int(meta.get("bus_incarnation", 0))
    bus = rt.bus
    bus.wait_ready(30)
    heard = os.path.join(args.record, "heard.%d" % os.getpid())
    sub = bus.subscribe(args.topic, start=offset, incarnation=incarnation)
    append(heard, "start %d %d\n" % (offset, incarnation))
    talker_done = False

    def position():
        _, known = bus.positions()  # the broker's incarnation, once a message came
        return {"offset": offset, "bus_incarnation": known or incarnation}
    while not rt.should_stop and not (step >= args.steps and talker_done):
        time.sleep(args.step_ms / 1000.0)
        step = min(step + 1, args.steps)  # at its steps it only waits for the talker's end
        lines = []
        while True:
            m = sub.next(0)
            if m is None:
                break
            lines.append("%d %s\n" % (m.offset, m.payload.decode()))
            offset = m.offset + 1
            talker_done = talker_done or m.payload.endswith(b":end")
        if lines:
            append(heard, "".join(lines))
        rt.set_step(step)
        if rt.checkpointer.save_due:
            save(rt, step, position())
    save(rt, step, position(), final=True)
    print("done at step %d" % step, flush=True)


def agent_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["talk", "listen"])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-ms", type=int, default=20)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--record", required=True)
    args = parser.parse_args(argv)
    import agentrt
    with agentrt.Runtime(heartbeat_ms=200) as rt:
        hello(rt)
        try:
            (talk if args.role == "talk" else listen)(rt, args)
        except (agentrt.BusError, agentrt.CheckpointError) as e:
            print("soak_chat: %s" % e, file=sys.stderr, flush=True)
            return 1
    return 0


def _lines(path):
    with open(path) as f:
        return [line.split() for line in f if line.endswith("\n")]


def check(record, steps):
    """(problems, counts): what is wrong with the records of `record` (sentences; none: the bus
    kept its promise) and {"acked", "listeners", "heard"}."""
    problems = []
    acked = {}  # offset -> payload
    payloads = set()
    acks_path = os.path.join(record, "acks")
    for offset, payload in (_lines(acks_path) if os.path.exists(acks_path) else []):
        offset = int(offset)
        if offset in acked:
            problems.append("offset %d acknowledged twice (%s, %s)" % (offset, acked[offset], payload))
        if payload in payloads:
            problems.append("%s acknowledged twice" % payload)
        acked[offset] = payload
        payloads.add(payload)
    # One launch publishes at a time: the offsets each talker process got acknowledged do not
    # interleave with another's (the controller fences a launch off the bus before the next
    # one starts, so an old one whose link heals is refused).
    spans = {}
    for offset, payload in acked.items():
        pid = payload.split(":")[0]
        lo, hi = spans.get(pid, (offset, offset))
        spans[pid] = (min(lo, offset), max(hi, offset))
    ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
    for (pid, (_, hi)), (later, (lo, _)) in zip(ordered, ordered[1:]):
        if hi > lo:
            problems.append("talker process %s had offset %d acknowledged after process %s, "
                            "launched later, published at offset %d" % (pid, hi, later, lo))
    ends = sorted(o for o, p in acked.items() if p.endswith(":end"))
    if not ends:
        problems.append("the talker's end (after step %d) was never acknowledged" % steps)
        return problems, {"acked": len(acked), "listeners": 0, "heard": 0}
    final = ends[0]
    late = sorted(o for o, p in acked.items() if o > final and not p.endswith(":end"))
    if late:
        problems.append("%d steps acknowledged after the talker's end (offset %d): %s"
                        % (len(late), final, ", ".join(acked[o] for o in late[:5])))
    heard_offsets = set()
    listeners = 0
    reached_final = False
    for path in sorted(glob.glob(os.path.join(record, "heard.*"))):
        rows = _lines(path)
        if not rows or rows[0][0] != "start":
            problems.append("%s has no start line" % path)
            continue
        listeners += 1
        expect = int(rows[0][1])
        for offset, payload in rows[1:]:
            offset = int(offset)
            if offset != expect:
                problems.append("%s: offset %d where %d was next (%s)"
                                % (path, offset, expect, "a gap" if offset > expect else "a duplicate"))
            expect = offset + 1
            if offset in acked and acked[offset] != payload:
                problems.append("%s: offset %d holds %s, acknowledged as %s"
                                % (path, offset, payload, acked[offset]))
            heard_offsets.add(offset)
            reached_final = reached_final or offset == final
    if not reached_final:
        problems.append("no listener heard the talker's end (offset %d)" % final)
    lost = sorted(o for o in acked if o <= final and o not in heard_offsets)
    if lost:
        problems.append("%d acknowledged messages never heard: offsets %s"
                        % (len(lost), ", ".join(map(str, lost[:10]))))
    return problems, {"acked": len(acked), "listeners": listeners, "heard": len(heard_offsets)}


if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
