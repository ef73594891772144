#!/usr/bin/env python3
"""Turns the raw outputs of scripts/bench.sh into docs/benchmarks.md and docs/benchmarks.svg.

Standard library only, so `make bench` needs nothing beyond python3.
"""
import json
import os
import sys
from pathlib import Path


def pair_runs(out, pairs, prefix, names):
    """Interleaved runs, pair by pair: {name: figures} for each pair whose two runs both finished
    ((f): "ab-ref-1", "ab-head-1", ...; (e): "traces-off-1", "traces-on-1", ...)."""
    runs = []
    for pair in range(1, pairs + 1):
        got = {}
        for name in names:
            run = f"{prefix}-{name}-{pair}"
            load_path, proc_path = out / f"load-{run}.json", out / f"proc-{run}.json"
            if not load_path.exists() or not load_path.read_text().strip() or not proc_path.exists():
                break
            load, proc = json.loads(load_path.read_text()), json.loads(proc_path.read_text())
            got[name] = {"pps": load["payments_per_sec"], "p99": load["latency"]["p99_us"] / 1000,
                         "cpu_us": proc["cpu_ticks"] / proc["clk_tck"] / max(load["deliveries"], 1) * 1e6,
                         "rss_mb": proc["peak_rss_kb"] / 1024}
            extra = out / f"{prefix}-{name}-{pair}.json"
            if extra.exists():
                got[name].update(json.loads(extra.read_text()))
        if len(got) == len(names):
            runs.append(got)
    return runs


def pair_summary(runs, a, b):
    """Both sides' mean payments/s and CPU per delivery over every pair, and b's rate over a's."""
    mean = lambda side, key: sum(r[side][key] for r in runs) / len(runs)
    a_pps, b_pps = mean(a, "pps"), mean(b, "pps")
    return a_pps, b_pps, b_pps / a_pps if a_pps else 0.0, mean(a, "cpu_us"), mean(b, "cpu_us")


def ab_runs(out, pairs):
    """(f): the baseline commit's build ("ref") and this build ("head")."""
    return pair_runs(out, pairs, "ab", ("ref", "head"))


def trace_runs(out, pairs):
    """(e): this build with tracing "off" and "on"."""
    return pair_runs(out, pairs, "traces", ("off", "on"))


def print_pairs(runs, a, b, name_a, name_b):
    """bench.sh's line per pair of (e) or (f), and the means, as soon as they are measured."""
    for i, r in enumerate(runs, 1):
        x, y = r[a], r[b]
        dropped = f", {y['spans_dropped']:,} spans dropped" if "spans_dropped" in y else ""
        print(f"pair {i}: {name_a} {x['pps']:,.0f} payments/s ({x['cpu_us']:.0f} µs CPU/delivery), "
              f"{name_b} {y['pps']:,.0f} ({y['cpu_us']:.0f} µs{dropped}): "
              f"ratio {y['pps'] / x['pps'] if x['pps'] else 0:.2f}")
    if runs:
        mean_a, mean_b, ratio, cpu_a, cpu_b = pair_summary(runs, a, b)
        print(f"mean: {name_a} {mean_a:,.0f} payments/s, {name_b} {mean_b:,.0f}: ratio {ratio:.2f}; "
              f"CPU per delivery {cpu_a:.0f} µs vs {cpu_b:.0f} µs")


if sys.argv[1] == "--ab":
    out, pairs, ref_sha = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    print_pairs(ab_runs(out, pairs), "ref", "head", ref_sha, "this build")
    sys.exit(0)

if sys.argv[1] == "--traces":
    out, pairs = Path(sys.argv[2]), int(sys.argv[3])
    print_pairs(trace_runs(out, pairs), "off", "on", "tracing off", "on")
    sys.exit(0)

