"""Exit codes and the one bad-input printer every command uses.

Exit codes (those of :mod:`trainperf.core.errors`): 0 success, 1 the run failed (e.g. target not
reached, a check failed), 2 bad input (one line on stderr; with --json also one object on stdout).
"""

from __future__ import annotations

import json
import sys

from trainperf.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, SpecError
from trainperf.core.untrusted import printable

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_OK", "SpecError", "bad_input"]


def bad_input(msg: str, as_json: bool) -> int:
    """Say what is wrong in one line (and as JSON on stdout with --json); the exit code to return.
    Control characters are escaped: a message may quote a name from a downloaded file."""
    msg = printable(msg, limit=4000)
    if as_json:
        print(json.dumps({"error": msg, "exit_code": EXIT_BAD_INPUT}))
    print(f"trainperf: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT
