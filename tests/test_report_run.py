#!/usr/bin/env python3
"""A real training run, its HTML report in a real browser, its TensorBoard files read by
TensorBoard itself (tests/cmake/report.cmake registers the three steps as ctest tests sharing
one run folder):

  setup QCTRAIN RUN        a 3-step cpu-smoke run with validation and a checkpoint at step 2,
                           then a resume from that checkpoint to step 4 (steps 3 and 4 run
                           again: TensorBoard must show each step once); the report with a
                           hand-made plan (RUN-plan/) and the report without its libraries;
                           2-step runs with every stash offloaded (RUN-offload/) and recomputed
                           (RUN-recompute/).
  browser QCTRAIN RUN      chromium-headless-shell renders each page; over the DevTools
                           protocol (--remote-debugging-pipe) the test reads the DOM the browser
                           built and every console message, exception and network request.
  tensorboard RUN          tensorboard's EventAccumulator reads RUN/tb/: every scalar equals
                           metrics.jsonl's value (as float32, the type of a simple value), each
                           step once; a file cut inside a record keeps every earlier record.

chromium-headless-shell and the tensorboard package come from tools/install-deps; a missing one
fails the test (CI installs them), it never skips.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser

CHROME = shutil.which("chromium-headless-shell") or "/usr/bin/chromium-headless-shell"


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg)


def run(cmd, env=None):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env)
    if r.returncode != 0:
        fail("exit %d: %s\n%s" % (r.returncode, " ".join(cmd), r.stdout))
    return r.stdout


def metrics_lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- setup --------------------------------------------------------------------------------------

def setup(qctrain, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    for suffix in ("-plan", "-oom", "-one", "-stopped", "-ranks"):
        shutil.rmtree(run_dir + suffix, ignore_errors=True)
    common = ["--preset", "cpu-smoke", "--batch-size", "1", "--eval-every", "2",
              "--val-scenes", "2", "--quiet"]
    run([qctrain, "train"] + common + ["--steps", "3", "--save-every", "2", "--out", run_dir])
    check(len(os.listdir(os.path.join(run_dir, "tb"))) == 1, "one TensorBoard file after run 1")
    # resume from step 2: steps 3 and 4 run (again)
    run([qctrain, "train"] + common + ["--steps", "4", "--resume",
                                       os.path.join(run_dir, "ckpt-000002")])
    check(len(os.listdir(os.path.join(run_dir, "tb"))) == 2, "a second TensorBoard file")
    check(os.path.exists(os.path.join(run_dir, "report.html")), "train wrote report.html")
    # the report without its libraries
    env = dict(os.environ, QC_REPORT_JS_DIR="/nonexistent")
    run([qctrain, "report", run_dir, "--out", os.path.join(run_dir, "report-nolibs.html")], env)
    # a hand-made plan beside the measured blocks (the memory work's memory.json contract)
    plan_dir = run_dir + "-plan"
    os.makedirs(plan_dir)
    for name in ("metrics.jsonl", "run.json"):
        shutil.copy(os.path.join(run_dir, name), plan_dir)
    with open(os.path.join(run_dir, "memory.json")) as f:
        mem = json.load(f)
    blocks = [b for b in mem["peak"]["by_block"] if not b["other"]][:4]
    policies = ["keep", "offload_host", "recompute", "offload_nvme"]
    mem["plan"] = {
        "step": mem["peak"]["step"],
        "predicted_peak_bytes": mem["allocator"]["bytes_allocated_peak"] - 1048576,
        "measured_peak_bytes": mem["allocator"]["bytes_allocated_peak"],
        "blocks": [{"name": b["name"], "policy": policies[i], "bytes": b["bytes"] - 512 * i,
                    "predicted_time_s": 0.001 * (i + 1)} for i, b in enumerate(blocks)]}
    with open(os.path.join(plan_dir, "memory.json"), "w") as f:
        json.dump(mem, f, indent=1)
    out = run([qctrain, "report", plan_dir])
    check("with the plan" in out, "report of the plan run: " + out.strip())
    # a step that ran out of memory and was re-planned (step 3 of 4: neither one of the first
    # steps nor, necessarily, the peak; alloc.trace_every=0): its trace is kept
    d = run_dir + "-oom"
    shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, QC_FAULT_OOM_STEP="3")
    out = run([qctrain, "train", "--preset", "cpu-smoke", "--batch-size", "1", "--quiet",
               "--steps", "4", "--set", "device.budget=1GiB", "--set", "alloc.trace_every=0",
               "--out", d], env)
    check("re-planned" in out, "the injected out-of-memory was rolled back and re-planned")
    # a one-scene file: "1 batch/epoch of 1 scene", not "1 batches/epoch of 2 scenes"
    d = run_dir + "-one"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    one = os.path.join(d, "one.qcshard")
    run([qctrain, "gen", "--scenes", "1", "--seed", "9", "--out", one])
    out = run([qctrain, "train", "--preset", "cpu-smoke", "--steps", "1", "--data", one,
               "--out", os.path.join(d, "run")])
    check("1 batch/epoch of 1 scene x 1 group/step" in out,
          "a one-scene file: %r" % [l for l in out.splitlines() if "epoch" in l])
    # a run that stops: its one scene does not fit the budget; it still writes its reports
    d = run_dir + "-stopped"
    shutil.rmtree(d, ignore_errors=True)
    r = subprocess.run([qctrain, "train", "--preset", "cpu-smoke", "--quiet", "--steps", "3",
                        "--set", "device.budget=40MiB", "--out", d], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 1 and "does not fit the device budget" in r.stdout,
          "a run whose scene fits no budget fails (exit %d)" % r.returncode)
    check("qctrain: error: train: step 1, group 0: scene " in r.stdout,
          "the fatal message says train: once: %r" % r.stdout[-600:])
    for name in ("memory.json", "memory.txt", "report.html"):
        check(os.path.exists(os.path.join(d, name)), "the stopped run wrote %s" % name)
    # several ranks: a hand-made memory.json with a dist object (rank 1 peaks higher)
    d = run_dir + "-ranks"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name in ("metrics.jsonl", "run.json"):
        shutil.copy(os.path.join(run_dir, name), d)
    with open(os.path.join(run_dir, "memory.json")) as f:
        mem = json.load(f)
    peak = mem["allocator"]["bytes_allocated_peak"]
    mem["dist"] = {"world_size": 2, "zero_stage": 1, "ranks": [
        {"rank": r, "params_bytes": 1000, "grads_bytes": 1000, "grads_reduced_bytes": 500,
         "moments_bytes": 1000, "comm_bytes": 64, "peak_allocated_bytes": peak + r * 12345}
        for r in range(2)]}
    with open(os.path.join(d, "memory.json"), "w") as f:
        json.dump(mem, f, indent=1)
    run([qctrain, "report", d])
    # the memory system at work: every stash offloaded to the host tier, or recomputed (its
    # trace marks offload puts and fetches, or recomputes, on the timeline)
    for policy in ("offload", "recompute"):
        d = run_dir + "-" + policy
        shutil.rmtree(d, ignore_errors=True)
        run([qctrain, "train", "--preset", "cpu-smoke", "--batch-size", "1", "--quiet",
             "--steps", "2", "--set", "plan.policy=" + policy, "--out", d])
        key = "offload_host_bytes" if policy == "offload" else "recompute_bytes"
        check(all(l.get(key, 0) > 0 for l in metrics_lines(d)),
              "plan.policy=%s: %s > 0 in every step" % (policy, key))


# ---- a minimal DOM from the browser's serialization ----------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.text = [], ""

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def all_text(self):
        return self.text + "".join(c.all_text() for c in self.children)

    def find(self, tag=None, **attrs):
        return [n for n in self.walk() if (tag is None or n.tag == tag) and
                all(n.attrs.get(k) == v for k, v in attrs.items())]


class DomBuilder(HTMLParser):
    def __init__(self):
        super().__init__()
        self.root = Node("#root", [], None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text += data


def dom(html):
    b = DomBuilder()
    b.feed(html)
    return b.root


def by_id(root, id_):
    found = root.find(id=id_)
    return found[0] if found else None


# ---- the browser, over the DevTools protocol on a pipe -------------------------------------------

class Browser:
    """chromium-headless-shell with --remote-debugging-pipe: commands go to its fd 3, replies
    and events come from its fd 4, one JSON message per NUL-terminated chunk."""

    def __init__(self):
        if not os.path.exists(CHROME):
            fail("chromium-headless-shell not found (tools/install-deps installs it)")
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()
        self.profile = tempfile.mkdtemp(prefix="qc-chrome-")

        def child_fds():
            a, b = os.dup(cmd_r), os.dup(res_w)  # out of the way of 3 and 4
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)  # dup2 onto itself would keep close-on-exec
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [CHROME, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage",
             "--remote-debugging-pipe", "--user-data-dir=" + self.profile,
             "--window-size=1400,1000", "about:blank"],
            preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self.buf, self.next_id, self.events = b"", 0, []

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                fail("the browser did not answer in time")
            chunk = os.read(self.res_r, 1 << 20)
            if not chunk:
                fail("the browser closed its DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail("DevTools %s: %s" % (method, m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, timeout=60):
        deadline = time.time() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def render(self, path):
        """Loads file://path, waits until the page script has run, returns (DOM html,
        console errors, requested URLs)."""
        self.events = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(domain + ".enable", session=s)
        self.send("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=s)
        self.wait_event("Page.loadEventFired")
        deadline = time.time() + 60
        while True:
            r = self.send("Runtime.evaluate", {
                "expression": "document.body && document.body.getAttribute('data-rendered')",
                "returnByValue": True}, session=s)
            if r.get("result", {}).get("value") == "yes":
                break
            if time.time() > deadline:
                fail("%s: the page script did not finish (data-rendered)" % path)
            time.sleep(0.2)
        time.sleep(0.5)  # let late console messages arrive
        html = self.send("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                              "returnByValue": True}, session=s)
        html = html["result"]["value"]
        self.send("Runtime.evaluate", {"expression": "1"}, session=s)  # drain events
        errors, urls = [], []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                errors.append("console.%s: %s" % (p["type"], [a.get("value", a.get("description"))
                                                             for a in p.get("args", [])]))
            elif m == "Runtime.exceptionThrown":
                errors.append("exception: %s" % p.get("exceptionDetails", {}))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append("log: %s" % p["entry"].get("text"))
            elif m == "Network.requestWillBeSent":
                urls.append(p["request"]["url"])
        self.send("Target.closeTarget", {"targetId": target})
        return html, errors, urls

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except SystemExit:
            pass
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


def check_page_common(name, html, errors, urls, page_path, mem):
    root = dom(html)
    check(not errors, "%s: no console errors or exceptions %s" % (name, errors))
    page_url = "file://" + os.path.abspath(page_path)
    others = [u for u in urls if u != page_url and not u.startswith("data:")]
    check(not others, "%s: no request besides the page itself (self-contained) %s" % (name, others))
    for sec in ("timeline", "blocks", "holders", "curves", "run"):
        n = by_id(root, sec)
        check(n is not None and n.tag == "section", "%s: section #%s" % (name, sec))
    a = mem["allocator"]
    fig = by_id(root, "fig-peak-allocated")
    check(fig is not None and fig.attrs.get("data-bytes") == str(a["bytes_allocated_peak"]),
          "%s: peak allocated figure = memory.json's %d" % (name, a["bytes_allocated_peak"]))
    check("{:,}".format(a["bytes_allocated_peak"]) in fig.all_text(),
          "%s: the page shows %s bytes (%r)" % (name, "{:,}".format(a["bytes_allocated_peak"]),
                                                fig.all_text()))
    frag = by_id(root, "fig-fragmentation")
    check(frag is not None and float(frag.attrs.get("data-value")) == a["fragmentation"],
          "%s: fragmentation figure = memory.json's %s" % (name, a["fragmentation"]))
    check(frag.all_text().strip() == "%.3f" % a["fragmentation"],
          "%s: the page shows fragmentation %r" % (name, frag.all_text()))
    data = by_id(root, "qc-data")
    check(data is not None and data.attrs.get("type") == "application/json",
          "%s: the data sits in <script type=application/json>" % name)
    check(len(root.find("script", type="application/json")) == 1, "%s: the data is there once" % name)
    return root


def holders_checks(root, run_dir, mem):
    """The "What holds the peak" section of a run's report: its rows add up to the measured peak
    of the peak step (the trace index's figure and memory.json's steps[] entry), byte for byte,
    and name the r of an edge set with the knob model.edge_mode."""
    peak_fig = by_id(root, "fig-holders-peak")
    check(peak_fig is not None, "holders: the peak figure")
    step, peak = int(peak_fig.attrs["data-step"]), int(peak_fig.attrs["data-bytes"])
    with open(os.path.join(run_dir, "trace", "index.json")) as f:
        idx = {e["step"]: e for e in json.load(f)["steps"]}
    check(step in idx and idx[step]["bytes_allocated_peak"] == peak,
          "holders: step %d's peak %d = the trace index's step peak" % (step, peak))
    steps = {e["step"]: e["bytes_allocated_peak"] for e in mem.get("steps", [])}
    check(steps.get(step) == peak, "holders: = memory.json steps[] of step %d (%s)" %
          (step, steps.get(step)))
    rows = by_id(root, "holders-table").find("tbody")[0].find("tr")
    total = sum(int(tr.find("td")[3].attrs["data-sort"]) for tr in rows)
    check(total == peak, "holders: %d rows sum to %d bytes = the peak %d" % (len(rows), total, peak))
    kinds = by_id(root, "holders-kinds").find("tbody")[0].find("tr")
    check(sum(int(tr.find("td")[1].attrs["data-sort"]) for tr in kinds) == peak,
          "holders: the kinds sum to the peak")
    check(by_id(root, "holders-sum").attrs.get("data-bytes") == str(peak),
          "holders: the page says the rows add up to the peak")
    r = [tr for tr in rows if tr.find("td")[0].all_text().startswith("r of edge set ")]
    check(r and all("model.edge_mode" in tr.find("td")[7].all_text() for tr in r),
          "holders: %d rows name an edge set's r with the knob model.edge_mode (%s)" %
          (len(r), [tr.find("td")[0].all_text() for tr in r][:3]))
    fixed = [tr.find("td")[0].all_text() for tr in rows if tr.find("td")[0].attrs.get("data-kind")
             == "fixed"]
    check({"parameters", "gradients", "AdamW moments"} <= set(fixed),
          "holders: the fixed owners named (%s)" % fixed)


def browser(qctrain, run_dir):
    del qctrain
    with open(os.path.join(run_dir, "memory.json")) as f:
        mem = json.load(f)
    b = Browser()
    try:
        # 1. the report train wrote
        page = os.path.join(run_dir, "report.html")
        html, errors, urls = b.render(page)
        root = check_page_common("report.html", html, errors, urls, page, mem)
        for sec in ("timeline", "curves", "blocks"):
            charts = by_id(root, sec).find("canvas") + by_id(root, sec).find("svg")
            check(len(charts) > 0, "report.html: #%s holds charts (%d canvas/svg)" % (sec, len(charts)))
        check(by_id(root, "timeline-stack") is not None and by_id(root, "timeline-totals") is not None,
              "report.html: both timeline charts")
        check(by_id(root, "curve-loss") is not None and by_id(root, "curve-memory") is not None,
              "report.html: loss and memory curves")
        check(by_id(root, "curve-eval_heading") is not None, "report.html: minAHE / minFHE curve")
        rows = by_id(root, "blocks-table").find("tbody")[0].find("tr")
        check(len(rows) == len(mem["peak"]["by_block"]), "report.html: one row per block")
        check(not root.find(id="lib-missing-dygraphs"), "report.html: no missing-library notice")
        # what holds the peak: every holder of the peak step's peak, summing to its measured peak
        holders_checks(root, run_dir, mem)
        check(by_id(root, "config-table") is not None, "report.html: the configuration")
        # plan versus measured: every planned row has its measured bytes (one naming of planned
        # blocks and allocator tags), equal to the prediction when every stash is kept
        plan = json.loads(by_id(root, "qc-data").all_text())["memory"]["plan"]
        prow = by_id(root, "plan-table").find("tbody")[0].find("tr")
        check(len(prow) == len(plan["blocks"]) > 50, "report.html: %d planned rows" % len(prow))
        missing = [tr.find("td")[0].all_text() for tr in prow
                   if tr.find("td")[3].attrs.get("data-sort") in (None, "-1")]
        check(not missing, "report.html: every planned row has a measured figure (%s)" % missing[:5])
        off = [(b["name"], b["bytes"], b["measured_bytes"]) for b in plan["blocks"]
               if b["policy"] == "keep" and abs(b["measured_bytes"] - b["bytes"]) >
               0.02 * b["bytes"] + 512]
        check(not off, "report.html: kept stashes measured as planned, within 2 %% (%s)" % off[:5])
        # axis ticks at round binary steps (64 MiB, not 47.7 MiB)
        units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        labels = [n.all_text() for n in by_id(root, "timeline-totals").walk()
                  if "dygraph-axis-label-y" in n.attrs.get("class", "")]
        vals = sorted(float(t.split()[0]) * units[t.split()[1]] for t in labels if t.strip())
        steps = {round(b - a) for a, b in zip(vals, vals[1:])}
        check(len(vals) >= 3 and len(steps) == 1 and (lambda x: x & (x - 1) == 0)(steps.pop()),
              "report.html: y-axis ticks a power of two apart: %s" % labels)
        # an all-zero chart says so instead of drawing an axis of "1 B"
        none = by_id(root, "curve-offload-none")
        check(none is not None and "Nothing offloaded" in none.all_text() and
              by_id(root, "curve-offload") is None, "report.html: 'nothing offloaded', no chart")
        # 2. the hand-made plan
        with open(os.path.join(run_dir + "-plan", "memory.json")) as f:
            pmem = json.load(f)
        page = os.path.join(run_dir + "-plan", "report.html")
        html, errors, urls = b.render(page)
        root = check_page_common("plan report", html, errors, urls, page, pmem)
        plan = pmem["plan"]
        table = by_id(root, "plan-table")
        check(table is not None, "plan report: the plan table")
        prow = table.find("tbody")[0].find("tr")
        check(len(prow) == len(plan["blocks"]), "plan report: one row per planned block")
        for tr, pb in zip(prow, plan["blocks"]):
            cells = tr.find("td")
            check(cells[0].all_text() == pb["name"] and cells[1].all_text() == pb["policy"],
                  "plan report: %s is %s" % (pb["name"], pb["policy"]))
            check(cells[2].attrs.get("data-sort") == str(pb["bytes"]),
                  "plan report: predicted bytes of %s" % pb["name"])
            measured = {x["name"]: x["bytes"] for x in pmem["peak"]["by_block"]}[pb["name"]]
            check(cells[3].attrs.get("data-sort") == str(measured),
                  "plan report: measured bytes of %s beside it" % pb["name"])
        check(by_id(root, "fig-plan-predicted").attrs.get("data-bytes") ==
              str(plan["predicted_peak_bytes"]), "plan report: predicted peak figure")
        # the step that ran out of memory: kept whatever alloc.trace_every says, shown first
        d = run_dir + "-oom"
        with open(os.path.join(d, "memory.json")) as f:
            om = json.load(f)
        with open(os.path.join(d, "trace", "index.json")) as f:
            idx = json.load(f)
        oom_steps = [e["step"] for e in idx["steps"] if "oom" in e["reasons"]]
        check(oom_steps == [3], "the re-planned step 3 kept with reason oom: %s" %
              [(e["step"], e["reasons"]) for e in idx["steps"]])
        page = os.path.join(d, "report.html")
        html, errors, urls = b.render(page)
        root = check_page_common("out-of-memory report", html, errors, urls, page, om)
        data = json.loads(by_id(root, "qc-data").all_text())
        check(data["timeline"]["step"] == 3 and "oom" in data["timeline"]["reasons"],
              "out-of-memory report: opens on step 3 (%s)" % data["timeline"]["step"])
        n = by_id(root, "timeline-ooms")
        check(n is not None and n.attrs.get("data-steps") == "3" and "re-planned" in n.all_text(),
              "out-of-memory report: the steps that ran out of memory are listed")
        # the run that stopped: its report says why (the error, the scene, the budget it needs)
        d = run_dir + "-stopped"
        with open(os.path.join(d, "memory.json")) as f:
            sm = json.load(f)
        stop = sm.get("stopped") or {}
        check(stop.get("reason") == "error" and stop.get("step") == 1 and
              "does not fit the device budget" in stop.get("message", "") and
              "it needs a budget of about" in stop.get("message", ""),
              "stopped run: memory.json says why: %s" % stop)
        page = os.path.join(d, "report.html")
        html, errors, urls = b.render(page)
        root = check_page_common("stopped report", html, errors, urls, page, sm)
        n = by_id(root, "stopped")
        check(n is not None and n.attrs.get("data-step") == "1" and
              "needs a budget of about" in n.all_text(), "stopped report: the notice says why")
        # several ranks: the largest rank's peak is the headline, the per-rank table beside it
        d = run_dir + "-ranks"
        with open(os.path.join(d, "memory.json")) as f:
            rm = json.load(f)
        top = max(r["peak_allocated_bytes"] for r in rm["dist"]["ranks"])
        shown = json.loads(json.dumps(rm))
        shown["allocator"]["bytes_allocated_peak"] = top
        page = os.path.join(d, "report.html")
        html, errors, urls = b.render(page)
        root = check_page_common("two-rank report", html, errors, urls, page, shown)
        check(by_id(root, "fig-peak-allocated").attrs.get("data-rank") == "1",
              "two-rank report: the headline is rank 1's peak")
        rows = by_id(root, "ranks-table").find("tbody")[0].find("tr")
        check(len(rows) == 2, "two-rank report: the per-rank table")
        # 3. without the libraries: tables, a clear notice, no broken page
        page = os.path.join(run_dir, "report-nolibs.html")
        html, errors, urls = b.render(page)
        root = check_page_common("no-library report", html, errors, urls, page, mem)
        for lib in ("dygraphs", "chartjs"):
            n = by_id(root, "lib-missing-" + lib)
            check(n is not None and "was not found" in n.all_text(),
                  "no-library report: notice for %s" % lib)
        check(by_id(root, "timeline-table") is not None and by_id(root, "curve-table-loss") is not None,
              "no-library report: the timeline and curves as tables")
        check(not by_id(root, "timeline").find("canvas"), "no-library report: no broken chart")
        # 4. runs of the memory system: its marks on the timeline, its curves, its plan
        for policy, kinds, pol, curve in (
                ("offload", ("offload_put", "offload_get"), "offload_host", "curve-offload"),
                ("recompute", ("recompute",), "recompute", "curve-offload")):
            d = run_dir + "-" + policy
            with open(os.path.join(d, "memory.json")) as f:
                pm = json.load(f)
            page = os.path.join(d, "report.html")
            html, errors, urls = b.render(page)
            name = "plan.policy=%s report" % policy
            root = check_page_common(name, html, errors, urls, page, pm)
            marks = by_id(root, "timeline-marks")
            check(marks is not None, "%s: the timeline's marks summary" % name)
            for k in kinds:
                n = int(marks.attrs.get("data-" + k, "0"))
                check(n > 0, "%s: %d %s marks on the timeline" % (name, n, k))
            data = json.loads(by_id(root, "qc-data").all_text())
            kinds_in_data = {m["kind"] for m in data["timeline"]["marks"]}
            check(set(kinds) <= kinds_in_data,
                  "%s: the page data marks %s (%s)" % (name, kinds, sorted(kinds_in_data)))
            check(by_id(root, curve) is not None, "%s: the offload/recompute curve" % name)
            table = by_id(root, "plan-table")
            check(table is not None, "%s: the plan table" % name)
            prow = table.find("tbody")[0].find("tr")
            check(len(prow) == len(pm["plan"]["blocks"]) and
                  any(tr.find("td")[1].all_text() == pol for tr in prow),
                  "%s: %d planned blocks, policy %s shown" % (name, len(prow), pol))
    finally:
        b.close()


# ---- TensorBoard --------------------------------------------------------------------------------

STEP_TAGS = {"loss": "train/loss", "reg_loss_propose": "train/reg_loss_propose",
             "reg_loss_refine": "train/reg_loss_refine", "cls_loss": "train/cls_loss",
             "lr": "train/lr", "samples_per_s": "train/samples_per_s",
             "peak_device_bytes": "memory/peak_device_bytes",
             "reserved_bytes": "memory/reserved_bytes",
             "peak_reserved_live_bytes": "memory/peak_reserved_live_bytes",
             "predicted_peak_bytes": "memory/predicted_peak_bytes",
             "offload_host_bytes": "memory/offload_host_bytes",
             "offload_nvme_bytes": "memory/offload_nvme_bytes",
             "recompute_bytes": "memory/recompute_bytes",
             "peak_active_bytes": "memory/peak_active_bytes",
             "prefetch_stall_s": "memory/prefetch_stall_s", "replans": "memory/replans",
             "splits": "memory/splits", "skipped_scenes": "memory/skipped_scenes",
             "plan_ms": "memory/plan_ms", "plan_ahead_ms": "memory/plan_ahead_ms"}
EVAL_KEYS = ["loss", "minADE", "minFDE", "MR", "Brier", "brier_minFDE", "minAHE", "minFHE"]


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def tensorboard(run_dir):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        fail("the tensorboard package is missing (tools/install-deps: pip install tensorboard)")
    lines = metrics_lines(run_dir)
    steps = [l for l in lines if "eval" not in l]
    evals = [l for l in lines if "eval" in l]
    check([l["step"] for l in steps] == [1, 2, 3, 4], "metrics.jsonl: steps 1..4 once each")
    acc = EventAccumulator(os.path.join(run_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = set()
    for key, tag in STEP_TAGS.items():
        if not any(key in l for l in steps):
            continue
        expected.add(tag)
        got = {e.step: e.value for e in acc.Scalars(tag)}
        check(sorted(got) == [l["step"] for l in steps if key in l] and
              len(acc.Scalars(tag)) == len(got),
              "%s: each step once %s" % (tag, [e.step for e in acc.Scalars(tag)]))
        for l in steps:
            check(got[l["step"]] == f32(l[key]),
                  "%s @ %d: %r == metrics.jsonl %r" % (tag, l["step"], got[l["step"]], l[key]))
    check([e["step"] for e in evals] == [2, 4], "eval lines at steps 2 and 4")
    for key in EVAL_KEYS:
        tag = "eval/" + key
        expected.add(tag)
        got = {e.step: e.value for e in acc.Scalars(tag)}
        check(sorted(got) == [2, 4], "%s at steps 2 and 4" % tag)
        for l in evals:
            check(got[l["step"]] == f32(l["eval"][key]), "%s @ %d == metrics.jsonl" % (tag, l["step"]))
    check(expected <= tags, "every expected tag is there (missing: %s)" % (expected - tags))
    # the memory system's bytes reach TensorBoard: offloaded, recomputed (and equal metrics.jsonl)
    for policy, key in (("offload", "offload_host_bytes"), ("recompute", "recompute_bytes")):
        d = run_dir + "-" + policy
        pacc = EventAccumulator(os.path.join(d, "tb"), size_guidance={"scalars": 0})
        pacc.Reload()
        got = {e.step: e.value for e in pacc.Scalars("memory/" + key)}
        want = {l["step"]: f32(l[key]) for l in metrics_lines(d) if "eval" not in l}
        check(got == want and all(v > 0 for v in got.values()),
              "plan.policy=%s: memory/%s = metrics.jsonl, > 0 (%s)" % (policy, key, got))
    # a crash inside a record: the earlier records stay readable
    tmp = tempfile.mkdtemp(prefix="qc-tb-")
    try:
        newest = sorted(f for f in os.listdir(os.path.join(run_dir, "tb")))[-1]
        with open(os.path.join(run_dir, "tb", newest), "rb") as f:
            data = f.read()
        with open(os.path.join(tmp, newest), "wb") as f:
            f.write(data[:-7])
        cut = EventAccumulator(tmp, size_guidance={"scalars": 0})
        cut.Reload()
        check([e.step for e in cut.Scalars("train/loss")] == [3, 4],
              "a file cut inside its last record keeps every earlier record")
    finally:
        shutil.rmtree(tmp)


def main():
    mode = sys.argv[1]
    if mode == "setup":
        setup(sys.argv[2], sys.argv[3])
    elif mode == "browser":
        browser(sys.argv[2], sys.argv[3])
    elif mode == "tensorboard":
        tensorboard(sys.argv[2])
    else:
        fail("unknown mode " + mode)
    print("all checks passed")


if __name__ == "__main__":
    main()
