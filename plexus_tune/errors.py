"""Errors that the command line reports as one line with exit code 2."""


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and how to fix it."""


EXIT_USER_ERROR = 2


class SkippedLinesWarning(UserWarning):
    """Lines of an input file that were skipped (e.g. malformed lines of a measurement log).

    The command line prints each one as a single plain line on stderr, once.
    """
