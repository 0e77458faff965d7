"""The run folder's TensorBoard files, read by TensorBoard's own reader (the
`tensorboard` package from PyPI, in a test venv): `rlhost run` of the GRPO
example writes every numeric field of every metrics.jsonl record as a scalar
`<phase>/<key>` at its step; after a resume both hold the same steps again,
each once; the samples of samples.jsonl are text summaries (`rl/samples`, the
Text tab) at their steps, also after a resume; `run.tensorboard: false`
writes none."""

import json
import os
import struct
import unittest

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("the tensorboard package is not installed in this venv (no PyPI?): skipped")
    raise SystemExit(77)

from rlhost_runs import RunFolderCase, read_records, rlhost_run  # noqa: E402


def f32(v):
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


class TensorBoardFiles(RunFolderCase):
    RUN = "grpo"

    def rlhost_run(self, *sets):
        p = rlhost_run(self.tmp.name, "examples/grpo.lua", "examples/grpo.yaml",
                       ("sft.steps=3",) + sets)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])

    def records(self):
        return read_records(self.run_dir)

    def expect_same(self):
        acc = EventAccumulator(os.path.join(self.run_dir, "tensorboard"),
                               size_guidance={"scalars": 0})
        acc.Reload()
        scalars = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}
        want = {}
        for rec in self.records():
            for key, value in rec.items():
                if key in ("phase", "step") or isinstance(value, bool) or \
                        not isinstance(value, (int, float)):
                    continue
                want[(f"{rec['phase']}/{key}", rec["step"])] = f32(value)
        got = {}
        for tag, events in scalars.items():
            for e in events:
                self.assertNotIn((tag, e.step), got, f"{tag} step {e.step} written twice")
                got[(tag, e.step)] = e.value
        self.assertGreater(len(want), 50)
        self.assertEqual(set(got), set(want))
        for k, v in want.items():
            self.assertEqual(got[k], v, k)
        return scalars

    def test_every_metric_of_every_step_is_a_scalar_and_a_resume_keeps_them_once(self):
        self.rlhost_run("run.steps=4")
        scalars = self.expect_same()
        self.assertIn("rl/reward", scalars)
        self.assertIn("sft/loss", scalars)
        self.assertEqual([e.step for e in scalars["rl/reward"]], [1, 2, 3, 4])
        # What a process killed after its last checkpoint leaves: events the
        # resumed run redoes (here a second copy of every step so far).
        tb = os.path.join(self.run_dir, "tensorboard")
        (first,) = os.listdir(tb)
        with open(os.path.join(tb, first), "rb") as f:
            stale = f.read()
        with open(os.path.join(tb, "events.out.tfevents.1.stale.rl"), "wb") as f:
            f.write(stale)
        self.rlhost_run("run.steps=6", "run.resume=true")
        scalars = self.expect_same()
        self.assertEqual([e.step for e in scalars["rl/reward"]], [1, 2, 3, 4, 5, 6])

    def texts(self):
        acc = EventAccumulator(os.path.join(self.run_dir, "tensorboard"),
                               size_guidance={"tensors": 0})
        acc.Reload()
        self.assertIn("rl/samples", acc.Tags()["tensors"])
        out = {}
        for e in acc.Tensors("rl/samples"):
            self.assertNotIn(e.step, out, f"samples of step {e.step} written twice")
            (text,) = e.tensor_proto.string_val
            out[e.step] = text.decode()
        return out

    def test_samples_are_text_summaries_at_their_steps_and_survive_a_resume(self):
        self.rlhost_run("run.steps=2", "run.samples_every=1", "run.checkpoint_every=2")
        with open(os.path.join(self.run_dir, "samples.jsonl")) as f:
            samples = [json.loads(line) for line in f if line.strip()]
        steps = sorted({s["step"] for s in samples if s["phase"] == "rl"})
        self.assertTrue(steps)
        texts = self.texts()
        self.assertEqual(sorted(texts), steps)
        for step in steps:
            first = next(s for s in samples if s["phase"] == "rl" and s["step"] == step)
            text = texts[step]
            self.assertTrue(text.startswith("| group | reward | advantage | prompt | completion |"))
            self.assertIn(first["task"]["prompt"].replace("\n", "\\n"), text)
            self.assertIn(first["completion"].replace("|", "\\|").replace("\n", "\\n"), text)
        self.rlhost_run("run.steps=3", "run.samples_every=1", "run.resume=true")
        again = self.texts()
        for step in steps:
            self.assertEqual(again[step], texts[step])

    def test_run_tensorboard_false_writes_no_event_files(self):
        self.rlhost_run("run.steps=1", "run.tensorboard=false")
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "tensorboard")))
        self.assertEqual(len([r for r in self.records() if r["phase"] == "rl"]), 1)


if __name__ == "__main__":
    unittest.main()
