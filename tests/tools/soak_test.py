#!/usr/bin/python3
"""A compressed stretch of failures on one machine: `agentctl run` of single-rank and 2-rank MPI
agents checkpointing every 2 s, while a fault injector with a fixed seed keeps breaking things:
SIGKILL of a rank (a league member's too), SIGSTOP of a rank (found by its heartbeat timeout),
kill -9 of the controller (and with it the bus's broker) followed by `agentctl resume`, kill -9 of
the broker alone (the controller starts it again; the agents live through it). Two Python agents
talk over the bus
with `durability: always`; a PBT population of three and a league of two agent-worker members
(C++) live through the controller kills (tests/tools/soak_agents.py). Checked at every fault, not
only at the end:

- the incarnation after a fault resumes from a checkpoint at least as new as the newest one
  committed when the fault struck: the steps lost are at most those since the last checkpoint;
- every agent reaches its target step and succeeds; the run exits 0;
- every acknowledged bus message is stored once, at the offset its acknowledgement named, and
  every listener process hears the topic from where it restored, without gap or duplicate;
- PBT's lineage has one entry per exploit; the league applied each match result once;
- no process of the run survives it, and every port of its block can be bound again.

It prints a table: faults by kind, survived, steps lost per fault (median, max), recovery time
per kind (median, max).

    soak_test.py [--seconds S] [--seed N]     (make test: 30 s; make soak: 15 minutes)
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import soak_agents  # noqa: E402
from agentrt_testing import (AgentctlRun, Failure, check, free_port_block, heartbeating,  # noqa: E402
                             incarnation_restore, kill_broker, newest_committed, print_fault_table,
                             run_processes, sigkill_league_member, soak_agent_command, wait_for)

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")
STEP_MS = soak_agents.STEP_MS
# name: ranks (the pair runs under mpirun); talker, listener: soak_agents.py's. The population
# (soak_agents.POPULATION) is not struck itself: a PBT exploit may replace a member's checkpoints
# at any time, so its steps lost say nothing; it lives through every controller kill.
AGENTS = {"solo-a": 1, "solo-b": 1, "pair": 2, "talker": 1, "listener": 1}
PORTS = 96


def config(first_port, target, chat_dir):
    agents = ""
    for name, ranks in AGENTS.items():
        if name in soak_agents.CHAT:
            continue
        cmd = soak_agent_command(AGENT, target, STEP_MS, keep_last=3)
        agents += "  - {name: %s, ranks: %d, command: %s}\n" % (name, ranks, json.dumps(cmd))
    return """run: {name: soak, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 8}
defaults:
  restart: {max_restarts: 1000, backoff_s: 0.2, backoff_max_s: 1, crash_loop_after: 0,
            heartbeat_timeout_s: 3, grace_s: 1}
  checkpoint: {interval_s: 2, keep_last: 3}
  env: %s