out, machine, versions, duration, pgbench_secs, concurrency, commit = sys.argv[1:8]
out = Path(out)
ref_sha = os.environ.get("BENCH_REF", "")
ab = ab_runs(out, int(os.environ.get("BENCH_AB_PAIRS", "0") or 0)) if ref_sha else []
traced = trace_runs(out, int(os.environ.get("BENCH_TRACE_PAIRS", "0") or 0))
instructions = json.loads((out / "instructions.json").read_text()) if (out / "instructions.json").exists() else None

pg = {}
for line in (out / "pgbench.txt").read_text().splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[2]:
        pg.setdefault(parts[0], []).append((int(parts[1]), float(parts[2])))


def best(script):
    runs = pg.get(script, [])
    return max(runs, key=lambda r: r[1]) if runs else (0, 0.0)


ceiling_clients, ceiling = best("reference")

SERIES = ("redis", "postgres", "unique-only")
LABEL = {"redis": "Redis leases", "postgres": "PostgreSQL leases",
         "unique-only": "UNIQUE constraint only (no lease)", "inbox": "inbox, accepting (0 workers)"}


def row(name, series, k):
    path = out / f"load-{name}.json"
    if not path.exists() or not path.read_text().strip():
        return None
    load = json.loads(path.read_text())
    proc = json.loads((out / f"proc-{name}.json").read_text())
    deliveries = load["deliveries"] or 1
    cpu_s = proc["cpu_ticks"] / proc["clk_tck"]
    inbox = load.get("inbox") or {}
    pps = inbox.get("accept_rate", load["payments_per_sec"]) if series == "inbox" else load["payments_per_sec"]
    return {
        "series": series, "k": k,
        "rps": load["deliveries_per_sec"], "pps": pps,
        "p50": load["latency"]["p50_us"] / 1000, "p99": load["latency"]["p99_us"] / 1000,
        "first_try": load["first_try_200_share"] * 100,
        "cpu_us": cpu_s / deliveries * 1e6, "rss_mb": proc["peak_rss_kb"] / 1024,
        "ratio": pps / ceiling if ceiling else 0.0,
        "without_200": load["transactions_without_200"],
    }


rows = [r for r in (row(f"{s}-k{k}", s, k) for s in SERIES for k in (1, 4, 16)) if r]
inbox_row = row("inbox", "inbox", 1)
drain = json.loads((out / "drain-inbox.json").read_text()) if (out / "drain-inbox.json").exists() else None
lag_run = None
if (out / "load-inbox-lag.json").exists() and (out / "load-inbox-lag.json").read_text().strip():
    lag_run = json.loads((out / "load-inbox-lag.json").read_text())
idle = json.loads((out / "idle-connections.json").read_text()) if (out / "idle-connections.json").exists() else None


def find(series, k):
    return next((r for r in rows if r["series"] == series and r["k"] == k), None)


md = ["# Benchmarks\n",
      "Measured by `make bench` (scripts/bench.sh) in one run on this machine; regenerate with "
      "`make bench`. Everything below the notes marker is kept across runs.\n",
      f"- machine: {machine}; {versions}; PostgreSQL, Redis, the service and the load generator "
      "all share these cores",
      f"- commit: `{commit}`, release build",
      f"- (a) PostgreSQL ceilings: `pgbench -n -M prepared -c 8|16 -j 2 -T {pgbench_secs}`, durable "
      "commits, on fencehook's own SQL for a new payment (scripts/bench-delivery.sql, checked "
      "against the store by a unit test)",
      f"- (b) one `fencehook serve` per row (its own database and Redis prefix), "
      f"`fencehook load --duration {duration}s --concurrency {concurrency} --duplicates k "
      "--failed-share 0`; CPU per delivery is the server's user+system time divided by "
      "deliveries; peak RSS is the server's VmHWM",
      "- (c) inbox: `serve` with `FENCEHOOK_MODE=inbox FENCEHOOK_WORKERS=0` driven as in (b) with "
      "`--inbox` (the accept rate), then `fencehook work` draining what was accepted; "
      "then `serve` with its default 4 workers driven at `--rate 500 --inbox --database-url` "
      "(accept → booked, from the `events` table)",
      "- (d) 1,000 idle keep-alive connections (each after one request) opened on one instance; "
      "the growth of its VmRSS divided by 1,000",
      "- (e) Redis leases at k = 1 as in (b), tracing off and on interleaved in pairs as (f) (off on, on off, "
      "…): `OTEL_EXPORTER_OTLP_ENDPOINT` to a local OTLP/HTTP sink that reads and discards every export, "
      "`OTEL_TRACES_SAMPLER=always_on`",
      "- (f) the baseline commit's release build (`BENCH_BASELINE`, built in a git worktree of its own) and "
      "this one, Redis leases at k = 1 as in (b), interleaved A B B A B A … (each pair in the other order than the one before); both driven by this build's "
      "`fencehook load`",
      "- (g) instructions per delivery: `scripts/bench-instructions.sh` (`make bench-instructions`), "
      "`serve` under `valgrind --tool=callgrind`, counters zeroed after a warm-up "
      "and dumped after a fixed number of new payments (k = 1, Redis leases); the service process's "
      "instructions (user space) divided by the deliveries\n",
      "## (a) Ceilings\n",
      "| transaction | round trips | 8 clients | 16 clients |",
      "| --- | ---: | ---: | ---: |"]
