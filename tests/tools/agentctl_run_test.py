#!/usr/bin/python3
"""Integration tests of `agentctl run` on one machine, with the real
agentctl binary and the real test agent (agentrt-test-agent).

    agentctl_run_test.py SCENARIO     (env_contract | restart | failing | kill_controller | busy_port)

Every wait is bounded; ports come from a block probed free by the test; each
scenario runs in its own temporary directory, which is removed on success.
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import (AgentctlRun, Failure, check, committed_dirs, free_port_block, heartbeating,  # noqa: E402
                             incarnation_restore, newest_committed, run_processes, scenarios_main, wait_for)

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")



def agentctl(*args, timeout=30):
    return subprocess.run([AGENTCTL] + list(args), capture_output=True, text=True, timeout=timeout)


def yaml_config(port_first, agents, extra=""):
    return """run: {name: t, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 8}
defaults:
  restart: {max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 3}
%s
agents:
%s""" % (port_first, port_first + 63, extra, agents)


def agent_yaml(name, args, gpus=0, ranks=1, restart=None, env=None):
    cmd = json.dumps([AGENT] + args)
    s = "  - name: %s\n    gpus: %d\n    ranks: %d\n    command: %s\n" % (name, gpus, ranks, cmd)
    if restart:
        s += "    restart: %s\n" % restart
    if env:
        s += "    env: %s\n" % json.dumps(env)
    return s


# ---------------------------------------------------------------------------------------------

def scenario_env_contract(work):
    """Disjoint GPUs (fake inventory), distinct checkpoint dirs, MASTER_PORT in the block,
    ranks 0..n-1, no secret in env or argv; status/logs after the end."""
    first = free_port_block(64)
    dump = os.path.join(work, "env")
    inventory = os.path.join(work, "inventory.yaml")
    with open(inventory, "w") as f:
        f.write("cluster:\n  nodes:\n    - {name: localhost, gpus: 4, cpus: 64}\n"
                "  ports: {first: %d, last: %d, per_agent: 8}\n" % (first, first + 63))
    args = ["--steps", "15", "--step-ms", "20", "--heartbeat-ms", "200", "--dump-env", dump]
    agents = (agent_yaml("gpu-a", args, gpus=2, ranks=2) + agent_yaml("gpu-b", args, gpus=2, ranks=2) +
              agent_yaml("cpu-c", args, gpus=0, ranks=2, env={"MY_FLAG": "1"}) + agent_yaml("cpu-d", args))
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents), ["--cluster", inventory])
    rc = run.wait_exit(90)
    out = run.output()
    check(rc == 0, "agentctl run exits 0 when every agent succeeded (rc %d)\n%s" % (rc, out))
    dumps = {}
    for fn in sorted(os.listdir(dump)):
        with open(os.path.join(dump, fn)) as f:
            d = json.load(f)
        dumps.setdefault(d["agent"], {})[d["rank"]] = d
    check(sorted(dumps) == ["cpu-c", "cpu-d", "gpu-a", "gpu-b"], "every agent dumped its environment")
    sizes = {"gpu-a": 2, "gpu-b": 2, "cpu-c": 2, "cpu-d": 1}
    gpu_sets, ckpt_dirs = {}, set()
    with open(os.path.join(run.run_dir, "secrets", "run.secret"), "rb") as f:
        secret = f.read()
    check(len(secret) >= 16, "the run secret exists")
    secret_forms = [secret, secret.hex().encode(), secret.hex().upper().encode()]
    contract = ["AGENTRT_RUN_DIR", "AGENTRT_AGENT", "AGENTRT_AGENT_INDEX", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "AGENTRT_PORTS",
                "AGENTRT_CKPT_DIR", "AGENTRT_BUS", "AGENTRT_TOKEN_FILE", "AGENTRT_BUS_CA", "AGENTRT_TELEMETRY", "AGENTRT_RESTART_COUNT",
                "AGENTRT_WORKDIR"]
    for name, ranks in sorted(dumps.items()):
        check(sorted(ranks) == list(range(sizes[name])), "%s has ranks 0..%d" % (name, sizes[name] - 1))
        for r, d in ranks.items():
            env = d["env"]
            missing = [v for v in contract if v not in env]
            check(not missing, "%s rank %d has every agent contract variable (missing %s)" % (name, r, missing))
            extra = sorted(k for k in env if k.startswith("AGENTRT_") and k not in contract)
            check(not extra, "%s rank %d has no other AGENTRT_ variable (%s)" % (name, r, extra))
            check(env["RANK"] == str(r) and env["WORLD_SIZE"] == str(sizes[name]),
                  "%s rank %d: RANK/WORLD_SIZE" % (name, r))
            check(env["AGENTRT_AGENT"] == name and env["AGENTRT_RESTART_COUNT"] == "0", "%s identity" % name)
            lo, hi = map(int, env["AGENTRT_PORTS"].split("-"))
            check(lo <= int(env["MASTER_PORT"]) <= hi, "%s MASTER_PORT %s inside AGENTRT_PORTS %s" %
                  (name, env["MASTER_PORT"], env["AGENTRT_PORTS"]))
            check(first <= lo and hi <= first + 63, "%s block inside the configured range" % name)
            tok = env["AGENTRT_TOKEN_FILE"]
            check(stat.S_IMODE(os.stat(tok).st_mode) == 0o600, "%s token file is 0600" % name)
            blob = (json.dumps(env) + " ".join(d["argv"])).encode()
            with open("/proc/self/environ", "rb") as f:
                pass
            check(not any(s in blob for s in secret_forms), "%s rank %d: no secret in env or argv" % (name, r))
            gpu_sets.setdefault(name, set()).add(env["CUDA_VISIBLE_DEVICES"])
            ckpt_dirs.add((name, env["AGENTRT_CKPT_DIR"]))
        check(len(gpu_sets[name]) == 1, "%s: every rank sees the same GPUs" % name)
    check("MY_FLAG" in dumps["cpu-c"][0]["env"], "an agent's env: from agents.yaml reaches it")
    a = set(next(iter(gpu_sets["gpu-a"])).split(","))
    b = set(next(iter(gpu_sets["gpu-b"])).split(","))
    check(len(a) == 2 and len(b) == 2 and not (a & b), "GPU agents got disjoint GPU sets %s %s" % (a, b))
    check(gpu_sets["cpu-c"] == {""} and gpu_sets["cpu-d"] == {""}, "CPU agents get an empty CUDA_VISIBLE_DEVICES")
    check(len({d for _, d in ckpt_dirs}) == 4, "every agent has its own checkpoint directory")
    for _, d in ckpt_dirs:
        check(d.startswith(run.run_dir + "/"), "checkpoint dir %s lies in the run dir" % d)
    ports = set()
    for name in dumps:
        ports.add(dumps[name][0]["env"]["AGENTRT_PORTS"])
    check(len(ports) == 4, "port blocks are distinct")

    st = json.loads(agentctl("status", run.run_dir, "--json").stdout)
    check(st["state"] == "succeeded" and all(a["state"] == "succeeded" for a in st["agents"]),
          "status --json: run and agents succeeded")
    for key in ["run", "state", "agents"]:
        check(key in st, "status has '%s'" % key)
    for key in ["name", "state", "restarts", "ranks", "last_checkpoint_step", "metrics"]:
        check(all(key in a for a in st["agents"]), "every agent in status has '%s'" % key)
    check(all(set(["rank", "pid", "node", "exit_code"]) <= set(r) for a in st["agents"] for r in a["ranks"]),
          "every rank has rank/pid/node/exit_code")
    check(all(r["exit_code"] == 0 for a in st["agents"] for r in a["ranks"]), "every rank exited 0")
    check("loss" in st["agents"][0]["metrics"], "latest metrics are recorded")
    with open(os.path.join(run.run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    check(len(lines) >= 10 and {"agent", "rank", "step"} <= set(lines[0]), "metrics.jsonl holds metric lines")
    logs = agentctl("logs", run.run_dir, "cpu-c")
    check(logs.returncode == 0 and "[rank1]" in logs.stdout and "done at step" in logs.stdout,
          "agentctl logs shows every rank of an mpirun agent")
    one = agentctl("logs", run.run_dir, "gpu-a", "--rank", "1")
    check(one.returncode == 0 and "rank 1/2" in one.stdout, "agentctl logs --rank 1")
    bad = agentctl("logs", run.run_dir, "nobody")
    check(bad.returncode != 0 and "gpu-a" in bad.stderr, "unknown agent: error naming the known ones")
    check(not os.path.exists(os.path.join(run.run_dir, "controller.pid")), "controller.pid removed at the end")
    for forbidden in secret_forms:
        check(forbidden not in out.encode(), "the secret is never printed")


def scenario_restart(work):
    """kill -9 of one rank of a 2-rank agent restarts that agent (restart count 1) and leaves
    the other agent's pids alone; a SIGSTOPped rank is caught by the heartbeat timeout."""
    first = free_port_block(64)
    args = ["--forever", "--step-ms", "50", "--heartbeat-ms", "200"]
    restart = "{max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 2, grace_s: 1}"
    agents = (agent_yaml("pair", args + ["--ckpt-interval-s", "0.5"], ranks=2, restart=restart) +
              agent_yaml("solo", args, restart=restart))
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        wait_for("pair heartbeating", lambda: heartbeating(run, "pair", 2), 40)
        ckpt = wait_for("a checkpoint of pair", lambda: (run.agent("pair") or {}).get("last_checkpoint_step"), 40)
        check(ckpt > 0, "status.json records pair's last_checkpoint_step (%d)" % ckpt)
        pair = wait_for("pair heartbeating", lambda: heartbeating(run, "pair", 2), 40)
        solo = wait_for("solo heartbeating", lambda: heartbeating(run, "solo", 1), 40)
        solo_pids = [r["pid"] for r in solo["ranks"]]
        victim = pair["ranks"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        restarted = wait_for("pair restarted once", lambda: heartbeating(run, "pair", 2)
                             if (run.agent("pair") or {}).get("restarts") == 1 else None, 40)
        check(restarted["restarts"] == 1, "the agent with a killed rank restarted with restart count 1")
        check(victim not in [r["pid"] for r in restarted["ranks"]], "its ranks are new processes")
        log_path = os.path.join(run.run_dir, "logs", "pair", "rank0.log")
        log = wait_for("the restarted rank to report its restore",
                       lambda: (lambda t: t if "restart 1" in t and "training from step" in t.split("restart 1")[1] else None)(
                           open(log_path).read()), 20)
        check("restart 1" in log, "the new incarnation saw AGENTRT_RESTART_COUNT=1")
        check("resumed from step" in log.split("restart 1")[1], "the restarted agent resumed from its last checkpoint")
        solo_now = run.agent("solo")
        check(solo_now["restarts"] == 0 and [r["pid"] for r in solo_now["ranks"]] == solo_pids,
              "the other agent's pids are unchanged")
        check(all(os.path.exists("/proc/%d" % p) for p in solo_pids), "the other agent's processes still run")

        frozen = restarted["ranks"][0]["pid"]
        os.kill(frozen, signal.SIGSTOP)
        again = wait_for("pair restarted after the heartbeat timeout",
                         lambda: heartbeating(run, "pair", 2) if (run.agent("pair") or {}).get("restarts") == 2 else None, 40)
        check(again["restarts"] == 2, "a SIGSTOPped rank was detected by heartbeat timeout and restarted")
        check("heartbeat" in run.output(), "the reason names the heartbeat")
        check(not os.path.exists("/proc/%d" % frozen) or open("/proc/%d/stat" % frozen).read().split(")")[1].split()[0] == "Z",
              "the stopped rank is gone")
        check(run.agent("solo")["restarts"] == 0, "the other agent was still never restarted")

        stop = agentctl("stop", run.run_dir, timeout=60)
        check(stop.returncode == 0, "agentctl stop returns 0: %s %s" % (stop.stdout, stop.stderr))
        rc = run.wait_exit(30)
        check(rc != 0, "a stopped run exits non-zero (rc %d)" % rc)
        st = run.status()
        check(st["state"] == "stopped" and all(a["state"] == "stopped" for a in st["agents"]),
              "after stop: run and agents are stopped")
        check(wait_for("no process left", lambda: not run_processes(run.run_dir) or None, 10),
              "no agent process is left after stop")
        again_stop = agentctl("stop", run.run_dir)
        check(again_stop.returncode == 0 and "not running" in again_stop.stdout, "stop of an ended run says so")
    finally:
        run.kill()


def scenario_failing(work):
    """An agent that always fails ends failed after max_restarts; the run exits non-zero with a
    summary naming the agent and its log; a healthy agent next to it succeeds."""
    first = free_port_block(64)
    restart = "{max_restarts: 2, backoff_s: 0.2, heartbeat_timeout_s: 30, grace_s: 1}"
    # "plain" does not use the runtime (like a stock PyTorch script): no heartbeats, judged by its exit.
    plain = ('  - name: plain\n    command: ["/bin/sh", "-c", "sleep 2; echo plain done"]\n'
             '    restart: {max_restarts: 0, heartbeat_timeout_s: 0.5}\n')
    agents = (agent_yaml("broken", ["--fail-at-step", "2", "--exit-code", "3", "--step-ms", "10"], restart=restart) +
              agent_yaml("fine", ["--steps", "20", "--step-ms", "10"], restart=restart) + plain)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    follow = subprocess.Popen([AGENTCTL, "logs", run.run_dir, "fine", "--follow"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    rc = run.wait_exit(60)
    out = run.output()
    check(rc != 0, "the run exits non-zero (rc %d)" % rc)
    try:
        followed, _ = follow.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        follow.kill()
        raise Failure("agentctl logs --follow did not end after the run ended")
    check(follow.returncode == 0 and "done at step 20" in followed, "logs --follow streamed the log and ended with the run")
    st = run.status()
    broken = run.agent("broken")
    check(st["state"] == "failed", "run state failed")
    check(broken["state"] == "failed" and broken["restarts"] == 2, "broken failed after max_restarts=2")
    check(broken["ranks"][0]["exit_code"] == 3, "its exit code is recorded")
    check(run.agent("fine")["state"] == "succeeded", "the healthy agent succeeded")
    check(run.agent("plain")["state"] == "succeeded", "a program without heartbeats is judged by its exit (succeeded)")
    check("agent broken failed after 2 restarts" in out and "exited with code 3" in out and
          "logs/broken/rank0.log" in out, "the summary names the agent, the cause and the log:\n" + out)
    human = agentctl("status", run.run_dir)
    check(human.returncode == 0 and "broken" in human.stdout and "failed" in human.stdout, "agentctl status (table)")


def scenario_kill_controller(work):
    """kill -9 of agentctl run: within 5 s no process of the run is left (direct ranks and
    mpirun's ranks alike)."""
    first = free_port_block(64)
    args = ["--forever", "--step-ms", "50", "--heartbeat-ms", "200"]
    agents = agent_yaml("mpi-pair", args, ranks=2) + agent_yaml("solo", args)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        wait_for("mpi-pair heartbeating", lambda: heartbeating(run, "mpi-pair", 2), 40)
        wait_for("solo heartbeating", lambda: heartbeating(run, "solo", 1), 40)
        before = run_processes(run.run_dir)
        check(len(before) >= 3, "the run has its processes (%s)" % before)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        t0 = time.monotonic()
        wait_for("every process of the run to die", lambda: not run_processes(run.run_dir) or None, 5.0, 0.05)
        check(True, "nothing left %.2f s after kill -9 of agentctl (was %d processes)" % (time.monotonic() - t0, len(before)))
        st = agentctl("status", run.run_dir)
        check(st.returncode == 3 and "is gone" in st.stderr and "controller gone" in st.stdout,
              "status says the controller is gone (exit 3)")
        stop = agentctl("stop", run.run_dir)
        check(stop.returncode != 0 and "is gone" in stop.stderr, "stop refuses, saying what it found")
    finally:
        run.kill()


def scenario_busy_port(work):
    """A foreign process holds the first port of an agent's block: the agent starts on the next
    port of its block."""
    first = free_port_block(64)
    dump = os.path.join(work, "env")
    agents = agent_yaml("a", ["--steps", "10", "--step-ms", "10", "--dump-env", dump])
    cfg = yaml_config(first, agents)
    with open(os.path.join(work, "plan.yaml"), "w") as f:
        f.write(cfg)
    plan = json.loads(agentctl("plan", os.path.join(work, "plan.yaml"), "--json").stdout)
    block = plan["agents"][0]["ports"]
    foreign = socket.socket()
    foreign.bind(("127.0.0.1", block["first"]))
    foreign.listen(1)
    try:
        run = AgentctlRun(AGENTCTL, work, cfg)
        rc = run.wait_exit(60)
        check(rc == 0, "the agent still ran to completion (rc %d)\n%s" % (rc, run.output()))
        with open(os.path.join(dump, "a.rank0.json")) as f:
            env = json.load(f)["env"]
        port = int(env["MASTER_PORT"])
        check(port != block["first"] and block["first"] < port <= block["last"],
              "MASTER_PORT %d is another port of the block %d-%d" % (port, block["first"], block["last"]))
        check(run.agent("a")["master_port"] == port, "status.json records the port used")
    finally:
        foreign.close()


# --------------------------------------------------------------------------------------------
# Shared machines: concurrent runs, working directories, resume, rank-level status.

def plan_of(run_dir):
    with open(os.path.join(run_dir, "plan.json")) as f:
        return json.load(f)


def scenario_concurrent(work):
    """Four runs of one config at once on one machine: every agent opens many fresh bus
    connections and rendezvouses on its MASTER_PORT; no call is refused, no port is shared by
    two runs, every run succeeds."""
    first = free_port_block(256)
    inventory = os.path.join(work, "inventory.yaml")
    with open(inventory, "w") as f:  # fake GPUs: agents of 2 ranks spawned directly
        f.write("cluster:\n  nodes:\n    - {name: localhost, gpus: 8, cpus: 64}\n"
                "  ports: {first: %d, last: %d, per_agent: 8}\n" % (first, first + 255))
    args = ["--steps", "10", "--step-ms", "10", "--heartbeat-ms", "200", "--rendezvous",
            "--bus-connections", "20"]
    agents = agent_yaml("a", args, gpus=2, ranks=2) + agent_yaml("b", args, gpus=2, ranks=2)
    channels = 'channels:\n  - {topic: "probe/*", publishers: ["*"], subscribers: ["*"]}\n'
    runs = []
    for i in range(4):
        d = os.path.join(work, "run%d" % i)
        os.makedirs(d)
        runs.append(AgentctlRun(AGENTCTL, d, yaml_config(first, agents, channels), ["--cluster", inventory]))
    codes = [r.wait_exit(120) for r in runs]
    for i, (r, rc) in enumerate(zip(runs, codes)):
        check(rc == 0, "run %d succeeded (rc %d)\n%s" % (i, rc, r.output()))
    ports = {}
    for i, r in enumerate(runs):
        plan = plan_of(r.run_dir)
        used = [plan["bus"]["port"]]
        for a in plan["agents"]:
            used += list(range(a["ports"]["first"], a["ports"]["last"] + 1))
        for port in used:
            check(port not in ports, "port %d of run %d is not also run %s's" % (port, i, ports.get(port)))
            ports[port] = i
        for a in ("a", "b"):
            for rank in (0, 1):
                with open(os.path.join(r.run_dir, "logs", a, "rank%d.log" % rank)) as f:
                    log = f.read()
                check("20 bus connections ok" in log and "rendezvous on port" in log,
                      "run %d %s rank %d: 20 fresh bus connections and its own rendezvous" % (i, a, rank))
    check(len({plan_of(r.run_dir)["bus"]["port"] for r in runs}) == 4, "four buses on four ports")


def scenario_workdir(work):
    """Two agents run one stock script that writes and reads a relative file: each sees only its
    own, in its own working directory; the script is found next to agents.yaml."""
    first = free_port_block(64)
    script = os.path.join(work, "snapshot.py")
    with open(script, "w") as f:
        f.write("import os, sys, time\n"
                "me = os.environ['AGENTRT_AGENT']\n"
                "if os.path.exists('snapshot.txt'):\n"
                "    print('found a snapshot of', open('snapshot.txt').read()); sys.exit(3)\n"
                "open('snapshot.txt', 'w').write(me)\n"
                "time.sleep(1.0)\n"
                "seen = open('snapshot.txt').read()\n"
                "print('cwd', os.getcwd(), 'workdir', os.environ['AGENTRT_WORKDIR'], 'seen', seen)\n"
                "sys.exit(0 if seen == me and os.getcwd() == os.environ['AGENTRT_WORKDIR'] else 4)\n")
    agents = ""
    for name in ("one", "two"):
        agents += "  - name: %s\n    command: [/usr/bin/python3, snapshot.py]\n" % name
    elsewhere = os.path.join(work, "elsewhere")
    os.makedirs(elsewhere)
    config = os.path.join(work, "agents.yaml")
    with open(config, "w") as f:
        f.write(yaml_config(first, agents).replace("dir: runs", "dir: %s" % os.path.join(work, "runs")))
    out = subprocess.run([AGENTCTL, "run", config, "--quiet"], cwd=elsewhere, capture_output=True,
                         text=True, timeout=60)
    check(out.returncode == 0, "both agents saw only their own file (rc %d)\n%s%s" %
          (out.returncode, out.stdout, out.stderr))
    run_dir = glob.glob(os.path.join(work, "runs", "t-*"))[0]
    for name in ("one", "two"):
        with open(os.path.join(run_dir, "agents", name, "snapshot.txt")) as f:
            check(f.read() == name, "%s's snapshot.txt is in RUN_DIR/agents/%s" % (name, name))
    check(not os.path.exists(os.path.join(elsewhere, "snapshot.txt")), "nothing landed in agentctl's directory")
    bad = os.path.join(work, "missing.yaml")
    with open(bad, "w") as f:
        f.write("agents:\n  - name: x\n    command: [python3, nothere.py]\n")
    v = agentctl("validate", bad)
    check(v.returncode != 0 and "missing.yaml:3:24" in v.stderr and "nothere.py" in v.stderr,
          "a missing script is an error at file:line:col: %s" % v.stderr.strip())


def scenario_resume(work):
    """kill -9 of agentctl, then agentctl resume: the finished agent stays finished, the other
    resumes from its checkpoint and completes; resume is refused while a controller lives."""
    first = free_port_block(64)
    quick = ["--steps", "5", "--step-ms", "10", "--heartbeat-ms", "200"]
    slow = ["--steps", "60", "--step-ms", "50", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.5"]
    agents = agent_yaml("quick", quick) + agent_yaml("slow", slow)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        wait_for("quick to finish", lambda: (run.agent("quick") or {}).get("state") == "succeeded", 30)
        wait_for("a checkpoint of slow",
                 lambda: ((run.agent("slow") or {}).get("last_checkpoint_step") or 0) >= 5, 30)
        refused = agentctl("resume", run.run_dir)
        check(refused.returncode != 0 and "live controller" in refused.stderr,
              "resume is refused while the controller lives: %s" % refused.stderr.strip())
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        wait_for("the old agents to die", lambda: not run_processes(run.run_dir) or None, 10)
        st = agentctl("status", run.run_dir)
        check(st.returncode == 3, "status: the controller is gone (exit 3)")
        resumed = subprocess.run([AGENTCTL, "resume", run.run_dir, "--quiet"], capture_output=True,
                                 text=True, timeout=90)
        check(resumed.returncode == 0, "the resumed run succeeded\n%s%s" % (resumed.stdout, resumed.stderr))
        with open(os.path.join(run.run_dir, "logs", "slow", "rank0.log")) as f:
            log = f.read()
        steps = [int(x) for x in re.findall(r"resumed from step (\d+)", log)]
        check(steps and steps[-1] >= 5, "slow resumed from its checkpoint (step %s)" % steps)
        check("done at step 60" in log, "slow reached its budget")
        with open(os.path.join(run.run_dir, "logs", "quick", "rank0.log")) as f:
            check(f.read().count("training from step") == 1, "quick was not started again")
        final = run.status()
        check(final["state"] == "succeeded" and run.agent("slow")["restarts"] >= 1,
              "status: succeeded, slow counted one more incarnation")
    finally:
        run.kill()


def scenario_mpi_rank_failure(work):
    """SIGKILL of rank 1 of an mpirun agent: status names rank 1, its own pid and the signal."""
    first = free_port_block(64)
    args = ["--forever", "--step-ms", "50", "--heartbeat-ms", "200"]
    agents = agent_yaml("pair", args, ranks=2, restart="{max_restarts: 0}")
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        a = wait_for("both ranks heartbeating", lambda: heartbeating(run, "pair", 2), 40)
        pids = {r["rank"]: r["pid"] for r in a["ranks"]}
        check(len(set(pids.values())) == 2, "status shows each rank's own pid: %s" % pids)
        os.kill(pids[1], signal.SIGKILL)
        rc = run.wait_exit(60)
        reason = run.agent("pair")["reason"]
        check(rc != 0 and "rank 1 (pid %d) was killed by SIGKILL" % pids[1] in reason,
              "the failure names rank 1, its pid and SIGKILL: %s" % reason)
        ranks = {r["rank"]: r for r in run.agent("pair")["ranks"]}
        check(ranks[1]["exit_code"] == -9, "status.json records rank 1's own end (-9)")
    finally:
        run.kill()


def scenario_hangs(work):
    """Collective hang detection (group.collective_timeout_s 3): one rank skips an all-reduce, one
    sleeps inside the loop, one calls a barrier where its peer all-reduces; each is named (op,
    sequence, rank) within the bound, its hang report written, the agent restarted from its
    checkpoint, and the run finishes. A fourth agent whose last rank is 2 s slower every step
    (its peer waits 2 s in every all-reduce) runs 60 s without a false alarm."""
    first = free_port_block(64)
    common = ["--collective", "--step-ms", "100", "--heartbeat-ms", "250", "--ckpt-interval-s", "0.5"]
    agents = "".join([
        agent_yaml("skip", common + ["--steps", "30", "--hang", "skip", "--hang-at-step", "10"], ranks=2),
        agent_yaml("sleep", common + ["--steps", "30", "--hang", "sleep", "--hang-at-step", "10"], ranks=2),
        agent_yaml("deadlock", common + ["--steps", "30", "--hang", "deadlock", "--hang-at-step", "10"],
                   ranks=2),
        agent_yaml("healthy", ["--collective", "--step-ms", "100", "--slow-rank-ms", "2000",
                               "--heartbeat-ms", "250", "--steps", "28"], ranks=2)])
    extra = "  group: {collective_timeout_s: 3}"
    cfg = yaml_config(first, agents).replace("  restart: {max_restarts: 3", extra + "\n  restart: {max_restarts: 3")
    run = AgentctlRun(AGENTCTL, work, cfg)
    t0 = time.time()
    try:
        detected = {}
        def restarted():
            for name in ("skip", "sleep", "deadlock"):
                a = run.agent(name)
                if name not in detected and a and a["restarts"] >= 1:
                    detected[name] = (time.time() - t0, a["reason"])
            return len(detected) == 3
        wait_for("every hang detected and its agent restarted", restarted, 60, 0.1)
        for name, (at, reason) in sorted(detected.items()):
            print("%s: detected after %.1f s: %s" % (name, at, reason))
        skip_reason, sleep_reason, dead_reason = (detected[n][1] for n in ("skip", "sleep", "deadlock"))
        # skip: rank 1 left out one all-reduce; from there on the two ranks' sequence numbers
        # disagree, and one of them ends up waiting in a collective the other is past.
        check(re.search(r"rank 1 never entered all_reduce #\d+ that rank 0 entered \d+ s ago", skip_reason)
              or re.search(r"rank [01] waited \d+ s in all_reduce #\d+ while rank [01] at #\d+ .*"
                           r"collective sequences disagree", skip_reason),
              "the skipped collective is named: %s" % skip_reason)
        check(re.search(r"rank 1 never entered all_reduce #10 that rank 0 entered \d+ s ago", sleep_reason),
              "the sleeping rank is named: %s" % sleep_reason)
        check("every rank is stuck in collective #10" in dead_reason and "rank 0: all_reduce" in dead_reason
              and "rank 1: barrier" in dead_reason, "the mismatched collectives are named: %s" % dead_reason)
        # Within the bound: two heartbeat intervals plus the timeout after the hang began (step 10
        # at 100 ms a step is ~1 s in; skip hangs at the end, ~3 s in), with room for start-up.
        check(detected["sleep"][0] < 1.5 + 3 + 0.5 + 5 and detected["deadlock"][0] < 1.5 + 3 + 0.5 + 5,
              "detected within the bound: %s" % {n: round(v[0], 1) for n, v in detected.items()})
        for name, (_, reason) in detected.items():
            m = re.search(r"hang report: (\S+\.json)", reason)
            check(m and os.path.exists(m.group(1)), "%s: the hang report exists: %s" % (name, reason))
            report = json.load(open(m.group(1)))
            check(report["agent"] == name and len(report["ranks"]) == 2 and
                  all(r["collective"]["recent"] for r in report["ranks"]),
                  "%s: the report has both ranks' flight recorders" % name)
        rc = run.wait_exit(120)
        out = run.output()
        check(rc == 0, "the run finishes (rc %d)\n%s" % (rc, out))
        for name in ("skip", "sleep", "deadlock"):
            a = run.agent(name)
            check(a["state"] == "succeeded" and a["restarts"] == 1, "%s: restarted once, then done: %s" % (name, a))
        healthy = run.agent("healthy")
        check(healthy["state"] == "succeeded" and healthy["restarts"] == 0 and time.time() - t0 > 55,
              "the slow healthy agent ran %.0f s without a false alarm: %s" % (time.time() - t0, healthy))
    finally:
        run.kill()


def scenario_config_error(work):
    """An agent that exits 78 (EX_CONFIG) is not restarted; the summary says configuration error
    and quotes what it said. A Python agent's uncaught agentrt.ConfigurationError exits 78."""
    first = free_port_block(64)
    args = ["--steps", "5", "--fail-at-step", "1", "--exit-code", "78", "--say",
            "my-agent: unknown option 'lrr' in args"]
    # A Python agent raising agentrt.ConfigurationError (uncaught: exit 78).
    py = json.dumps(["/usr/bin/python3", "-c",
                     "import agentrt\nraise agentrt.ConfigurationError(3, 'args.lr: expected a number')"])
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agent_yaml("picky", args) +
                                                  "  - name: pyconf\n    command: %s\n" % py))
    rc = run.wait_exit(60)
    out = run.output()
    a = run.agent("picky")
    check(rc == 1 and a["state"] == "failed" and a["restarts"] == 0, "failed at once, no restart")
    check("configuration error" in a["reason"] and "unknown option 'lrr'" in out,
          "the summary says configuration error and quotes the agent: %s" % a["reason"])
    p = run.agent("pyconf")
    check(p["state"] == "failed" and p["restarts"] == 0 and p["ranks"][0]["exit_code"] == 78 and
          p["reason"] == "configuration error: agentrt.errors.ConfigurationError: INVALID_ARGUMENT: "
          "args.lr: expected a number", "the Python agent exited 78, not restarted: %s" % p["reason"])


def scenario_crash_loop(work):
    """A Python agent that fails at import every time is a crash loop: failed after three identical
    start-up failures, not after its ten restarts; the summary quotes its traceback."""
    first = free_port_block(64)
    cmd = json.dumps(["/usr/bin/python3", "-c", "import agentrt_no_such_module"])
    agents = ("  - name: importer\n    command: %s\n    restart: {max_restarts: 10, backoff_s: 0.2}\n" % cmd +
              agent_yaml("fine", ["--steps", "20", "--step-ms", "10"]))
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    rc = run.wait_exit(60)
    out = run.output()
    a = run.agent("importer")
    said = "ModuleNotFoundError: No module named 'agentrt_no_such_module'"
    check(rc == 1 and a["state"] == "failed" and a["restarts"] == 2,
          "failed after 2 restarts of 10 (rc %d, %s, %d restarts)" % (rc, a["state"], a["restarts"]))
    check(a["reason"].startswith("crash loop: failed at start-up 3 times in a row the same way") and
          a["reason"].endswith(said), "the reason says crash loop and quotes it: %s" % a["reason"])
    check(a["log_tail"] and a["log_tail"][0].startswith("Traceback") and a["log_tail"][-1] == said,
          "status keeps its last lines: %s" % a["log_tail"])
    check("the last lines of rank0.log:\n    Traceback (most recent call last):" in out and
          "    " + said in out, "the summary quotes the traceback:\n" + out[-1500:])
    check(run.agent("fine")["state"] == "succeeded", "the other agent was not touched")


def scenario_stop_resume(work):
    """Two stops and resumes are no failures: with max_restarts 1, one SIGKILL after them is still
    restarted, and the agent reaches its budget; status counts the resumes apart."""
    first = free_port_block(64)
    args = ["--steps", "400", "--step-ms", "25", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.3"]
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agent_yaml(
        "steady", args, restart="{max_restarts: 1, backoff_s: 0.2, heartbeat_timeout_s: 30, grace_s: 3}")))
    resumed = None
    try:
        for cycle in range(2):
            wait_for("steady heartbeating (cycle %d)" % cycle, lambda: heartbeating(run, "steady", 1), 40)
            stop = agentctl("stop", run.run_dir)
            check(stop.returncode == 0, "agentctl stop: %s" % stop.stderr.strip())
            proc = run.proc if cycle == 0 else resumed
            proc.wait(timeout=40)
            check(proc.returncode == 130 and run.agent("steady")["state"] == "stopped",
                  "stop %d: the run stopped (rc %s)" % (cycle + 1, proc.returncode))
            resumed = subprocess.Popen([AGENTCTL, "resume", run.run_dir, "--quiet"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        a = wait_for("steady heartbeating after 2 resumes", lambda: heartbeating(run, "steady", 1), 40)
        check(a["resumes"] == 2 and a["restarts"] == 2, "2 incarnations, both resumes: %s" % a)
        os.kill(a["ranks"][0]["pid"], signal.SIGKILL)
        resumed.wait(timeout=120)
        a = run.agent("steady")
        check(resumed.returncode == 0 and a["state"] == "succeeded" and a["step"] == 400,
              "the SIGKILL was restarted (max_restarts 1) and steady met its budget (rc %s, %s at step %d)" %
              (resumed.returncode, a["state"], a["step"]))
        check(a["restarts"] == 3 and a["resumes"] == 2, "3 restarts, of which 2 resumes: %s" % a)
    finally:
        run.kill()
        if resumed and resumed.poll() is None:
            resumed.kill()


TLS_PY = """import agentrt
bus = agentrt.Bus.from_environment()
bus.wait_ready(20)
print("python published at offset %d" % bus.publish("probe/py", b"over tls"))
"""


def bus_certificate(work):
    """A CA and a bus certificate it signed, for 127.0.0.1, localhost and this host (openssl)."""
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=work, check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=agentrt test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "bus.key", "-out", "bus.csr", "-subj", "/CN=bus")
    with open(os.path.join(work, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:%s\n" % socket.gethostname())
    openssl("x509", "-req", "-in", "bus.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "bus.pem", "-days", "1", "-extfile", "san.ext")
    os.chmod(os.path.join(work, "bus.key"), 0o600)


def run_over_tls(work, bus_yaml):
    """A C++ and a Python agent publishing over the bus `bus_yaml` configures; both must reach
    it over TLS trusting the CA they are given (AGENTRT_BUS_CA). Returns the finished run."""
    first = free_port_block(64)
    script = os.path.join(work, "tls_agent.py")
    with open(script, "w") as f:
        f.write(TLS_PY)
    agents = (agent_yaml("cpp", ["--steps", "5", "--step-ms", "10", "--bus-connections", "2"]) +
              '  - name: py\n    command: ["/usr/bin/python3", "%s"]\n' % script)
    extra = (bus_yaml + "\n" +
             'channels:\n  - {topic: "probe/*", publishers: ["*"], subscribers: ["*"]}')
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents, extra))
    rc = run.wait_exit(90)
    out = run.output()
    check(rc == 0, "the run over a TLS bus succeeded (rc %d)\n%s" % (rc, out[-2000:]))
    logs = {}
    for name in ("cpp", "py"):
        with open(os.path.join(run.run_dir, "logs", name, "rank0.log")) as f:
            logs[name] = f.read()
    check("2 bus connections ok" in logs["cpp"], "the C++ agent published over TLS:\n" + logs["cpp"][-500:])
    check("python published at offset" in logs["py"], "the Python agent published over TLS:\n" + logs["py"][-500:])
    check("andshake" not in out, "no failed handshake anywhere:\n" + out[-1000:])
    return run


def scenario_tls(work):
    """bus: {tls: true, cert_file, key_file, ca_file}: every agent reaches the TLS-only bus trusting
    the configured CA (AGENTRT_BUS_CA): C++ through BusClient, Python through agentrt.Bus; the
    run succeeds and nothing logs a failed handshake."""
    if not shutil.which("openssl"):
        print("SKIPPED: openssl is needed to make the certificates")
        return 77
    bus_certificate(work)
    run = run_over_tls(work, "bus: {tls: true, cert_file: bus.pem, key_file: bus.key, ca_file: ca.pem}")
    with open(os.path.join(run.run_dir, "plan.json")) as f:
        bus = json.load(f)["bus"]
    check(bus["tls"] == "on" and not bus["run_ca"] and bus["ca_file"] == os.path.join(work, "ca.pem"),
          "the plan keeps the user's own certificate: %s" % bus)


def scenario_tls_run_ca(work):
    """bus: {tls: on, mtls: true} without a certificate: the run makes its own CA (secrets/, 0600),
    signs the broker's certificate and one per agent naming it, and every agent trusts exactly
    that CA and shows its own certificate. The plan.json of a loopback run with the default
    (auto) says off."""
    run = run_over_tls(work, "bus: {tls: on, mtls: true}")
    with open(os.path.join(run.run_dir, "plan.json")) as f:
        bus = json.load(f)["bus"]
    secrets = os.path.join(run.run_dir, "secrets")
    check(bus["tls"] == "on" and bus["run_ca"] and bus["ca_file"] == os.path.join(secrets, "ca.pem"),
          "the plan points at the run's CA: %s" % bus)
    for name in ("ca.pem", "ca.key", "bus.pem", "bus.key", "cpp.client.pem", "cpp.client.key",
                 "py.client.key", "agentrt:league.client.key"):
        mode = os.stat(os.path.join(secrets, name)).st_mode & 0o777
        check(mode == 0o600, "secrets/%s is 0600 (%o)" % (name, mode))
    with open(os.path.join(secrets, "py.token")) as f:
        token = json.load(f)
    check(token["cert_file"] == os.path.join(secrets, "py.client.pem") and
          token["key_file"] == os.path.join(secrets, "py.client.key"),
          "the agent's token file names its certificate: %s" % sorted(token))
    with open(os.path.join(secrets, "ca.key")) as f:
        check("PRIVATE KEY" in f.read(), "secrets/ca.key holds the CA's key")
    # auto, the default, on loopback: plaintext, and no CA made.
    os.makedirs(os.path.join(work, "auto"))
    plain = AgentctlRun(AGENTCTL, os.path.join(work, "auto"),
                        yaml_config(free_port_block(64), agent_yaml("a", ["--steps", "2"])))
    rc = plain.wait_exit(60)
    check(rc == 0, "the loopback run succeeded (rc %d)\n%s" % (rc, plain.output()[-1000:]))
    with open(os.path.join(plain.run_dir, "plan.json")) as f:
        bus = json.load(f)["bus"]
    check(bus["tls"] == "off" and not bus["run_ca"], "auto on loopback is off: %s" % bus)
    check(not os.path.exists(os.path.join(plain.run_dir, "secrets", "ca.key")), "no CA for a plaintext bus")


def scenario_fresh_after_corrupt(work):
    """Every checkpoint of an agent corrupt when it restarts: it starts fresh and status and the
    summary say so, naming the skipped steps."""
    first = free_port_block(64)
    args = ["--steps", "400", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.3",
            "--keep-last", "2"]
    agents = agent_yaml("victim", args, restart="{max_restarts: 2, backoff_s: 3}")
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        wait_for("two checkpoints", lambda: len(committed_dirs(run.run_dir, "victim")) >= 2, 40)
        # status.json shows what the checkpoints' files already do within a moment.
        pid = wait_for("victim heartbeating", lambda: heartbeating(run, "victim", 1), 20)["ranks"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("the restart's backoff", lambda: (run.agent("victim") or {}).get("state") == "restarting", 20)
        time.sleep(0.5)  # let the dying rank's writer finish; the restart is 3 s away
        steps = []
        for d in committed_dirs(run.run_dir, "victim"):
            steps.append(int(os.path.basename(d).split("-")[1]))
            with open(os.path.join(d, "rank-0.shard"), "r+b") as f:
                f.write(b"\xff" * 8)  # damage every committed shard
        def fresh_again():
            a = run.agent("victim") or {}
            return a.get("restarts", 0) >= 1 and a.get("restored_step") == -1 and a.get("skipped_checkpoints")
        wait_for("the fresh start of the next incarnation", fresh_again, 30)
        a = run.agent("victim")
        check(sorted(a["skipped_checkpoints"]) == sorted(steps),
              "status lists the skipped steps %s (%s)" % (steps, a["skipped_checkpoints"]))
        rc = run.wait_exit(60)
        out = run.output()
        check(rc == 0 and "started fresh: every checkpoint was corrupt" in out,
              "the summary says it started fresh (rc %d)" % rc)
    finally:
        run.kill()


def scenario_last_checkpoint(work):
    """agentctl stop: the checkpoint written while stopping is the one status reports."""
    first = free_port_block(64)
    args = ["--forever", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "30"]
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agent_yaml("saver", args)))
    try:
        wait_for("saver heartbeating", lambda: heartbeating(run, "saver", 1), 30)
        stop = agentctl("stop", run.run_dir, "--timeout-s", "30", timeout=60)
        check(stop.returncode == 0, "agentctl stop: %s%s" % (stop.stdout, stop.stderr))
        run.wait_exit(30)
        newest = max(int(os.path.basename(d).split("-")[1]) for d in committed_dirs(run.run_dir, "saver"))
        check(run.agent("saver")["last_checkpoint_step"] == newest,
              "last_checkpoint_step %s is the newest committed, %d (written while stopping)" %
              (run.agent("saver")["last_checkpoint_step"], newest))
    finally:
        run.kill()


# --------------------------------------------------------------------------------------------
# The fault suite (label fault): bounded in time, real processes, real signals.

def scenario_kill_loop(work):
    """SIGKILL of a random rank of a random agent, a dozen times: every restart resumes from a
    checkpoint (never from 0 while one exists), the step budget is met exactly, and no process of
    the run outlives it."""
    import random
    rng = random.Random(12)
    first = free_port_block(64)
    common = ["--steps", "250", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.3",
              "--keep-last", "3"]
    # Kills come faster than checkpoints: the backoff would double up to a minute (backoff_max_s).
    restart = "{max_restarts: 20, backoff_s: 0.3, backoff_max_s: 1, heartbeat_timeout_s: 30, grace_s: 3}"
    agents = agent_yaml("solo", common, restart=restart) + agent_yaml("pair", common, ranks=2, restart=restart)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    sizes = {"solo": 1, "pair": 2}
    try:
        kills = 0
        while kills < 12:
            # Agents near their budget (or past it) are not worth a kill.
            live = [n for n in sorted(sizes) if (run.agent(n) or {}).get("step", 0) < 230
                    and (run.agent(n) or {}).get("state") != "succeeded"]
            if not live:
                break
            name = rng.choice(live)
            a = wait_for("%s heartbeating" % name, lambda: heartbeating(run, name, sizes[name]), 60)
            if a["step"] >= 230:
                continue
            ckpt = newest_committed(run.run_dir, name)
            rank = rng.randrange(sizes[name])
            pid = [r["pid"] for r in a["ranks"] if r["rank"] == rank][0]
            restarts = a["restarts"]
            os.kill(pid, signal.SIGKILL)
            kills += 1
            b = wait_for("%s back after kill %d" % (name, kills),
                         lambda: (lambda x: x if x and x["restarts"] > restarts else None)(
                             heartbeating(run, name, sizes[name])), 60)
            # mpirun relays a rank's stdout on its own schedule: read the log once the
            # new incarnation's first line and what it restored are in it.
            log = os.path.join(run.run_dir, "logs", name, "rank0.log")
            resumed = wait_for("%s rank 0 logged incarnation %d" % (name, b["restarts"]),
                               lambda: incarnation_restore(log, b["restarts"]), 30)[0]
            resumed = [resumed] if resumed >= 0 else []
            if ckpt > 0:
                check(resumed and resumed[-1] >= ckpt,
                      "kill %d: %s rank %d resumed from step %s, not below its checkpoint %d" %
                      (kills, name, rank, resumed[-1:] or "-", ckpt))
            check(b["step"] >= max(ckpt, 0), "kill %d: %s's step did not go back (%d)" % (kills, name, b["step"]))
        check(kills >= 8, "%d kills landed" % kills)
        rc = run.wait_exit(120)
        check(rc == 0, "the run still succeeded (rc %d)\n%s" % (rc, run.output()[-2000:]))
        for name in sizes:
            a = run.agent(name)
            check(a["state"] == "succeeded" and a["step"] == 250, "%s met its budget exactly (%d)" % (name, a["step"]))
        wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 10)
    finally:
        run.kill()


def scenario_bye_linger(work):
    """A rank that says bye (closes its runtime) and then never exits is torn down once
    heartbeat_timeout_s has passed since, named in the reason; the run ends instead of waiting
    for it forever, and no process of it is left."""
    first = free_port_block(64)
    restart = "{max_restarts: 1, backoff_s: 0.2, heartbeat_timeout_s: 2, grace_s: 1}"
    agents = agent_yaml("stuck", ["--steps", "10", "--step-ms", "20", "--heartbeat-ms", "200",
                                  "--linger-s", "600"], ranks=2, restart=restart)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        rc = run.wait_exit(60)
        check(rc != 0, "the run ends failed, not succeeded (rc %d)\n%s" % (rc, run.output()[-2000:]))
        a = run.agent("stuck")
        check(a["state"] == "failed" and a["restarts"] == 1, "stuck failed after its one restart: %s" % a)
        check("every rank is done" in a["reason"] and "not exited" in a["reason"],
              "the reason says the ranks said bye and did not exit: %s" % a["reason"])
        wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 10)
    finally:
        run.kill()


