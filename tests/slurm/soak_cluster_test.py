#!/usr/bin/python3
"""A compressed stretch of failures on a 6-node test cluster (slurm/testcluster/start.sh
--nodes 6: real slurmctld and slurmd, one network namespace per node): `agentctl run --backend
slurm` of a 2-node MPI agent (`wide`, 4 ranks, srun --mpi=pmix), two single-rank C++ agents and
two single-rank Python agents talking over the bus (`durability: always`, TLS since the run spans
nodes; tests/tools/soak_agents.py), a PBT population of three and a league of two agent-worker
members (CPU agents), checkpointing every 2 s with `slurm.spare_nodes: 2`, while a fault injector
with a fixed seed keeps breaking things:

- SIGKILL and SIGSTOP of a rank (on any node), and SIGKILL of a league member mid-match;
- a node death (its slurmd and every process in its namespace killed, the node marked down)
  under a single-node agent: the agent moves to a spare node; the dead node is brought back
  afterwards (SLURM takes it back; this allocation does not);
- a partition (the node's link cut, the node marked down) under a single-node agent, whose
  rank there lives on: the agent moves to a spare, and the cut-off incarnation must be fenced
  (no checkpoint of it after the move, and no bus message: the link heals afterwards);
- a node loss with no spare left: the run requeues its allocation, every agent resumes;
- a SLURM preemption (`scancel --signal=USR2 --batch`): every agent checkpoints, the job
  requeues and every agent resumes;
- kill -9 of the controller (the allocation's batch shell): SLURM ends the job, the operator
  requeues it (`scontrol requeue`) and every agent resumes;
- kill -9 of the bus's broker alone (a process of its own beside the controller, on the batch
  node): the controller starts it again on its port with its durable log, and every agent lives
  through it without a restart (its talk checked at the end);
- a clock step: one node's wall clock (every task of the node reads it through the test
  cluster's shim, start.sh --clock-shim) steps CLOCK_STEP_S forward or back, as NTP steps a
  clock that drifted, and back again CLOCK_HOLD_S later: nothing may restart for it, every rank's
  heartbeat age in status.json stays under heartbeat_timeout_s, and each agent with a rank on the
  node commits a new checkpoint;
- a full disk: the run directory's file system (a tmpfs of its own, mounted before the nodes
  start; checkpoints, logs and the bus log live there) is filled for FULL_DISK_S, then freed:
  every agent must commit a new checkpoint afterwards, and no restore may ever meet a corrupt
  one.

Checked at every fault, not only at the end: each affected agent's next incarnation resumes
from a checkpoint at least as new as the newest one committed when the fault struck (the steps
lost are at most those since its last checkpoint); after a partition, every checkpoint
committed after the move carries the new incarnation's fence. At the end: every agent reached
its target step and succeeded; PBT's lineage has one entry per exploit and the league applied
each match result once, through every node loss, requeue and controller kill; every acknowledged bus message is stored once at its acknowledged
offset, the talker's launches never published at the same time, and every listener process heard
the topic from where it restored without gap or duplicate; no process of the run is left on any node; the job left no
Open MPI shared memory in /dev/shm; stopping the cluster leaves no namespace.

It prints a table: faults by kind, survived, steps lost per fault (median, max), recovery time
per kind (median, max).

    soak_cluster_test.py [--seconds S] [--seed N] [--kinds K,K]
    (make test: 60 s; make soak: 15 minutes; --kinds: only these faults)

Skips (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN).
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import soak_agents  # noqa: E402
from agentrt_testing import (Failure, check, heartbeating, kill_broker, newest_committed,  # noqa: E402
                             print_fault_table, read_status, restore_since, run_processes,
                             runs_program, set_clock_offset, sigkill_league_member,
                             soak_agent_command, status_agent, wait_for)

SRC = os.environ.get("AGENTRT_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")
STEP_MS = soak_agents.STEP_MS
NODES = 6
# CPUs per node: one is kept for the controller's task, two go to a node's single-GPU agents, and
# the three CPU agents of the population fit beside them (with 4 one would take a node of its own,
# and the allocation would need more nodes than the cluster has).
CPUS = 6
SPARES = 2
# name: ranks; wide spans two nodes; talker and listener are soak_agents.py's (Python). The PBT
# population (soak_agents.POPULATION, CPU agents) is not struck itself: an exploit may replace a
# member's checkpoints at any time, so its steps lost say nothing; it lives through every node
# fault, requeue and controller kill.
AGENTS = {"wide": 4, "solo-a": 1, "solo-b": 1, "talker": 1, "listener": 1}
SINGLE = [n for n, ranks in AGENTS.items() if ranks == 1]
LEAGUE_KILL = "SIGKILL of a league member"
# The league's members update once per soak step of the others: beside them on this cluster's
# nodes an update takes 5-25 ms, so they play through most of the faults. A snapshot every 10
# updates, each stream keeping its newest 20 in bus log files of 8 MiB: the run directory has
# 512 MiB, which a stream keeping every snapshot filled within 900 s (one per update: 300 s).
# The league's frozen snapshots are older than 20 versions mostly, so its members keep finding
# them gone (and the league forgets them).
LEAGUE_STEPS_PER_UPDATE = 1
LEAGUE_SNAPSHOT_EVERY = 10
WEIGHTS_KEEP_LAST = 20
BUS_SEGMENT_BYTES = 8 << 20
CLOCK_STEP = "clock step"
KINDS = ["SIGKILL of a rank", "SIGKILL of a rank", "SIGSTOP of a rank", "node death", "partition",
         "preemption", "kill controller", "full disk", LEAGUE_KILL, CLOCK_STEP, "kill broker"]
# The test cluster's wall-clock shim (tests/slurm/clock_offset_shim.cc); without it no clock step.
CLOCK_SHIM = os.environ.get("AGENTRT_CLOCK_SHIM",
                            os.path.join(BIN, "..", "tests", "libagentrt_clock_offset.so"))
CLOCK_STEP_S = 90  # the step, forward or back
HEARTBEAT_TIMEOUT_S = 4  # the agents' restart.heartbeat_timeout_s (config())
CLOCK_HOLD_S = 2 * HEARTBEAT_TIMEOUT_S  # how long the node's clock stays stepped at least
DISK_MIB = 512  # the run directory's file system
FULL_DISK_S = 5  # how long it stays full: over two checkpoint intervals


def sh(*args, timeout=15, ok=True):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if ok and p.returncode != 0:
        raise Failure("%s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p.stdout


class Cluster:
    """A test cluster of its own (start.sh), stopped (stop.sh) by close()."""

    def __init__(self):
        self.state = tempfile.mkdtemp(prefix="agentrt-msoak.")
        self.tag = hashlib.md5(self.state.encode()).hexdigest()[:4]
        start = os.path.join(SRC, "slurm", "testcluster", "start.sh")
        args = [start, self.state, "--nodes", str(NODES), "--gpus", "2", "--cpus", str(CPUS)]
        self.clocks = os.path.exists(CLOCK_SHIM)
        if self.clocks:
            args += ["--clock-shim", CLOCK_SHIM]
        p = subprocess.run(args, capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            self.close()  # what did start
            raise Failure("start.sh --nodes %d failed: %s" % (NODES, p.stdout + p.stderr))
        os.environ["SLURM_CONF"] = os.path.join(self.state, "slurm.conf")

    def netns(self, node):
        return "art%s-%s" % (self.tag, node)

    def pids(self, node):
        return [int(p) for p in sh("ip", "netns", "pids", self.netns(node), ok=False).split()]

    def mark_down(self, node, why):
        sh("scontrol", "update", "nodename=" + node, "state=down", "reason=" + why)

    def kill(self, node):
        """The node dies: every process in its namespace, then SLURM is told."""
        for pid in self.pids(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.mark_down(node, "agentrt-soak-killed")

    def step_clock(self, node, seconds):
        """Node `node`'s wall clock reads `seconds` from the host's from now on."""
        set_clock_offset(os.path.join(self.state, "clock", node), seconds)

    def link(self, node, up):
        sh("ip", "link", "set", "arth%s%s" % (self.tag, node[1:]), "up" if up else "down")

    def cut(self, node):
        self.link(node, False)
        self.mark_down(node, "agentrt-soak-partition")

    def back(self, node, slurmd_dead):
        """A dead node's slurmd starts again (as start.sh started it); a cut node's link heals.
        Either way SLURM takes it back (state=resume) once it answers."""
        if slurmd_dead:
            script = os.path.join(self.state, "slurmd-%s.sh" % node)
            with open(os.path.join(self.state, "log", "slurmd-%s.out" % node), "a") as log:
                p = subprocess.Popen([script], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            with open(os.path.join(self.state, "pids"), "a") as f:
                f.write("slurmd-%s %d\n" % (node, p.pid))
        else:
            self.link(node, True)

        def answering():
            sh("scontrol", "update", "nodename=" + node, "state=resume", ok=False)
            s = sh("sinfo", "-h", "-n", node, "-o", "%T", ok=False).strip()
            return s and not re.search(r"down|drain|fail|unknown|not_responding|\*", s)
        wait_for("node %s back in SLURM" % node, answering, 60, 0.5)

    def close(self):
        subprocess.run([os.path.join(SRC, "slurm", "testcluster", "stop.sh"), self.state],
                       capture_output=True, timeout=120)
        left = [n for n in sh("ip", "netns", "list", ok=False).split() if n.startswith("art" + self.tag)]
        shutil.rmtree(self.state, ignore_errors=True)
        return left


def config(work, target, chat_dir):
    agents = ""
    for name, ranks in AGENTS.items():
        if name in soak_agents.CHAT:
            continue
        cmd = soak_agent_command(AGENT, target, STEP_MS, keep_last=100)
        extra = "ranks: 4, gpus: 4, backend: mpi, " if ranks > 1 else "gpus: 1, "
        agents += "  - {name: %s, %scommand: %s}\n" % (name, extra, json.dumps(cmd))
    return """run: {name: msoak, dir: %s/runs}
