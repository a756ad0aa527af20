#!/usr/bin/env python3
"""The metastable failure (issue 37; `make metastable`; docs/BENCHMARKS.md 13): an overload
trigger that ends while the system stays down, because the retries it provoked keep it
overloaded ("Metastable Failures in the Wild", OSDI'22), reproduced with real processes, and
what each retry strategy does to it.

    bench/metastable.py --build=build --out=build/metastable           # the whole sweep
    bench/metastable.py --cells=0.30x10 --strategies=none,caps --fleet-sizes=  # one cell
    bench/metastable.py --cells=0.30x10 --strategies=none,caps,fleet --series=immediate \\
        --fleet-sizes= --languages=cpp,go,js,python  # the fleet budget in every language
    bench/metastable.py --check                                         # the ctest (< 60 s)

Processes, all on loopback:
  - the backend (build/bench/metastable_backend): K workers, S ms of service each (a sleep), a
    FIFO queue holding --queue-seconds of work, work done for callers that gave up; capacity
    C = K * 1000 / S calls/s. The trigger: its capacity cut to a fraction F for D seconds
    (--trigger, from the run's epoch), --warmup seconds into the run.
  - W worker processes (build/bench/metastable_worker), open loop, together --load x C logical
    calls/s, each attempt with a --timeout-ms deadline and up to 4 resends, either at once
    (immediate, as in the OSDI'22 artifact) or after the project's full-jitter backoff (jitter).
  - for the fleet budget: one real retry-budget-server (policy below), a fresh tenant per run.

Strategies: none (one attempt per call: the floor), caps (4 resends per call), process (gRPC
retryThrottling per worker process: max_tokens 100, token_ratio 0.1), fleet (the fleet budget:
TryAcquire per resend, RecordSuccess per succeeded call, on the real C++ client library).

Measured each second (rows): offered calls, goodput (calls that succeeded, each attempt within its
deadline), failed calls, the backend's attempts (arrivals) and resends, the workers' resends and
denied resends, the backend's queue length and wasted work (served after the caller gave up).
Recovery time: from the trigger's end until goodput stays >= 90% of offered for 5 s (the start of
the first such 5 s); null (metastable) when that does not start within --observe (60) s.
Metastable per the issue's target: goodput < 20% of offered in each of the 30 s after the trigger.

Output in --out: metastable.jsonl (one line per run, with its rows), metastable_summary.json
(the table and the targets), metastable.md (the markdown tables), and with --plots=DIR the PNGs
(gnuplot-nox): metastable_timeseries.png (goodput and queue over time per strategy in one
metastable cell) and metastable_recovery.png (recovery time over the sweep).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fleet budget's tenant policy: the server's documented default, stated here.
FLEET_POLICY = {"capacity": 100, "refill_per_second": 1, "success_credit": 0.1}

STRATEGIES = ["none", "caps", "process", "fleet"]
GOOD = 0.9        # goodput >= 90% of offered ...
GOOD_FOR = 5      # ... for 5 s: recovered
DOWN = 0.2        # goodput < 20% of offered ...
DOWN_FOR = 30     # ... for 30 s after the trigger: metastable (the target)


class Proc:
    """A child process whose stdout lines a thread collects; stdin a pipe (closing it stops it)."""

    def __init__(self, argv, name, env=None):
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        self.err = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.strip())
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # end of output
            self.cv.notify_all()

    def _read_err(self):
        for line in self.p.stderr:
            self.err.append(line.rstrip())

    def first_line(self, timeout):
        end = time.time() + timeout
        with self.cv:
            while not self.lines:
                if not self.cv.wait(max(0.0, end - time.time())):
                    break
            if not self.lines or self.lines[0] is None:
                raise RuntimeError(f"{self.name} said nothing within {timeout} s "
                                   f"(exit {self.p.poll()}): {' / '.join(self.err[-3:])}")
            return self.lines[0]

    def records(self):
        with self.cv:
            out = []
            for line in self.lines:
                if line and line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
            return out

    def stop(self, timeout):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


class BudgetServer:
    """One retry-budget-server on 127.0.0.1:0 with FLEET_POLICY as its default policy."""

    def __init__(self, binary, directory):
        policy = os.path.join(directory, "policy.textproto")
        with open(policy, "w") as f:
            f.write("default_policy { capacity: %g refill_per_second: %g success_credit: %g }\n"
                    % (FLEET_POLICY["capacity"], FLEET_POLICY["refill_per_second"],
                       FLEET_POLICY["success_credit"]))
        port_file = os.path.join(directory, "budget.port")
        self.log = open(os.path.join(directory, "budget-server.log"), "w")
        self.p = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                                   f"--policy={policy}", "--metrics_listen="],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        end = time.time() + 20
        while time.time() < end:
            if os.path.exists(port_file) and open(port_file).read().strip():
                self.target = "127.0.0.1:" + open(port_file).read().strip()
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"retry-budget-server did not start (see {self.log.name})")

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# The measures
# ---------------------------------------------------------------------------------------------

def merge_rows(backend, workers, horizon):
    """Per second t in [0, horizon): the fleet's and the backend's counts, summed."""
    rows = {t: {"t": t, "offered": 0, "goodput": 0, "failed": 0, "worker_attempts": 0,
                "worker_retries": 0, "denied": 0, "attempts": 0, "resends": 0, "rejected": 0,
                "completions": 0, "wasted": 0, "queue": 0, "fraction": 1.0}
            for t in range(horizon)}
    for recs in workers:
        for r in recs:
            t = r.get("t")
            if t is None or t not in rows:
                continue
            row = rows[t]
            row["offered"] += r["offered"]
            row["goodput"] += r["ok"]
            row["failed"] += r["failed"]
            row["worker_attempts"] += r["attempts"]
            row["worker_retries"] += r["retries"]
            row["denied"] += r["denied"]
    for r in backend:
        t = r.get("t")
        if t is None or t not in rows:
            continue
        row = rows[t]
        row["attempts"] += r["arrivals"]
        row["resends"] += r["resends"]
        row["rejected"] += r["rejected"]
        row["completions"] += r["completions"]
        row["wasted"] += r["wasted"]
        row["queue"] = r["queue"]
        row["fraction"] = r["fraction"]
    return [rows[t] for t in range(horizon)]


def trim_tail(rows, rate):
    """The rows without the seconds at the end in which the fleet was stopping (fewer than 90%
    of the calls due were offered)."""
    last = len(rows)
    while last > 0 and rows[last - 1]["offered"] < 0.9 * rate:
        last -= 1
    return rows[:last]


def good(row):
    return row["offered"] > 0 and row["goodput"] >= GOOD * row["offered"]


def recovery_time(rows, trigger_end, observe):
    """Seconds from the trigger's end to the first second s (<= trigger_end + observe) that
    starts GOOD_FOR seconds of goodput >= 90% of offered; None if there is none (metastable), or
    if the rows end before it can be known."""
    for s in range(trigger_end, trigger_end + observe + 1):
        window = rows[s:s + GOOD_FOR]
        if len(window) < GOOD_FOR:
            return None
        if all(good(r) for r in window):
            return s - trigger_end
    return None


def stays_down(rows, trigger_end):
    """The issue's metastable target: goodput < 20% of offered in each of the 30 s after the
    trigger's end."""
    window = rows[trigger_end:trigger_end + DOWN_FOR]
    return len(window) == DOWN_FOR and all(
        r["offered"] > 0 and r["goodput"] < DOWN * r["offered"] for r in window)


