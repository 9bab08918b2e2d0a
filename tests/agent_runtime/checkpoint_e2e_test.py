#!/usr/bin/python3
"""Checkpoints end to end with `agentctl run`: an agent that counts steps
and checkpoints every second is kill -9ed; after the restart it continues from
its last committed step, no step lost beyond the interval; status.json records
last_checkpoint_step. Runs the real agentctl and the real test agent.

    checkpoint_e2e_test.py SCENARIO     (single | mpi_pair)

Every wait is bounded; the port block is probed free; the work directory is
removed on success.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import AgentctlRun, Failure, check, free_port_block, run_scenarios, wait_for  # noqa: E402

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")
STEP_MS = 20
INTERVAL_S = 1.0
STEPS_PER_INTERVAL = int(INTERVAL_S * 1000 / STEP_MS)


def committed_steps(ckpt_dir):
    """Steps whose manifest exists (the commit point), newest first."""
    steps = []
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return steps
    for name in names:
        m = re.fullmatch(r"step-(\d+)", name)
        if m and os.path.exists(os.path.join(ckpt_dir, name, "manifest.json")):
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def running(run, name, ranks, restarts):
    a = run.agent(name)
    if not a or a["state"] != "running" or a["restarts"] != restarts or len(a["ranks"]) != ranks:
        return None
    # Each rank's own pid: it has sent telemetry (before that, mpirun's pid stands for it).
    if a.get("step", -1) < 1 or not all(r["pid"] > 0 and r.get("heard_unix_s") for r in a["ranks"]):
        return None
    return a


def scenario(work, ranks):
    first = free_port_block(64)
    args = ["--forever", "--step-ms", str(STEP_MS), "--ckpt-interval-s", str(INTERVAL_S), "--heartbeat-ms", "200"]
    yaml_text = """run: {name: ckpt, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 8}
defaults:
  restart: {max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 5}
agents:
  - name: counter
    gpus: 0
    ranks: %d
    command: %s
""" % (first, first + 63, ranks, json.dumps([AGENT] + args))
    run = AgentctlRun(AGENTCTL, work, yaml_text)
    try:
        a = wait_for("counter running", lambda: running(run, "counter", ranks, 0), 60)
        ckpt_dir = os.path.join(run.run_dir, "checkpoints", "counter")
        # Let it commit a few checkpoints, then kill -9 one rank right after one more commit lands.
        wait_for("two committed checkpoints", lambda: len(committed_steps(ckpt_dir)) >= 2 and
                 committed_steps(ckpt_dir)[0] >= 2 * STEPS_PER_INTERVAL, 60)
        newest = committed_steps(ckpt_dir)[0]
        wait_for("status.json records last_checkpoint_step",
                 lambda: (run.agent("counter") or {}).get("last_checkpoint_step", -1) >= newest, 20)
        check(True, "status.json last_checkpoint_step >= %d" % newest)
        time.sleep(INTERVAL_S / 2)  # kill between two checkpoints
        before = committed_steps(ckpt_dir)[0]
        step_at_kill = run.agent("counter")["step"]
        victim = run.agent("counter")["ranks"][ranks - 1]["pid"]
        os.kill(victim, signal.SIGKILL)
        check(True, "killed rank %d (pid %d) at about step %d; newest commit %d" %
              (ranks - 1, victim, step_at_kill, before))

        wait_for("counter restarted", lambda: running(run, "counter", ranks, 1), 60)
        logs = [os.path.join(run.run_dir, "logs", "counter", "rank%d.log" % r) for r in range(ranks)]

        def resumed():
            found = []
            for path in logs:
                with open(path) as f:
                    m = re.findall(r"resumed from step (\d+)", f.read())
                if not m:
                    return None
                found.append(int(m[-1]))
            return found

        steps = wait_for("every rank to log its resume", resumed, 30)
        check(len(set(steps)) == 1, "every rank resumed from the same step %s" % steps)
        resumed_step = steps[0]
        check(resumed_step >= before, "resumed from step %d, not older than the last commit before the kill (%d)" %
              (resumed_step, before))
        check(step_at_kill - resumed_step <= 2 * STEPS_PER_INTERVAL,
              "no step lost beyond the interval: about step %d at the kill, resumed at %d (interval = %d steps)" %
              (step_at_kill, resumed_step, STEPS_PER_INTERVAL))
        wait_for("progress past the resume point", lambda: (run.agent("counter") or {}).get("step", 0) > resumed_step, 30)
        check(True, "training continues after the resume")

        stop = subprocess.run([AGENTCTL, "stop", run.run_dir], capture_output=True, text=True, timeout=60)
        check(stop.returncode == 0, "agentctl stop: %s %s" % (stop.stdout, stop.stderr))
        run.proc.wait(timeout=60)
        final = run.agent("counter")
        check(final["last_checkpoint_step"] >= resumed_step,
              "status.json keeps last_checkpoint_step (%d)" % final["last_checkpoint_step"])
        if ranks == 1:
            with open(logs[0]) as f:
                log = f.read()
            check("checkpointed step" in log and "stopping at step" in log,
                  "on stop the agent checkpointed before it exited")
            check(committed_steps(ckpt_dir)[0] >= final["last_checkpoint_step"],
                  "status.json never claims a checkpoint newer than the newest on disk")
    finally:
        run.kill()


def main():
    for path in (AGENTCTL, AGENT):
        if not os.access(path, os.X_OK):
            print("missing %s (build agentctl and agentrt-test-agent)" % path)
            return 1
    scenarios = {"single": lambda work: scenario(work, 1), "mpi_pair": lambda work: scenario(work, 2)}
    return run_scenarios(scenarios, sys.argv[1], "agentrt-ckpt-e2e")


if __name__ == "__main__":
    sys.exit(main())
