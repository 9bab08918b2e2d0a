#!/usr/bin/python3
"""`agentctl dashboard` over a live run of the real agentctl and test agents (two on fake GPUs,
one on the CPU): /metrics read by Prometheus' own parser (python3-prometheus-client), the JSON
views and their decimation, the event stream, the token off loopback, and the page in a real
headless chromium (agent table, partition map, a learning curve that gains points, a killed
agent's restart). Screenshots land in the build dir (AGENTRT_BIN_DIR/..)."""
import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import (AgentctlRun, Failure, check, die_with_parent, free_port_block, run_example,  # noqa: E402
                             heartbeating, kill_broker, runs_program, scenarios_main, wait_for)

BIN = os.environ["AGENTRT_BIN_DIR"]
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")
SOURCE = os.environ.get("AGENTRT_SOURCE_DIR", ".")
SHOTS = os.path.join(os.path.dirname(BIN), "dashboard-screenshots")


def start_run(work):
    first = free_port_block(64)
    inventory = os.path.join(work, "inventory.yaml")
    with open(inventory, "w") as f:
        f.write("cluster:\n  nodes:\n    - {name: localhost, gpus: 4, cpus: 16, nvlink_domains: [[0, 1], [2, 3]]}\n"
                "  ports: {first: %d, last: %d, per_agent: 8}\n" % (first, first + 63))
    args = ["--forever", "--step-ms", "20", "--heartbeat-ms", "200", "--ckpt-interval-s", "0.5",
            "--bus-connections", "1"]

    def agent(name, gpus, ranks):
        return "  - name: %s\n    gpus: %d\n    ranks: %d\n    command: %s\n" % (
            name, gpus, ranks, json.dumps([AGENT] + args))
    text = ("run: {name: dash, dir: runs}\ncluster:\n  ports: {first: %d, last: %d, per_agent: 8}\n"
            "defaults:\n  restart: {max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 30, grace_s: 2}\n"
            "agents:\n" % (first, first + 63))
    text += agent("hunter", 2, 2) + agent("scout", 1, 1) + agent("critic", 0, 1)
    text += 'channels:\n  - {topic: "probe/*", publishers: ["*"], subscribers: ["*"]}\n'
    run = AgentctlRun(AGENTCTL, work, text, ["--cluster", inventory])
    for name, n in (("hunter", 2), ("scout", 1), ("critic", 1)):
        wait_for("%s heartbeating" % name, lambda: heartbeating(run, name, n), 60)
    return run


class Dashboard:
    def __init__(self, run_dir, *flags):
        self.proc = subprocess.Popen([AGENTCTL, "dashboard", run_dir] + list(flags), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        line = self.proc.stdout.readline()
        check(line.startswith("dashboard of ") and "://" in line, "agentctl dashboard printed its URL: %r%s"
              % (line, "" if line else self.proc.stderr.read()))
        self.line = line
        self.url = line.split(": ", 1)[1].split()[0]
        self.context = None  # an ssl.SSLContext for an HTTPS dashboard

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10, context=self.context) as r:
            return r.read().decode()

    def post(self, path, headers=None):
        """(HTTP status, JSON body) of a POST."""
        req = urllib.request.Request(self.url + path, data=b"", method="POST", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.context) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            try:
                return e.code, json.loads(body)
            except ValueError:
                return e.code, {"text": body}

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        check(self.proc.returncode == 0, "agentctl dashboard exits 0 on SIGTERM")


def scenario_metrics(work):
    from prometheus_client.parser import text_string_to_metric_families
    run = start_run(work)
    dash = None
    try:
        # agentctl run serves its own dashboard while it runs, and says where.
        own = [ln.split(": ", 1)[1] for ln in run.output().splitlines() if ln.startswith("dashboard: http://127.0.0.1:")]
        check(len(own) == 1, "agentctl run printed its dashboard's URL: %s" % own)
        with urllib.request.urlopen(own[0] + "api/run", timeout=10) as r:
            check(len(json.load(r)["agents"]) == 3, "and serves the run there")
        dash = Dashboard(run.run_dir)
        check(dash.url.startswith("http://127.0.0.1:"), "loopback by default: %s" % dash.url)
        families = {f.name: f for f in text_string_to_metric_families(dash.get("metrics"))}
        state = [s for s in families["agentrt_agent_state"].samples if s.value == 1]
        check(sorted((s.labels["agent"], s.labels["state"]) for s in state) ==
              [("critic", "running"), ("hunter", "running"), ("scout", "running")],
              "Prometheus' parser reads every agent's state: %s" % state)
        check(all(s.labels["run"] == "dash" for s in state), "labelled by run")
        hb = families["agentrt_rank_heartbeat_age_seconds"].samples
        check(len(hb) == 4 and all(0 <= s.value < 30 for s in hb), "heartbeat age per rank: %s" % hb)
        check(families["agentrt_controller_up"].samples[0].value == 1, "the controller is up")
        restarts = {s.labels["agent"]: s.value for s in families["agentrt_agent_restarts"].samples}
        check(restarts == {"critic": 0, "hunter": 0, "scout": 0}, "restarts counters: %s" % restarts)
        view = json.loads(dash.get("api/run"))
        hunter = [a for a in view["agents"] if a["name"] == "hunter"][0]
        check(hunter["placement"][0]["gpus"] == [0, 1] and len(hunter["ranks"]) == 2,
              "the run view has hunter's GPUs and ranks: %s" % hunter["placement"])
        wait_for("metrics to accumulate", lambda: json.loads(dash.get("api/series?metric=loss&points=30"))["series"]
                 and json.loads(dash.get("api/series?metric=loss&points=30"))["series"][0]["total"] > 40 or None, 60)
        series = json.loads(dash.get("api/series?metric=loss&points=30"))["series"]
        check(sorted(s["agent"] for s in series) == ["critic", "hunter", "scout"], "a loss curve per agent")
        check(all(len(s["points"]) <= 31 < s["total"] or len(s["points"]) == s["total"] for s in series),
              "decimated to the points asked for: %s" % [(len(s["points"]), s["total"]) for s in series])
        # The bus: topics with their end offsets, and a subscriber (critic's credential, through the real
        # agentrt package) with its position and lag, in the view and on /metrics.
        sys.path.insert(0, os.path.join(os.path.dirname(BIN), "python"))
        import agentrt
        with open(os.path.join(run.run_dir, "secrets", "critic.token")) as f:
            cred = json.load(f)
        with open(os.path.join(run.run_dir, "plan.json")) as f:
            where = json.load(f)["bus"]
        bus = agentrt.Bus.connect("%s:%d" % (where["host"], where["port"]), cred["agent"], cred["token"])
        sub = bus.subscribe("probe/hunter", start=0)
        check(sub.next(10) is not None, "critic reads probe/hunter")
        view = wait_for("the subscriber in the run view", lambda: (lambda v: v if any(
            s["agent"] == "critic" and s["topic"] == "probe/hunter" for s in v["bus"].get("subscribers", []))
            else None)(json.loads(dash.get("api/run"))), 20)
        topics = {t["topic"]: t["end_offset"] for t in view["bus"]["topics"]}
        check(topics.get("probe/hunter") == 2 and topics.get("probe/scout") == 1,
              "topics with their end offsets (each rank published once): %s" % topics)
        families = {f.name: f for f in text_string_to_metric_families(dash.get("metrics"))}
        lag = [s for s in families["agentrt_bus_subscriber_lag_messages"].samples
               if s.labels["agent"] == "critic" and s.labels["topic"] == "probe/hunter"]
        check(len(lag) == 1 and 0 <= lag[0].value <= 2, "the subscriber's lag on /metrics: %s" % lag)
        sub.close()
        bus.close()
        # The run's broker killed with -9: started again, and said so in the view, on /metrics and by
        # agentctl status.
        broker = view["bus"]["broker_pid"]
        check(runs_program(broker, "agentrt-bus") and view["bus"]["broker_restarts"] == 0,
              "the run view names the broker process (pid %d)" % broker)
        check(kill_broker(run, {"critic": 1, "hunter": 2, "scout": 1}) is not None,
              "kill -9 of the broker, every agent heartbeating")
        view = wait_for("the view to name the new broker", lambda: (lambda v: v if v["bus"].get("broker_restarts") == 1
                                                                    and v["bus"].get("broker_pid") not in (0, broker)
                                                                    else None)(json.loads(dash.get("api/run"))), 30)
        families = {f.name: f for f in text_string_to_metric_families(dash.get("metrics"))}
        check(families["agentrt_bus_broker_restarts"].samples[0].value == 1,
              "/metrics counts the restart: %s" % families["agentrt_bus_broker_restarts"].samples)
        shown = subprocess.run([AGENTCTL, "status", run.run_dir], capture_output=True, text=True, timeout=30)
        check("bus: broker pid %d, restarted 1 time(s)" % view["bus"]["broker_pid"] in shown.stdout,
              "agentctl status names the new broker\n" + shown.stdout)
        # Per-rank logs, and bad requests: clear errors, nothing read outside the run.
        logs = json.loads(dash.get("api/logs?agent=hunter&rank=1&lines=5"))["lines"]
        check(0 < len(logs) <= 5 and any("agent hunter rank 1" in ln for ln in
                                         json.loads(dash.get("api/logs?agent=hunter&rank=1&lines=50"))["lines"]),
              "hunter rank 1's log: %s" % logs)
        found = json.loads(dash.get("api/logs?agent=hunter&rank=0&lines=10&q=training"))["lines"]
        check(found and all("training" in ln for ln in found), "search in a log: %s" % found)

        def refused(path, code, says):
            try:
                dash.get(path)
            except urllib.error.HTTPError as e:
                body = e.read().decode()
                check(e.code == code and says in body, "%s: %d %s" % (path, e.code, body.strip()))
                return
            raise Failure("%s was not refused" % path)
        refused("api/logs?agent=../../../etc/passwd&rank=0", 404, "no agent")
        refused("api/logs?agent=hunter&rank=7", 404, "ranks 0..1")
        refused("api/logs?agent=hunter&rank=0&lines=100000000", 400, "lines must be")
        refused("api/series?metric=loss&points=999999999", 400, "points must be")
        refused("api/series?metric=loss&points=lots", 400, "points must be")
        refused("no/such/page", 404, "no such page")
        # The event stream sends the run at once.
        with urllib.request.urlopen(dash.url + "events", timeout=10) as r:
            first = b""
            while b"\n\n" not in first:
                more = r.read1(4096)
                check(more, "the event stream did not end before its first event")
                first += more
        text = first.decode()
        check(text.startswith("event: run\ndata: ") and '"hunter"' in text, "the event stream: %s" % text[:120])
        dash.stop()
        dash = None
        # agentctl export --csv: the same metrics for a notebook.
        import csv
        out = subprocess.run([AGENTCTL, "export", run.run_dir, "--csv", "-"], capture_output=True, text=True,
                             timeout=60)
        check(out.returncode == 0, "agentctl export --csv: %s" % out.stderr)
        table = list(csv.DictReader(out.stdout.splitlines()))
        check(table and {"agent", "rank", "step", "loss", "steps_per_s"} <= set(table[0]) and
              {r["agent"] for r in table} == {"critic", "hunter", "scout"} and
              all(float(r["loss"]) > 0 for r in table if r["loss"]),
              "the CSV has a row per report and a column per metric (%d rows)" % len(table))
        # A finished run is served too.
        run.kill()
        wait_for("the run to end", lambda: run.proc.poll() is not None or None, 30)
        dash = Dashboard(run.run_dir)
        view = json.loads(dash.get("api/run"))
        check(view["run"]["controller_alive"] is False and view["run"]["state"] == "controller_gone",
              "a run whose agentctl is gone is still shown, as such: %s" % view["run"]["state"])
        shown = subprocess.run([AGENTCTL, "status", run.run_dir], capture_output=True, text=True, timeout=30)
        check("bus: broker ended with the run, restarted 1 time(s)" in shown.stdout,
              "agentctl status names no broker of a run that ended, only its restart\n" + shown.stdout)
    finally:
        if dash:
            dash.stop()
        run.kill()