slurm: {spare_nodes: %d}
defaults:
  restart: {max_restarts: 1000, backoff_s: 0.2, backoff_max_s: 1, crash_loop_after: 0,
            heartbeat_timeout_s: %d, grace_s: 2}
  checkpoint: {interval_s: 2, keep_last: 100}
  env: %s
agents:
%s%s%s%s%s""" % (work, SPARES, HEARTBEAT_TIMEOUT_S, soak_agents.env_yaml(BIN), agents,
                 soak_agents.agents_yaml(target, chat_dir, "gpus: 1, ", list(soak_agents.CHAT)),
                 soak_agents.agents_yaml(target, chat_dir, "", list(soak_agents.POPULATION)),
                 soak_agents.league_yaml(BIN, target, LEAGUE_STEPS_PER_UPDATE, LEAGUE_SNAPSHOT_EVERY),
                 soak_agents.sections_yaml(league=True, weights_keep_last=WEIGHTS_KEEP_LAST,
                                           segment_bytes=BUS_SEGMENT_BYTES))


class Soak:
    def __init__(self, cluster, work, chat, seconds, seed, kinds=None):
        self.kinds = kinds
        self.chat = chat
        self.cluster = cluster
        self.work = work
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.target = int(seconds * 1000 / STEP_MS)
        with open(os.path.join(work, "agents.yaml"), "w") as f:
            f.write(config(work, self.target, chat))
        out = subprocess.run([AGENTCTL, "run", "agents.yaml", "--backend", "slurm", "--detach"],
                             cwd=work, capture_output=True, text=True, timeout=60)
        m = re.search(r"submitted job (\d+)", out.stdout + out.stderr)
        check(out.returncode == 0 and m, "agentctl run --backend slurm --detach submitted the run: "
              + out.stdout + out.stderr)
        self.job = m.group(1)
        self.run_dir = glob.glob(os.path.join(work, "runs", "msoak-*"))[0]
        self.faults = []  # {kind, agent, lost, recovery_s}
        # Nodes this allocation lost: (node, its slurmd died (True), cut off (False), back (None)).
        self.lost_nodes = []
        self.wait_all_running("the run to start", 120)

    # --- the run, as status.json says
    def status(self):
        return read_status(self.run_dir)

    def agent(self, name):
        return status_agent(self.run_dir, name)

    def heartbeating(self, name, not_pids=(), since=0.0):
        return heartbeating(self, name, AGENTS[name], not_pids, since)

    def wait_all_running(self, what, timeout):
        return wait_for(what, lambda: all(self.heartbeating(n) for n in AGENTS) or None, timeout, 0.2)

    def batch_host(self):
        return sh("squeue", "-h", "-j", self.job, "-o", "%B", ok=False).strip()

    # --- one fault
    def before(self, names):
        """What each agent of `names` was when the fault struck."""
        out = {}
        for name in names:
            a = self.heartbeating(name)
            if not a or a["step"] >= self.target * 0.9:
                return None
            log = os.path.join(self.run_dir, "logs", name, "rank0.log")
            out[name] = {"row": a, "checkpoint": newest_committed(self.run_dir, name),
                         "pids": {r["pid"] for r in a["ranks"]},
                         "offset": os.path.getsize(log) if os.path.exists(log) else 0, "log": log}
        return out

    def recovered(self, kind, before, t0, timeout=120):
        """Every agent of `before` heartbeats again from new processes and resumed from a
        checkpoint no older than the newest one committed when the fault struck."""
        t_wall = time.time()
        for name, b in before.items():
            a = wait_for("%s back after %s" % (name, kind),
                         lambda: self.heartbeating(name, b["pids"], t_wall - (time.monotonic() - t0)),
                         timeout, 0.1)
            recovery = time.monotonic() - t0
            rank0 = next(r for r in a["ranks"] if r["rank"] == 0)
            got = wait_for("%s's restore line" % name,
                           lambda: restore_since(b["log"], b["offset"], rank0["pid"]), 30)[0]
            check(got >= b["checkpoint"],
                  "%s after %s resumed from step %d, not older than checkpoint %d committed before it"
                  % (name, kind, got, b["checkpoint"]))
            lost = max(0, b["row"]["step"] - max(got, 0))
            self.faults.append({"kind": kind, "agent": name, "lost": lost, "recovery_s": recovery})

    def rank_fault(self, kind):
        name = self.rng.choice(sorted(AGENTS))
        before = self.before([name])
        if not before:
            return
        rank = self.rng.choice(before[name]["row"]["ranks"])
        if not runs_program(rank["pid"], "agentrt-test-agent", "soak_agents.py"):
            return
        t0 = time.monotonic()
        try:
            os.kill(rank["pid"], signal.SIGKILL if kind == "SIGKILL of a rank" else signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.recovered(kind, before, t0)

    def job_restarts(self):
        m = re.search(r"Restarts=(\d+)", sh("scontrol", "show", "job", self.job, "-o", ok=False))
        return int(m.group(1)) if m else -1

    def node_fault(self, partition):
        """A node under a single-node agent dies or is cut off. With a spare left, the agents
        there move; with none, the run requeues its allocation and every agent resumes."""
        host = self.batch_host()
        wide = {r["node"] for r in (self.agent("wide") or {"ranks": []})["ranks"]}
        nodes = {}
        for name in SINGLE:
            a = self.agent(name)
            if a and a["ranks"] and a["ranks"][0]["node"] not in wide | {host}:
                nodes.setdefault(a["ranks"][0]["node"], []).append(name)
        if not nodes:
            return
        node = self.rng.choice(sorted(nodes))
        before = self.before(sorted(AGENTS))  # a requeue takes every agent
        if not before:
            return
        restarts = self.job_restarts()
        old_pid = before[nodes[node][0]]["row"]["ranks"][0]["pid"]
        t0 = time.monotonic()
        if partition:
            self.cluster.cut(node)
        else:
            self.cluster.kill(node)
        self.lost_nodes.append((node, not partition))
        kind = "partition" if partition else "node death"

        def outcome():
            if self.job_restarts() > restarts:
                return "requeue"
            moved = all(self.heartbeating(n, before[n]["pids"]) for n in nodes[node])
            return "moved" if moved else None
        if wait_for("%s of %s to be survived" % (kind, node), outcome, 120, 0.2) == "requeue":
            # The lost nodes come back first, so the requeued allocation gets all it asks for.
            self.bring_back_lost_nodes()
            self.recovered(kind + ", no spare: requeue", before, t0, timeout=180)
            return
        t_moved = time.time()
        self.recovered(kind, {n: before[n] for n in nodes[node]}, t0)
        if partition:
            self.check_fenced(nodes[node][0], old_pid, t_moved)
        self.bring_back_lost_nodes(keep_lost=True)

    def wait_requeued(self, restarts):
        wait_for("job %s to be requeued" % self.job, lambda: self.job_restarts() > restarts, 90, 0.5)

    def bring_back_lost_nodes(self, keep_lost=False):
        """Lost nodes rejoin SLURM; this allocation has dropped them (keep_lost: they are
        remembered as back, until the next allocation)."""
        for node, slurmd_dead in self.lost_nodes:
            if slurmd_dead is not None:
                self.cluster.back(node, slurmd_dead)
        self.lost_nodes = [(n, None) for n, _ in self.lost_nodes] if keep_lost else []

    def check_fenced(self, name, old_pid, t_moved):
        """The cut-off incarnation lived on past the move, and no checkpoint committed after the
        move is anyone's but the new incarnation's."""
        fence = open(os.path.join(self.run_dir, "checkpoints", name, "FENCE")).read().strip()

        def new_commit():
            after = []
            for m in glob.glob(os.path.join(self.run_dir, "checkpoints", name, "step-*", "manifest.json")):
                try:
                    j = json.load(open(m))
                except (OSError, ValueError):
                    continue
                # The file's time, from the kernel: the manifest's own "time" is its node's wall
                # clock, which a clock step may have moved.
                if os.stat(m).st_mtime > t_moved:
                    after.append(j.get("incarnation"))
            return after or None
        after = wait_for("%s's new incarnation to commit a checkpoint" % name, new_commit, 30, 0.2)
        check(all(inc == fence for inc in after),
              "after the partition only %s's new incarnation %s committed: %s" % (name, fence, after))

    def preempt(self):
        before = self.before(sorted(AGENTS))
        if not before:
            return
        restarts = self.job_restarts()
        t0 = time.monotonic()
        sh("scancel", "--signal=USR2", "--batch", self.job)
        self.wait_requeued(restarts)
        self.bring_back_lost_nodes()
        self.recovered("SLURM preemption + requeue", before, t0, timeout=180)

    def controller_pid(self):
        """The run's controller: `agentctl run --backend slurm-steps` in the batch shell."""
        for entry in os.listdir("/proc"):
            try:
                cmd = open("/proc/%s/cmdline" % entry).read().split("\0")
            except (OSError, ValueError):
                continue
            if "slurm-steps" in cmd and self.run_dir in cmd and \
                    os.path.basename(cmd[0]) == "agentctl":
                return int(entry)
        return None

    def kill_controller(self):
        """kill -9 of the controller (the allocation's batch shell): SLURM ends the job; the
        operator requeues it (scontrol requeue) and every agent resumes."""
        before = self.before(sorted(AGENTS))
        pid = self.controller_pid()
        if not before or pid is None:
            return
        restarts = self.job_restarts()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def requeued():
            if self.job_restarts() > restarts:
                return True
            # Refused while the job still runs or completes; asked again until it is over.
            sh("scontrol", "requeue", self.job, ok=False)
            return None
        wait_for("job %s to end and be requeued" % self.job, requeued, 90, 0.5)
        self.bring_back_lost_nodes()
        self.recovered("kill -9 controller + requeue", before, t0, timeout=180)

    def full_disk(self):
        """The file system of the run directory (checkpoints, logs, the bus log) is full for
        FULL_DISK_S: saves fail, and nothing may be torn. Once there is room again, every agent
        commits a checkpoint newer than its last one from before; one that restarted meanwhile
        resumed from a checkpoint no older than that."""
        before = self.before(sorted(AGENTS))
        if not before:
            return
        filler = os.path.join(self.work, "filler")
        t0 = time.monotonic()
        with open(filler, "wb") as f:
            st = os.statvfs(self.work)
            try:
                os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize)
            except OSError:
                pass  # as full as it gets
        time.sleep(FULL_DISK_S)
        os.unlink(filler)
        for name, b in before.items():
            wait_for("%s to commit a checkpoint after the disk was full" % name,
                     lambda: newest_committed(self.run_dir, name) > b["checkpoint"], 60, 0.2)
            a = wait_for("%s running" % name, lambda: self.heartbeating(name), 60, 0.2)
            lost = 0
            if not b["pids"] & {r["pid"] for r in a["ranks"]}:  # it restarted meanwhile
                rank0 = next(r for r in a["ranks"] if r["rank"] == 0)
                got = wait_for("%s's restore line" % name,
                               lambda: restore_since(b["log"], b["offset"], rank0["pid"]), 30)[0]
                check(got >= b["checkpoint"], "%s restarted while the disk was full and resumed "
                      "from step %d, not older than checkpoint %d" % (name, got, b["checkpoint"]))
                lost = max(0, b["row"]["step"] - max(got, 0))
            self.faults.append({"kind": "full disk", "agent": name, "lost": lost,
                                "recovery_s": time.monotonic() - t0 - FULL_DISK_S})

    def clock_step(self):
        """One node's wall clock steps CLOCK_STEP_S forward or back, and back again once
        CLOCK_HOLD_S have passed and each agent with a rank on the node has committed a
        checkpoint meanwhile (its recovery: the time to that checkpoint), then stays right for
        heartbeat_timeout_s and 2 s more. Nothing restarts for
        it: all along every agent keeps its processes, and from 1.5 s after each step (status.json
        is written once a second, and a step of the controller's own node moves its clock
        between a heartbeat and the next write) every rank's heartbeat age there stays under
        heartbeat_timeout_s."""
        on = {}  # node: the agents with a rank there
        for a in (self.status() or {"agents": []})["agents"]:
            for r in a["ranks"] if a["name"] in AGENTS else ():
                on.setdefault(r["node"], set()).add(a["name"])
        before = self.before(sorted(AGENTS))
        if not on or not before:
            return
        node = self.rng.choice(sorted(on))
        step = self.rng.choice([-1, 1]) * CLOCK_STEP_S
        kind = "clock step ±%d s%s" % (
            CLOCK_STEP_S, ", controller's node" if node == self.batch_host() else "")
        committed = {}  # agent on the node: seconds from the step to its first commit after it
        finished = set()  # agents that reached their target meanwhile (nothing more to commit)
        oldest = [0.0]  # the oldest heartbeat age seen in status.json

        def hold(seconds, until_committed):
            stepped = time.monotonic()
            while time.monotonic() < stepped + seconds or (
                    until_committed and not on[node] - finished <= set(committed)):
                if time.monotonic() > stepped + 60:
                    raise Failure("not every agent on %s committed a checkpoint within 60 s of a "
                                  "%+d s clock step: only %s" % (node, step, sorted(committed)))
                status = self.status()
                for name, b in before.items() if status else ():
                    a = next(x for x in status["agents"] if x["name"] == name)
                    if a["state"] == "succeeded":
                        finished.add(name)  # it reached its target meanwhile
                        continue
                    pids = {r["pid"] for r in a["ranks"]}
                    if a["state"] != "running" or pids != b["pids"]:
                        raise Failure("%s did not keep running in the same processes %s through a "
                                      "%+d s clock step of %s (now %s, pids %s)" % (
                                          name, sorted(b["pids"]), step, node, a["state"],
                                          sorted(pids)))
                    if time.monotonic() > stepped + 1.5:
                        ages = [status["updated_unix_s"] - r["heard_unix_s"] for r in a["ranks"]]
                        oldest[0] = max(oldest[0], *ages)
                        if max(ages) >= HEARTBEAT_TIMEOUT_S:
                            raise Failure("%s's heartbeat ages reached %d s in a %+d s clock step "
                                          "of %s: %s" % (name, HEARTBEAT_TIMEOUT_S, step, node,
                                                         ["%.1f" % x for x in ages]))
                    if name in on[node] and name not in committed and \
                            newest_committed(self.run_dir, name) > before[name]["checkpoint"]:
                        committed[name] = time.monotonic() - stepped
                time.sleep(0.25)
        self.cluster.step_clock(node, step)
        try:
            hold(CLOCK_HOLD_S, True)
        finally:
            self.cluster.step_clock(node, 0)
        hold(HEARTBEAT_TIMEOUT_S + 2.0, False)  # a rank the step back stalled would be torn down
        print("ok: a %+d s clock step of %s and back: no agent restarted, heartbeat ages at most "
              "%.1f s, %s committed checkpoints meanwhile" % (step, node, oldest[0],
                                                              ", ".join(sorted(committed))))
        for name, recovery in sorted(committed.items()):
            self.faults.append({"kind": kind, "agent": name, "lost": 0, "recovery_s": recovery})

    def check_nothing_corrupt(self):
        """No restore had to pass over a corrupt checkpoint: none was torn."""
        for name in AGENTS:
            a = self.agent(name)
            check(not a.get("skipped_checkpoints"),
                  "%s passed over no corrupt checkpoint (%s)" % (name, a.get("skipped_checkpoints")))

    def go(self):
        kinds = self.kinds
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(1.0, 3.0))
            kind = self.rng.choice(kinds)
            if kind == "node death" or kind == "partition":
                self.node_fault(kind == "partition")
            elif kind == "preemption":
                self.preempt()
            elif kind == "kill controller":
                self.kill_controller()
            elif kind == "full disk":
                self.full_disk()
            elif kind == CLOCK_STEP:
                self.clock_step()
            elif kind == "kill broker":
                if self.before(sorted(AGENTS)):
                    fault = kill_broker(self, AGENTS, "kill -9 broker")
                    if fault:
                        self.faults.append(fault)
            elif kind == LEAGUE_KILL:
                fault = sigkill_league_member(self, self.rng, soak_agents.LEAGUE, kind)
                if fault:
                    self.faults.append(fault)
            else:
                self.rank_fault(kind)
        # The run goes on to its end.
        wait_for("the run to end", lambda: (self.status() or {}).get("state") in
                 ("succeeded", "failed", "stopped"), self.target * STEP_MS / 1000 * 3 + 180, 0.5)
        for name in AGENTS:
            a = self.agent(name)
            check(a["state"] == "succeeded" and a["step"] == self.target,
                  "%s reached its target step %d and succeeded (%s, step %d, %d restarts)"
                  % (name, self.target, a["state"], a["step"], a["restarts"]))
        self.check_nothing_corrupt()
        soak_agents.check_all(self.run_dir, self.chat, self.target, league=True)
        wait_for("job %s to leave the queue" % self.job,
                 lambda: not sh("squeue", "-h", "-j", self.job, ok=False).strip(), 60, 0.5)
        wait_for("no process of the run left on any node",
                 lambda: not run_processes(self.run_dir), 30)
        print("ok: no process of the run is left")
        wait_for("no Open MPI shared memory of the job left in /dev/shm",
                 lambda: not glob.glob("/dev/shm/agentrt-mpi.step.%s.*" % self.job) and
                 not glob.glob("/dev/shm/vader_segment.n*"), 30)
        print("ok: the job left no shared memory")
        kinds_seen = {f["kind"] for f in self.faults}
        check(len(self.faults) >= 3 and len(kinds_seen) >= min(2, len(set(self.kinds or "ab"))),
              "faults were injected and survived: %d of %d kinds" % (len(self.faults), len(kinds_seen)))
        print_fault_table(self.faults)



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument("--kinds", help="only these faults (comma-separated, as in the table)")
    args = parser.parse_args()
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "add", "agentrt-probe-%d" % os.getpid()],
                                           capture_output=True).returncode != 0:
        print("soak_cluster_test: skipped: cannot create network namespaces here "
              "(needs root and CAP_NET_ADMIN)")
        return 77
    subprocess.run(["ip", "netns", "del", "agentrt-probe-%d" % os.getpid()], capture_output=True)
    work = tempfile.mkdtemp(prefix="agentrt-msoak-work.")
    chat = tempfile.mkdtemp(prefix="agentrt-msoak-chat.")  # the bus's records: not on the full disk
    # The run directory on a file system of its own that the injector can fill, mounted before
    # the nodes start so that their mount namespaces hold it too.
    disk = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm,mode=0700" % DISK_MIB, "tmpfs",
                           work], capture_output=True).returncode == 0
    cluster = None
    rc = 1
    try:
        cluster = Cluster()
        kinds = args.kinds.split(",") if args.kinds else KINDS
        if not disk and "full disk" in kinds:
            print("soak_cluster_test: no full-disk faults: cannot mount a tmpfs on %s" % work)
            kinds = [k for k in kinds if k != "full disk"]
        if not cluster.clocks and CLOCK_STEP in kinds:
            print("soak_cluster_test: no clock steps: no clock shim at %s (build the tests)" % CLOCK_SHIM)
            kinds = [k for k in kinds if k != CLOCK_STEP]
        soak = Soak(cluster, work, chat, args.seconds, args.seed, kinds)
        soak.go()
        rc = 0
    except Failure as e:
        print("FAILED: %s\n(work dir kept: %s)" % (e, work))
        for run_dir in glob.glob(os.path.join(work, "runs", "*")):
            for pid in run_processes(run_dir):  # what is left, and where it waits
                try:
                    cmd = open("/proc/%d/cmdline" % pid).read().replace("\0", " ")[:120]
                    st = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
                    wchan = open("/proc/%d/wchan" % pid).read()
                    print("left: pid %d (ppid %s) state %s wchan %s: %s" % (pid, st[1], st[0], wchan, cmd))
                except OSError:
                    pass
        for log in sorted(glob.glob(os.path.join(work, "runs", "*", "slurm-*.out"))):
            print("--- %s\n%s" % (log, "".join(open(log, errors="replace").readlines()[-30:])))
    finally:
        if cluster is not None:
            left = cluster.close()
            if left:
                print("FAILED: stop.sh left namespaces %s" % left)
                rc = 1
        if disk:
            if rc != 0:
                kept = tempfile.mkdtemp(prefix="agentrt-msoak-kept.")
                subprocess.run(["cp", "-a", work + "/.", kept])
                print("(the work dir's contents are kept in %s)" % kept)
            if subprocess.run(["umount", work], capture_output=True).returncode != 0:
                print("FAILED: cannot unmount the tmpfs on %s" % work)
                rc = 1
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(chat, ignore_errors=True)
        print("PASSED cluster soak (seed %d, %.0f s)" % (args.seed, args.seconds))
    else:
        print("(the bus's records are kept in %s)" % chat)
    return rc


if __name__ == "__main__":
    sys.exit(main())
