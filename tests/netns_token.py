"""Network-namespace prefixes of this test run: a letter per use and three random letters per run.

Two test runs on one host (two users, or a run beside CI) then never share a prefix, so
neither counts the other's emulated clusters as left behind, nor removes them in its
cleanup tests (a prefix is at most 4 lower-case letters: plexus_tune.cluster.emulated).
"""

import secrets
import string

#: three random lower-case letters, fixed for this Python process (17,576 values)
RUN_TOKEN = "".join(secrets.choice(string.ascii_lowercase) for _ in range(3))


def prefix_for(letter: str) -> str:
    """``letter`` + :data:`RUN_TOKEN`: the prefix of one group of tests in this run."""
    return letter + RUN_TOKEN
