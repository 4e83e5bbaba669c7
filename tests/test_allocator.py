import platform
import subprocess
import sys

import pytest


def _run(code, **env):
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True).stdout.strip()


def test_retain_large_allocations_applies_on_glibc_and_can_be_disabled():
    code = "from plexus_tune.allocator import retain_large_allocations as r; print(r())"
    if platform.libc_ver()[0] == "glibc":
        assert _run(code) == "True"
    assert _run(code, PLEXUS_TUNE_MALLOC="default") == "False"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_freed_large_blocks_are_reused_instead_of_remapped():
    # a 64 MiB block freed and allocated again: glibc's default maps it anew (new page faults);
    # with retain_large_allocations the second allocation reuses the heap memory (no new faults)
    code = (
        "import ctypes, resource, sys\n"
        "from plexus_tune.allocator import retain_large_allocations\n"
        "if sys.argv[1:] == ['retain']: retain_large_allocations()\n"
        "libc = ctypes.CDLL('libc.so.6'); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = (ctypes.c_void_p,)\n"
        "n = 64 << 20\n"
        "def touch():\n"
        "    p = libc.malloc(n); ctypes.memset(p, 1, n); return p\n"
        "libc.free(touch())\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "libc.free(touch())\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    default = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    retained = int(subprocess.run([sys.executable, "-c", code, "retain"], capture_output=True, text=True, check=True).stdout)
    assert default > 10000  # 16384 pages of 4 KiB faulted in again
    assert retained < 1000
