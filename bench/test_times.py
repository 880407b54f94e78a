#!/usr/bin/env python3
"""Did a functional test get slower or flakier? Each test's time and outcome, two trees side by side.

    python3 bench/test_times.py run TREE OUT.json [--repeat N]   # TREE's tests (built with
                                                                 # `cargo test --no-run` there), N times;
                                                                 # an OUT of the same commit gains the runs
    python3 bench/test_times.py compare OLD.json NEW.json        # a markdown report

`run` asks cargo in TREE for its test executables (CARGO_TARGET_DIR is passed through), and
runs each as `cargo test` would (from TREE, the default threads) with libtest's own per-test
times (`-Z unstable-options --format json --report-time`, which RUSTC_BOOTSTRAP=1 lets a
stable build's tests take). Tests a tree has and the other has not are counted, not compared.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def executables(tree):
    """The test executables of `tree`, as cargo lists them (built already)."""
    listed = subprocess.run(["cargo", "test", "--no-run", "--message-format=json", "--quiet"], cwd=tree,
                            stdout=subprocess.PIPE, text=True, check=True).stdout
    found = []
    for line in listed.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("profile", {}).get("test") \
                and message.get("executable"):
            found.append(message["executable"])
    return found


def run(tree, out, repeat):
    tree = Path(tree).resolve()
    head, tests, walls = commit(tree), {}, []
    if Path(out).exists():
        earlier = results(out)
        if earlier["commit"] == head:
            tests, walls = earlier["tests"], earlier["walls"]
    found = executables(tree)
    for attempt in range(repeat):
        started = time.perf_counter()
        for executable in found:
            child = subprocess.run([executable, "-Z", "unstable-options", "--format", "json", "--report-time"],
                                   cwd=tree, env={**os.environ, "RUSTC_BOOTSTRAP": "1"},
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for line in child.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                # libtest's "timeout" event only says a test has run past 60 s; its outcome follows
                if event.get("type") != "test" or event.get("event") not in ("ok", "failed"):
                    continue
                name = f"{Path(executable).name.rsplit('-', 1)[0]}::{event['name']}"
                tests.setdefault(name, []).append((event["event"], event.get("exec_time")))
        walls.append(time.perf_counter() - started)
        print(f"run {len(walls)}: {len(tests)} tests, {walls[-1]:.0f} s", file=sys.stderr)
    Path(out).write_text(json.dumps({"tree": str(tree), "commit": head, "walls": walls, "tests": tests}, indent=0))


def commit(tree):
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, stdout=subprocess.PIPE,
                          text=True).stdout.strip()


def compare(old_path, new_path):
    old, new = results(old_path), results(new_path)
    both = sorted(set(old["tests"]) & set(new["tests"]))

    def seconds(runs):
        times = [time for outcome, time in runs if time is not None]
        return statistics.median(times) if times else None

    def failures(runs):
        return sum(outcome != "ok" for outcome, _ in runs)

    print(f"# Test times: {old['commit']} against {new['commit']}\n")
    print(f"Suite wall time (every executable, one after another): {old['commit']} "
          f"{', '.join(f'{w:.0f} s' for w in old['walls'])}; {new['commit']} "
          f"{', '.join(f'{w:.0f} s' for w in new['walls'])}.\n")
    print(f"Tests: {len(old['tests'])} and {len(new['tests'])}; {len(both)} in both, compared below; "
          f"{len(set(new['tests']) - set(old['tests']))} new, {len(set(old['tests']) - set(new['tests']))} gone.\n")
    old_sum = sum(seconds(old["tests"][name]) or 0 for name in both)
    new_sum = sum(seconds(new["tests"][name]) or 0 for name in both)
    print(f"Sum of the compared tests' own times (median of the runs): {old_sum:.1f} s and {new_sum:.1f} s "
          f"({new_sum / old_sum:.2f}x).\n")
    slower = []
    for name in both:
        before, after = seconds(old["tests"][name]), seconds(new["tests"][name])
        if before is not None and after is not None and after > 1.5 * before and after - before > 0.5:
            slower.append((name, before, after))
    print(f"Slower by more than 1.5x and 0.5 s: {len(slower)}.\n")
    if slower:
        print("| test | before | after |")
        print("|---|---|---|")
        for name, before, after in sorted(slower, key=lambda row: row[1] - row[2]):
            print(f"| `{name}` | {before:.2f} s | {after:.2f} s |")
        print()
    failed = [(name, failures(old["tests"].get(name, [])), len(old["tests"].get(name, [])),
               failures(new["tests"].get(name, [])), len(new["tests"].get(name, [])))
              for name in sorted(set(old["tests"]) | set(new["tests"]))
              if failures(old["tests"].get(name, [])) or failures(new["tests"].get(name, []))]
    print(f"Tests that failed in any run: {len(failed)}.\n")
    if failed:
        print(f"| test | failed in {old['commit'][:7]} (of runs) | failed in {new['commit'][:7]} (of runs) |")
        print("|---|---|---|")
        for name, before, runs_before, after, runs_after in failed:
            print(f"| `{name}` | {before} of {runs_before} | {after} of {runs_after} |")

def usage(message):
    """Bad usage: one line, exit 2 (nothing was run)."""
    print(f"test_times.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def results(path):
    """A `run`'s OUT file, or exit 2 saying why it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        usage(f"{path}: {error}")
    if not isinstance(data, dict) or not {"commit", "walls", "tests"} <= data.keys():
        usage(f"{path}: not a file written by `test_times.py run`")
    return data


def main():
    args = sys.argv[1:]
    if len(args) in (3, 5) and args[0] == "run" and (len(args) == 3 or args[3] == "--repeat"):
        if len(args) == 5 and (not args[4].isdigit() or int(args[4]) < 1):
            usage("--repeat takes a whole number, at least 1")
        if not (Path(args[1]) / "Cargo.toml").is_file():
            usage(f"{args[1]} is not a cargo tree")
        if not Path(args[2]).resolve().parent.is_dir() or Path(args[2]).is_dir():
            usage(f"{args[2]}: cannot be written (no such folder, or a folder)")
        run(args[1], args[2], int(args[4]) if len(args) == 5 else 1)
    elif len(args) == 3 and args[0] == "compare":
        compare(args[1], args[2])
    else:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
