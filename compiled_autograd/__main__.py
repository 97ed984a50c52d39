"""``python -m compiled_autograd`` is the ``compiled-autograd`` command (see cli.py)."""
import sys

from compiled_autograd.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
