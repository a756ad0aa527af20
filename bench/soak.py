#!/usr/bin/env python3
"""The soak (issue 38; `make soak`, NOT part of `make test`): a seeded random schedule of every
fault kind the fleet tool has, for N minutes, on loopback, bounded in time, stopping by itself.

    bench/soak.py --build=build --minutes=10 --seed=38   # or: make soak SOAK_MINUTES=10 SOAK_SEED=38
    bench/soak.py --minutes=2 --phases=A               # phase A only (below), 2 minutes
    bench/soak.py --minutes=2 --languages=cpp          # the C++ workers only

It drives the fleet tool (build/tools/fleet/retry-budget-fleet, tools/fleet/README.md); it
launches nothing itself. Every phase runs workers of every language on the same tenants: the
tool's C++ workers and, through its --foreign-workers, Go (build/client/go/bin/go_worker), Node
(tools/fleet/js_worker/worker.mjs, with client/js/node_modules) and Python (mixed_fleet.py
--worker) workers, one of each language per tenant, each worker's spending counted in its
tenant's bound and against the ideal bucket (`--languages` narrows the set). Two phases:

  A. cluster (about 90% of the minutes): 3 servers on a 3-member etcd (`--cluster=3`), 4 tenants,
     4 C++ worker processes of 2 threads and 4 workers of 2 loops per other language, and a random
     `--cluster-chaos` schedule drawn from the seed: kill -9 (the owner of tenant 0, or a
     numbered server) with a restart, SIGSTOP of the owner, SIGTERM of the owner with a restart
     (`term`), rolling restarts, one etcd member restarted or stopped for a while, all of etcd
     stopped, quorum lost (two of three members) and regained, quorum lost with a server
     SIGTERMed and restarted during the outage, and once, in the last third, the etcd leader
     killed for good (`kill-etcd-leader` has no undo: no etcd fault follows it). The faults
     follow each other (gaps of 2-6 s); only the SIGTERM inside a lost quorum overlaps another
     fault. Rolling restarts never overlap an etcd fault (each server's restart waits for it to
     join etcd, up to 10 s, holding the schedule).
  B. dropped and delayed Syncs (about 10%): the fleet tool's fault proxy drops responses,
     duplicates and replays requests (with a kill -9 and restart of the server), then delays
     every response (with a SIGSTOP of the server). ONE server, not the cluster: the proxy sits
     in front of one target, and in a cluster a client syncs each tenant with its owner at the
     address the owner advertises in etcd, past any proxy in front of the target, so it would
     see almost none of them. A proxy per server would need each server to advertise its
     proxy's address, the launcher to start servers that way, and the proxy to carry the admin
     and health services too: not done.

At the end it prints, per phase and tenant, the retries spent against the bound (lease part +
fallback allowance) and against one ideal central bucket, the servers' SIGTERM stop times (max)
and the restart-to-serving times (health SERVING, polled every 50 ms), writes
OUT/soak_summary.json and plots phase A over time (gnuplot-nox) into --plot. Exit 0: every
tenant of every phase within its budget; 1: one was not; 3: a phase gave no verdict (or a
language's worker is missing).
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One workload for A and B: half the attempts fail, a budget funded by refill and successes.
POLICY = {"capacity": 50, "refill": 10, "credit": 0.1, "lease_ttl_ms": 2000}
CLUSTER_LEASE_TTL = 3  # seconds: the servers' --etcd_lease_ttl in A


def policy_flags():
    return [f"--capacity={POLICY['capacity']}", f"--refill={POLICY['refill']}",
            f"--credit={POLICY['credit']}", f"--lease-ttl-ms={POLICY['lease_ttl_ms']}"]


def cluster_schedule(rng, duration, servers=3, etcd_nodes=3):
    """The --cluster-chaos spec of phase A and its windows [(start, end, label)]."""
    kinds = ["kill-owner", "kill-server", "stop-owner", "term-owner", "rolling-restart",
             "stop-etcd", "restart-etcd-member", "stop-etcd-member", "lose-quorum",
             "lose-quorum-term"]
    etcd_kinds = {"stop-etcd", "restart-etcd-member", "stop-etcd-member", "lose-quorum",
                  "lose-quorum-term"}
    ttl = CLUSTER_LEASE_TTL
    specs, windows = [], []
    t = 5.0
    end_limit = duration - 15.0  # everything healed well before the workers' final Syncs
    bag = []
    leader_killed = False
    misses = 0
    while misses < 20:
        if not leader_killed and t > duration * 2 / 3 and t + 4 <= end_limit:
            specs.append(f"kill-etcd-leader@{t:.1f}")
            windows.append((t, t + 4, "kill-etcd-leader"))
            leader_killed = True
            t += 4 + rng.uniform(2, 6)
            continue
        if not bag:
            bag = kinds[:]
            rng.shuffle(bag)
        kind = bag.pop()
        if leader_killed and kind in etcd_kinds:
            misses += 1
            continue
        new = []
        if kind == "kill-owner" or kind == "kill-server":
            d = rng.uniform(2, 5)
            who = "owner" if kind == "kill-owner" else str(rng.randrange(servers))
            new.append(f"kill:{who}@{t:.1f}+{d:.1f}")
            length = max(d, ttl) + 4
        elif kind == "stop-owner":
            d = rng.uniform(1, 4)
            new.append(f"stop:owner@{t:.1f}+{d:.1f}")
            length = d + 4
        elif kind == "term-owner":
            d = rng.uniform(1, 3)
            new.append(f"term:owner@{t:.1f}+{d:.1f}")
            length = d + 4
        elif kind == "rolling-restart":
            gap = rng.uniform(1, 3)
            new.append(f"rolling-restart@{t:.1f}+{gap:.1f}")
            length = servers * (gap + 4)
        elif kind == "stop-etcd":
            d = rng.uniform(2, 8)
            new.append(f"stop-etcd@{t:.1f}+{d:.1f}")
            length = d + 5
        elif kind == "restart-etcd-member":
            new.append(f"restart-etcd:{rng.randrange(etcd_nodes)}@{t:.1f}")
            length = 4
        elif kind == "stop-etcd-member":
            d = rng.uniform(3, 10)
            new.append(f"stop-etcd:{rng.randrange(etcd_nodes)}@{t:.1f}+{d:.1f}")
            length = d + 3
        elif kind == "lose-quorum":
            d = rng.uniform(5, 20)
            new.append(f"lose-quorum@{t:.1f}+{d:.1f}")
            length = d + 6
        else:  # lose-quorum-term: a SIGTERM while etcd has no quorum, restarted during it
            d = rng.uniform(10, 20)
            s = rng.randrange(servers)
            back = rng.uniform(1, d - 5)
            new.append(f"lose-quorum@{t:.1f}+{d:.1f}")
            new.append(f"term:{s}@{t + 2:.1f}+{back:.1f}")
            length = d + 8
        if t + length > end_limit:
            misses += 1
            continue
        specs.extend(new)
        windows.append((t, t + length, kind))
        t += length + rng.uniform(2, 6)
    return ",".join(specs), windows


def run(cmd, timeout, log_path, env=None):
    """Runs `cmd` in its own process group; kills that group past `timeout`. (rc, last line)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                             start_new_session=True, env=env, cwd=REPO)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return None, f"timed out after {timeout} s"
    lines = [line for line in out.splitlines() if line.strip().startswith("{")]
    return p.returncode, (lines[-1] if lines else "")