def sums(rows, a, b):
    keys = ("offered", "goodput", "attempts", "resends", "worker_attempts", "worker_retries",
            "denied", "wasted", "rejected")
    return {k: sum(r[k] for r in rows[a:b]) for k in keys}


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------

def worker_argv(cfg, language, target, rate, phase, epoch_ms, horizon, strategy, backoff, seed,
                budget, tenant):
    """The command line (and environment) of one worker: the C++ worker for every strategy;
    the Go, Node and Python workers' open-loop modes for the fleet budget, immediate resends."""
    if language == "cpp":
        argv = [cfg.worker_bin, f"--target={target}", f"--rate={rate}", f"--phase={phase}",
                f"--epoch_unix_ms={epoch_ms}", f"--duration={horizon}s",
                f"--timeout_ms={cfg.timeout_ms}", "--max_attempts=5", f"--strategy={strategy}",
                f"--backoff={backoff}", f"--seed={seed}"]
        if strategy == "fleet":
            argv += [f"--budget_target={budget.target}", f"--tenant={tenant}"]
        return argv, None
    if strategy != "fleet" or backoff != "immediate":
        raise ValueError(f"the {language} worker runs the fleet budget with immediate resends "
                         f"only, not {strategy}/{backoff}")
    flags = [f"--backend={target}", f"--server={budget.target}", f"--tenant={tenant}",
             f"--rate={rate}", f"--phase={phase}", f"--epoch-ms={epoch_ms}",
             f"--duration={horizon}", f"--timeout-ms={cfg.timeout_ms}", "--max-attempts=5"]
    if language == "go":
        return [cfg.go_worker_bin] + flags, None
    if language == "js":
        return [cfg.node, cfg.js_worker] + flags, None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(cfg.build, "client/python/gen"), os.path.join(REPO, "client/python")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return [cfg.python, os.path.join(REPO, "tools/fleet/open_loop_worker.py")] + flags, env


class LateStart(RuntimeError):
    """The fleet was not ready at the run's epoch."""