def scenario_prometheus(work):
    """A real Prometheus (Debian's) finds the run through the file agentctl writes for
    file_sd_configs, scrapes its /metrics, and a PromQL query returns every agent's step."""
    prometheus = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus")
                                                 else None)
    if prometheus is None:
        print("SKIP: no prometheus binary (Debian's prometheus package)")
        return 77
    run = start_run(work)
    prom = None
    try:
        targets_file = os.path.join(run.run_dir, "prometheus_targets.json")
        targets = wait_for("prometheus_targets.json", lambda: os.path.exists(targets_file) and
                           json.load(open(targets_file)), 30)
        check(len(targets) == 1 and targets[0]["targets"][0].startswith("127.0.0.1:")
              and "__scheme__" not in targets[0]["labels"],
              "one loopback target over plain HTTP, the run's dashboard: %s" % targets)
        port = free_port_block(1)
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "scrape_configs:\n"
                    "  - job_name: agentrt\n"
                    "    file_sd_configs: [{files: ['%s'], refresh_interval: 1s}]\n" % targets_file)
        log = open(os.path.join(work, "prometheus.log"), "w")
        prom = subprocess.Popen([prometheus, "--config.file", config, "--storage.tsdb.path", os.path.join(work, "tsdb"),
                                 "--web.listen-address", "127.0.0.1:%d" % port], stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)

        def steps():
            url = "http://127.0.0.1:%d/api/v1/query?query=agentrt_agent_step" % port
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    result = json.load(r)["data"]["result"]
            except (OSError, ValueError, KeyError):
                return None
            by_agent = {x["metric"]["agent"]: float(x["value"][1]) for x in result}
            return by_agent if len(by_agent) == 3 else None
        check(prom.poll() is None, "prometheus started")
        got = wait_for("every agent's step series in Prometheus", steps, 90)
        check(sorted(got) == ["critic", "hunter", "scout"] and all(v > 0 for v in got.values()),
              "PromQL agentrt_agent_step returns each agent's step: %s" % got)
        run.proc.send_signal(signal.SIGINT)
        run.wait_exit(60)
        check(not os.path.exists(targets_file), "the run's dashboard removed its targets when it stopped")
    finally:
        run.kill()
        if prom is not None and prom.poll() is None:
            prom.terminate()
            prom.wait(timeout=30)