for script, what, trips in (("reference", "**the reference**: lookup, stand-in (acquire), claim, stand-in (release)", 4),
                            ("service", "the service's SQL alone: lookup, claim", 2),
                            ("claim", "the claim alone (the same work as one statement)", 1)):
    by = dict(pg.get(script, []))
    md.append(f"| {what} | {trips} | {by.get(8, 0):,.0f} | {by.get(16, 0):,.0f} |")
md.append(f"\n**The ceiling: {ceiling:,.0f} transactions/s** (the reference, {ceiling_clients} clients). "
          "The service makes the same four round trips per new payment (two to PostgreSQL, two to "
          "the lease store), so this is what it could do if it cost nothing itself.\n")

md.append("## (b) The service\n")
md.append("| lease | k | deliveries/s | payments/s | p50 ms | p99 ms | 200 first try | CPU µs/delivery | peak RSS MB | payments/s ÷ ceiling |")
md.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    md.append(f"| {LABEL[r['series']]} | {r['k']} | {r['rps']:,.0f} | {r['pps']:,.0f} | {r['p50']:.1f} | "
              f"{r['p99']:.1f} | {r['first_try']:.1f} % | {r['cpu_us']:.0f} | {r['rss_mb']:.1f} | "
              f"{r['ratio']:.2f} |")
md.append("")
md.append("![payments/s and p99 by k](benchmarks.svg)\n")
missing = [r for r in rows if r["without_200"]]
if missing:
    md.append("Transactions that never got a 200 in a run: " +
              ", ".join(f"{r['series']} k={r['k']}: {r['without_200']}" for r in missing) + "\n")

md.append("## (c) Inbox\n")
if inbox_row:
    md.append(f"- accepting, no workers: **{inbox_row['pps']:,.0f} deliveries/s accepted**, p50 "
              f"{inbox_row['p50']:.1f} ms, p99 {inbox_row['p99']:.1f} ms, CPU "
              f"{inbox_row['cpu_us']:.0f} µs/delivery ({inbox_row['ratio']:.2f} of the ceiling)")
if drain and drain.get("span_secs"):
    rate = drain["done"] / drain["span_secs"] if drain["span_secs"] else 0
    md.append(f"- draining {drain['queued_at_start']:,} accepted events with `fencehook work` "
              f"({drain.get('workers', '?')} workers): **{rate:,.0f} events/s** ({drain['done']:,} done, "
              f"{drain['dead']} dead, first to last in {drain['span_secs']:.1f} s)")
