"""Helpers shared by agentrt's Python tests (Debian's /usr/bin/python3, standard library only).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from agentrt_testing import Failure, check, wait_for, free_port_block, test_plan

Every wait is bounded; a failed check raises Failure, which run_scenarios() reports.
"""
import glob
import hashlib
import hmac
import json
import os
import random
import re
import signal
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback


class Failure(Exception):
    """A check that did not hold: the test fails with this message."""


def check(cond, what):
    """Raise Failure(what) unless cond; print 'ok: what' when it holds."""
    if not cond:
        raise Failure(what)
    print("ok:", what, flush=True)


def wait_for(what, pred, timeout_s=30.0, period_s=0.05):
    """The first truthy value of pred(), polled every period_s; Failure after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(period_s)
    raise Failure("timed out after %.0f s waiting for %s" % (timeout_s, what))


def soak_agent_command(agent, steps, step_ms, keep_last):
    """The soaks' agentrt-test-agent (at `agent`): `steps` steps of `step_ms`, heartbeats every
    200 ms, a checkpoint every 2 s, `keep_last` kept."""
    return [agent, "--steps", str(steps), "--step-ms", str(step_ms), "--heartbeat-ms", "200",
            "--ckpt-interval-s", "2", "--keep-last", str(keep_last)]


def free_port_block(n):
    """First port of n consecutive ports that can all be bound now, below the kernel's ephemeral
    range: an outgoing connection of a test running beside this one (a client, an MPI rank)
    takes its local port from that range and could land in the block meanwhile."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_first = 32768
    rng = random.Random()  # seeded from the OS: tests side by side pick apart
    for _ in range(200):
        first = rng.randrange(10000, max(10001, ephemeral_first - n))
        if first + n > 65000:
            continue
        ok = True
        for p in range(first, first + n):
            t = socket.socket()
            try:
                t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                t.bind(("0.0.0.0", p))
            except OSError:
                ok = False
            finally:
                t.close()
            if not ok:
                break
        if ok:
            return first
    raise Failure("no free block of %d ports" % n)


