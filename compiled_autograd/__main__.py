"""Command line: ``compiled-autograd`` (also ``python -m compiled_autograd``).

For now one subcommand, ``demo`` (the default): train the bundled MLP a few steps and
check its gradients against finite differences. ``trace``, ``run`` and ``memory``
arrive with the tracer and code generator.
"""
from __future__ import annotations

import argparse
import sys


def _parser():
    parser = argparse.ArgumentParser(
        prog="compiled-autograd",
        description="A numpy autograd library whose backward pass can be compiled.")
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="train the bundled MLP and check its gradients")
    demo.add_argument("--steps", type=int, default=5, help="SGD steps (default 5)")
    demo.add_argument("--checks", type=int, default=8,
                      help="gradient entries compared with finite differences (default 8)")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in (None, "demo"):
        from compiled_autograd import demo
        steps = getattr(args, "steps", 5)
        checks = getattr(args, "checks", 8)
        if steps < 0 or checks < 1:
            print("compiled-autograd: error: --steps must be >= 0 and --checks >= 1",
                  file=sys.stderr)
            return 2
        worst = demo.run(steps=steps, checks=checks)
        return 0 if worst < 1e-5 else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