def scenario_token(work):
    run = start_run(work)
    try:
        out = subprocess.run([AGENTCTL, "dashboard", run.run_dir, "--listen", "0.0.0.0:0"],
                             capture_output=True, text=True, timeout=30)
        check(out.returncode != 0 and "needs a token" in out.stderr,
              "off loopback without a token: refused (%s)" % out.stderr.strip())
        token_file = os.path.join(work, "dash.token")
        with open(token_file, "w") as f:
            f.write("s3cret-dashboard-token\n")
        os.chmod(token_file, 0o644)
        out = subprocess.run([AGENTCTL, "dashboard", run.run_dir, "--listen", "0.0.0.0:0", "--token-file",
                              token_file], capture_output=True, text=True, timeout=30)
        check(out.returncode != 0 and ("0600" in out.stderr or "chmod" in out.stderr),
              "a token file others may read is refused (%s)" % out.stderr.strip())
        os.chmod(token_file, 0o600)
        dash = Dashboard(run.run_dir, "--listen", "0.0.0.0:0", "--token-file", token_file)
        try:
            check("0.0.0.0" not in dash.url, "the URL names this host, not 0.0.0.0: %s" % dash.url)
            ca = os.path.join(run.run_dir, "secrets", "ca.pem")
            check(dash.url.startswith("https://") and ca in dash.line,
                  "off loopback it serves HTTPS, signed by the run's CA: %s" % dash.line.strip())
            port = dash.url.rsplit(":", 1)[1].strip("/")
            try:
                urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10).read()
                raise AssertionError("plain HTTP answered")
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                pass  # the token never crosses in the clear
            try:
                urllib.request.urlopen("https://127.0.0.1:%s/metrics" % port, timeout=10,
                                       context=ssl.create_default_context()).read()
                raise AssertionError("a client not trusting the run's CA connected")
            except urllib.error.URLError as e:
                check(isinstance(e.reason, ssl.SSLCertVerificationError),
                      "a client without the run's CA refuses the certificate: %s" % e.reason)
            dash.context = ssl.create_default_context(cafile=ca)
            dash.url = "https://127.0.0.1:%s/" % port
            try:
                dash.get("metrics")
                raise AssertionError("no 401")
            except urllib.error.HTTPError as e:
                check(e.code == 401, "without the token: 401")
            check("agentrt_agent_state" in dash.get("metrics", {"Authorization": "Bearer s3cret-dashboard-token"}),
                  "with it: the metrics")
            targets = json.load(open(os.path.join(run.run_dir, "prometheus_targets.json")))
            check(targets[0]["labels"].get("__scheme__") == "https"
                  and targets[0]["targets"] == [dash.line.split("https://")[1].split("/")[0]],
                  "its Prometheus target says https, at the host its certificate names: %s" % targets)
            try:
                dash.get("api/run", {"Authorization": "Bearer wrong"})
                raise AssertionError("no 401")
            except urllib.error.HTTPError as e:
                check(e.code == 401, "a wrong token: 401")
            # ?token= once: the cookie it sets is derived from the token, not the token, and is
            # accepted on its own afterwards.
            with urllib.request.urlopen(dash.url + "?token=s3cret-dashboard-token", timeout=10,
                                        context=dash.context) as r:
                page = r.read().decode()
                cookie = r.headers["Set-Cookie"]
                headers = r.headers
            check(cookie and "s3cret" not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
                  and "Secure" in cookie,
                  "the session cookie holds no raw token: %s" % cookie)
            session = cookie.split(";", 1)[0]
            check("agentrt_agent_state" in dash.get("metrics", {"Cookie": session}), "the session cookie is accepted")
            try:
                dash.get("metrics", {"Cookie": "agentrt_session=s3cret-dashboard-token"})
                raise AssertionError("no 401")
            except urllib.error.HTTPError as e:
                check(e.code == 401, "the raw token as a cookie is not a session: 401")
            # The page's headers: no sniffing, no framing, only its own script (by hash).
            script = page[page.index("<script>") + 8:page.index("</script>")]
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            csp = headers["Content-Security-Policy"] or ""
            check(headers["X-Content-Type-Options"] == "nosniff" and "frame-ancestors 'none'" in csp and
                  ("script-src 'sha256-%s';" % digest) in csp and "unsafe-eval" not in csp and
                  headers["Referrer-Policy"] == "no-referrer",
                  "nosniff, frame-ancestors and the script's hash: %s" % csp)
            try:
                dash.get("api/run")
            except urllib.error.HTTPError as e:
                check(e.headers["X-Content-Type-Options"] == "nosniff", "a 401 says nosniff too")
        finally:
            dash.stop()
    finally:
        run.kill()


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """A real headless chromium driven over the DevTools protocol: one page kept open, so what
    it shows can be watched as the run goes on (the page's own event stream updates it)."""

    def __init__(self, binary, work):
        import websocket
        port = free_port_block(1)
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-port=%d" % port, "--remote-allow-origins=*",
             "--user-data-dir=" + os.path.join(work, "chromium"), "--window-size=1400,1100", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, TMPDIR=work),  # its singleton folder goes with the work folder, not in /tmp
            preexec_fn=lambda: (os.setsid(), die_with_parent()))  # its own group: close() ends all of it

        def page():
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/json" % port, timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                return pages[0]["webSocketDebuggerUrl"] if pages else None
            except OSError:
                return None
        self.ws = websocket.create_connection(wait_for("chromium's DevTools endpoint", page, 30), timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise Failure("DevTools %s: %s" % (method, reply["error"]))
                return reply["result"]

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    def screenshot(self, path):
        import base64
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self):
        try:
            self.ws.close()
        finally:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the browser and its renderer, GPU, zygote processes
            self.proc.wait(timeout=10)

            def group_gone():
                try:
                    os.killpg(self.proc.pid, 0)
                    return None
                except ProcessLookupError:
                    return True
            wait_for("chromium's processes to end", group_gone, 10)


