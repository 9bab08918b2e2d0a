#!/usr/bin/python3
"""examples/torch_ppo through `agentctl run`: the PyTorch PPO league on pursuit
(Debian's python3-torch, gloo on CPU), with the real controller, bus, mpirun
and signals. One scenario per CTest entry:

  league    configs/torch_demo.yaml as shipped: the predators learn (captures
            per episode at least 3x those of random predators against the same
            prey snapshot), metrics and snapshots reach `agentctl status`.
  sigkill   SIGKILL of one rank of a 2-rank predator: only that agent restarts,
            from its checkpoint (step never back to 0), against the versions it
            played against there.
  sigstop   SIGSTOP of a rank: its heartbeat stops, the controller restarts the agent.
  tampered  the newest checkpoint is corrupted while the run is down; `agentctl
            resume` falls back to the one before, naming the file and the reason.

Skips (exit 77) where /usr/bin/python3 cannot import torch.
"""
import json
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import (AgentctlRun, check, committed_dirs, free_port_block,  # noqa: E402
                             heartbeating, newest_committed, run_processes, scenarios_main, wait_for)

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
SRC = os.path.abspath(os.environ.get("AGENTRT_SOURCE_DIR", "."))
AGENTCTL = os.path.join(BIN, "agentctl")
TRAIN = os.path.join(SRC, "examples", "torch_ppo", "train.py")


def league_config(first, predator_steps, prey_steps, restart, eval_episodes=0, interval_s=1):
    """The demo's shape (2 predators x 2 ranks, 1 prey) on a probed port block."""
    return """run: {name: torch, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 16}
defaults:
  restart: %s
  checkpoint: {interval_s: %s, keep_last: 3}
  env: {PYTHONUNBUFFERED: "1", OMP_NUM_THREADS: "1"}
agents:
  - name: predator
    replicas: 2
    ranks: 2
    command: [/usr/bin/python3, %s]
    args: {env: pursuit, role: predator, steps: %d, eval_episodes: %d}
  - name: prey
    command: [/usr/bin/python3, %s]
    args: {env: pursuit, role: prey, steps: %d}
channels:
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]}
""" % (first, first + 127, restart, interval_s, TRAIN, predator_steps, eval_episodes, TRAIN,
       prey_steps)


def read_log(run, agent, rank=0):
    return read_log_of(run.run_dir, agent, rank)


def read_log_of(run_dir, agent, rank=0):
    with open(os.path.join(run_dir, "logs", agent, "rank%d.log" % rank)) as f:
        return f.read()


def resumed_steps(text):
    return [int(x) for x in re.findall(r"resumed at step (\d+)", text)]


def finish(run, timeout_s):
    rc = run.wait_exit(timeout_s)
    check(rc == 0, "the run succeeded (rc %d)\n%s" % (rc, run.output()[-3000:]))
    wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 15)


