"""``compiled_autograd.runtime`` and ``compiled_autograd.codegen`` in a source checkout.

Installed (``pip install .``), the folders ``runtime/`` and ``codegen/`` are
``compiled_autograd/runtime/`` and ``compiled_autograd/codegen/`` (pyproject's
``package-dir``), so the ordinary import system finds them. In a checkout they
stay beside ``compiled_autograd/`` (DESIGN.md's layout), and a process that imports
the package from there (``PYTHONPATH=<checkout>``, or run from its root) needs to
be told where they are: ``install()`` adds a finder for exactly these two names,
and only when this package is a checkout's. (``pip install -e .`` has
setuptools' own finder for the same mapping.) Nothing here makes ``runtime`` or
``codegen`` importable as top-level names. See docs/architecture.md, "Packaging".
"""
import os
import sys
from importlib.machinery import PathFinder

PACKAGE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PACKAGE)
FOLDERS = ("runtime", "codegen")


def is_checkout(package: str = PACKAGE) -> bool:
    """True where the two folders sit beside the package (a checkout), not inside
    it (an installed copy)."""
    root = os.path.dirname(package)
    return (os.path.isfile(os.path.join(root, "pyproject.toml"))
            and all(os.path.isfile(os.path.join(root, f, "__init__.py")) for f in FOLDERS)
            and not any(os.path.isdir(os.path.join(package, f)) for f in FOLDERS))


class CheckoutFinder:
    """A ``sys.meta_path`` finder: ``compiled_autograd.<folder>`` is the checkout's
    ``<folder>/``; their submodules are then found by the package's ``__path__``."""

    names = {f"{__package__}.{f}" for f in FOLDERS}

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname not in cls.names:
            return None
        return PathFinder.find_spec(fullname, [ROOT])


def install() -> None:
    if is_checkout() and CheckoutFinder not in sys.meta_path:
        sys.meta_path.append(CheckoutFinder)