lag = ((lag_run or {}).get("inbox") or {}).get("drain") or {}
if lag.get("lag"):
    l = lag["lag"]
    md.append(f"- accept → booked at a steady {lag_run['deliveries_per_sec']:,.0f} deliveries/s with "
              f"serve's 4 workers: **p50 {l['p50_ms']:.0f} ms**, p90 {l['p90_ms']:.0f} ms, p99 "
              f"{l['p99_ms']:.0f} ms, max {l['max_ms']:.0f} ms ({lag.get('done', 0):,} events done, "
              f"{lag.get('dead', 0)} dead)")
md.append("")

md.append("## (d) Memory\n")
if idle:
    md.append(f"- one idle keep-alive connection costs **{idle['per_connection_bytes'] / 1024:.1f} KiB** "
              f"of resident memory ({idle['rss_before_kb'] / 1024:.1f} MB with 50 connections, "
              f"{idle['rss_after_kb'] / 1024:.1f} MB with 1,050)")
rss_max = max((r["rss_mb"] for r in rows), default=0)
md.append(f"- the largest peak RSS of any run in (b): {rss_max:.1f} MB\n")

md.append("## (e) Tracing\n")
if traced:
    md.append("| pair | off payments/s | on payments/s | ratio | off CPU µs/delivery | on CPU µs/delivery | "
              "p99 ms (off / on) | spans dropped |")
    md.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, r in enumerate(traced, 1):
        a, b = r["off"], r["on"]
        md.append(f"| {i} | {a['pps']:,.0f} | {b['pps']:,.0f} | {b['pps'] / a['pps'] if a['pps'] else 0:.2f} | "
                  f"{a['cpu_us']:.0f} | {b['cpu_us']:.0f} | {a['p99']:.1f} / {b['p99']:.1f} | "
                  f"{b.get('spans_dropped', 0):,} |")
    off, on, ratio, off_cpu, on_cpu = pair_summary(traced, "off", "on")
    md.append(f"\nWith every delivery traced, over the {len(traced)} pairs the service books **{ratio:.2f} ×** "
              f"the payments/s of tracing off ({on:,.0f} vs {off:,.0f}) and spends {on_cpu / off_cpu:.2f} × the CPU "
              f"per delivery ({on_cpu:.0f} vs {off_cpu:.0f} µs). Tracing off runs the same code as (b)'s Redis "
              "k=1 row: with no tracing layer installed, every span callsite is disabled.\n")
else:
    md.append("(not measured in this run)\n")

md.append("## (f) Against the baseline\n")
if ab:
    md.append(f"| pair | `{ref_sha}` payments/s | this build payments/s | ratio | `{ref_sha}` CPU µs/delivery | "
              "this build CPU µs/delivery | p99 ms (baseline / this) |")
    md.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, r in enumerate(ab, 1):
        a, b = r["ref"], r["head"]
        md.append(f"| {i} | {a['pps']:,.0f} | {b['pps']:,.0f} | {b['pps'] / a['pps'] if a['pps'] else 0:.2f} | "
                  f"{a['cpu_us']:.0f} | {b['cpu_us']:.0f} | {a['p99']:.1f} / {b['p99']:.1f} |")
    ref_mean, head_mean, ab_ratio, ref_cpu, head_cpu = pair_summary(ab, "ref", "head")
    md.append(f"\nOver the {len(ab)} pairs this build books **{ab_ratio:.2f} ×** the payments/s of `{ref_sha}` "
              f"({head_mean:,.0f} vs {ref_mean:,.0f}), at {head_cpu:.0f} vs {ref_cpu:.0f} µs of CPU per delivery.\n")
else:
    md.append("(not measured in this run)\n")

md.append("## (g) Instructions per delivery\n")
if instructions:
    md.append("| build | commit | deliveries counted | instructions per delivery |")
    md.append("| --- | --- | ---: | ---: |")
    for r in instructions["builds"]:
        what = "the baseline" if r["build"] == "baseline" else "this build"
        md.append(f"| {what} | `{r['commit']}` | {r['deliveries']:,} | {r['instructions_per_delivery']:,} |")
    md.append(f"\n(after {instructions['warmup']} deliveries of warm-up, at concurrency "
              f"{instructions['concurrency']}; the service process alone, user space)\n")