agents:
%s%s%s""" % (first_port, first_port + PORTS - 1, soak_agents.env_yaml(BIN), agents,
             soak_agents.agents_yaml(target, chat_dir) + soak_agents.league_yaml(BIN, target),
             soak_agents.sections_yaml(league=True))


class Soak:
    def __init__(self, work, seconds, seed):
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.first = free_port_block(PORTS)
        # The target: about `seconds` of steps, plus room for what faults take back.
        self.target = int(seconds * 1000 / STEP_MS)
        self.chat = os.path.join(work, "chat")
        os.makedirs(self.chat)
        self.run = AgentctlRun(AGENTCTL, work, config(self.first, self.target, self.chat))
        self.controller = self.run.proc
        self.faults = []  # {kind, agent, lost, recovery_s}

    def agent(self, name):
        return self.run.agent(name)

    def running(self):
        """Agents heartbeating with every rank, not yet near their target."""
        out = []
        for name, ranks in AGENTS.items():
            a = heartbeating(self.run, name, ranks)
            if a and a["step"] < self.target * 0.9:
                out.append(a)
        return out

    def wait_recovered(self, name, before, t0, kind):
        """The next incarnation of `name` (`before`: its status row when the fault struck) is
        heartbeating from new processes; its restore is checked and recorded."""
        ranks = AGENTS[name]
        old_pids = {r["pid"] for r in before["ranks"]}
        ckpt_before = before["checkpoint"]

        def back():
            a = heartbeating(self.run, name, ranks)
            if not a or a["restarts"] <= before["restarts"]:
                return None
            return a if not old_pids & {r["pid"] for r in a["ranks"]} else None
        a = wait_for("%s back after %s" % (name, kind), back, 90, 0.05)
        recovery = time.monotonic() - t0
        restart = a["restarts"]
        log = os.path.join(self.run.run_dir, "logs", name, "rank0.log")
        got = wait_for("%s's restore line" % name, lambda: incarnation_restore(log, restart), 30)[0]
        check(got >= ckpt_before,
              "%s after %s resumed from step %d, not older than checkpoint %d committed before it"
              % (name, kind, got, ckpt_before))
        lost = max(0, before["step"] - max(got, 0))
        self.faults.append({"kind": kind, "agent": name, "lost": lost, "recovery_s": recovery})

    def rank_fault(self, kind):
        candidates = self.running()
        if not candidates:
            return
        a = self.rng.choice(candidates)
        rank = self.rng.choice(a["ranks"])
        a["checkpoint"] = newest_committed(self.run.run_dir, a["name"])
        t0 = time.monotonic()
        try:
            os.kill(rank["pid"], signal.SIGKILL if kind == "sigkill_rank" else signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.wait_recovered(a["name"], a, t0, kind)

    def league_fault(self):
        """SIGKILL of a league member's rank: its next incarnation plays on (its results then
        carry the new incarnation; check_league holds them to once each)."""
        fault = sigkill_league_member(self.run, self.rng, soak_agents.LEAGUE, "sigkill_league_member")
        if fault:
            self.faults.append(fault)

    def broker_fault(self):
        """kill -9 of the run's broker apart from its controller: started again on its port with
        its log, while every agent steps on without a restart (its talk checked at the end)."""
        if any(a["step"] >= self.target * 0.9 for a in self.running()):
            return
        fault = kill_broker(self.run, AGENTS)
        if fault:
            self.faults.append(fault)

    def kill_controller(self):
        before = {}
        for name, ranks in AGENTS.items():
            a = heartbeating(self.run, name, ranks)
            if not a:
                return  # only when every agent runs: each then has a fault to recover from
            a["checkpoint"] = newest_committed(self.run.run_dir, name)
            before[name] = a
        if any(a["step"] >= self.target * 0.9 for a in before.values()):
            return
        t0 = time.monotonic()
        self.controller.send_signal(signal.SIGKILL)
        self.controller.wait(timeout=10)
        wait_for("every process of the run to die", lambda: not run_processes(self.run.run_dir), 10)
        self.controller = subprocess.Popen([AGENTCTL, "resume", self.run.run_dir, "--quiet"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for name, a in before.items():
            self.wait_recovered(name, a, t0, "kill -9 controller + resume")

    def go(self):
        kinds = ["sigkill_rank", "sigkill_rank", "sigstop_rank", "kill_controller",
                 "sigkill_league_member", "kill_broker"]
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline and self.controller.poll() is None:
            time.sleep(self.rng.uniform(1.0, 3.0))
            kind = self.rng.choice(kinds)
            if kind == "kill_controller":
                self.kill_controller()
            elif kind == "sigkill_league_member":
                self.league_fault()
            elif kind == "kill_broker":
                self.broker_fault()
            else:
                self.rank_fault(kind)
        rc = self.controller.wait(timeout=self.target * STEP_MS / 1000 * 3 + 120)
        check(rc == 0, "the run ended well (rc %d)" % rc)
        for name in AGENTS:
            a = self.agent(name)
            check(a["state"] == "succeeded" and a["step"] == self.target,
                  "%s reached its target step %d and succeeded (%s, step %d, %d restarts)"
                  % (name, self.target, a["state"], a["step"], a["restarts"]))
        wait_for("no process of the run left", lambda: not run_processes(self.run.run_dir), 10)
        for port in range(self.first, self.first + PORTS):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
        check(True, "every port of the run's block binds again")
        check(len(self.faults) >= 3, "faults were injected and survived: %d" % len(self.faults))
        soak_agents.check_all(self.run.run_dir, self.chat, self.target, league=True)
        print_fault_table(self.faults)



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--seed", type=int, default=47)
    args = parser.parse_args()
    import tempfile
    work = tempfile.mkdtemp(prefix="agentrt-soak-")
    soak = None
    try:
        soak = Soak(work, args.seconds, args.seed)
        soak.go()
    except Failure as e:
        print("FAILED: %s\n(work dir kept: %s)" % (e, work))
        if soak is not None:
            soak.run.kill()
            if soak.controller.poll() is None:
                soak.controller.kill()
        return 1
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    print("PASSED soak (seed %d, %.0f s)" % (args.seed, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
