"""Re-decide the committed claims (figures/*/claims.json) with today's rules, from the numbers
they hold: no training, no merging (acetools.course.rejudge).

    python3 scripts/rejudge_claims.py           # rewrite the files, print every verdict that changed
    python3 scripts/rejudge_claims.py --check   # exit 1 if a committed verdict is not today's rule's
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's acetools, however the script is run

from acetools.course.rejudge import rejudge  # noqa: E402

ROOT = REPO / "figures"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    ap.add_argument("--figures", default=str(ROOT), help="the figures root (default: the repository's figures/)")
    args = ap.parse_args(argv)
    rows = rejudge(args.figures, write=not args.check)
    changed = [r for r in rows if r["changed"]]
    for r in rows:
        mark = "CHANGED" if r["changed"] else "same   "
        print(f"{mark} {r['id']:<22} {str(r['before']):<18} -> {r['after']:<18} {r['reason'][:150]}")
    print(f"{len(changed)} of {len(rows)} verdicts changed")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
