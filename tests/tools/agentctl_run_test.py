#!/usr/bin/python3
"""Integration tests of `agentctl run` on one machine (issue 3), with the real
agentctl binary and the real test agent (agentrt-test-agent).

    agentctl_run_test.py SCENARIO     (env_contract | restart | failing | kill_controller | busy_port)

Every wait is bounded; ports come from a block probed free by the test; each
scenario runs in its own temporary directory, which is removed on success.
"""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import AgentctlRun, Failure, check, free_port_block, run_scenarios, wait_for  # noqa: E402

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")



def run_processes(run_dir):
    """pids of every process whose environment names this run directory."""
    needle = ("AGENTRT_RUN_DIR=" + run_dir).encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read() + b"\0"
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            pids.append(int(entry))
    return pids


def heartbeating(run, name, ranks):
    """All ranks of `name` run and have told their own pid (hello) and a step."""
    a = run.agent(name)
    if not a or a["state"] != "running" or a["step"] < 1 or len(a["ranks"]) != ranks:
        return None
    pids = [r["pid"] for r in a["ranks"]]
    return a if len(set(pids)) == ranks and all(p > 0 for p in pids) else None


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
                "AGENTRT_CKPT_DIR", "AGENTRT_BUS", "AGENTRT_TOKEN_FILE", "AGENTRT_TELEMETRY", "AGENTRT_RESTART_COUNT",
                "AGENTRT_WORKDIR"]
    for name, ranks in sorted(dumps.items()):
        check(sorted(ranks) == list(range(sizes[name])), "%s has ranks 0..%d" % (name, sizes[name] - 1))
        for r, d in ranks.items():
            env = d["env"]
            missing = [v for v in contract if v not in env]
            check(not missing, "%s rank %d has every DESIGN §4 variable (missing %s)" % (name, r, missing))
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


def main():
    scenarios = {k[len("scenario_"):]: v for k, v in globals().items() if k.startswith("scenario_")}
    for path in (AGENTCTL, AGENT):
        if not os.access(path, os.X_OK):
            print("missing %s (build agentctl and agentrt-test-agent)" % path)
            return 1
    return run_scenarios(scenarios, sys.argv[1], "agentctl")


if __name__ == "__main__":
    sys.exit(main())