else:
    md.append("(not measured in this run)\n")

md.append("## Targets\n")
checks = []
redis1, pg1, storm = find("redis", 1), find("postgres", 1), find("redis", 4)
if redis1:
    checks.append(("Redis leases, k=1: ≥ 0.75 × the ceiling", redis1["ratio"] >= 0.75, f"{redis1['ratio']:.2f}"))
if pg1:
    checks.append(("PostgreSQL leases, k=1: ≥ 0.6 × the ceiling", pg1["ratio"] >= 0.6, f"{pg1['ratio']:.2f}"))
if storm:
    checks.append(("duplicate storm k=4: ≥ 95 % answered 200 first time", storm["first_try"] >= 95, f"{storm['first_try']:.1f} %"))
checks.append(("peak RSS ≤ 50 MB", rss_max <= 50, f"{rss_max:.1f} MB"))
if redis1 and inbox_row:
    accept = inbox_row["pps"] / redis1["pps"]
    checks.append(("inbox accept (no workers): ≥ 1.5 × the sync rate (Redis leases, k=1)", accept >= 1.5,
                   f"{accept:.2f} ({inbox_row['pps']:,.0f} vs {redis1['pps']:,.0f}/s)"))
if redis1 and drain and drain.get("span_secs"):
    drained = drain["done"] / drain["span_secs"] / redis1["pps"]
    checks.append(("inbox drain (`fencehook work`): ≥ 0.8 × the sync rate", drained >= 0.8,
                   f"{drained:.2f} ({drain['done'] / drain['span_secs']:,.0f} vs {redis1['pps']:,.0f}/s)"))
# Every sync k = 1 run of this build with Redis leases and tracing off in this run: (b)'s, (f)'s, (e)'s.
sync_runs = ([redis1["pps"]] if redis1 else []) + [r["head"]["pps"] for r in ab] + [r["off"]["pps"] for r in traced]
if sync_runs and drain and drain.get("span_secs"):
    sync_mean = sum(sync_runs) / len(sync_runs)
    drained = drain["done"] / drain["span_secs"] / sync_mean
    checks.append((f"inbox drain: ≥ 1.0 × the mean of this run's {len(sync_runs)} sync k=1 runs of this build "
                   "((b), (e) off, (f))", drained >= 1.0,
                   f"{drained:.2f} ({drain['done'] / drain['span_secs']:,.0f} vs {sync_mean:,.0f}/s)"))
if traced:
    off_pps, on_pps, trace_ratio, off_cpu, on_cpu = pair_summary(traced, "off", "on")
    checks.append(("tracing on (100 % sampled): ≥ 0.9 × tracing off (interleaved)", trace_ratio >= 0.9,
                   f"{trace_ratio:.2f}"))
    dropped = sum(r["on"].get("spans_dropped", 0) for r in traced)
    checks.append(("tracing on: no span dropped", dropped == 0, f"{dropped:,}"))
if ab:
    checks.append((f"Redis leases, k=1: ≥ 1.0 × `{ref_sha}` in the same run (interleaved)", ab_ratio >= 1.0,
                   f"{ab_ratio:.2f}"))
    checks.append((f"CPU per delivery ≤ `{ref_sha}`'s in the same run (interleaved)", head_cpu <= ref_cpu,
                   f"{head_cpu:.0f} vs {ref_cpu:.0f} µs"))
if instructions and len(instructions["builds"]) == 2:
    by = {r["build"]: r["instructions_per_delivery"] for r in instructions["builds"]}
    checks.append((f"instructions per delivery ≤ `{ref_sha}`'s", by["head"] <= by["baseline"],
                   f"{by['head']:,} vs {by['baseline']:,}"))
md.append("| target | met | measured |")
md.append("| --- | --- | ---: |")
for what, ok, got in checks:
    md.append(f"| {what} | {'yes' if ok else '**no**'} | {got} |")