def run_one(cfg, strategy, backoff, workers, fraction, duration, budget, tenant, full=False,
            observe=None):
    """run_one_try, tried again with twice the start margin (at most 3 times) when the fleet was
    not ready in time (a busy machine)."""
    margin = 3.0 + 0.1 * workers
    for attempt in range(3):
        try:
            return run_one_try(cfg, strategy, backoff, workers, fraction, duration, budget,
                               f"{tenant}-{attempt}" if attempt else tenant, full, observe,
                               margin)
        except LateStart as e:
            print(f"metastable: {e}; again with a {2 * margin:.1f} s margin", flush=True)
            margin *= 2
    raise RuntimeError("the fleet was never ready in time")


def run_one_try(cfg, strategy, backoff, workers, fraction, duration, budget, tenant, full,
                observe, margin):
    """One run: the backend, W workers, the trigger F for D s after cfg.warmup s. Stops early
    once recovered (unless `full`), else after the trigger's end + observe (default
    cfg.observe) + GOOD_FOR s."""
    capacity = cfg.backend_workers * 1000.0 / cfg.service_ms
    rate = cfg.load * capacity
    trigger_end = cfg.warmup + duration
    horizon = trigger_end + (cfg.observe if observe is None else observe) + GOOD_FOR + 1
    epoch_ms = int((time.time() + margin) * 1000)
    procs = []
    try:
        backend = Proc([cfg.backend_bin, f"--workers={cfg.backend_workers}",
                        f"--service_ms={cfg.service_ms}",
                        f"--max_queue={int(cfg.queue_seconds * capacity)}",
                        f"--epoch_unix_ms={epoch_ms}",
                        f"--trigger={fraction}@{cfg.warmup}s+{duration}s"], "backend")
        procs.append(backend)
        port = json.loads(backend.first_line(10))["port"]
        languages = cfg.languages if strategy == "fleet" else ["cpp"]
        for i in range(workers):
            language = languages[i % len(languages)]
            argv, env = worker_argv(cfg, language, f"127.0.0.1:{port}", rate / workers,
                                    i / workers, epoch_ms, horizon, strategy, backoff, i + 1,
                                    budget, tenant)
            procs.append(Proc(argv, f"{language} worker {i}", env))
        for w in procs[1:]:
            try:
                line = w.first_line(max(1.0, epoch_ms / 1000.0 - time.time()))
            except RuntimeError:
                if w.p.poll() is None:
                    raise LateStart(f"{w.name} was not ready at the epoch")
                raise
            if line != '{"ready":true}':
                raise RuntimeError(f"{w.name}: {line}")
        late = time.time() - epoch_ms / 1000.0
        if late > 0:
            raise LateStart(f"the fleet was ready {late:.2f} s after the epoch")
        # Watch: stop once recovered and GOOD_FOR more seconds are in (the workers print a
        # second 2 s after it ends).
        stop_at = epoch_ms / 1000.0 + horizon
        while time.time() < stop_at + 1:
            time.sleep(0.5)
            if full:
                continue
            now_t = int(time.time() - epoch_ms / 1000.0) - 3
            if now_t <= trigger_end + GOOD_FOR:
                continue
            rows = merge_rows(backend.records(), [w.records() for w in procs[1:]], now_t)
            rec = recovery_time(rows, trigger_end, cfg.observe)
            if rec is not None:
                break
        for w in procs[1:]:
            w.stop(30 + 5 * cfg.timeout_ms / 1000.0)
        backend.stop(10)
        elapsed = int(time.time() - epoch_ms / 1000.0)
        worker_recs = [w.records() for w in procs[1:]]
        totals = [r["totals"] for recs in worker_recs for r in recs if "totals" in r]
        if len(totals) != workers:
            raise RuntimeError(f"{workers - len(totals)} workers ended without totals: "
                               + " / ".join(e for w in procs[1:] for e in w.err[-2:]))
        rows = merge_rows(backend.records(), worker_recs, min(elapsed, horizon))
        rows = trim_tail(rows, rate)
        rec = recovery_time(rows, trigger_end, cfg.observe)
        result = {
            "strategy": strategy, "backoff": backoff, "workers": workers,
            "fraction": fraction, "duration": duration, "trigger_start": cfg.warmup,
            "trigger_end": trigger_end, "recovery_s": rec, "stays_down_30s": stays_down(
                rows, trigger_end),
            "before": sums(rows, 0, cfg.warmup),
            "trigger": sums(rows, cfg.warmup, trigger_end),
            "after": sums(rows, trigger_end, len(rows)),
            "totals": {k: sum(t[k] for t in totals) for k in totals[0]},
            "backend_totals": next((r["totals"] for r in backend.records() if "totals" in r), {}),
            "max_queue": max((r["queue"] for r in rows), default=0),
            "rows": rows,
        }
        if strategy == "fleet":
            result["tenant"] = tenant
            result["languages"] = cfg.languages
        return result
    finally:
        for p in procs:
            p.kill()


# ---------------------------------------------------------------------------------------------
# The sweep, the table, the plots
# ---------------------------------------------------------------------------------------------

def label(r):
    return r["strategy"] if r["strategy"] == "none" else f'{r["strategy"]}/{r["backoff"]}'


