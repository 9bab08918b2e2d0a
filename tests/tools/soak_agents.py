#!/usr/bin/python3
"""The soaks' Python agents (`import agentrt`), the lines of agents.yaml that run them, and the
checks of what they did: a talker and a listener on a bus with `durability: always`, and a PBT
population of three; and the lines of a league of two agent-worker members, whose committed
league state check_league holds to applying each result once. Run as an agent:

    soak_agents.py talk   --steps N --step-ms MS --topic T --record DIR
    soak_agents.py listen --steps N --step-ms MS --topic T --record DIR
    soak_agents.py skill  --steps N --step-ms MS

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

A PBT member ("skill") grows its skill by lr x 1000 per step (lr from its args in the plan, which an
exploit changes), reports it as its score, checkpoints it, and logs "adopted from A step S" when
the checkpoint it resumed from was copied from member A's step S by an exploit.

check_chat(DIR, steps) holds the records to the bus's promise: every acknowledged message is stored once,
at the offset its acknowledgement named; the talker processes' acknowledged offsets do not
interleave (a replaced launch cannot publish), and no step comes after the talker's end; every
listener process heard the topic from exactly where it restored, without a gap or a duplicate,
and together they heard every acknowledged message up to the talker's end."""
import argparse
import collections
import glob
import json
import os
import re
import sys
import time

SCRIPT = os.path.abspath(__file__)
CHAT = {"talker": "talk", "listener": "listen"}  # agent: role
POPULATION = {"pop-a": 0.001, "pop-b": 0.001, "pop-c": 1e-6}  # agent: initial lr
# A league of agent-worker members on pursuit (C++): agent: role. Each reports a match result
# per update and asks the league for the next opponent.
LEAGUE = {"hunter": "predator", "runner": "prey"}
STEP_MS = 20


def agents_yaml(steps, record, more="", names=None):
    """The entries under `agents:` of the talker, the listener and the population (`names`: only
    these; `more`: keys added to each entry, such as "gpus: 1, ")."""
    out = ""
    for name, role in CHAT.items():
        if names is not None and name not in names:
            continue
        cmd = ["/usr/bin/python3", SCRIPT, role, "--steps", str(steps), "--step-ms", str(STEP_MS),
               "--topic", "chat", "--record", record]
        out += "  - {name: %s, %scommand: %s}\n" % (name, more, json.dumps(cmd))
    for name, lr in POPULATION.items():
        if names is not None and name not in names:
            continue
        cmd = ["/usr/bin/python3", SCRIPT, "skill", "--steps", str(steps), "--step-ms", str(STEP_MS)]
        out += "  - {name: %s, %scommand: %s, args: {lr: %g}}\n" % (name, more, json.dumps(cmd), lr)
    return out