def ideal_curve(policy, initial, retries, denied, successes, slice_s):
    """Cumulative retries one ideal central bucket allows the same demand, per slice (the
    replay of fleet_report.cc IdealAllowed(), without the refill outside the timeline)."""
    level = min(initial, policy["capacity"])
    allowed, out = 0.0, []
    for i in range(len(retries)):
        available = level + policy["refill"] * slice_s + policy["credit"] * successes[i]
        take = min(retries[i] + denied[i], int(available + 1e-9))
        level = min(policy["capacity"], available - take)
        allowed += take
        out.append(allowed)
    return out


def add(a, b):
    if len(a) < len(b):
        a.extend([0] * (len(b) - len(a)))
    for i, v in enumerate(b):
        a[i] += v


def plot_cluster(report, worker_lines_path, windows, out_dir, png):
    tenants = report.get("tenants") or []
    n = len(tenants)
    series = [{"retries": [], "denied": [], "successes": []} for _ in range(n)]
    slice_s = None
    with open(worker_lines_path) as f:
        for line in f:
            w = json.loads(line)
            i = w.get("tenant_index", 0)
            slice_s = w["timeline_slice_seconds"]
            add(series[i]["retries"], w["retries_timeline"])
            add(series[i]["denied"], w["denied_timeline"])
            add(series[i]["successes"], w["successes_timeline"])
    slices = max(len(s["retries"]) for s in series)
    for s in series:
        for k in s:
            s[k].extend([0] * (slices - len(s[k])))
    cum_ideal, cum_spent, cum_lease = [], [], []
    for i, s in enumerate(series):
        initial = tenants[i]["initial_tokens"]
        cum_ideal.append(ideal_curve(POLICY, initial, s["retries"], s["denied"],
                                     s["successes"], slice_s))
        spent, succ, lease = 0, 0, []
        spent_c = []
        for k in range(slices):
            spent += s["retries"][k]
            succ += s["successes"][k]
            spent_c.append(spent)
            lease.append(initial + POLICY["refill"] * slice_s * (k + 1) + POLICY["credit"] * succ)
        cum_spent.append(spent_c)
        cum_lease.append(lease)
    # Every 5 s (and the last slice): per tenant cumulative spent / ideal and spent / lease bound,
    # and the fleet's rate (retries/s) against the ideal's in that window.
    step = max(1, int(round(5.0 / slice_s)))
    dat = os.path.join(out_dir, "soak_cluster.dat")
    with open(dat, "w") as f:
        f.write("# t (a 5 s window's end)  fleet_retries_per_s  ideal_per_s (in the window)  then "
                "per tenant: spent/ideal spent/lease (cumulative up to t)\n")
        prev_spent = prev_ideal = 0.0
        first = True
        ends = list(range(step - 1, slices, step))
        if ends and slices - 1 - ends[-1] >= step / 2:
            ends.append(slices - 1)
        for k in ends:
            t = (k + 1) * slice_s
            spent = sum(c[k] for c in cum_spent)
            ideal = sum(c[k] for c in cum_ideal)
            width = t - (ends[ends.index(k) - 1] + 1) * slice_s if ends.index(k) else t
            row = [t, (spent - prev_spent) / width, (ideal - prev_ideal) / width]
            prev_spent, prev_ideal = spent, ideal
            for i in range(n):
                row.append(cum_spent[i][k] / cum_ideal[i][k] if cum_ideal[i][k] > 0 else 0)
                row.append(cum_spent[i][k] / cum_lease[i][k] if cum_lease[i][k] > 0 else 0)
            if first:  # fsteps draws a window's rate over [previous t, t]: the first from 0
                f.write(" ".join(f"{v:.4f}" for v in [0.0] + row[1:]) + "\n")
                first = False
            f.write(" ".join(f"{v:.4f}" for v in row) + "\n")
    gp = os.path.join(out_dir, "soak_cluster.gp")
    with open(gp, "w") as f:
        f.write('set terminal pngcairo size 1100,900 font ",9"\n')
        f.write(f'set output "{png}"\nset multiplot layout 3,1\nset grid\nset key outside right\n')
        f.write(f'set xrange [0:{slices * slice_s:.1f}]\n')
        for k, (a, b, label) in enumerate(windows):
            color = "#ffd0d0" if ("etcd" in label or "quorum" in label) else "#d0d8ff"
            f.write(f'set object {k + 1} rect from {a:.1f},graph 0 to {b:.1f},graph 1 '
                    f'fc rgb "{color}" fs solid 0.5 noborder behind\n')
        f.write('set title "Phase A: the fleet\'s retries per second (5 s windows) and one ideal '
                'central bucket\'s, same demand (red: etcd faults, blue: server faults)"\n')
        f.write('set ylabel "retries / s"\n')
        f.write(f'plot "{dat}" using 1:2 with fsteps lw 2 title "fleet", '
                f'"" using 1:3 with fsteps lw 1 dt 2 title "ideal bucket"\n')
        f.write('set title "Per tenant: retries spent / what the ideal bucket allowed, cumulative"\n')
        f.write('set ylabel "spent / ideal"\nset yrange [0.5:1.3]\n')
        f.write("plot " + ", ".join(
            f'"{dat}" using 1:{4 + 2 * i} with lines title "{tenants[i]["tenant"]}"'
            for i in range(n)) + "\n")
        f.write('set title "Per tenant: retries spent / the lease part of the bound (initial + '
                'refill*t + credit*successes), cumulative; the fallback allowance comes on top"\n')
        f.write('set ylabel "spent / lease bound"\nset yrange [0:1.3]\nset xlabel "seconds"\n')
        f.write("plot " + ", ".join(
            f'"{dat}" using 1:{5 + 2 * i} with lines title "{tenants[i]["tenant"]}"'
            for i in range(n)) + ", 1 with lines lc rgb 'black' dt 3 notitle\n")
        f.write("unset multiplot\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"soak: gnuplot failed: {r.stderr.strip()}", file=sys.stderr)
        return False
    return True


def tenant_rows(phase, report):
    rows = []
    for t in report.get("tenants") or [report]:
        rows.append({
            "phase": phase, "tenant": t.get("tenant"),
            "retries": t.get("retries_allowed"), "lease_bound": t.get("lease_bound"),
            "fallback_allowance": t.get("fallback_allowance"), "bound": t.get("bound"),
            "within_budget": t.get("within_budget"), "utilisation": t.get("utilisation"),
            "utilisation_vs_ideal": t.get("utilisation_vs_ideal"),
            "fallback_seconds": t.get("fallback_seconds",
                                      (t.get("fallback") or {}).get("seconds_total")),
        })
    return rows


def fmt(v, spec=".3f"):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def foreign_worker_flags(args, build):
    """The fleet tool's --foreign-workers flags for --languages: one worker of each language
    other than C++ per tenant. Exits 3 naming what is missing."""
    commands = {
        "go": [os.path.join(build, "client/go/bin/go_worker")],
        "js": [args.node, os.path.abspath(args.js_worker)],
        "python": [args.python, os.path.join(REPO, "tools/fleet/mixed_fleet.py"), "--worker"],
    }
    flags = []
    for language in [l.strip() for l in args.languages.split(",") if l.strip()]:
        if language == "cpp":
            continue
        if language not in commands:
            sys.exit(f"soak: --languages: unknown language '{language}' (cpp, go, js, python)")
        program = commands[language][0]
        if not os.access(program, os.X_OK):
            print(f"soak: the {language} worker's program {program} is missing (go: cmake "
                  f"--build {build} --target retrybudget_go; js: node; python: --python)",
                  file=sys.stderr)
            sys.exit(3)
        modules = os.path.join(os.path.dirname(os.path.abspath(args.js_worker)),
                               "../../../client/js/node_modules")
        if language == "js" and not os.path.isdir(modules):
            print(f"soak: {os.path.normpath(modules)} is missing (npm ci --prefix client/js)",
                  file=sys.stderr)
            sys.exit(3)
        flags.append(f"--foreign-workers={language}:{args.tenants}:{' '.join(commands[language])}")
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory (default build)")
    ap.add_argument("--minutes", type=float, default=10, help="length of the soak (default 10)")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    ap.add_argument("--out", default=None, help="output directory (default BUILD/soak-SEED)")
    ap.add_argument("--plot", default=None, help="PNG of phase A (default OUT/soak.png)")
    ap.add_argument("--workers", type=int, default=4, help="C++ worker processes (default 4)")
    ap.add_argument("--threads", type=int, default=2, help="loops per worker of any language")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--languages", default="cpp,go,js,python",
                    help="the languages of the fleet (default cpp,go,js,python): one worker of "
                         "each other language per tenant")
    ap.add_argument("--phases", default="AB", help="the phases to run (default AB)")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="python with grpcio and protobuf, for the Python workers "
                         "(default /usr/bin/python3)")
    ap.add_argument("--node", default=shutil.which("node") or "/usr/bin/node",
                    help="node, for the Node workers")
    ap.add_argument("--js-worker", default=os.path.join(REPO, "tools/fleet/js_worker/worker.mjs"),
                    help="the Node worker script (it imports ../../../client/js/src; a copy of "
                         "both keeps a run safe from an `npm ci` of client/js meanwhile)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    build = os.path.abspath(args.build)
    out_dir = os.path.abspath(args.out or os.path.join(build, f"soak-{seed}"))
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.abspath(args.plot or os.path.join(out_dir, "soak.png"))
    fleet = os.path.join(build, "tools/fleet/retry-budget-fleet")
    server = os.path.join(build, "server/retry-budget-server")
    for binary in (fleet, server):
        if not os.access(binary, os.X_OK):
            sys.exit(f"soak: {binary} is missing (cmake --build {build} --target "
                     f"retry-budget-fleet retry-budget-server)")
    languages = foreign_worker_flags(args, build)
    # The Python workers import the package and its generated modules.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(build, "client/python/gen"), os.path.join(REPO, "client/python")] +
        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    rng = random.Random(seed)
    total = args.minutes * 60
    phases_wanted = args.phases.upper()
    proxy_s = max(20.0, round(total * 0.1)) if "B" in phases_wanted else 0
    cluster_s = max(30.0, total - proxy_s) if "A" in phases_wanted else 0
    print(f"soak: seed {seed}, {args.minutes:g} min: cluster {cluster_s:.0f} s, proxy "
          f"{proxy_s:.0f} s; languages {args.languages}; output in {out_dir}", flush=True)

    phases, rows = [], []
    summary = {"seed": seed, "minutes": args.minutes, "command": " ".join(sys.argv),
               "languages": args.languages}

    # A. The cluster under the random schedule (drawn first: the same seed gives the same
    # schedule whatever phases run).
    chaos, windows = cluster_schedule(rng, max(cluster_s, 30.0))
    lines_path = os.path.join(out_dir, "cluster_worker_lines.jsonl")
    cmd = [fleet, f"--spawn-server={server}", "--cluster=3", "--etcd-nodes=3",
           f"--cluster-lease-ttl={CLUSTER_LEASE_TTL}s", "--tenant=soak",
           f"--tenants={args.tenants}", f"--workers={args.workers}", f"--threads={args.threads}",
           f"--duration={cluster_s:.0f}", "--failure-rate=0.5", f"--seed={seed}",
           "--reset-budget", *policy_flags(), *languages, f"--cluster-chaos={chaos}",
           f"--worker-lines={lines_path}", "--worker-grace=60s"]
    if cluster_s:
        print(f"soak A: --cluster-chaos={chaos}", flush=True)
        rc, line = run(cmd, cluster_s + 240, os.path.join(out_dir, "cluster.log"))
        phases.append(("cluster", cmd, rc, line))

    # B. Dropped, duplicated, replayed and delayed Syncs on one server, with a kill / a SIGSTOP.
    if proxy_s:
        half = proxy_s / 2
        drop = rng.uniform(0.05, 0.3)
        kill_at = rng.uniform(0.2, 0.5) * half
        b1 = [f"--fault-drop-response={drop:.2f}",
              f"--fault-duplicate-request={rng.uniform(0, 0.1):.2f}",
              f"--fault-replay-old={rng.uniform(0, 0.1):.2f}",
              f"--kill-server-after={kill_at:.1f}", f"--restart-after={rng.uniform(1, 4):.1f}"]
        b2 = [f"--fault-delay={rng.randrange(20, 300)}ms",
              f"--fault-drop-response={rng.uniform(0, 0.1):.2f}",
              f"--stop-server-after={rng.uniform(0.2, 0.5) * half:.1f}",
              f"--resume-after={rng.uniform(1, 5):.1f}"]
        for name, extra in (("drops", b1), ("delays", b2)):
            cmd = [fleet, f"--spawn-server={server}", "--tenant=soak-proxy",
                   f"--tenants={args.tenants}", f"--workers={args.workers}",
                   f"--threads={args.threads}", f"--duration={half:.0f}", "--failure-rate=0.5",
                   f"--seed={seed}", "--reset-budget", *policy_flags(), *languages, *extra]
            print(f"soak B ({name}): {' '.join(extra)}", flush=True)
            rc, line = run(cmd, half + 120, os.path.join(out_dir, f"proxy_{name}.log"))
            phases.append((f"proxy-{name}", cmd, rc, line))

    # The verdicts.
    exit_code = 0
    summary["phases"] = []
    for name, cmd, rc, line in phases:
        entry = {"phase": name, "command": " ".join(cmd), "exit": rc}
        try:
            report = json.loads(line)
        except ValueError:
            print(f"soak {name}: no verdict (exit {rc}): {line}; see {out_dir}", flush=True)
            entry["error"] = line
            summary["phases"].append(entry)
            exit_code = 3
            continue
        entry["report"] = report
        summary["phases"].append(entry)
        rows += tenant_rows(name, report)
        if not report.get("within_budget"):
            exit_code = max(exit_code, 1)

    print("\n| phase | tenant | retries | lease bound | fallback allowance | bound | within | "
          "utilisation | vs ideal | fallback s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['tenant']} | {fmt(r['retries'])} | {fmt(r['lease_bound'], '.0f')}"
              f" | {fmt(r['fallback_allowance'], '.0f')} | {fmt(r['bound'], '.0f')} | "
              f"{fmt(r['within_budget'])} | {fmt(r['utilisation'])} | "
              f"{fmt(r['utilisation_vs_ideal'])} | {fmt(r['fallback_seconds'], '.1f')} |")
    for name, _, _, line in phases:
        try:
            report = json.loads(line)
        except ValueError:
            continue
        print(f"{name}: within budget {report.get('within_budget')}, utilisation "
              f"{fmt(report.get('utilisation'))}, vs ideal {fmt(report.get('utilisation_vs_ideal'))}"
              f", elapsed {fmt(report.get('elapsed_seconds'), '.1f')} s")
        c = report.get("cluster")
        if c and name == "cluster":
            stops = c.get("stops") or []
            restarts = c.get("restarts") or []
            print(f"  SIGTERM stops: {len(stops)}, max {fmt(c.get('max_stop_seconds'))} s; "
                  + ", ".join(f"{s['seconds']:.3f}" for s in stops))
            served = [r["serving_after_seconds"] for r in restarts if "serving_after_seconds" in r]
            print(f"  restarts: {len(restarts)}, serving after (health SERVING) max "
                  f"{fmt(c.get('max_restart_to_serving_seconds'))} s, not serving "
                  f"{c.get('restarts_not_serving', 0)}; " + ", ".join(f"{v:.2f}" for v in served))
            # A start while etcd has no quorum serves only once it is back: told apart.
            outages = [(a, b) for a, b, label in windows
                       if label in ("stop-etcd", "lose-quorum", "lose-quorum-term")]
            split = {"etcd up": [], "etcd without quorum": []}
            for r in restarts:
                if "serving_after_seconds" in r:
                    down = any(a <= r["at_seconds"] <= b for a, b in outages)
                    split["etcd without quorum" if down else "etcd up"].append(
                        r["serving_after_seconds"])
            for key, values in split.items():
                if values:
                    print(f"    started with {key}: {len(values)}, serving after "
                          f"{min(values):.2f}-{max(values):.2f} s")
            summary["restart_to_serving"] = split
            summary["stop_seconds"] = [st["seconds"] for st in stops]
            print(f"  events: {c.get('events')}")
            summary["stop_seconds_max"] = c.get("max_stop_seconds")
            summary["restart_to_serving_seconds_max"] = c.get("max_restart_to_serving_seconds")
            summary["windows"] = windows
            if os.path.exists(lines_path) and plot_cluster(report, lines_path, windows,
                                                           out_dir, png):
                print(f"  plot: {png}")
        for language, part in (report.get("languages") or {}).items():
            print(f"  {language}: {part.get('workers')} workers, retries {part.get('retries_allowed')}"
                  f", denied {part.get('retries_denied')}, successes {part.get('successes')}, "
                  f"fallback allowance {fmt(part.get('fallback_allowance'), '.1f')}, back on a "
                  f"lease {part.get('workers_back_on_lease')}, tokens held at exit "
                  f"{part.get('tokens_held_at_exit')}, shutdown {part.get('shutdown_status')}")
        if "chaos" in report:
            print(f"  chaos: {json.dumps(report['chaos'])}")
        if "faults" in report:
            print(f"  faults: {json.dumps(report['faults'])}")
    summary["rows"] = rows
    summary["exit"] = exit_code
    with open(os.path.join(out_dir, "soak_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"soak: seed {seed}, exit {exit_code} (0: every tenant within budget)", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
