"""Errors and exit codes every command shares.

Bad input is a :class:`SpecError` with a one-line message saying what is wrong and what would be
valid; the CLI turns it into exit code 2 before any process starts.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and its result is a failure (a run that missed its target, a failed check)
EXIT_BAD_INPUT = 2  # refused before anything ran


class SpecError(ValueError):
    """Bad input: a one-line message saying what is wrong and what would be valid."""
