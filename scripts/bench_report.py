#!/usr/bin/env python3
"""Turns the raw outputs of scripts/bench.sh into docs/benchmarks.md and docs/benchmarks.svg.

Standard library only, so `make bench` needs nothing beyond python3.
"""
import json
import sys
from pathlib import Path

out, machine, versions, duration, pgbench_secs, concurrency, commit = sys.argv[1:8]
out = Path(out)

pg = [line.split() for line in (out / "pgbench.txt").read_text().splitlines() if len(line.split()) == 2]
pg = [(int(c), float(t)) for c, t in pg]
best_clients, ceiling = max(pg, key=lambda r: r[1])

rows = []
for backend in ("redis", "postgres"):
    for k in (1, 4, 16):
        load = json.loads((out / f"load-{backend}-k{k}.json").read_text())
        proc = json.loads((out / f"proc-{backend}-k{k}.json").read_text())
        deliveries = load["deliveries"] or 1
        cpu_s = proc["cpu_ticks"] / proc["clk_tck"]
        rows.append({
            "backend": backend,
            "k": k,
            "rps": load["deliveries_per_sec"],
            "pps": load["payments_per_sec"],
            "p50": load["latency"]["p50_us"] / 1000,
            "p99": load["latency"]["p99_us"] / 1000,
            "first_try": load["first_try_200_share"] * 100,
            "cpu_us": cpu_s / deliveries * 1e6,
            "rss_mb": proc["peak_rss_kb"] / 1024,
            "ratio": load["payments_per_sec"] / ceiling if ceiling else 0,
            "without_200": load["transactions_without_200"],
        })

md = []
md.append("# Benchmarks\n")
md.append("Measured by `make bench` (scripts/bench.sh) in one run on this machine; "
          "regenerate with `make bench`.\n")
md.append(f"- machine: {machine}; {versions}; PostgreSQL, Redis, the service and the load "
          "generator all share these cores")
md.append(f"- commit: `{commit}`, release build")
md.append(f"- (a) ceiling: `pgbench -n -M prepared -T {pgbench_secs} -f target/bench/delivery.sql` at "
          "1, 2, 4, 8, 16, 32 clients — fencehook's own per-delivery SQL for a new payment (the "
          "fast-path lookup, then the one-statement fenced claim + ledger entry), durable commits")
md.append(f"- (b)/(c): one `fencehook serve`, `fencehook load --duration {duration}s --concurrency "
          f"{concurrency} --duplicates k --failed-share 0`; CPU per delivery is the server process's "
          "user+system time divided by deliveries; peak RSS is the server's VmHWM\n")
md.append("pgbench ceiling by client count (transactions/s): " +
          ", ".join(f"{c}: {t:,.0f}" for c, t in pg) +
          f" — **best {ceiling:,.0f} at {best_clients} clients**.\n")
md.append("| lease backend | k | deliveries/s | payments/s | p50 ms | p99 ms | 200 without retry | CPU µs/delivery | peak RSS MB | payments/s ÷ ceiling |")
md.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    md.append(f"| {r['backend']} | {r['k']} | {r['rps']:,.0f} | {r['pps']:,.0f} | {r['p50']:.1f} | "
              f"{r['p99']:.1f} | {r['first_try']:.1f} % | {r['cpu_us']:.0f} | {r['rss_mb']:.1f} | "
              f"{r['ratio']:.2f} |")
md.append("")
md.append("![throughput and p99 by k](benchmarks.svg)\n")
missing = [r for r in rows if r["without_200"]]
if missing:
    md.append("Transactions that never got a 200 in a run: " +
              ", ".join(f"{r['backend']} k={r['k']}: {r['without_200']}" for r in missing) + "\n")

# The chart: payments/s (bars) and p99 (dots) by k, one colour per backend.
W, H, L, B = 720, 360, 70, 50
colors = {"redis": "#c0392b", "postgres": "#2c6fbb"}
max_pps = max(r["pps"] for r in rows) * 1.15 or 1
max_p99 = max(r["p99"] for r in rows) * 1.15 or 1
plot_w, plot_h = W - L - 70, H - B - 40
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">fencehook: payments/s (bars) and p99 latency (dots) by duplicate factor k</text>']
y0 = H - B
svg.append(f'<line x1="{L}" y1="{y0}" x2="{L+plot_w}" y2="{y0}" stroke="black"/>')
svg.append(f'<line x1="{L}" y1="{y0}" x2="{L}" y2="{y0-plot_h}" stroke="black"/>')
svg.append(f'<line x1="{L+plot_w}" y1="{y0}" x2="{L+plot_w}" y2="{y0-plot_h}" stroke="black"/>')
for i in range(5):
    v = max_pps * i / 4
    y = y0 - plot_h * i / 4
    svg.append(f'<text x="{L-6}" y="{y+4}" text-anchor="end">{v:,.0f}</text>')
    p = max_p99 * i / 4
    svg.append(f'<text x="{L+plot_w+6}" y="{y+4}">{p:.0f} ms</text>')
svg.append(f'<text x="14" y="{y0-plot_h/2}" transform="rotate(-90 14 {y0-plot_h/2})" text-anchor="middle">payments/s</text>')
group_w = plot_w / 3
for gi, k in enumerate((1, 4, 16)):
    gx = L + group_w * gi
    svg.append(f'<text x="{gx+group_w/2}" y="{y0+18}" text-anchor="middle">k = {k}</text>')
    for bi, backend in enumerate(("redis", "postgres")):
        r = next(r for r in rows if r["backend"] == backend and r["k"] == k)
        bw = group_w / 4
        x = gx + group_w / 4 + bi * bw
        h = plot_h * r["pps"] / max_pps
        svg.append(f'<rect x="{x:.1f}" y="{y0-h:.1f}" width="{bw-4:.1f}" height="{h:.1f}" fill="{colors[backend]}" opacity="0.8"/>')
        svg.append(f'<text x="{x+(bw-4)/2:.1f}" y="{y0-h-4:.1f}" text-anchor="middle" font-size="10">{r["pps"]:,.0f}</text>')
        py = y0 - plot_h * r["p99"] / max_p99
        svg.append(f'<circle cx="{x+(bw-4)/2:.1f}" cy="{py:.1f}" r="5" fill="black" stroke="{colors[backend]}" stroke-width="3"/>')
ceil_y = y0 - plot_h * ceiling / max_pps
if ceiling <= max_pps:
    svg.append(f'<line x1="{L}" y1="{ceil_y:.1f}" x2="{L+plot_w}" y2="{ceil_y:.1f}" stroke="gray" stroke-dasharray="5,4"/>')
    svg.append(f'<text x="{L+4}" y="{ceil_y-4:.1f}" fill="gray">pgbench ceiling {ceiling:,.0f}/s</text>')
for i, backend in enumerate(("redis", "postgres")):
    svg.append(f'<rect x="{L+10+i*150}" y="{H-20}" width="12" height="12" fill="{colors[backend]}"/>')
    svg.append(f'<text x="{L+28+i*150}" y="{H-10}">{backend} leases</text>')
svg.append('</svg>')

Path("docs/benchmarks.svg").write_text("\n".join(svg) + "\n")
bench_md = Path("docs/benchmarks.md")
notes = ""
if bench_md.exists():
    text = bench_md.read_text()
    marker = "<!-- notes: kept across runs -->"
    if marker in text:
        notes = text[text.index(marker):]
bench_md.write_text("\n".join(md) + "\n" + (notes or "<!-- notes: kept across runs -->\n"))
print("\n".join(md))
