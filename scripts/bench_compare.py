#!/usr/bin/env python3
"""Compares two builds (or one build under two environments) with `tandem bench`, run in
alternation so that drift of the machine falls on both alike.

    scripts/bench_compare.py --a OLD/tandem --b NEW/tandem [--rounds N] [--env-a K=V]
        [--env-b K=V] -- --model M.gguf --draft DIR --iters 10 --only decode,verify16

Everything after `--` goes to every `tandem bench` run (its --json is added here). Prints,
per measured row, each run's milliseconds, the median of each side and the median of the
paired differences b - a (round by round), and exits 1 if a run failed. --b defaults to
--a, for comparing environments (e.g. --env-b TANDEM_PDL=off)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# (label, path into the JSON report) of the rows compared, in the table's order
ROWS = [
    ("decode 1K", ("decode", "1k", "ms")),
    ("decode 32K", ("decode", "32k", "ms")),
    ("verify 4", ("verify", "4", "ms")),
    ("verify 8", ("verify", "8", "ms")),
    ("verify 16", ("verify", "16", "ms")),
    ("verify 32", ("verify", "32", "ms")),
    ("verify 16 @32K", ("verify", "16_32k", "ms")),
    ("rollback", ("rollback", "ms")),
    ("prefill 1K", ("prefill", "ms")),
    ("prefill chunked", ("prefill_chunked", "ms")),
    ("draft step", ("draft", "ms")),
    ("draft step 8", ("draft", "block8", "ms")),
    ("draft step 4", ("draft", "block4", "ms")),
]


def row_value(report, path):
    v = report
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v if isinstance(v, (int, float)) else None


def split_value(report, end):
    s = report.get("split", {}).get(end, {})
    return s.get("cost_us") / 1e3 if s.get("measured") else None


def env_of(pairs):
    env = dict(os.environ)
    for p in pairs:
        if "=" not in p:
            sys.exit(f"bench_compare: --env-a/--env-b takes KEY=VALUE, not '{p}'")
        k, v = p.split("=", 1)
        env[k] = v
    return env


def run(binary, env, args, path):
    cmd = [binary, "bench", *args, "--json", path]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"bench_compare: {' '.join(cmd)} exited {p.returncode}\n{p.stderr}")
        return None
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="tandem binary of side a")
    ap.add_argument("--b", help="tandem binary of side b (default: --a)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    ap.add_argument("--env-a", action="append", default=[], metavar="K=V")
    ap.add_argument("--env-b", action="append", default=[], metavar="K=V")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER,
                    help="-- then the arguments of every tandem bench run")
    o = ap.parse_args()
    if o.rounds < 1:
        sys.exit("bench_compare: --rounds must be at least 1")
    args = o.bench_args[1:] if o.bench_args[:1] == ["--"] else o.bench_args
    if "--json" in args:
        sys.exit("bench_compare: --json is added here; leave it out of the bench arguments")
    sides = [("a", o.a, env_of(o.env_a)), ("b", o.b or o.a, env_of(o.env_b))]
    reports = {"a": [], "b": []}
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(o.rounds):
            for name, binary, env in sides:
                rep = run(binary, env, args, os.path.join(tmp, f"{name}{r}.json"))
                failed |= rep is None
                reports[name].append(rep or {})
    rows = [(label, lambda rep, p=path: row_value(rep, p)) for label, path in ROWS]
    rows += [("split, no MPS", lambda rep: split_value(rep, "no_mps")),
             ("split, MPS", lambda rep: split_value(rep, "mps"))]
    print(f"a: {o.a} {' '.join(o.env_a)}".rstrip())
    print(f"b: {o.b or o.a} {' '.join(o.env_b)}".rstrip())
    print(f"{o.rounds} rounds of a then b; ms (split rows: the cost per step)")
    print(f"{'row':<16} {'a':>24} {'b':>24} {'med a':>9} {'med b':>9} {'b - a':>9} {'':>7}")
    for label, get in rows:
        va = [get(rep) for rep in reports["a"]]
        vb = [get(rep) for rep in reports["b"]]
        if all(v is None for v in va + vb):
            continue
        pairs = [y - x for x, y in zip(va, vb) if x is not None and y is not None]
        fa = [x for x in va if x is not None]
        fb = [y for y in vb if y is not None]
        ma = statistics.median(fa) if fa else None
        mb = statistics.median(fb) if fb else None
        d = statistics.median(pairs) if pairs else None

        def cell(vs):
            return " ".join("n/a" if v is None else f"{v:.3f}" for v in vs)

        def num(v, fmt="{:9.3f}"):
            return f"{'n/a':>9}" if v is None else fmt.format(v)
        pct = f"{100 * d / ma:+6.1f}%" if d is not None and ma else ""
        print(f"{label:<16} {cell(va):>24} {cell(vb):>24} {num(ma)} {num(mb)} "
              f"{num(d, '{:+9.3f}')} {pct:>7}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
