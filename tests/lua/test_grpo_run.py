"""The GRPO example end to end, on what it leaves besides metrics:

- a frozen reference model (ref.model): the batch's ref_logprobs come from
  it, so the loss reports ref_kl, exactly 0 on the first trained step (the
  reference is the policy as RL starts) and above 0 once the policy moved; a
  resumed run keeps the reference it started with; a folder that is no model
  is refused naming the key; without ref.model nothing changes;
- samples.jsonl (run.samples_every): the trained sequences of every N-th step
  with task, completion, reward and advantage, cut back to the checkpoint on
  resume;
- online evaluation (eval.*): every N-th step's record carries eval/* over
  the same tasks (env tasks or a JSON-lines file, whose bad line is named);
- DAPO's overlong shaping (reward.overlong_buffer): the formula, and a step's
  reward moved by exactly its logged penalty (rollouts:set_rewards);
- QeRL noise (engine.noise_scheduler): the first stage samples as without
  noise, the noisy stages only move the rollouts (the rollout / trainer 'kl'
  leaves 0), counted after the warm-up; refused with an inference server;
- `rlhost report`: one HTML page with a chart per metric and phase (as many
  points as records) and the samples, text escaped, no script; it reads a
  run that is still writing its last line and names a broken one; a real
  browser (Debian's headless Chromium, installed by `install-deps.sh
  --tests`) lays out and paints every chart with no page error."""

import json
import os
import re
import shutil
from html.parser import HTMLParser
import subprocess
import unittest

from rlhost_runs import RLHOST, RunFolderCase, read_records, rlhost_run


class GrpoRun(RunFolderCase):
    RUN = "grpo"

    def rlhost_run(self, *sets, ok=True):
        p = rlhost_run(self.tmp.name, "examples/grpo.lua", "examples/grpo.yaml",
                       ("sft.steps=3", "run.tensorboard=false") + sets)
        if ok:
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        return p

    def trained_steps(self):
        return [r for r in read_records(self.run_dir, "rl") if "grad_norm" in r]


class ReferenceModel(GrpoRun):
    def test_initial_reference_scores_every_trained_batch_and_survives_a_resume(self):
        self.rlhost_run("run.steps=4", "ref.model=initial", "loss.params.kl_coef=0.05")
        steps = self.trained_steps()
        self.assertGreaterEqual(len(steps), 2)
        self.assertTrue(all("ref_kl" in r for r in steps), steps)
        self.assertEqual(steps[0]["ref_kl"], 0.0, "the reference is the policy as RL starts")
        self.assertGreater(steps[-1]["ref_kl"], 0.0)
        weights = os.path.join(self.run_dir, "reference", "model.safetensors")
        before = os.stat(weights).st_mtime_ns
        self.rlhost_run("run.steps=7", "run.resume=true", "ref.model=initial",
                        "loss.params.kl_coef=0.05")
        self.assertEqual(os.stat(weights).st_mtime_ns, before, "the reference is not rewritten")
        resumed = [r for r in self.trained_steps() if r["step"] > 4]
        self.assertTrue(resumed)
        self.assertTrue(all(r["ref_kl"] > 0.0 for r in resumed), resumed)

    def test_base_reference_is_the_lora_base_with_the_adapter_off(self):
        # The adapter starts as a no-op (B = 0) and no warm-up trains it: the
        # first trained step's policy is the base, so ref_kl is 0; once the
        # adapter trained, it is not.
        self.rlhost_run("run.steps=4", "sft.steps=0", "ref.model=base", "lora.rank=4",
                        "trainer.learning_rate=1e-2", "loss.params.kl_coef=0.05")
        steps = self.trained_steps()
        self.assertGreaterEqual(len(steps), 2)
        self.assertTrue(all("ref_kl" in r for r in steps), steps)
        self.assertEqual(steps[0]["ref_kl"], 0.0)
        self.assertGreater(steps[-1]["ref_kl"], 0.0)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "reference")),
                         "base needs no copy of the weights")
        p = self.rlhost_run("run.steps=1", "ref.model=base", ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ref.model: 'base' is the LoRA base with the adapter off and needs "
                      "lora.rank > 0", p.stdout + p.stderr)

    def test_a_reference_that_is_no_model_folder_is_refused_naming_the_key(self):
        missing = os.path.join(self.tmp.name, "nowhere")
        p = self.rlhost_run("run.steps=1", f"ref.model={missing}", ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"ref.model: '{missing}' is not a model folder", p.stdout + p.stderr)

    def test_without_ref_model_the_batches_carry_no_reference(self):
        self.rlhost_run("run.steps=2")
        steps = self.trained_steps()
        self.assertTrue(steps)
        self.assertTrue(all("ref_kl" not in r for r in steps), steps)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "reference")))


