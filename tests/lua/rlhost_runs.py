"""What the end-to-end tests of tests/lua share: the built rlhost and the
source tree it runs the examples from (RL_TEST_RLHOST, RL_TEST_SOURCE_DIR),
`rlhost run` of an example with its run folders and tiny model in a temporary
folder, and the records of a run's metrics.jsonl."""

import json
import os
import subprocess
import tempfile
import unittest

RLHOST = os.environ["RL_TEST_RLHOST"]
SOURCE = os.environ["RL_TEST_SOURCE_DIR"]
SCALE = int(os.environ.get("RL_TEST_TIME_SCALE", "1"))  # 4 under the sanitizers


def rlhost_run(tmp, script, config, sets, launch=(), timeout=600):
    """`rlhost [launch...] run script --config config` in the source tree, its
    runs (run.dir) and tiny model (model.init_dir) under the folder `tmp`,
    progress as lines, then `--set s` for every s of `sets` (a later one
    wins); the finished process, output captured."""
    args = [RLHOST, *launch, "run", script, "--config", config,
            "--set", "run.progress=lines", "--set", f"run.dir={tmp}/runs",
            "--set", f"model.init_dir={tmp}/tiny"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=SOURCE, capture_output=True, text=True, timeout=timeout)


def read_records(run_dir, phase=None):
    """The records of run_dir/metrics.jsonl, or only those of `phase`."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return recs if phase is None else [r for r in recs if r["phase"] == phase]


class RunFolderCase(unittest.TestCase):
    """A temporary folder per test (self.tmp) and the run folder
    runs/<RUN> in it (self.run_dir, the run.name RUN)."""

    RUN = "run"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix=f"rl-{self.RUN}-")
        self.run_dir = os.path.join(self.tmp.name, "runs", self.RUN)

    def tearDown(self):
        self.tmp.cleanup()
