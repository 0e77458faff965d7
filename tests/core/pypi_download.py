"""`pip download` of one package from PyPI for the reference scripts of tests/core."""

import subprocess
import sys


def pip_download(spec, dest, binary):
    """Downloads `spec` (no dependencies) into `dest`: wheels when `binary`, else the
    source distribution. None, or why it failed (PyPI unreachable, ...)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           "--only-binary" if binary else "--no-binary", ":all:",
           "--disable-pip-version-check", "--quiet", "-d", dest, spec]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "pip download %s failed: %s" % (spec, e)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return "cannot fetch from PyPI (pip download %s): %s" % (spec, " | ".join(tail))
    return None