def fmt_rec(v):
    return "stays down" if v is None else f"{v} s"


def judge(results, cells, fleet_sizes, main_w):
    """The issue's targets, from the runs of this one sweep."""
    by = {}
    for r in results:
        by[(r["fraction"], r["duration"], r["workers"], label(r))] = r
    out = {"caps_metastable_cells": [], "caps_down_cells": [], "fleet_within_floor": [],
           "process_by_w": []}
    for f, d in cells:
        floor = by.get((f, d, main_w, "none"))
        for series in ("immediate", "jitter"):
            caps = by.get((f, d, main_w, f"caps/{series}"))
            # Caps "stay down": not recovered within the observation; the stricter
            # "metastable" adds goodput < 20% of offered in each of the 30 s after the trigger.
            if caps is None or not (caps["stays_down_30s"] or caps["recovery_s"] is None):
                continue
            out["caps_down_cells"].append({"cell": f"{f}x{d}", "series": series})
            if caps["stays_down_30s"]:
                out["caps_metastable_cells"].append({"cell": f"{f}x{d}", "series": series})
            for w in sorted({main_w} | set(fleet_sizes)):
                fl = by.get((f, d, w, f"fleet/{series}"))
                fw = by.get((f, d, w, "none")) or floor
                if fl is None or fw is None:
                    continue
                limit = None if fw["recovery_s"] is None else 1.5 * fw["recovery_s"] + 1
                ok = (fl["recovery_s"] is not None and limit is not None
                      and fl["recovery_s"] <= limit)
                out["fleet_within_floor"].append({
                    "cell": f"{f}x{d}", "series": series, "workers": w,
                    "floor_s": fw["recovery_s"], "limit_s": limit,
                    "fleet_s": fl["recovery_s"], "met": ok})
    for r in results:
        if r["strategy"] == "process":
            out["process_by_w"].append({"cell": f'{r["fraction"]}x{r["duration"]}',
                                        "series": r["backoff"], "workers": r["workers"],
                                        "recovery_s": r["recovery_s"]})
    out["met"] = {
        "caps_stay_down_somewhere": bool(out["caps_metastable_cells"]),
        "fleet_within_1.5x_floor_plus_1s_everywhere_caps_stay_down":
            bool(out["fleet_within_floor"]) and all(x["met"] for x in out["fleet_within_floor"]),
    }
    return out