def read_status(run_dir):
    """The run's status.json, None while there is none (or it is half written)."""
    try:
        with open(os.path.join(run_dir, "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def status_agent(run_dir, name):
    """Agent `name`'s row of the run's status.json, None while there is none."""
    s = read_status(run_dir)
    return next((a for a in s["agents"] if a["name"] == name), None) if s else None


class AgentctlRun:
    """One `agentctl run` of yaml_text in workdir, in the background; its output goes to
    workdir/agentctl.out and its run directory is workdir/runs/<name>-<time>."""

    def __init__(self, agentctl, workdir, yaml_text, extra_args=()):
        self.workdir = workdir
        self.config = os.path.join(workdir, "agents.yaml")
        with open(self.config, "w") as f:
            f.write(yaml_text)
        self.out_path = os.path.join(workdir, "agentctl.out")
        self.out = open(self.out_path, "w")
        self.proc = subprocess.Popen([agentctl, "run", self.config, "--status-interval-s", "5"] + list(extra_args),
                                     cwd=workdir, stdout=self.out, stderr=subprocess.STDOUT)
        self.run_dir = wait_for("the run directory", self._find_run_dir, 30)

    def _find_run_dir(self):
        base = os.path.join(self.workdir, "runs")
        if not os.path.isdir(base):
            return None
        for name in os.listdir(base):
            d = os.path.join(base, name)
            if os.path.exists(os.path.join(d, "status.json")):
                return d
        return None

    def status(self):
        return read_status(self.run_dir)

    def agent(self, name):
        return status_agent(self.run_dir, name)

    def wait_exit(self, timeout_s=60):
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise Failure("agentctl run did not exit within %d s" % timeout_s)

    def output(self):
        self.out.flush()
        with open(self.out_path) as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def run_example(agentctl, source, work, config, timeout_s=240, sets=()):
    """`agentctl run configs/<config>` with its run dir under work/<config stem>, to its end:
    (returncode, run dir or None, output)."""
    runs = os.path.join(work, config.split(".")[0])
    args = [agentctl, "run", os.path.join(source, "configs", config), "--no-dashboard", "--quiet",
            "--set", "run.dir=" + runs]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=work)
    dirs = [os.path.join(runs, d) for d in os.listdir(runs)] if os.path.isdir(runs) else []
    return p.returncode, (dirs[0] if len(dirs) == 1 else None), p.stdout + p.stderr


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


def heartbeating(run, name, ranks, not_pids=(), since=0.0):
    """All ranks of `name` run and have told their own pid (hello) and a step. Until a rank has
    sent telemetry (heard_unix_s), its pid may be its launcher's (mpirun or srun stands for every
    rank). With `not_pids` and `since` (Unix time): every rank is a process not in `not_pids`,
    heard from after `since` (a new incarnation after a fault)."""
    a = run.agent(name)
    if not a or a["state"] != "running" or a["step"] < 1 or len(a["ranks"]) != ranks:
        return None
    if any((r.get("heard_unix_s") or 0) <= since for r in a["ranks"]):
        return None
    pids = [r["pid"] for r in a["ranks"]]
    if any(p in not_pids for p in pids):
        return None
    return a if len(set(pids)) == ranks and all(p > 0 for p in pids) else None


def runs_program(pid, *names):
    """Process `pid` is one of the programs `names` itself (its command line names one), not the
    launcher (srun, mpirun) that stands for a rank until it says hello; False once it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid) as f:
            cmdline = f.read()
    except OSError:
        return False
    return any(n in cmdline for n in names)


def sigkill_league_member(run, rng, members, kind, timeout=90):
    """SIGKILL of a running league member's rank (one of `members`, chosen by `rng`), mid-match
    or mid-report; `run` has agent(name). Waits for its next incarnation (or its end: the fault
    struck a member at its end) and returns the fault ({kind, agent, lost: None, recovery_s}),
    or None when no member runs. Its steps lost are not counted: a member's log is agent-worker's,
    and what matters of it is its results (soak_agents.check_league holds them to once each)."""
    running = [a for a in (heartbeating(run, n, 1) for n in sorted(members)) if a]
    if not running:
        return None
    a = rng.choice(running)
    pid = a["ranks"][0]["pid"]
    if not runs_program(pid, "agent-worker"):
        return None
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None

    def back():
        b = heartbeating(run, a["name"], 1, not_pids={pid})
        if b and b["restarts"] > a["restarts"]:
            return b
        b = run.agent(a["name"])
        return b if b and b["state"] == "succeeded" else None
    wait_for("%s back after SIGKILL" % a["name"], back, timeout, 0.05)
    return {"kind": kind, "agent": a["name"], "lost": None, "recovery_s": time.monotonic() - t0}


def kill_broker(run, agents, kind="kill -9 broker", timeout=30):
    """kill -9 of the run's broker process (RUN_DIR/bus.report.json names it). The controller
    starts it again on its port with its durable log; every agent of `agents` ({name: ranks}),
    all heartbeating when it struck, lives through it: it steps on past where it was, in the same
    incarnation (no restart). Returns the fault ({kind, agent: None, lost: 0, recovery_s: until
    status.json names the new broker}), or None when not every agent ran. `run` has run_dir."""
    before = {}
    for name, ranks in agents.items():
        a = heartbeating(run, name, ranks)
        if not a:
            return None
        before[name] = a
    try:
        with open(os.path.join(run.run_dir, "bus.report.json")) as f:
            pid = json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return None
    if not runs_program(pid, "agentrt-bus"):
        return None
    restarts = ((read_status(run.run_dir) or {}).get("bus") or {}).get("broker_restarts", 0)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def serving():
        bus = (read_status(run.run_dir) or {}).get("bus") or {}
        return bus.get("broker_pid", 0) not in (0, pid) and bus.get("broker_restarts", 0) > restarts
    wait_for("the broker to serve again after kill -9 of pid %d" % pid, serving, timeout, 0.02)
    recovery = time.monotonic() - t0
    # Where each agent is now that the new broker serves; it must step on from there (an agent
    # whose bus calls hang stops stepping: the talker publishes before each step).
    served = {name: run.agent(name) or before[name] for name in before}
    for name, a in before.items():
        def on():
            b = run.agent(name)
            if b is None or b["restarts"] != a["restarts"]:
                raise Failure("%s restarted across kill -9 of the broker (restarts %d, then %s)"
                              % (name, a["restarts"], b and b["restarts"]))
            return b["step"] > served[name]["step"] + 5 or b["state"] == "succeeded"
        wait_for("%s to step on after kill -9 of the broker" % name, on, timeout, 0.05)
    return {"kind": kind, "agent": None, "lost": 0, "recovery_s": recovery}


def committed_dirs(run_dir, agent):
    """The committed checkpoint directories (manifest written) of `agent`."""
    d = os.path.join(run_dir, "checkpoints", agent)
    return sorted(os.path.dirname(m) for m in glob.glob(os.path.join(d, "step-*", "manifest.json")))


def _restore_after(log, hello, offset=0):
    """(step,) the test agent whose hello line of `log` (from byte `offset`) matches `hello` logged
    it resumed from on a line after it, (-1,) when it restored nothing, None while that line is not
    whole in `log` yet. Lines between are another process's: a cut-off incarnation on a partitioned
    node writes to the same file (the run directory is shared) until it is fenced."""
    try:
        with open(log, errors="replace") as f:
            f.seek(offset)
            text = f.read()
    except FileNotFoundError:
        return None
    # Skipping other lines, but not another rank's hello.
    m = re.search(hello + r"\n(?:(?!agent \S+ rank )[^\n]*\n)*?"
                  r"(resumed from step (\d+)|no (?:usable )?checkpoint[^\n]*)\n", text)
    if not m:
        return None
    return (int(m.group(2)) if m.group(2) else -1,)


def incarnation_restore(log, restart):
    """What incarnation `restart` of a test agent resumed from (_restore_after)."""
    return _restore_after(log, r" restart %d" % restart)


def restore_since(log, offset, pid):
    """What the test agent's rank with pid `pid` resumed from, said after byte `offset` of `log`
    (_restore_after): restart counts start again in a requeued SLURM allocation, pids do not
    repeat within a run."""
    return _restore_after(log, r" pid %d restart \d+" % pid, offset)


def print_fault_table(faults):
    """A soak's table: faults ({kind, lost, recovery_s}) by kind, with the steps lost and the
    recovery time (median, max); "-" for steps lost of a kind that has none to count (lost None).
    A fault that is not survived fails the soak where it strikes, so every row printed was
    survived."""
    print("\n%-36s %8s %8s %14s %14s" % ("fault", "injected", "survived", "steps lost", "recovery s"))
    print("%-36s %8s %8s %14s %14s" % ("", "", "", "median / max", "median / max"))
    for kind in sorted({f["kind"] for f in faults}):
        mine = [f for f in faults if f["kind"] == kind]
        lost = [f["lost"] for f in mine if f["lost"] is not None]
        rec = [f["recovery_s"] for f in mine]
        steps = "%6d / %5d" % (statistics.median(lost), max(lost)) if lost else "%14s" % "-"
        print("%-36s %8d %8d %s %6.2f / %5.2f" % (kind, len(mine), len(mine), steps,
                                                 statistics.median(rec), max(rec)))


def set_clock_offset(path, seconds):
    """Every process that reads its wall clock through the test cluster's clock shim
    (tests/slurm/clock_offset_shim.cc) with the offset file `path` reads it `seconds` from the
    host's from now on: one aligned 8-byte store (nanoseconds, native byte order) into the file,
    mapped, as the shim maps it."""
    import ctypes
    import mmap
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 8)
        word = ctypes.c_int64.from_buffer(m)
        word.value = int(round(seconds * 1e9))
        del word  # the mapping closes only once nothing points into it
        m.close()


def newest_committed(run_dir, agent):
    steps = [int(os.path.basename(d).split("-")[1]) for d in committed_dirs(run_dir, agent)]
    return max(steps) if steps else -1


def die_with_parent():
    """preexec_fn: the child gets SIGTERM when the test process dies (PR_SET_PDEATHSIG),
    so a test killed by its timeout leaves no daemon behind."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def agent_token(secret, agent):
    """The bus token of `agent` under the run secret (comms/auth.h: HMAC-SHA256, hex)."""
    return hmac.new(secret, agent.encode(), hashlib.sha256).hexdigest()


class StandaloneBus:
    """A real agentrt-bus on 127.0.0.1 for a test: with `plan` (a dict) its ACL, else --open.
    `address`, `secret`; token(agent); stop() (also on `with` exit) asserts a clean exit."""

    def __init__(self, work, plan=None, flags=()):
        """`flags`: more agentrt-bus flags (e.g. --log-dir, --durability). A second bus on the same
        `work` keeps the first one's secret (a restarted broker of the same run)."""
        secret_file = os.path.join(work, "bus.secret")
        if os.path.exists(secret_file):
            with open(secret_file, "rb") as f:
                self.secret = f.read()
        else:
            self.secret = os.urandom(32)
            fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, self.secret)
            os.close(fd)
        address_file = os.path.join(work, "bus.address")
        if os.path.exists(address_file):
            os.unlink(address_file)  # a killed bus's address is not this one's
        args = [os.path.join(os.environ["AGENTRT_BIN_DIR"], "agentrt-bus"), "--secret-file",
                secret_file, "--host", "127.0.0.1", "--port", "0", "--address-file", address_file]
        if plan is None:
            args.append("--open")
        else:
            plan_file = os.path.join(work, "plan.json")
            with open(plan_file, "w") as f:
                json.dump(plan, f)
            args += ["--plan", plan_file]
        args += list(flags)
        self.proc = subprocess.Popen(args, preexec_fn=die_with_parent)
        wait_for("agentrt-bus's address file",
                 lambda: os.path.exists(address_file) or self.proc.poll() is not None, 30)
        check(self.proc.poll() is None, "agentrt-bus started")
        with open(address_file) as f:
            self.address = f.read().strip()

    def token(self, agent):
        return agent_token(self.secret, agent)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise Failure("agentrt-bus did not stop within 20 s of SIGTERM")

    def kill(self):
        """kill -9: the broker dies mid-whatever, as in a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def test_plan(run, agents, channels=(), first_port=20016):
    """A complete plan.json for agents on one node: agents is a list of
    names or of dicts {name, ranks, backend, args}; channels of (topic, publishers, subscribers)."""
    out = {"run": run, "bus": {"host": "localhost", "port": first_port - 16}, "agents": [], "channels": []}
    for i, a in enumerate(agents):
        a = {"name": a} if isinstance(a, str) else dict(a)
        ranks = a.get("ranks", 1)
        first = first_port + 16 * i
        out["agents"].append({
            "name": a["name"], "index": i, "ranks": ranks,
            "placement": [{"node": "localhost", "gpus": [], "ranks": list(range(ranks))}],
            "ports": {"node": "localhost", "first": first, "last": first + 15},
            "master_addr": "localhost", "master_port": first,
            "checkpoint_dir": "checkpoints/" + a["name"], "gpus": 0,
            "backend": a.get("backend", "single" if ranks == 1 else "mpi"),
            "args": a.get("args", {}),
            "checkpoint": a.get("checkpoint", {"interval_s": 1800, "keep_last": 3})})
    for topic, pubs, subs in channels:
        out["channels"].append({"topic": topic, "publishers": list(pubs), "subscribers": list(subs)})
    return out


def scenarios_main(namespace, prefix, argv=None):
    """The main of a test script of scenarios: runs scenario_<argv[1]> of `namespace`
    (the script's globals()) through run_scenarios; usage (exit 2) for anything else."""
    argv = sys.argv if argv is None else argv
    scenarios = {k[len("scenario_"):]: v for k, v in namespace.items() if k.startswith("scenario_")}
    if len(argv) != 2 or argv[1] not in scenarios:
        print("usage: %s {%s}" % (argv[0], ",".join(sorted(scenarios))))
        return 2
    return run_scenarios(scenarios, argv[1], prefix)


def run_scenarios(scenarios, name, prefix):
    """Runs scenarios[name](work) in a fresh temporary folder; returns the exit status
    (77, CTest's skip, when the scenario returns 77: it could not run here). The folder
    is removed on success and kept (and named) on failure."""
    work = tempfile.mkdtemp(prefix="%s-%s-" % (prefix, name))
    try:
        if scenarios[name](work) == 77:
            shutil.rmtree(work, ignore_errors=True)
            print("SKIPPED", name, flush=True)
            return 77
    except Exception as e:  # noqa: BLE001 - a Failure or a bug in the test: keep the evidence either way
        if not isinstance(e, Failure):
            traceback.print_exc()
        print("FAILED:", e, flush=True)
        print("(work dir kept: %s)" % work, flush=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("PASSED", name, flush=True)
    return 0


def require_executables(*paths):
    """Exit 1 naming the first of paths that is not an executable (a build step is missing)."""
    for path in paths:
        if not os.access(path, os.X_OK):
            print("missing %s (build it first)" % path, file=sys.stderr)
            sys.exit(1)