def league_yaml(bin_dir, steps, steps_per_update=4, snapshot_every=1):
    """The entries under `agents:` of the league's members: agent-worker, one update (4 envs x 16
    steps) per `steps_per_update` of the soak agents' `steps`, so that they play through the
    faults (agent-worker is not paced: an update takes what the machine gives it), publishing a
    snapshot every `snapshot_every` updates (on the durable bus as long as its stream keeps it:
    sections_yaml's weights_keep_last)."""
    out = ""
    for name, role in LEAGUE.items():
        out += ("  - {name: %s, command: [%s], args: {env: pursuit, role: %s, steps: %d, "
                "num_envs: 4, rollout_steps: 16, lr: 0.001, snapshot_every: %d, match_every: 1, "
                "env_args: {width: 5, max_steps: 20}}}\n"
                % (name, json.dumps(os.path.join(bin_dir, "agent-worker")), role,
                   max(60, steps // steps_per_update) * 64, snapshot_every))
    return out


def sections_yaml(league=False, weights_keep_last=0, segment_bytes=0):
    """The top-level sections of agents.yaml they need: the bus (durability: always), the chat
    channel and the population; with `league`, the league of league_yaml's members. On a run
    directory of bounded size: `weights_keep_last`, the versions each member's weight stream
    keeps (the league then hands out frozen snapshots the stream has dropped, and forgets them
    when a member reports one gone), and `segment_bytes`, the bus log's files (retention frees
    whole files)."""
    keep = ", keep_last: %d" % weights_keep_last if weights_keep_last else ""
    bus = "durability: always" + (", segment_bytes: %d" % segment_bytes if segment_bytes else "")
    members = """  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]%s}
league:
  seed: 7
  members:
    - {agents: [hunter], role: main, opponents: [runner]}
    - {agents: [runner], role: main, opponents: [hunter]}
""" % keep if league else ""
    return "bus: {" + bus + """}
channels:
  - {topic: chat, publishers: [talker], subscribers: [listener]}
""" + members + """pbt:
  - agents: ["pop-*"]
    interval_steps: 250
    metric: score
    fraction: 0.34
    resample_probability: 0
    hyperparameters:
      lr: {min: 1.0e-6, max: 0.01}
"""


def env_yaml(bin_dir):
    """`env:` (under `defaults:`) that finds their package: the build's python folder, next to
    `bin_dir`."""
    return '{PYTHONPATH: %s, PYTHONUNBUFFERED: "1"}' % json.dumps(
        os.path.join(os.path.dirname(bin_dir), "python"))


def hello(rt):
    print("agent %s rank %d/%d pid %d restart %d" % (rt.agent, rt.rank, rt.world_size, os.getpid(),
                                                      rt.restart_count), flush=True)


def restore(rt):
    """(step, metadata, Restore) of the newest checkpoint, (0, {}, Restore) without one; logs
    which, and where an exploit copied it from."""
    r = rt.checkpointer.restore()
    if not r.restored:
        print(r.describe, flush=True)
        return 0, {}, r
    step = int(r["step"][0])
    print("resumed from step %d" % step, flush=True)
    adopted = r.metadata.get("adopted_from")
    if adopted:
        print("adopted from %s step %d" % (adopted["agent"], adopted["step"]), flush=True)
    return step, dict(r.metadata), r


def append(path, line):
    """One whole line, appended in one write (a killed process leaves no half line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def save(rt, step, metadata=None, final=False, more=None):
    """A checkpoint of `step` (and the arrays `more`). A failed periodic save (a full disk) is said and training goes on,
    as agentrt-test-agent does; a failed final one ends the process (its restart saves again)."""
    import agentrt
    import numpy as np
    try:
        arrays = dict(more or {}, step=np.array([step], dtype=np.int64))
        rt.checkpointer.save(step, arrays, metadata=metadata)
    except agentrt.CheckpointError as e:
        print("soak_agents: %s" % e, file=sys.stderr, flush=True)
        if final:
            raise


def talk(rt, args):
    step, _, _ = restore(rt)
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
    rt.report(step)  # its status says where it ended, also when it resumed there
    print("done at step %d" % step, flush=True)


def listen(rt, args):
    step, meta, _ = restore(rt)
    offset, incarnation = int(meta.get("offset", 0)), int(meta.get("bus_incarnation", 0))
    bus = rt.bus
    bus.wait_ready(30)
    heard = os.path.join(args.record, "heard.%d" % os.getpid())
    sub = bus.subscribe(args.topic, start=offset, incarnation=incarnation)
    append(heard, "start %d %d\n" % (offset, incarnation))
    talker_done = bool(meta.get("talker_done", False))  # it heard the end before this restart

    def position():
        _, known = bus.positions()  # the broker's incarnation, once a message came
        return {"offset": offset, "bus_incarnation": known or incarnation,
                "talker_done": talker_done}
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
    rt.report(step)  # its status says where it ended, also when it resumed there
    print("done at step %d" % step, flush=True)


def skill(rt, args):
    import numpy as np
    lr = float(rt.args["lr"])
    step, _, r = restore(rt)
    value = np.array(r["skill"] if r.restored else [0.0], dtype=np.float64)
    while not rt.should_stop and step < args.steps:
        time.sleep(args.step_ms / 1000.0)
        step += 1
        value += lr * 1000
        rt.report(step, score=float(value[0]))
        if rt.checkpointer.save_due:
            save(rt, step, more={"skill": value})
    save(rt, step, final=True, more={"skill": value})
    rt.report(step)  # its status says where it ended, also when it resumed there
    print("done at step %d" % step, flush=True)


def agent_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["talk", "listen", "skill"])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-ms", type=int, default=20)
    parser.add_argument("--topic")
    parser.add_argument("--record")
    args = parser.parse_args(argv)
    import agentrt
    with agentrt.Runtime(heartbeat_ms=200) as rt:
        hello(rt)
        try:
            {"talk": talk, "listen": listen, "skill": skill}[args.role](rt, args)
        except (agentrt.BusError, agentrt.CheckpointError) as e:
            print("soak_agents: %s" % e, file=sys.stderr, flush=True)
            return 1
    return 0


def _lines(path):
    with open(path) as f:
        return [line.split() for line in f if line.endswith("\n")]


def check_chat(record, steps):
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



def check_population(run_dir):
    """(problems, exploits): the population's lineage (RUN_DIR/league/lineage.jsonl) against what
    its members say they restored. Each exploit has one lineage entry (none twice, as a resumed
    controller doing an exploit again would write), and each entry is an adoption a member
    resumed from, and each adoption a member resumed from has its entry."""
    problems = []
    path = os.path.join(run_dir, "league", "lineage.jsonl")
    lines = []
    if os.path.exists(path):
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    entries = collections.Counter((l["recipient"], l["donor"], l["donor_step"]) for l in lines
                                  if l["outcome"] == "exploited")
    problems += ["%s adopted %s's step %d: %d lineage entries" % (k + (n,)) for k, n in entries.items()
                 if n > 1]
    resumed = set()
    for name in POPULATION:
        log = os.path.join(run_dir, "logs", name, "rank0.log")
        text = open(log, errors="replace").read() if os.path.exists(log) else ""
        resumed |= {(name, m.group(1), int(m.group(2)))
                    for m in re.finditer(r"^adopted from (\S+) step (\d+)$", text, re.M)}
    problems += ["%s resumed from %s's step %d with no lineage entry" % k
                 for k in sorted(resumed - set(entries))]
    problems += ["lineage says %s adopted %s's step %d, which it never resumed from" % k
                 for k in sorted(set(entries) - resumed)]
    return problems, sum(entries.values())



def check_league(run_dir):
    """(problems, applied): the league's committed state (RUN_DIR/league/state.json) against its
    promise to apply each result once. A member sends its results of one incarnation numbered 1,
    2, ... and each only after the one before was acknowledged, so every result was applied once,
    none twice and none skipped, exactly when the results applied add up to the highest number
    applied of each (member, incarnation)."""
    with open(os.path.join(run_dir, "league", "state.json")) as f:
        state = json.load(f)
    applied = state["results_applied"]
    highest = state["applied"]  # "<agent>/<incarnation>": the highest number applied
    problems = []
    if applied != sum(highest.values()):
        problems.append("%d results applied, but their numbers add up to %d: %s"
                        % (applied, sum(highest.values()), highest))
    for name in LEAGUE:
        if not any(k.startswith(name + "/") for k in highest):
            problems.append("no result of %s was applied" % name)
    return problems, applied


def check_all(run_dir, record, steps, league=False):
    """The soak's checks of these agents at the end of a run (agentrt_testing.check: each says ok or
    raises Failure): every member of the population succeeded at `steps`, its lineage is whole
    (check_population), the bus kept its promise (check_chat), and with `league` the league's
    members succeeded and each of their results was applied once (check_league)."""
    sys.path.insert(0, os.path.join(os.path.dirname(SCRIPT), ".."))
    from agentrt_testing import check, status_agent
    if league:
        for name in LEAGUE:
            a = status_agent(run_dir, name)
            check(a and a["state"] == "succeeded", "league member %s succeeded (%s)"
                  % (name, a and (a["state"], a["step"], a["restarts"])))
        problems, applied = check_league(run_dir)
        check(not problems, "league: each result applied once (%d results, %s)"
              % (applied, ", ".join("%s %d restarts" % (n, status_agent(run_dir, n)["restarts"])
                                    for n in LEAGUE)) + "".join("\n  " + p for p in problems))
    for name in POPULATION:
        a = status_agent(run_dir, name)
        check(a and a["state"] == "succeeded" and a["step"] >= steps,
              "%s reached its target step %d and succeeded (%s)"
              % (name, steps, a and (a["state"], a["step"], a["restarts"])))
    problems, exploits = check_population(run_dir)
    check(not problems and exploits > 0, "PBT: one lineage entry per exploit, each one resumed from "
          "(%d exploits)" % exploits + "".join("\n  " + p for p in problems))
    problems, counts = check_chat(record, steps)
    check(not problems, "the bus kept every acknowledged message once, in order, without gap "
          "(%(acked)d acknowledged, heard by %(listeners)d listener processes)" % counts
          + "".join("\n  " + p for p in problems))

if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
