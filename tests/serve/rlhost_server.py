"""`rlhost <command>` serving a fresh tiny model (seed 7) from a temporary folder on a free
port, for the tests that drive it with a client from PyPI."""

import os
import re
import signal
import subprocess
import tempfile

RLHOST = os.environ["RL_TEST_RLHOST"]


class RlhostServer:
    def __init__(self, command, *args, checkpoint_dir=False, prepare=None):
        """checkpoint_dir: pass --checkpoint-dir, a folder inside the temporary one;
        prepare: called with the model folder before the server starts."""
        import rl

        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "tiny")
        rl.init_model("tiny", self.dir, 7)
        if prepare is not None:
            prepare(self.dir)
        args = list(args)
        if checkpoint_dir:
            args += ["--checkpoint-dir", os.path.join(self.tmp.name, "ckpt")]
        self.proc = subprocess.Popen(
            [RLHOST, command, "--model", self.dir, "--port", "0", "--threads", "1"] + args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError("rlhost %s did not start: %r %s" %
                               (command, line, self.proc.stderr.read()))
        self.command = command
        self.url = match.group(1)

    def stop(self):
        """SIGINT, and the server must exit with 0."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        self.tmp.cleanup()
        assert code == 0, "rlhost %s exited with %d after SIGINT: %s" % (
            self.command, code, self.proc.stderr.read())