def scenario_league(work):
    out = subprocess.run([AGENTCTL, "run", os.path.join(SRC, "configs", "torch_demo.yaml"),
                          "--set", "run.dir=" + os.path.join(work, "runs"), "--quiet"],
                         cwd=work, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", "")))
    check(out.returncode == 0, "configs/torch_demo.yaml ran to success\n%s%s" %
          (out.stdout[-3000:], out.stderr[-3000:]))
    run_dir = os.path.join(work, "runs", os.listdir(os.path.join(work, "runs"))[0])
    st = subprocess.run([AGENTCTL, "status", run_dir, "--json"], capture_output=True, text=True,
                        timeout=30)
    status = json.loads(st.stdout)
    agents = {a["name"]: a for a in status["agents"]}
    check(sorted(agents) == ["predator-0", "predator-1", "prey-0"], "three agents: %s" % sorted(agents))
    for name, a in agents.items():
        m = a["metrics"]
        check(a["state"] == "succeeded" and a["restarts"] == 0, "%s succeeded without restarts" % name)
        check(m.get("snapshots_received", 0) > 0, "%s played against snapshots from the bus (%s)"
              % (name, m.get("snapshots_received")))
        check(committed_dirs(run_dir, name), "%s wrote verified checkpoints" % name)
    for name in ("predator-0", "predator-1"):
        m = agents[name]["metrics"]
        with open(os.path.join(run_dir, "logs", name, "rank0.log")) as f:
            log = f.read()
        check("gloo on cpu" in log and "group of 2" in log, "%s trained as its own 2-rank gloo group" % name)
        # Both ranks of an update play the same versions (rank 0 picks them).
        played = [re.findall(r"league: (\d+) version changes played, digest (\w+)",
                             read_log_of(run_dir, name, r)) for r in (0, 1)]
        check(played[0] and played[0] == played[1] and int(played[0][-1][0]) > 0,
              "%s: its two ranks played the same versions: %s" % (name, played))
        evals = re.findall(r"^eval (\{.*\})$", log, re.M)
        check(evals, "%s logged its evaluation" % name)
        e = json.loads(evals[-1])
        print("%s: captures/episode %.3f trained vs %.3f random predators (x%.2f), prey snapshot %s"
              % (name, e["capture_rate"], e["random_capture_rate"], e["ratio"], e["prey_snapshots"]))
        check(e["prey_snapshots"].get("prey-0", 0) > 0, "%s was evaluated against a prey snapshot" % name)
        check(e["capture_rate"] > 0 and e["capture_rate"] >= 3 * e["random_capture_rate"],
              "%s: trained predators capture at least 3x as often as random ones" % name)
        check(abs(m["eval_capture_rate"] - e["capture_rate"]) < 1e-9,
              "%s: the evaluation is in agentctl status" % name)
        a = agents[name]
        check(a["flops_per_sample"] > 0 and a["peak_flops"] > 0,
              "%s declared its FLOPs per sample, and its partition has a peak: %s" %
              (name, {k: a[k] for k in ("flops_per_sample", "achieved_flops", "peak_flops")}))


def checkpoint_versions(step_dir):
    """{agent: [version, step]} of the weight streams a checkpoint was playing against
    (train.py's extra "league_versions", as agentrt.torch stores a dict)."""
    try:
        with open(os.path.join(step_dir, "manifest.json")) as f:
            extra = dict(json.load(f)["metadata"]["extra"]["__dict__"])
    except FileNotFoundError:  # keep_last removed it since it was listed
        return {}
    return dict(extra.get("league_versions", {"__dict__": []})["__dict__"])


def with_versions(run_dir, agent, of=None):
    """The committed checkpoints of `agent` that hold league versions (of agent `of`, when
    given), oldest first."""
    return [d for d in committed_dirs(run_dir, agent)
            if ((of in checkpoint_versions(d)) if of else checkpoint_versions(d))]


def came_back(log, versions):
    """Whether `log` says `versions` (a checkpoint's, checkpoint_versions) came back, all of them."""
    want = ", ".join("%s v%d" % (a, v[0]) for a, v in sorted(versions.items()))
    return ("the checkpoint's versions came back: %s\n" % want) in log


def scenario_sigkill(work):
    first = free_port_block(128)
    restart = "{max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 5}"
    run = AgentctlRun(AGENTCTL, work, league_config(first, 80000, 120000, restart))
    try:
        a = wait_for("predator-0 checkpointed",
                     lambda: (lambda x: x if x and x.get("last_checkpoint_step") else None)(
                         heartbeating(run, "predator-0", 2)), 120)
        wait_for("a checkpoint of predator-0 playing against versions of prey",
                 lambda: with_versions(run.run_dir, "predator-0", of="prey") or None, 120)
        ckpt = newest_committed(run.run_dir, "predator-0")
        victim = [r["pid"] for r in a["ranks"] if r["rank"] == 1][0]
        os.kill(victim, signal.SIGKILL)
        b = wait_for("predator-0 restarted",
                     lambda: (lambda x: x if x and x["restarts"] >= 1 else None)(
                         heartbeating(run, "predator-0", 2)), 60)
        check("rank 1 (pid %d) was killed by SIGKILL" % victim in b["reason"],
              "the reason names rank 1, its pid and the signal: %s" % b["reason"])
        finish(run, 240)
        for other in ("predator-1", "prey"):
            check(run.agent(other)["restarts"] == 0, "%s was not restarted" % other)
        log = read_log(run, "predator-0")
        steps = resumed_steps(log)
        check(steps and steps[0] >= ckpt > 0,
              "predator-0 resumed at step %s, not below its checkpoint %d" % (steps, ckpt))
        # (keep_last has removed that checkpoint by now: its versions are read off the log.)
        after = log[log.index("resumed at step"):]
        back = re.search(r"the checkpoint's versions came back: .*\bprey v\d+", after)
        check(back, "it played first against the prey's version of its checkpoint, pinned: %s"
              % (back.group(0) if back else after[-1500:]))
        check(run.agent("predator-0")["step"] >= 80000, "and it met its budget")
    finally:
        run.kill()


def scenario_sigstop(work):
    first = free_port_block(128)
    restart = "{max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 4, grace_s: 3}"
    run = AgentctlRun(AGENTCTL, work, league_config(first, 60000, 60000, restart))
    victim = None
    try:
        a = wait_for("predator-1 checkpointed",
                     lambda: (lambda x: x if x and x.get("last_checkpoint_step") else None)(
                         heartbeating(run, "predator-1", 2)), 120)
        check(a["step"] < 30000, "predator-1 is still training when stopped (step %d of 60000)" % a["step"])
        victim = [r["pid"] for r in a["ranks"] if r["rank"] == 1][0]
        os.kill(victim, signal.SIGSTOP)
        b = wait_for("the heartbeat to catch the stopped rank",
                     lambda: (lambda x: x if x and x["restarts"] >= 1 else None)(run.agent("predator-1")), 60)
        check("heartbeat" in b["reason"] and "rank 1" in b["reason"],
              "the reason names the heartbeat and the rank: %s" % b["reason"])
        finish(run, 240)
        steps = resumed_steps(read_log(run, "predator-1"))
        check(steps and steps[0] > 0, "predator-1 resumed from its checkpoint (step %s)" % steps)
    finally:
        run.kill()
        if victim:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass


def scenario_tampered(work):
    first = free_port_block(128)
    restart = "{max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 3}"
    run = AgentctlRun(AGENTCTL, work, league_config(first, 1000000, 1000000, restart))
    try:
        wait_for("two checkpoints of prey playing against versions of the predators",
                 lambda: len(with_versions(run.run_dir, "prey")) >= 2 or None, 120)
        run.proc.send_signal(signal.SIGKILL)  # the whole run goes down: kill -9 of agentctl
        run.proc.wait(timeout=10)
        wait_for("the run's processes to die", lambda: not run_processes(run.run_dir) or None, 20)
        dirs = committed_dirs(run.run_dir, "prey")
        newest = max(dirs, key=lambda d: int(d.rsplit("-", 1)[1]))
        before = max((d for d in dirs if d != newest), key=lambda d: int(d.rsplit("-", 1)[1]))
        before_versions = checkpoint_versions(before)  # read now: keep_last may remove it later
        shard = os.path.join(newest, "rank-0.shard")
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) // 2)
            f.write(b"\xde\xad\xbe\xef")
        # Resume, then stop it once the prey is back: what it restored is in its log.
        resumed = subprocess.Popen([AGENTCTL, "resume", run.run_dir, "--quiet"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            wait_for("prey resumed", lambda: resumed_steps(read_log(run, "prey")) or None, 90)
        finally:
            subprocess.run([AGENTCTL, "stop", run.run_dir], capture_output=True, timeout=60)
            resumed.wait(timeout=120)
        log = read_log(run, "prey")
        bad, good = int(newest.rsplit("-", 1)[1]), int(before.rsplit("-", 1)[1])
        m = re.search(r"checkpoint step %d skipped: (\S+): (.+)" % bad, log)
        check(m and "rank-0.shard" in m.group(1) and "checksum" in m.group(2),
              "the log names the tampered file and the reason: %s" % (m.group(0) if m else log[-1500:]))
        check(resumed_steps(log)[-1] == good, "prey fell back to step %d (resumed at %s)"
              % (good, resumed_steps(log)))
        # The bus came back with its log (durability batch, the default): the versions the
        # checkpoint was playing against are there, the same numbers and steps.
        after = log[log.rindex("resumed at step"):]
        check(came_back(after, before_versions) and "of the checkpoint cannot be read" not in after,
              "after the resume prey played first against its checkpoint's versions %s:\n%s"
              % (before_versions, after[-1500:]))
        wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 15)
    finally:
        run.kill()


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_ppo_test: skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
        return 77
    return scenarios_main(globals(), "agentrt-torch")


if __name__ == "__main__":
    sys.exit(main())