class QerlNoise(GrpoRun):
    """engine.noise_scheduler (docs/moe.md) through the Lua loop: the first
    stage samples as without noise, later stages sample with noisy norms while
    the trainer scores with the clean ones (the rollout / trainer mismatch
    'kl' leaves 0); an inference server that cannot be asked for its schedule is refused."""

    def records(self, name):
        return read_records(os.path.join(self.tmp.name, "runs", name), "rl")

    def test_the_first_stage_is_clean_and_the_noisy_stages_move_only_the_rollouts(self):
        # 6 RL steps after the 3-step warm-up (schedule step = policy version
        # - 3), 2 stages: rollouts at schedule steps 0-2 are noise-free, later
        # ones at sigma_start.
        for name, on in (("clean", "false"), ("noisy", "true")):
            self.rlhost_run("run.steps=6", f"run.name={name}", "engine.noise_scheduler.num_stages=2",
                            f"engine.noise_scheduler.enabled={on}",
                            "buffer.drop_zero_variance=false")
        clean, noisy = self.records("clean"), self.records("noisy")
        self.assertEqual(len(clean), 6)
        self.assertEqual(len(noisy), 6)
        # The first step samples at version 3 = schedule step 0: as without noise.
        self.assertEqual(clean[0]["reward"], noisy[0]["reward"])
        self.assertEqual(clean[0].get("kl"), noisy[0].get("kl"))
        kl_clean = [r["kl"] for r in clean if "kl" in r]
        kl_noisy = [r["kl"] for r in noisy if "kl" in r]
        self.assertTrue(kl_clean and all(k < 1e-9 for k in kl_clean), clean)
        # Noisy: clean trained steps, then only noisy ones (kl > 0), at least one.
        first = next(i for i, k in enumerate(kl_noisy) if k > 1e-6)
        self.assertGreater(first, 0, kl_noisy)
        self.assertTrue(all(k < 1e-9 for k in kl_noisy[:first]), kl_noisy)
        self.assertTrue(all(k > 1e-6 for k in kl_noisy[first:]), kl_noisy)

    def test_noise_with_an_unreachable_inference_server_is_refused(self):
        p = self.rlhost_run("run.steps=1", "inference_server.url=http://127.0.0.1:9",
                            "engine.noise_scheduler.enabled=true", ok=False)
        self.assertNotEqual(p.returncode, 0)
        # Nothing answers there: the run cannot learn the server's schedule.
        self.assertIn("engine.noise_scheduler.enabled (QeRL noise) with inference_server.url needs "
                      "a server that applies the same schedule", p.stdout + p.stderr)


