"""The ``acetools`` command line: ``acetools demo`` (and more as the project grows)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    df = run_demo(n_tasks=args.tasks, seed=args.seed, methods=args.methods)
    print(f"Merging {args.tasks} linear-regression experts (seed {args.seed}); "
          "gain = 100*(L_base - L_merged)/(L_base - L_expert) on held-out data, 100 = expert level.")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="acetools", description="Data-free model merging: ACE, ESM and baselines.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="merge small generated experts with every method and print a table")
    d.add_argument("--tasks", type=int, default=6, help="number of experts (default 6)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--methods", nargs="+", default=None, help="methods to run (default: all)")
    d.set_defaults(func=_cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