STALLING_PY = """import time
import agentrt
with agentrt.Runtime(heartbeat_ms=200) as rt:
    step = 0
    while step < 30 and not rt.should_stop:
        step += 1
        rt.report(step, loss=1.0 / step)
        if step == 10 and rt.restart_count == 0:
            time.sleep(3600)  # a wedged torch.distributed call: no report(), heartbeats go on
        time.sleep(0.02)
print("done at step", step)
"""


def scenario_python_stall(work):
    """A Python agent (agentrt, as with torch.distributed used directly) whose training loop stops
    calling report() while its heartbeats go on: restart.progress_timeout_s catches it, names it,
    restarts the agent, and the run finishes."""
    first = free_port_block(64)
    script = os.path.join(work, "stall.py")
    with open(script, "w") as f:
        f.write(STALLING_PY)
    agents = ('  - name: stall\n    command: ["/usr/bin/python3", "%s"]\n'
              '    restart: {max_restarts: 2, backoff_s: 0.2, heartbeat_timeout_s: 30, grace_s: 1,'
              ' progress_timeout_s: 2}\n' % script)
    run = AgentctlRun(AGENTCTL, work, yaml_config(first, agents))
    try:
        a = wait_for("stall at step 10", lambda: (lambda x: x if x and x["step"] == 10 else None)(
            run.agent("stall")), 60, 0.05)
        t0 = time.time()
        b = wait_for("the stalled loop caught and restarted",
                     lambda: (lambda x: x if x and x["restarts"] >= 1 else None)(run.agent("stall")), 30, 0.05)
        caught = time.time() - t0
        check("no new step reported for" in b["reason"] and "progress_timeout_s 2" in b["reason"],
              "the reason names the stalled loop: %s" % b["reason"])
        check(caught < 2 + 3 * 0.2 + 1 + 0.2 + 3, "caught %.1f s after its last step (progress_timeout_s 2)" % caught)
        rc = run.wait_exit(60)
        check(rc == 0, "the run finishes (rc %d)\n%s" % (rc, run.output()[-2000:]))
        done = run.agent("stall")
        check(done["state"] == "succeeded" and done["restarts"] == 1 and done["step"] == 30,
              "restarted once, then ran to its end: %s" % done)
        check(a["ranks"][0]["heard_unix_s"] is not None, "its heartbeats came from the Python runtime")
        wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 10)
    finally:
        run.kill()


