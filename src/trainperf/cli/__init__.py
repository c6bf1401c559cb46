"""The ``trainperf`` command line: one module per command, assembled in :mod:`trainperf.cli.main`.

``trainperf.cli:main`` is the console entry point; ``build_parser`` is here too for scripts that ask
which commands exist. (The name ``main`` is the function: the module is ``sys.modules["trainperf.cli.main"]``.)
"""

from trainperf.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