def markdown(cfg, results, cells, main_w, targets):
    lines = []
    capacity = cfg.backend_workers * 1000.0 / cfg.service_ms
    lines.append(f"Backend: K={cfg.backend_workers} workers x S={cfg.service_ms} ms = capacity "
                 f"{capacity:.0f} calls/s, queue {cfg.queue_seconds} s of work; offered "
                 f"{cfg.load} x capacity = {cfg.load * capacity:.0f} calls/s open loop; timeout "
                 f"{cfg.timeout_ms} ms per attempt, up to 4 resends; trigger {cfg.warmup} s into "
                 f"the run. Fleet budget policy: capacity {FLEET_POLICY['capacity']}, refill "
                 f"{FLEET_POLICY['refill_per_second']}/s, success credit "
                 f"{FLEET_POLICY['success_credit']}.")
    lines.append("")
    labels = []
    for r in results:
        if r["workers"] == main_w and label(r) not in labels:
            labels.append(label(r))
    lines.append(f"Recovery time after the trigger ends (W = {main_w}; 'stays down' = not "
                 f"within {cfg.observe} s):")
    lines.append("")
    lines.append("| trigger | " + " | ".join(labels) + " |")
    lines.append("|---|" + "---|" * len(labels))
    for f, d in cells:
        cellr = {label(r): r for r in results
                 if r["fraction"] == f and r["duration"] == d and r["workers"] == main_w}
        if not cellr:
            continue
        vals = []
        for lab in labels:
            r = cellr.get(lab)
            vals.append("-" if r is None else fmt_rec(r["recovery_s"]))
        lines.append(f"| {f} x {d} s | " + " | ".join(vals) + " |")
    ws = sorted({r["workers"] for r in results if r["workers"] != main_w} | {main_w})
    wres = [r for r in results if r.get("w_sweep")]
    if wres:
        lines.append("")
        lines.append("Fleet size W, one cell (" + f'{wres[0]["fraction"]} x {wres[0]["duration"]} s'
                     + "), recovery time:")
        lines.append("")
        wl = []
        for r in wres:
            if label(r) not in wl:
                wl.append(label(r))
        lines.append("| W | " + " | ".join(wl) + " |")
        lines.append("|---|" + "---|" * len(wl))
        for w in ws:
            rr = {label(r): r for r in wres if r["workers"] == w}
            if rr:
                lines.append(f"| {w} | " + " | ".join(
                    "-" if rr.get(l) is None else fmt_rec(rr[l]["recovery_s"]) for l in wl) + " |")
    down = {x["cell"] for x in targets["caps_down_cells"]}
    for f, d in cells:
        if f"{f}x{d}" not in down:
            continue
        lines.append("")
        lines.append(f"Cell {f} x {d} s (W = {main_w}): attempts the backend saw per offered "
                     "call, during the trigger and in the 30 s after it; resends refused; the "
                     "longest queue; work served for callers that had given up:")
        lines.append("")
        lines.append("| strategy | recovery | attempts/offered, trigger | attempts/offered, 30 s "
                     "after | resends refused | max queue | wasted |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in results:
            if (r["fraction"], r["duration"], r["workers"]) != (f, d, main_w) or r.get("w_sweep"):
                continue
            after = sums(r["rows"], r["trigger_end"], r["trigger_end"] + DOWN_FOR)
            lines.append(
                f'| {label(r)} | {fmt_rec(r["recovery_s"])} | '
                f'{r["trigger"]["attempts"] / max(1, r["trigger"]["offered"]):.2f} | '
                f'{after["attempts"] / max(1, after["offered"]):.2f} | '
                f'{r["totals"]["denied"]} | {r["max_queue"]} | '
                f'{r.get("backend_totals", {}).get("wasted", "-")} |')
    lines.append("")
    lines.append("Targets:")
    lines.append("")
    for k, v in targets["met"].items():
        lines.append(f"- {k}: {'met' if v else 'NOT met'}")
    for x in targets["fleet_within_floor"]:
        lines.append(f'- {x["cell"]} {x["series"]} W={x["workers"]}: fleet {fmt_rec(x["fleet_s"])}'
                     f', floor {fmt_rec(x["floor_s"])}, limit '
                     f'{"-" if x["limit_s"] is None else "%.1f s" % x["limit_s"]}: '
                     f'{"met" if x["met"] else "NOT met"}')
    return "\n".join(lines) + "\n"


def plots(results, cells, main_w, plot_dir, work_dir, observe, prefer=()):
    """metastable_timeseries.png: goodput/offered and queue per strategy in one metastable cell
    (the first of `prefer`, the cells run to the end, where caps stay down; else the first such
    cell); metastable_recovery.png: recovery time per strategy over the sweep's cells."""
    os.makedirs(plot_dir, exist_ok=True)
    meta = None
    for f, d in list(prefer) + list(cells):
        for r in results:
            if (r["fraction"], r["duration"], r["workers"]) == (f, d, main_w) and \
                    r["strategy"] == "caps" and r["stays_down_30s"]:
                meta = (f, d)
                break
        if meta:
            break
    gp = os.path.join(work_dir, "metastable.gp")
    with open(gp, "w") as g:
        g.write('set terminal pngcairo size 1100,800 font ",9"\nset grid\nset key outside right\n')
        if meta:
            f, d = meta
            runs = [r for r in results if (r["fraction"], r["duration"], r["workers"]) ==
                    (f, d, main_w) and not r.get("w_sweep")]
            files = []
            for r in runs:
                dat = os.path.join(work_dir, f"ts_{label(r).replace('/', '_')}.dat")
                with open(dat, "w") as o:
                    for row in r["rows"]:
                        o.write(f'{row["t"]} {row["goodput"]} {row["offered"]} {row["queue"]} '
                                f'{row["attempts"]}\n')
                files.append((dat, label(r)))
            ts = os.path.join(plot_dir, "metastable_timeseries.png")
            g.write(f'set output "{ts}"\nset multiplot layout 2,1\n')
            g.write(f'set object 1 rect from {runs[0]["trigger_start"]},graph 0 to '
                    f'{runs[0]["trigger_end"]},graph 1 fc rgb "#ffd0d0" fs solid 0.5 noborder '
                    'behind\n')
            g.write(f'set title "Goodput per second, trigger: capacity x {f} for {d} s (red), '
                    f'W = {main_w}"\nset ylabel "calls / s"\n')
            g.write("plot " + ", ".join(f'"{dat}" using 1:2 with lines lw 2 title "{lab}"'
                                        for dat, lab in files)
                    + f', "{files[0][0]}" using 1:3 with lines lc rgb "black" dt 3 '
                    'title "offered"\n')
            g.write('set title "Backend queue length (requests)"\nset ylabel "queue"\n'
                    'set xlabel "seconds"\n')
            g.write("plot " + ", ".join(f'"{dat}" using 1:4 with lines lw 2 title "{lab}"'
                                        for dat, lab in files) + "\n")
            g.write("unset multiplot\nunset object 1\nunset xlabel\n")
        # Recovery over the sweep: one cluster of bars per cell; stays down drawn at observe + 5.
        labels = []
        for r in results:
            if r["workers"] == main_w and not r.get("w_sweep") and label(r) not in labels:
                labels.append(label(r))
        dat = os.path.join(work_dir, "recovery.dat")
        with open(dat, "w") as o:
            o.write("cell " + " ".join(labels) + "\n")
            for f, d in cells:
                cellr = {label(r): r for r in results if (r["fraction"], r["duration"],
                         r["workers"]) == (f, d, main_w) and not r.get("w_sweep")}
                if not cellr:
                    continue
                vals = []
                for lab in labels:
                    r = cellr.get(lab)
                    vals.append("NaN" if r is None else str(
                        observe + 5 if r["recovery_s"] is None else max(0.3, r["recovery_s"])))
                o.write(f'"{f}x{d}s" ' + " ".join(vals) + "\n")
        rec = os.path.join(plot_dir, "metastable_recovery.png")
        g.write(f'set output "{rec}"\nset style data histogram\nset style histogram cluster '
                'gap 1\nset style fill solid 0.8 border -1\nset boxwidth 0.9\n')
        g.write(f'set title "Recovery time after the trigger ends, per cell (capacity fraction x '
                f'seconds), W = {main_w}; a bar at {observe + 5} = stays down (not within '
                f'{observe} s); 0 s drawn as 0.3"\n')
        g.write(f'set ylabel "seconds"\nset yrange [0:{observe + 8}]\nset xtics rotate by -30\n')
        g.write(f'set arrow from graph 0,first {observe} to graph 1,first {observe} nohead '
                'dt 2 lc rgb "red"\n')
        g.write("plot " + ", ".join(
            f'"{dat}" using {i + 2}:xtic(1) title columnheader({i + 2})'
            for i in range(len(labels))) + "\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"metastable: gnuplot failed: {r.stderr.strip()}", file=sys.stderr)


def parse_cells(text):
    cells = []
    for c in text.split(","):
        if not c:
            continue
        f, d = c.split("x")
        cells.append((float(f), int(d)))
    return cells


def sweep(cfg):
    os.makedirs(cfg.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="metastable-")
    budget = BudgetServer(cfg.server_bin, work) if (
        "fleet" in cfg.strategies or cfg.fleet_sizes) else None
    cells = parse_cells(cfg.cells)
    results = []
    jsonl = open(os.path.join(cfg.out, "metastable.jsonl"), "a" if cfg.resume else "w")
    done = set()
    if cfg.resume:
        for line in open(os.path.join(cfg.out, "metastable.jsonl")):
            r = json.loads(line)
            r["rows"] = trim_tail(r["rows"], cfg.load * cfg.backend_workers * 1000.0 /
                                  cfg.service_ms)
            results.append(r)
            done.add((r["fraction"], r["duration"], r["workers"], label(r), bool(r.get("w_sweep"))))
    n = [0]
    lock = threading.Lock()

    def one(strategy, backoff, w, f, d, w_sweep=False):
        key = (f, d, w, strategy if strategy == "none" else f"{strategy}/{backoff}", w_sweep)
        if key in done:
            return
        with lock:
            n[0] += 1
            tenant = f"metastable-{os.getpid()}-{n[0]}"
        t0 = time.time()
        r = run_one(cfg, strategy, backoff, w, f, d, budget, tenant,
                    full=(f, d) in parse_cells(cfg.full_cells))
        r["w_sweep"] = w_sweep
        with lock:
            results.append(r)
            jsonl.write(json.dumps(r) + "\n")
            jsonl.flush()
            print(f"metastable: {f}x{d}s W={w} {label(r)}: recovery {fmt_rec(r['recovery_s'])}"
                  f"{' (down 30 s)' if r['stays_down_30s'] else ''}, attempts/offered during "
                  f"the trigger {r['trigger']['attempts'] / max(1, r['trigger']['offered']):.2f},"
                  f" max queue {r['max_queue']} ({time.time() - t0:.0f} s)", flush=True)

    # Two lists of runs, the cells and the fleet sizes; with --parallel=2 they run side by side
    # (the backend's capacity is sleeps, not the machine's cores).
    cell_runs = [(s, b, cfg.workers, f, d, False) for f, d in cells for s in cfg.strategies
                 for b in (["immediate"] if s == "none" else cfg.series)]
    w_runs = []
    if cfg.fleet_sizes:
        f, d = parse_cells(cfg.w_cell)[0]
        w_runs = [(s, b, w, f, d, True) for w in cfg.fleet_sizes
                  for s in ("none", "process", "fleet")
                  for b in (["immediate"] if s == "none" else cfg.series)]
    errors = []

    def run_list(runs):
        try:
            for r in runs:
                one(*r)
        except Exception as e:  # reported after both lists end
            errors.append(e)

    try:
        if cfg.parallel > 1:
            threads = [threading.Thread(target=run_list, args=(x,)) for x in (cell_runs, w_runs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            run_list(cell_runs + w_runs)
    finally:
        jsonl.close()
        if budget:
            budget.close()
    if errors:
        raise errors[0]
    targets = judge(results, cells, cfg.fleet_sizes, cfg.workers)
    table = markdown(cfg, results, cells, cfg.workers, targets)
    summary = {
        "bench": "metastable",
        "config": {k: getattr(cfg, k) for k in ("backend_workers", "service_ms", "queue_seconds",
                                                  "load", "timeout_ms", "warmup", "observe",
                                                  "workers", "cells", "fleet_sizes", "w_cell",
                                                  "series")},
        "capacity": cfg.backend_workers * 1000.0 / cfg.service_ms,
        "fleet_policy": FLEET_POLICY,
        "languages": cfg.languages,
        "runs": [{k: v for k, v in r.items() if k != "rows"} for r in results],
        "targets": targets,
    }
    with open(os.path.join(cfg.out, "metastable_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(cfg.out, "metastable.md"), "w") as f:
        f.write(table)
    print(table)
    if cfg.plots:
        plots(results, cells, cfg.workers, cfg.plots, work, cfg.observe,
              prefer=parse_cells(cfg.full_cells))
    return 0


# ---------------------------------------------------------------------------------------------
# The ctest: one short cell, real processes, outcomes that cannot be faked
# ---------------------------------------------------------------------------------------------

def check_admin(cfg, expect):
    """The SetCapacity RPC (the backend's client mode): a bad fraction is refused, a good one is
    in force at the next stats line and ends after its duration."""
    backend = Proc([cfg.backend_bin, "--workers=2", "--service_ms=10"], "backend")
    try:
        target = "127.0.0.1:%d" % json.loads(backend.first_line(10))["port"]
        bad = subprocess.run([cfg.backend_bin, f"--set_capacity={target}", "--fraction=1.5"],
                             capture_output=True, text=True, timeout=20)
        expect(bad.returncode != 0 and "fraction 1.5" in bad.stderr,
               f"SetCapacity(1.5) refused naming the value: {bad.returncode} {bad.stderr.strip()}")
        ok = subprocess.run([cfg.backend_bin, f"--set_capacity={target}", "--fraction=0.25",
                             "--duration_ms=1500"], capture_output=True, text=True, timeout=20)
        expect(ok.returncode == 0, f"SetCapacity(0.25, 1.5 s) accepted: {ok.stderr.strip()}")
        seen = []
        end = time.time() + 5
        while time.time() < end and not (0.25 in seen and seen[-1] == 1.0):
            time.sleep(0.2)
            seen = [r["fraction"] for r in backend.records() if "fraction" in r]
        expect(0.25 in seen and seen[-1] == 1.0,
               f"the cut was in force, then ended: fractions {seen}")
    finally:
        backend.stop(10)


def check(cfg):
    """A short cell: no retries, then caps (immediate). Checks the report's shape; that with no
    retries the backend saw one attempt per offered call (and no resend); that with caps
    the backend saw more attempts than offered calls during the trigger, the resends among them;
    that the backend's queue grew during the trigger and, with no retries, drained after it; and
    the SetCapacity RPC."""
    cfg.warmup, cfg.observe, cfg.timeout_ms = 3, 10, 1000
    failures = []
    passed = [0]

    def expect(cond, what):
        if cond:
            passed[0] += 1
        else:
            failures.append(what)
            print(f"FAILED: {what}", flush=True)

    check_admin(cfg, expect)
    f, d = 0.3, 3
    floor = run_one(cfg, "none", "immediate", 2, f, d, None, "")
    for k in ("strategy", "recovery_s", "stays_down_30s", "before", "trigger", "after", "rows"):
        expect(k in floor, f"the report has {k}")
    expect(all(set(r) >= {"t", "offered", "goodput", "attempts", "resends", "queue"}
               for r in floor["rows"]), "every row has t, offered, goodput, attempts, resends, "
           "queue")
    expect(floor["totals"]["offered"] > 0, "calls were offered")
    # Exact but for attempts that time out before they reach the backend (none on a quiet
    # machine; a few on one whose cores are taken by other jobs).
    arrived, offered = floor["backend_totals"].get("arrivals", 0), floor["totals"]["offered"]
    expect(0.99 * offered <= arrived <= offered,
           f"no retries: backend attempts {arrived} == offered calls {offered} (>= 99%)")
    expect(floor["totals"]["retries"] == 0 and floor["trigger"]["resends"] == 0,
           "no retries: no resend sent or seen")
    expect(max(r["queue"] for r in floor["rows"][cfg.warmup:floor["trigger_end"] + 1]) > 0,
           "the queue grew during the trigger")
    # Not the recovery time itself (5 s above 90% of offered reads the machine's scheduling too):
    # that the queue, which only no-retry traffic fed, drained once the trigger ended.
    expect(floor["rows"][-1]["queue"] < 0.1 * floor["max_queue"],
           f"no retries: the queue drained after the trigger (max {floor['max_queue']}, at the "
           f"end {floor['rows'][-1]['queue']}; recovery {floor['recovery_s']} s)")
    caps = run_one(cfg, "caps", "immediate", 2, f, d, None, "", observe=2)
    trig = sums(caps["rows"], cfg.warmup, caps["trigger_end"] + 2)
    expect(trig["attempts"] > trig["offered"],
           f"caps: backend attempts {trig['attempts']} > offered {trig['offered']} during the "
           "trigger")
    expect(trig["resends"] > 0 and caps["totals"]["retries"] > 0, "caps: resends were sent "
           "and seen")
    arrived, sent = caps["backend_totals"].get("arrivals", 0), caps["totals"]["attempts"]
    expect(0.99 * sent <= arrived <= sent,
           f"caps: backend attempts {arrived} == the workers' attempts {sent} (>= 99%)")
    print(json.dumps({k: v for k, v in floor.items() if k != "rows"}))
    print(json.dumps({k: v for k, v in caps.items() if k != "rows"}))
    print(f"{passed[0]} passed, {len(failures)} failed")
    return 0 if not failures else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--backend-bin", default=None, help="default BUILD/bench/metastable_backend")
    ap.add_argument("--worker-bin", default=None, help="default BUILD/bench/metastable_worker")
    ap.add_argument("--server-bin", default=None,
                    help="default BUILD/server/retry-budget-server")
    ap.add_argument("--out", default=None, help="results directory (default BUILD/metastable)")
    ap.add_argument("--plots", default=None, help="directory for the PNGs (e.g. docs)")
    ap.add_argument("--backend-workers", type=int, default=12, help="K")
    ap.add_argument("--service-ms", type=float, default=40, help="S")
    ap.add_argument("--queue-seconds", type=float, default=30)
    ap.add_argument("--load", type=float, default=0.75, help="offered / capacity")
    ap.add_argument("--timeout-ms", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--observe", type=int, default=60)
    ap.add_argument("--workers", type=int, default=16, help="W of the sweep")
    ap.add_argument("--cells", default="0.45x4,0.45x7,0.45x10,0.40x4,0.40x7,0.40x10,"
                    "0.30x4,0.30x7,0.30x10", help="FRACTIONxSECONDS,...")
    ap.add_argument("--strategies", default="none,caps,process,fleet")
    ap.add_argument("--series", default="immediate,jitter")
    ap.add_argument("--fleet-sizes", default="4,16,32")
    ap.add_argument("--w-cell", default="0.30x10")
    ap.add_argument("--full-cells", default="0.30x10",
                    help="cells run to the end even once recovered (the time-series plot's)")
    ap.add_argument("--parallel", type=int, default=1, choices=(1, 2),
                    help="2: the cells and the fleet sizes side by side")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in OUT")
    ap.add_argument("--check", action="store_true", help="the short end-to-end test")
    ap.add_argument("--languages", default="cpp",
                    help="the fleet budget's workers, round robin: cpp, go, js, python")
    ap.add_argument("--go-worker-bin", default=None, help="default BUILD/client/go/bin/go_worker")
    ap.add_argument("--node", default="node")
    ap.add_argument("--js-worker", default=os.path.join(REPO, "tools/fleet/js_worker/worker.mjs"))
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="a Python with grpcio (the retrybudget package's dependency)")
    cfg = ap.parse_args()
    cfg.strategies = [s for s in cfg.strategies.split(",") if s]
    for s in cfg.strategies:
        if s not in STRATEGIES:
            ap.error(f"--strategies: '{s}' is not one of {', '.join(STRATEGIES)}")
    cfg.series = [s for s in cfg.series.split(",") if s]
    for s in cfg.series:
        if s not in ("immediate", "jitter"):
            ap.error(f"--series: '{s}' is not one of immediate, jitter")
    cfg.fleet_sizes = [int(w) for w in cfg.fleet_sizes.split(",") if w]
    cfg.languages = [x for x in cfg.languages.split(",") if x]
    for x in cfg.languages:
        if x not in ("cpp", "go", "js", "python"):
            ap.error(f"--languages: '{x}' is not one of cpp, go, js, python")
    if cfg.languages != ["cpp"] and "jitter" in cfg.series:
        ap.error("--languages other than cpp: the Go, Node and Python workers resend at once "
                 "only (--series=immediate)")
    cfg.go_worker_bin = cfg.go_worker_bin or os.path.join(cfg.build, "client/go/bin/go_worker")
    cfg.backend_bin = cfg.backend_bin or os.path.join(cfg.build, "bench/metastable_backend")
    cfg.worker_bin = cfg.worker_bin or os.path.join(cfg.build, "bench/metastable_worker")
    cfg.server_bin = cfg.server_bin or os.path.join(cfg.build, "server/retry-budget-server")
    needed = [cfg.backend_bin, cfg.worker_bin] + ([] if cfg.check else [cfg.server_bin])
    for b in needed:
        if not os.access(b, os.X_OK):
            ap.error(f"{b} is missing: cmake --build {cfg.build} --target metastable_backend "
                     "metastable_worker retry-budget-server")
    if cfg.out is None:
        cfg.out = os.path.join(cfg.build, "metastable")
    if cfg.check:
        return check(cfg)
    return sweep(cfg)


if __name__ == "__main__":
    sys.exit(main())