class Samples(GrpoRun):
    def samples(self):
        with open(os.path.join(self.run_dir, "samples.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]

    def test_every_nth_step_writes_its_trained_sequences_and_a_resume_cuts_back(self):
        self.rlhost_run("run.steps=4", "run.samples_every=2")
        got = self.samples()
        trained = {r["step"] for r in self.trained_steps()}
        self.assertEqual({r["step"] for r in got}, {s for s in trained if s % 2 == 0})
        self.assertTrue(got)
        for r in got:
            self.assertEqual(r["phase"], "rl")
            self.assertIn("reverse: ", r["task"]["prompt"])
            self.assertIsInstance(r["completion"], str)
            self.assertIsInstance(r["reward"], float)
            self.assertIsInstance(r["advantage"], float)
        # GRPO: a group's advantages are its rewards centred on the group mean,
        # so they sum to 0 and follow the rewards' order.
        groups = {}
        for r in got:
            groups.setdefault((r["step"], r["group"]), []).append(r)
        for members in groups.values():
            self.assertAlmostEqual(sum(m["advantage"] for m in members), 0.0, places=5)
            best = max(members, key=lambda m: m["reward"])
            self.assertEqual(best["advantage"], max(m["advantage"] for m in members))
        # A process killed after logging step 6's samples but before its
        # checkpoint; the resumed run starts again from the checkpoint at 4,
        # and the stale line (step 2's group number: never a step 6 one) goes.
        stale = dict(got[0], step=6)
        with open(os.path.join(self.run_dir, "samples.jsonl"), "a") as f:
            f.write(json.dumps(stale) + "\n")
        self.rlhost_run("run.steps=6", "run.resume=true", "run.samples_every=2")
        after = self.samples()
        self.assertNotIn(stale, after)
        self.assertEqual(after[:len(got)], got)
        self.assertEqual({r["step"] for r in after[len(got):]}, {6})

    def test_samples_every_0_writes_none(self):
        self.rlhost_run("run.steps=2", "run.samples_every=0")
        self.assertEqual(self.samples(), [])


class Evaluation(GrpoRun):
    def records(self):
        return read_records(self.run_dir)

    def test_every_nth_step_records_the_evaluation(self):
        self.rlhost_run("run.steps=4", "eval.every=2", "eval.tasks=6", "eval.samples=3",
                        "eval.temperature=1.0", "eval.pass_reward=0.5")
        rl = [r for r in self.records() if r["phase"] == "rl"]
        self.assertEqual([r["step"] for r in rl], [1, 2, 3, 4])
        for r in rl:
            if r["step"] % 2:
                self.assertFalse([k for k in r if k.startswith("eval/")], r)
                continue
            self.assertEqual(r["eval/tasks"], 6)
            self.assertEqual(r["eval/k"], 3)
            self.assertGreaterEqual(r["eval/reward_mean"], 0.0)
            self.assertLessEqual(r["eval/reward_mean"], 1.0)
            self.assertIn(r["eval/pass_at_k"], [i / 6 for i in range(7)])
            self.assertIn("eval/env/exact_match", r)

    def test_tasks_from_a_file_and_a_bad_line_named(self):
        path = os.path.join(self.tmp.name, "eval.jsonl")
        tasks = [{"prompt": "reverse: ab\n", "answer": "ba", "metadata": {"text": "ab", "length": 2}},
                 {"prompt": "reverse: xyz\n", "answer": "zyx", "metadata": {"text": "xyz", "length": 3}}]
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(t) for t in tasks) + "\n")
        self.rlhost_run("run.steps=1", "eval.every=1", f"eval.file={path}")
        (r,) = [r for r in self.records() if r["phase"] == "rl"]
        self.assertEqual(r["eval/tasks"], 2)
        with open(path, "a") as f:
            f.write("{not json\n")
        p = self.rlhost_run("run.steps=1", "eval.every=1", f"eval.file={path}", ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"eval.file: {path}:3 is not a JSON object", p.stdout + p.stderr)