md.append("")

# The chart: payments/s (bars) and p99 (dots) by k, one colour per series.
W, H, L, B = 760, 380, 70, 60
colors = {"redis": "#c0392b", "postgres": "#2c6fbb", "unique-only": "#7f8c8d"}
series = [s for s in SERIES if any(r["series"] == s for r in rows)]
max_pps = max([r["pps"] for r in rows] + [ceiling]) * 1.15 or 1
max_p99 = max(r["p99"] for r in rows) * 1.15 if rows else 1
plot_w, plot_h = W - L - 70, H - B - 40
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">fencehook: payments/s (bars) and p99 latency (dots) by duplicate factor k</text>']
y0 = H - B
svg.append(f'<line x1="{L}" y1="{y0}" x2="{L+plot_w}" y2="{y0}" stroke="black"/>')
svg.append(f'<line x1="{L}" y1="{y0}" x2="{L}" y2="{y0-plot_h}" stroke="black"/>')
svg.append(f'<line x1="{L+plot_w}" y1="{y0}" x2="{L+plot_w}" y2="{y0-plot_h}" stroke="black"/>')
for i in range(5):
    y = y0 - plot_h * i / 4
    svg.append(f'<text x="{L-6}" y="{y+4}" text-anchor="end">{max_pps * i / 4:,.0f}</text>')
    svg.append(f'<text x="{L+plot_w+6}" y="{y+4}">{max_p99 * i / 4:.0f} ms</text>')
svg.append(f'<text x="14" y="{y0-plot_h/2}" transform="rotate(-90 14 {y0-plot_h/2})" text-anchor="middle">payments/s</text>')
group_w = plot_w / 3
bw = group_w / (len(series) + 1)
for gi, k in enumerate((1, 4, 16)):
    gx = L + group_w * gi
    svg.append(f'<text x="{gx+group_w/2}" y="{y0+18}" text-anchor="middle">k = {k}</text>')
    for bi, s in enumerate(series):
        r = find(s, k)
        if not r:
            continue
        x = gx + bw / 2 + bi * bw
        h = plot_h * r["pps"] / max_pps
        svg.append(f'<rect x="{x:.1f}" y="{y0-h:.1f}" width="{bw-4:.1f}" height="{h:.1f}" fill="{colors[s]}" opacity="0.8"/>')
        svg.append(f'<text x="{x+(bw-4)/2:.1f}" y="{y0-h-4:.1f}" text-anchor="middle" font-size="10">{r["pps"]:,.0f}</text>')
        py = y0 - plot_h * r["p99"] / max_p99
        svg.append(f'<circle cx="{x+(bw-4)/2:.1f}" cy="{py:.1f}" r="5" fill="black" stroke="{colors[s]}" stroke-width="3"/>')
ceil_y = y0 - plot_h * ceiling / max_pps
svg.append(f'<line x1="{L}" y1="{ceil_y:.1f}" x2="{L+plot_w}" y2="{ceil_y:.1f}" stroke="gray" stroke-dasharray="5,4"/>')
svg.append(f'<text x="{L+plot_w-4}" y="{ceil_y-4:.1f}" fill="gray" text-anchor="end">4-round-trip ceiling {ceiling:,.0f}/s</text>')
for i, s in enumerate(series):
    svg.append(f'<rect x="{L+10+i*230}" y="{H-24}" width="12" height="12" fill="{colors[s]}"/>')
    svg.append(f'<text x="{L+28+i*230}" y="{H-14}">{LABEL[s]}</text>')
svg.append('</svg>')

Path("docs/benchmarks.svg").write_text("\n".join(svg) + "\n")
bench_md = Path("docs/benchmarks.md")
marker = "<!-- notes: kept across runs -->"
notes = marker + "\n"
if bench_md.exists():
    text = bench_md.read_text()
    if marker in text:
        notes = text[text.index(marker):]
bench_md.write_text("\n".join(md) + "\n" + notes)
print("\n".join(md))
