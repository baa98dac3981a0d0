"""The hostile-input suite as a table: how each case ends on onnxkiln now, on an earlier
commit of onnxkiln (`--before REV`, checked out into a temporary worktree) and on
onnxruntime, each case in its own bounded subprocess.

    python scripts/hostile_table.py --before 9d260d2 > hostile.md
    python scripts/hostile_table.py -k external        # cases whose name contains this
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hostile"))
import harness  # noqa: E402


def worktree(rev: str) -> str:
    """The `src/` folder of `rev`, checked out once under /tmp."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = Path(f"/tmp/onnxkiln-before-{sha}")
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT,
                       check=True, capture_output=True)
    return str(path / "src")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="a git revision to compare with")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    cases = [c for c in harness.load_cases().values()
             if c.kind != "runner" and args.k in c.name]
    before = worktree(args.before) if args.before else None
    runs = [(c.name, "onnxkiln", None) for c in cases] + [
        (c.name, "onnxruntime", None) for c in cases]
    if before:
        runs += [(c.name, "onnxkiln", before) for c in cases]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(runs, pool.map(lambda r: harness.run_isolated(*r), runs)))
    head = "| class | case | expected | " + ("before | " if before else "") + "now | onnxruntime |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    good = 0
    for c in sorted(cases, key=lambda c: (c.kind, c.name)):
        now = results[(c.name, "onnxkiln", None)]
        good += now.outcome == c.expect
        cells = [c.kind, f"`{c.name}`: {c.doc}", c.expect]
        if before:
            cells.append(results[(c.name, "onnxkiln", before)].outcome)
        cells += [now.outcome, results[(c.name, "onnxruntime", None)].outcome]
        print("| " + " | ".join(cells) + " |")
    print(f"\n{good} of {len(cases)} cases end as expected on onnxkiln now.")
    return 0 if good == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