class OverlongShaping(GrpoRun):
    def test_the_penalty_follows_dapos_formula(self):
        script = os.path.join(self.tmp.name, "penalty.lua")
        with open(script, "w") as f:
            f.write('local rl = require("rl")\n'
                    'for _, n in ipairs({4, 5, 6, 7, 8, 9}) do\n'
                    '  print(n, rl.overlong_penalty(n, 8, 4, 0.5))\n'
                    'end\n')
        p = subprocess.run([RLHOST, "run", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = {int(a): float(b) for a, b in (line.split() for line in p.stdout.split("\n")
                                               if line.strip() and line.split()[0].isdigit())}
        # budget 8, buffer 4: free up to 4 tokens, then -(L - 4) / 4 * 0.5
        self.assertEqual(got, {4: 0.0, 5: -0.125, 6: -0.25, 7: -0.375, 8: -0.5, 9: -0.625})

    def test_a_steps_reward_moves_by_its_logged_penalty(self):
        self.rlhost_run("run.steps=1", "run.name=plain")
        plain = self.run_dir.replace("/grpo", "/plain")
        self.rlhost_run("run.steps=1", "run.name=shaped", "reward.overlong_buffer=4",
                        "reward.overlong_penalty_factor=0.5")
        shaped = self.run_dir.replace("/grpo", "/shaped")

        def rl_step(d):
            return read_records(d, "rl")[0]

        a, b = rl_step(plain), rl_step(shaped)
        self.assertNotIn("overlong_penalty", a)
        self.assertLess(b["overlong_penalty"], 0.0)
        self.assertAlmostEqual(b["reward"], a["reward"] + b["overlong_penalty"], places=12)
        p = self.rlhost_run("run.steps=1", "reward.overlong_buffer=9", ok=False)
        self.assertIn("reward.overlong_buffer (9) is larger than rollout.max_tokens (8)",
                      p.stdout + p.stderr)


class Page(HTMLParser):
    """Tags, polyline point counts, chart titles and text of a report."""

    def __init__(self):
        super().__init__()
        self.tags, self.points, self.titles, self.text = [], [], [], []
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "polyline":
            self.points.append(len(a["points"].split()))
        self._in_title = tag == "title"

    def handle_data(self, data):
        self.text.append(data)
        if self._in_title:
            self.titles.append(data)
            self._in_title = False


# Put at the top of the report's <head>: collects page errors, and after the
# load event writes what the browser made of each chart into <pre id="probe">.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));
window.addEventListener("load", () => {
  const charts = [...document.querySelectorAll("figure.chart svg")].map((svg) => {
    const box = svg.getBoundingClientRect();
    const line = svg.querySelector("polyline");
    const bb = line.getBBox();
    const style = getComputedStyle(line);
    return {title: svg.querySelector("title").textContent, width: box.width,
            height: box.height, points: line.points.numberOfItems, line_width: bb.width,
            line_height: bb.height, stroke: style.stroke, fill: style.fill,
            visible: style.visibility === "visible" && style.display !== "none"};
  });
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({charts: charts, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>"""


class Report(GrpoRun):
    def report(self, ok=True):
        p = subprocess.run([RLHOST, "report", self.run_dir], capture_output=True, text=True,
                           timeout=120)
        if ok:
            self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def page(self):
        page = Page()
        with open(os.path.join(self.run_dir, "report.html")) as f:
            page.feed(f.read())
        return page

    def test_a_chart_per_metric_with_every_step_and_the_samples_escaped(self):
        self.rlhost_run("run.steps=4", "run.samples_every=1")
        with open(os.path.join(self.run_dir, "samples.jsonl"), "a") as f:
            f.write(json.dumps({"phase": "rl", "step": 99, "group": 1, "task": {"prompt": "p"},
                                "completion": "<b>not a tag</b>", "reward": 1.0,
                                "advantage": 0.5}) + "\n")
        self.report()
        page = self.page()
        self.assertNotIn("script", page.tags)
        self.assertNotIn("b", page.tags)
        self.assertIn("<b>not a tag</b>", "".join(page.text))
        recs = read_records(self.run_dir)
        counts = {}
        for r in recs:
            for k, v in r.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    counts[(r["phase"], k)] = counts.get((r["phase"], k), 0) + 1
        self.assertEqual(len(page.points), len(counts))
        self.assertEqual(sorted(page.points), sorted(counts.values()))
        self.assertIn("reward", page.titles)
        # A run still writing: its last line without a newline is left out.
        with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
            f.write('{"phase": "rl", "st')
        self.report()
        self.assertEqual(len(self.page().points), len(counts))
        # A broken line in the middle is named.
        with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
            f.write('\n{"phase": "rl", "step": 5}\n')
        p = self.report(ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"metrics.jsonl:{len(recs) + 1} is not a JSON object", p.stderr)

    def test_a_headless_browser_draws_every_chart_with_no_page_error(self):
        browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
        self.assertIsNotNone(browser, "no headless Chromium: run scripts/install-deps.sh --tests "
                                      "(Debian package chromium-headless-shell)")
        self.rlhost_run("run.steps=3", "run.samples_every=1")
        self.report()
        with open(os.path.join(self.run_dir, "report.html")) as f:
            html = f.read()
        self.assertEqual(html.count("<head>"), 1)
        probe_page = os.path.join(self.tmp.name, "probe.html")
        with open(probe_page, "w") as f:
            f.write(html.replace("<head>", "<head>" + PROBE))
        p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                            f"--user-data-dir={self.tmp.name}/chromium",
                            "--enable-logging=stderr", "--v=0", "--window-size=1280,4000",
                            "--virtual-time-budget=10000", "--dump-dom",
                            "file://" + probe_page],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        # Script errors and console errors show on the browser's log.
        for line in p.stderr.splitlines():
            self.assertNotRegex(line, r"CONSOLE.*(Uncaught|Error)", line)
        m = re.search(r'<pre id="probe">(.*?)</pre>', p.stdout, re.S)
        self.assertIsNotNone(m, "the browser did not finish loading the page: " + p.stdout[-500:])
        probe = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<")
                           .replace("&gt;", ">").replace("&amp;", "&"))
        self.assertEqual(probe["errors"], [])
        expected = sorted(self.page().points)
        charts = probe["charts"]
        self.assertEqual(sorted(c["points"] for c in charts), expected)
        self.assertIn("reward", [c["title"] for c in charts])
        for c in charts:
            self.assertEqual((c["width"], c["height"]), (320, 160), c)
            self.assertTrue(c["visible"], c)
            self.assertEqual(c["stroke"], "rgb(31, 111, 178)", c)  # svg .line
            self.assertEqual(c["fill"], "none", c)
            if c["points"] > 1:  # a line across the frame, from the first step to the last
                self.assertGreater(c["line_width"], 200, c)


if __name__ == "__main__":
    unittest.main()