def scenario_sigstop_demo(work):
    """A short pursuit demo (agent-worker, the demo's shape); one SIGSTOP of a predator rank:
    caught by its heartbeat, the agent restarts from its checkpoint, the run still succeeds and no
    process of it survives. The budget is ten times the demo's, so that the stop lands in training
    (the demo's agents finish in about a second)."""
    budget = 600000
    first = free_port_block(128)
    worker = os.path.join(BIN, "agent-worker")
    config = """run: {name: demo, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 16}
defaults:
  restart: {max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 4, grace_s: 3}
  checkpoint: {interval_s: 1, keep_last: 3}
agents:
  - name: predator
    replicas: 2
    ranks: 2
    command: [%s]
    args: {env: pursuit, role: predator, steps: %d, num_envs: 8, rollout_steps: 64, eval_episodes: 20}
  - name: prey
    command: [%s]
    args: {env: pursuit, role: prey, steps: %d, num_envs: 8, rollout_steps: 64}
channels:
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: ["*"]}
  - {topic: results, publishers: ["*"], subscribers: ["*"]}
""" % (first, first + 127, worker, budget, worker, budget)
    run = AgentctlRun(AGENTCTL, work, config)
    try:
        a = wait_for("predator-1 checkpointed",
                     lambda: (lambda x: x if x and x.get("last_checkpoint_step") else None)(
                         heartbeating(run, "predator-1", 2)), 120)
        check(a["step"] < budget // 2, "predator-1 is still training when stopped (step %d)" % a["step"])
        victim = [r["pid"] for r in a["ranks"] if r["rank"] == 1][0]
        os.kill(victim, signal.SIGSTOP)
        b = wait_for("the heartbeat to catch the stopped rank and restart predator-1",
                     lambda: (lambda x: x if x and x["restarts"] >= 1 else None)(run.agent("predator-1")), 60)
        check("heartbeat" in b["reason"], "the reason names the heartbeat: %s" % b["reason"])
        rc = run.wait_exit(240)
        check(rc == 0, "the demo still succeeded (rc %d)\n%s" % (rc, run.output()[-2000:]))
        with open(os.path.join(run.run_dir, "logs", "predator-1", "rank0.log")) as f:
            log = f.read()
        resumed = [int(x) for x in re.findall(r"resumed at env step (\d+)", log)]
        check(resumed and resumed[0] > 0, "predator-1 resumed from its checkpoint (env step %s)" % resumed)
        wait_for("no process of the run left", lambda: not run_processes(run.run_dir) or None, 10)
    finally:
        run.kill()
        try:
            os.kill(victim, signal.SIGKILL)
        except (OSError, UnboundLocalError):
            pass


def learner_config(run, first, ranks, steps, others):
    """A run of `learner`, a cartpole PPO agent (agent-worker) of `ranks` ranks and a budget of
    `steps` env steps, checkpointing every second, beside the agents in `others` (yaml)."""
    return """run: {name: %s, dir: runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 16}
defaults:
  restart: {max_restarts: 1, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 3}
  checkpoint: {interval_s: 1, keep_last: 2}
agents:
  - name: learner
    ranks: %d
    command: [%s]
    args: {env: cartpole, steps: %d, num_envs: 4, rollout_steps: 64}
%s""" % (run, first, first + 63, ranks, os.path.join(BIN, "agent-worker"), steps, others)


def scenario_from_run(work):
    """agentctl run --from: a PPO agent (agent-worker) trained by 2 ranks goes on in a new run with
    3 ranks from its checkpoint, re-sharded; an agent the old run lacks starts fresh and one the new
    run lacks is named; a checkpoint that cannot be re-sharded stops the new run before it starts."""
    def config(first, ranks, steps, others):
        return learner_config("from", first, ranks, steps, others)

    quick = ["--steps", "3", "--step-ms", "10", "--heartbeat-ms", "200"]
    saving = ["--steps", "20", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.1"]
    os.makedirs(os.path.join(work, "a"))
    old = AgentctlRun(AGENTCTL, os.path.join(work, "a"),
                      config(free_port_block(64), 2, 4096, agent_yaml("gone", saving)))
    try:
        rc = old.wait_exit(120)
        check(rc == 0, "the first run succeeded (rc %d)\n%s" % (rc, old.output()[-2000:]))
    finally:
        old.kill()
    saved = newest_committed(old.run_dir, "learner")
    check(saved is not None and saved >= 4096, "the first run's learner checkpointed step %s" % saved)

    os.makedirs(os.path.join(work, "b"))
    new = AgentctlRun(AGENTCTL, os.path.join(work, "b"),
                      config(free_port_block(64), 3, 6144, agent_yaml("newbie", quick)),
                      extra_args=["--from", old.run_dir])
    try:
        rc = new.wait_exit(120)
        out = new.output()
        check(rc == 0, "the second run succeeded (rc %d)\n%s" % (rc, out[-2000:]))
    finally:
        new.kill()
    check("agent learner starts from step %d of run" % saved in out
          and "(saved by 2 ranks, re-sharded onto 3)" in out,
          "agentctl says where learner starts from:\n%s" % out[:1500])
    check("has no agent newbie; it starts fresh" in out, "the new agent is named")
    check("agent gone of run" in out and "is not in this run" in out, "the dropped agent is named")
    with open(os.path.join(new.run_dir, "logs", "learner", "rank0.log")) as f:
        log = f.read()
    check("re-sharded the checkpoint of 2 ranks onto 3" in log, "rank 0 re-sharded:\n%s" % log[-1500:])
    resumed = [int(x) for x in re.findall(r"resumed at env step (\d+)", log)]
    check(resumed == [saved], "learner resumed at env step %d, not from scratch (%s)" % (saved, resumed))
    with open(os.path.join(new.run_dir, "logs", "learner", "rank2.log")) as f:
        check("resumed at env step %d" % saved in f.read(), "the new rank 2 resumed with the others")
    check(newest_committed(new.run_dir, "learner") >= 6144,
          "learner trained on to its new budget")

    # Entries of single ranks (the test agent's) cannot be re-sharded: refused before anything
    # starts, naming the agent, both rank counts and the checkpoint.
    check(newest_committed(old.run_dir, "gone") >= 0, "the test agent checkpointed")
    os.makedirs(os.path.join(work, "c"))
    cfg = os.path.join(work, "c", "agents.yaml")
    with open(cfg, "w") as f:
        f.write(yaml_config(free_port_block(64), agent_yaml("gone", quick, ranks=2)))
    refused = subprocess.run([AGENTCTL, "run", cfg, "--from", old.run_dir, "--quiet", "--no-dashboard"],
                             cwd=os.path.join(work, "c"), capture_output=True, text=True, timeout=60)
    check(refused.returncode != 0 and "agent gone (1 ranks there, 2 here)" in refused.stderr
          and "saved by 1 ranks but this run has 2" in refused.stderr,
          "a checkpoint of one rank's own entries is refused at 2 ranks:\n%s%s"
          % (refused.stdout, refused.stderr))
    check(not glob.glob(os.path.join(work, "c", "runs", "*", "logs", "gone", "rank*.log")),
          "nothing of the refused run started")


def scenario_replan(work):
    """agentctl resume --replan: after the controller died, agents.yaml gives the PPO agent 3 ranks
    instead of 2, adds an agent and drops one; the run goes on in the same directory, the agent
    restores its checkpoint re-sharded. A change that cannot be re-sharded is refused first."""
    first = free_port_block(64)

    def config(ranks, steps, others):
        return learner_config("replan", first, ranks, steps, others)

    slow = ["--steps", "100000", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.2"]
    run = AgentctlRun(AGENTCTL, work, config(2, 50000000, agent_yaml("other", slow)))
    try:
        wait_for("checkpoints of both agents", lambda: all(
            ((run.agent(a) or {}).get("last_checkpoint_step") or 0) > 0 for a in ("learner", "other")), 60)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        wait_for("the old agents to die", lambda: not run_processes(run.run_dir) or None, 10)
    finally:
        run.kill()
    saved = newest_committed(run.run_dir, "learner")
    # The killed MPI agent's Open MPI shared memory is in a folder of its own, named for the
    # controller that is gone, not loose in /dev/shm; the next controller removes it.
    shm_left = glob.glob("/dev/shm/agentrt-mpi.%d.learner.*" % run.proc.pid)
    if os.access("/dev/shm", os.W_OK):
        check(len(shm_left) == 1, "the killed incarnation's shared memory folder: %s" % shm_left)

    # The test agent's checkpoint holds one rank's own entries: 2 ranks for it are refused.
    bad = os.path.join(work, "bad.yaml")
    with open(bad, "w") as f:
        f.write(config(2, 1, agent_yaml("other", slow, ranks=2)))
    refused = agentctl("resume", run.run_dir, "--replan", bad, "--quiet", "--no-dashboard", timeout=60)
    check(refused.returncode != 0 and "--replan: agent other (1 ranks planned before, 2 now)" in refused.stderr
          and "cannot be re-sharded" in refused.stderr,
          "a change the checkpoint cannot follow is refused:\n%s%s" % (refused.stdout, refused.stderr))
    check(not run_processes(run.run_dir), "and nothing started")

    new = os.path.join(work, "new.yaml")
    with open(new, "w") as f:
        f.write(config(3, 1, agent_yaml("newbie", ["--steps", "3", "--step-ms", "10", "--heartbeat-ms", "200"])))
    resumed = subprocess.run([AGENTCTL, "resume", run.run_dir, "--replan", new, "--quiet", "--no-dashboard"],
                             capture_output=True, text=True, timeout=120)
    out = resumed.stdout + resumed.stderr
    check(resumed.returncode == 0, "the replanned run succeeded\n%s" % out[-2000:])
    check("--replan: agent learner: 2 rank(s), 0 GPU(s) before; 3 rank(s), 0 GPU(s) now; its "
          "checkpoint of step %d (saved by 2 ranks) is re-sharded" % saved in out, "the change is said:\n%s" % out)
    check("agent newbie is new; it starts fresh" in out, "the new agent is named")
    check("agent other is no longer in the config" in out, "the dropped agent is named")
    with open(os.path.join(run.run_dir, "logs", "learner", "rank2.log")) as f:
        log = f.read()
    check("resumed at env step %d" % saved in log, "the new rank 2 resumed at the saved step:\n%s" % log[-1500:])
    with open(os.path.join(run.run_dir, "logs", "learner", "rank0.log")) as f:
        check("re-sharded the checkpoint of 2 ranks onto 3" in f.read(), "rank 0 says it re-sharded")
    plan = plan_of(run.run_dir)
    check([a["name"] for a in plan["agents"]] == ["learner", "newbie"] and plan["agents"][0]["ranks"] == 3,
          "plan.json is the new plan")
    final = json.load(open(os.path.join(run.run_dir, "status.json")))
    check(final["state"] == "succeeded", "status: succeeded")
    check(not [d for d in shm_left if os.path.exists(d)], "the resumed run removed %s" % shm_left)


def main():
    for path in (AGENTCTL, AGENT):
        if not os.access(path, os.X_OK):
            print("missing %s (build agentctl and agentrt-test-agent)" % path)
            return 1
    return scenarios_main(globals(), "agentctl")


if __name__ == "__main__":
    sys.exit(main())