def scenario_browser(work):
    browser = chromium()
    if browser is None:
        print("SKIPPED: no chromium (apt-get install chromium)")
        return 77
    run = start_run(work)
    dash = page = None
    try:
        dash = Dashboard(run.run_dir)
        page = Browser(browser, work)
        page.call("Page.navigate", url=dash.url)
        rows = wait_for("the agent table", lambda: (lambda r: r if r and len(r) == 3 else None)(
            page.js("[...document.querySelectorAll('#agents tbody tr')].map(r => r.dataset.agent)")), 20)
        check(sorted(rows) == ["critic", "hunter", "scout"], "the agent table shows every agent: %s" % rows)
        gpus = page.js("[...document.querySelectorAll('#partition .gpu[data-agent]')].map(g => g.dataset.agent + ':' + g.dataset.gpu)")
        check(sorted(gpus) == ["hunter:0", "hunter:1", "scout:2"],
              "the partition map colours hunter's GPUs 0,1 and scout's GPU 2: %s" % gpus)
        check(page.js("document.querySelectorAll('#partition .cpu[data-agent=critic]').length") == 1,
              "and shows critic on the CPU")
        domains = page.js("[...document.querySelectorAll('#partition .domain')].map(d => "
                          "[...d.querySelectorAll('.gpu')].map(g => g.dataset.gpu).join(','))")
        check(domains == ["0,1", "2,3"], "each NVLink domain is outlined with its GPUs: %s" % domains)
        points = lambda: page.js("+document.getElementById('chart').dataset.points")  # noqa: E731
        try:
            before = wait_for("the learning curve's first points", lambda: points() or None, 20)
        except Failure:
            raise Failure("no learning curve; the page's errors: %r" % page.js("window.pageErrors"))
        page.screenshot(os.path.join(SHOTS, "dashboard-running.png"))
        later = wait_for("the curve to gain points as the run goes on (the page's event stream)",
                         lambda: (lambda p: p if p > before else None)(points()), 30)
        print("the learning curve went from %d to %d points on the open page" % (before, later))
        # A killed agent shows its restart on the open page.
        victim = heartbeating(run, "scout", 1)["ranks"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        t0 = time.time()
        shown = wait_for("the page to show scout's restart", lambda: page.js(
            "(() => { const r = document.querySelector('#agents tr[data-agent=scout]');"
            " return r && r.children[2].textContent === '1' ? r.textContent : null; })()"), 30)
        print("the open page showed scout's restart %.1f s after the kill: %s" % (time.time() - t0, shown))
        check("SIGKILL" in shown, "with its reason: %s" % shown)
        page.screenshot(os.path.join(SHOTS, "dashboard-restart.png"))
        # Log scale and a zoom keep the chart drawn.
        page.js("document.getElementById('logy').click()")
        check(points() > 0, "log y still draws the curves")
        check(page.js("document.querySelectorAll('#topics tr[data-topic]').length") >= 3,
              "the bus section lists the probe topics")
        with open(os.path.join(run.run_dir, "bus.report.json")) as f:
            broker = json.load(f)["pid"]
        check(page.js("document.getElementById('broker').textContent") == "broker pid %d, restarted 0 time(s)" % broker,
              "and names the broker process: %s" % page.js("document.getElementById('broker').textContent"))
        check(page.js("window.pageErrors") == [], "and the page had no script error: %s" % page.js("window.pageErrors"))
        print("screenshots in %s" % SHOTS)
    finally:
        if page:
            page.close()
        if dash:
            dash.stop()
        run.kill()


def crc32c(data):
    """CRC32C (Castagnoli), bit by bit: an implementation of our own, not agentrt's."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(data, i):
    """(value, next index) of the base-128 varint at data[i]."""
    v, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def protobuf_fields(data):
    """(field number, wire type, value) of a protobuf message, decoded by hand."""
    import struct
    i, out = 0, []
    while i < len(data):
        key, i = varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(data, i)
        elif wire == 1:
            v = struct.unpack("<d", data[i:i + 8])[0]
            i += 8
        elif wire == 5:
            v = struct.unpack("<f", data[i:i + 4])[0]
            i += 4
        elif wire == 2:
            n, i = varint(data, i)
            v = data[i:i + n]
            i += n
        else:
            raise Failure("unexpected wire type %d" % wire)
        out.append((field, wire, v))
    return out


def scenario_tensorboard(work):
    """agentctl export --tensorboard: TFRecord files with TensorBoard's Event/Summary records, read
    back by an independent decoder (framing, masked CRC32C, protobuf wire format)."""
    import struct
    run_dir = finished_example(work, "cartpole.yaml")
    out = os.path.join(work, "tb")
    e = subprocess.run([AGENTCTL, "export", run_dir, "--tensorboard", out], capture_output=True, text=True, timeout=60)
    check(e.returncode == 0 and "tensorboard --logdir" in e.stderr, "export --tensorboard: %s" % e.stderr.strip())
    files = os.listdir(os.path.join(out, "cartpole"))
    check(len(files) == 1 and files[0].startswith("events.out.tfevents."), "one event file per agent: %s" % files)
    with open(os.path.join(out, "cartpole", files[0]), "rb") as f:
        data = f.read()
    records, i = [], 0
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if crc != masked(crc32c(header)):
            raise Failure("record %d: the length's checksum is wrong" % len(records))
        body = data[i + 12:i + 12 + n]
        (crc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if crc != masked(crc32c(body)):
            raise Failure("record %d: the record's checksum is wrong" % len(records))
        records.append(body)
        i += 16 + n
    print("ok: %d records, every length and record checksum right" % len(records))
    first = {f: v for f, _, v in protobuf_fields(records[0])}
    check(first.get(3) == b"brain.Event:2", "the first record is the file version")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    check(len(records) - 1 == len(lines), "one event per metrics line (%d)" % len(lines))
    last = protobuf_fields(records[-1])
    step = [v for f, _, v in last if f == 2][0]
    scalars = {}
    for f, _, v in last:
        if f == 5:
            for vf, _, value in protobuf_fields(v):
                fields = dict((a, c) for a, _, c in protobuf_fields(value))
                scalars[fields[1].decode()] = fields[2]
    want = lines[-1]["metrics"]
    check(step == lines[-1]["step"], "the last event's step is the last line's (%d)" % step)
    check(set(scalars) == {k for k, v in want.items() if isinstance(v, (int, float))} and
          abs(scalars["episode_return_mean"] - want["episode_return_mean"]) < 1e-3,
          "its scalars are the line's metrics (episode_return_mean %.2f)" % scalars["episode_return_mean"])
    bad = subprocess.run([AGENTCTL, "export", run_dir], capture_output=True, text=True, timeout=30)
    check(bad.returncode != 0 and "--csv FILE or --tensorboard DIR" in bad.stderr, "export without a target: an error")


def scenario_actions(work):
    """Stop run and restart agent: refused by a read-only dashboard, without the token or without
    the confirmation header, for an unknown agent; done with them (the API, then the page's own
    buttons in a real browser, confirming the dialog)."""
    browser = chromium()
    run = start_run(work)
    dashes, page = [], None
    try:
        readonly = Dashboard(run.run_dir)
        dashes.append(readonly)
        code, body = readonly.post("api/restart?agent=scout", {"X-Agentrt-Confirm": "yes"})
        check(code == 403 and "read-only" in body["error"], "a dashboard without a token is read-only: %d %s" % (code, body))
        token_file = os.path.join(work, "actions.token")
        with open(token_file, "w") as f:
            f.write("act-token\n")
        os.chmod(token_file, 0o600)
        dash = Dashboard(run.run_dir, "--token-file", token_file)
        dashes.append(dash)
        auth = {"Authorization": "Bearer act-token"}
        code, _ = dash.post("api/restart?agent=scout", {"X-Agentrt-Confirm": "yes"})
        check(code == 401, "without the token: 401")
        code, body = dash.post("api/restart?agent=scout", auth)
        check(code == 400 and "X-Agentrt-Confirm" in body["error"], "without the confirmation: 400")
        code, body = dash.post("api/restart?agent=nobody", dict(auth, **{"X-Agentrt-Confirm": "yes"}))
        check(code == 404 and "nobody" in body["error"], "an unknown agent: 404")
        control = os.path.join(run.run_dir, "control")
        check(run.agent("scout")["restarts"] == 0 and not (os.path.isdir(control) and os.listdir(control)),
              "none of these changed anything")
        code, body = dash.post("api/restart?agent=scout", dict(auth, **{"X-Agentrt-Confirm": "yes"}))
        check(code == 202 and body["accepted"], "restart scout: accepted")
        scout = wait_for("scout's restart", lambda: (lambda a: a if a and a["restarts"] == 1 and a["state"] == "running"
                                                     else None)(run.agent("scout")), 30)
        check("restart requested by the dashboard" in scout["reason"] and run.agent("hunter")["restarts"] == 0,
              "scout restarted (%s), hunter untouched" % scout["reason"])
        if browser is None:
            print("no chromium: the page's buttons are not tried")
            return
        page = Browser(browser, work)
        page.call("Page.navigate", url=dash.url + "?token=act-token")
        buttons = wait_for("the restart buttons", lambda: (lambda b: b if b and len(b) == 3 else None)(
            page.js("[...document.querySelectorAll('#agents button[data-restart]')].map(b => b.dataset.restart)")), 30)
        check(sorted(buttons) == ["critic", "hunter", "scout"], "a restart button per running agent: %s" % buttons)
        check(page.js("document.getElementById('stop-run').hidden") is False, "and a stop button")
        page.js("window.asked = []; window.confirm = (q) => { window.asked.push(q); return true; }")
        page.js("document.getElementById('stop-run').click()")
        rc = run.wait_exit(60)
        check(rc == 130 and run.status()["state"] == "stopped", "the page stopped the run (exit %d)" % rc)
        check("Stop the run?" in page.js("window.asked[0]"), "after asking: %s" % page.js("window.asked"))
        check(all(a["state"] == "stopped" and "requested by the dashboard" in a["reason"] for a in run.status()["agents"]),
              "every agent stopped at the dashboard's request")
    finally:
        if page:
            page.close()
        for d in dashes:
            d.stop()
        run.kill()


def finished_example(work, config):
    """An example config (configs/<config>) run to its end under `work`; its run directory."""
    rc, run_dir, out = run_example(AGENTCTL, SOURCE, work, config)
    check(rc == 0 and run_dir, "agentctl run configs/%s succeeded%s" % (config, "" if rc == 0 else "\n" + out))
    return run_dir


def scenario_league(work):
    """The league's ratings and the PBT lineage on the page and in /metrics (configs/league.yaml
    and configs/pbt.yaml, finished runs)."""
    from prometheus_client.parser import text_string_to_metric_families
    browser = chromium()
    if browser is None:
        print("SKIPPED: no chromium (apt-get install chromium)")
        return 77
    league_dir = finished_example(work, "league.yaml")
    pbt_dir = finished_example(work, "pbt.yaml")
    page = None
    dashes = []
    try:
        page = Browser(browser, work)
        dashes.append(Dashboard(league_dir))
        page.call("Page.navigate", url=dashes[-1].url)
        members = wait_for("the league table", lambda: (lambda r: r if r and len(r) == 4 else None)(
            page.js("[...document.querySelectorAll('#league tbody tr')].map(r => r.dataset.member)")), 20)
        families = {f.name: f for f in text_string_to_metric_families(dashes[-1].get("metrics"))}
        ratings = {s.labels["agent"]: s.value for s in families["agentrt_league_rating"].samples}
        check(sorted(ratings) == sorted(members), "/metrics has every member's rating: %s" % {k: round(v) for k, v in ratings.items()})
        # Who learns fastest is league_run_test's to judge; the page's part is the order.
        check([ratings[m] for m in members] == sorted(ratings.values(), reverse=True),
              "the league table ranks the members by rating, highest first: %s (%s)"
              % (members, {k: round(v) for k, v in ratings.items()}))
        wait_for("the learning curves", lambda: page.js("+document.getElementById('chart').dataset.points"), 20)
        page.screenshot(os.path.join(SHOTS, "dashboard-league.png"))
        dashes.append(Dashboard(pbt_dir))
        page.call("Page.navigate", url=dashes[-1].url)
        exploits = wait_for("the PBT lineage", lambda: page.js("document.querySelectorAll('#lineage tbody tr').length"), 20)
        with open(os.path.join(pbt_dir, "league", "lineage.jsonl")) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        check(exploits == min(20, len(lines)), "the page lists the %d exploits of lineage.jsonl" % len(lines))
        check(page.js("document.getElementById('league-section').hidden") is False, "in the league section")
        check(page.js("document.getElementById('league').hidden") is True, "with no ratings table (no league)")
        wait_for("the learning curves", lambda: page.js("+document.getElementById('chart').dataset.points"), 20)
        page.js("document.getElementById('league-section').scrollIntoView()")
        page.screenshot(os.path.join(SHOTS, "dashboard-pbt.png"))
        check(page.js("window.pageErrors") == [], "and the page had no script error: %s" % page.js("window.pageErrors"))
    finally:
        if page:
            page.close()
        for d in dashes:
            d.stop()


def main():
    for path in (AGENTCTL, AGENT):
        if not os.access(path, os.X_OK):
            print("missing %s" % path)
            return 1
    return scenarios_main(globals(), "dashboard")


if __name__ == "__main__":
    sys.exit(main())
