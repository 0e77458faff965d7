#!/usr/bin/env python3
"""examples/grpo.py: examples/grpo.lua in Python, through the same C API.

    PYTHONPATH=sdk/python python3 examples/grpo.py --config examples/grpo.yaml

Same configuration, same seeds, same calls: with one configuration it logs the
same rewards and losses step for step as `rlhost run examples/grpo.lua`. One
JSON line per step goes to --metrics (default: run.dir/run.name/metrics.py.jsonl).
"""

import argparse
import json
import os
import sys
import time

import rl

# This script's own settings, checked like the host's (as grpo.lua declares them).
SFT_KEYS = [
    {"key": "sft.steps", "type": "integer", "default": 0, "min": 0,
     "doc": "Supervised warm-up steps on the env's reference answers before RL."},
    {"key": "sft.batch_size", "type": "integer", "default": 32, "min": 1,
     "doc": "Examples per warm-up step."},
    {"key": "sft.learning_rate", "type": "number", "default": 1e-3, "min": 0,
     "doc": "Warm-up learning rate."},
]


def load_model(cfg):
    """The configuration's model; the built-in preset is created when model.path is empty."""
    m = cfg["model"]
    path = m["path"] or m["init_dir"]
    if not m["path"] and not os.path.exists(os.path.join(path, "config.json")):
        os.makedirs(path, exist_ok=True)
        rl.init_model(m["preset"], path, cfg["run"]["seed"])
        print(f"created the built-in '{m['preset']}' model in {path}")
    return rl.Model(path, {"threads": m["threads"], "device": m["device"], "dtype": m["dtype"]})


def generation_params(cfg, **extra):
    r = cfg["rollout"]
    p = {"n": r["n"], "temperature": r["temperature"], "top_p": r["top_p"], "top_k": r["top_k"],
         "max_tokens": r["max_tokens"], "stop": r["stop"]}
    p.update(extra)
    return p


def loss_stats(out):
    """loss, kl, clip_frac, mask_frac, whatever names the loss plugin uses (as rl.loss_stats)."""
    m = out.metrics

    def first(*names):
        return next((m[n] for n in names if n in m), None)

    return {"loss": out.scalars["loss"],
            "kl": first("kl_sample_train_k3", "kl", "approx_kl", "ref_kl"),
            "clip_frac": first("pg_clipfrac", "clip_fraction", "tis_clipfrac"),
            "mask_frac": first("masked", "icepop_maskfrac", "behav_maskfrac")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="YAML run configuration")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key (YAML value)")
    ap.add_argument("--plugin-path", help="plugin files or folders (else RL_PLUGIN_PATH)")
    ap.add_argument("--metrics", help="JSON lines, one per step")
    args = ap.parse_args()

    cfg = rl.config_declare(rl.config_load(args.config, args.set), SFT_KEYS)
    seed = cfg["run"]["seed"]
    run_dir = os.path.join(cfg["run"]["dir"], cfg["run"]["name"])
    os.makedirs(run_dir, exist_ok=True)
    metrics_path = args.metrics or os.path.join(run_dir, "metrics.py.jsonl")

    paths = ([args.plugin_path] if args.plugin_path else []) + cfg["plugins"]["path"]
    with rl.Runtime(plugin_path=os.pathsep.join(paths) or None) as rt, load_model(cfg) as model, \
            open(metrics_path, "w") as metrics:
        info = model.info()
        trainer_cfg = dict(cfg["trainer"], total_steps=cfg["run"]["steps"], seed=seed)
        # The QeRL noise schedule (engine.noise_scheduler): its length, its start
        # after the supervised warm-up, its seed.
        engine_cfg = dict(cfg["engine"], total_steps=cfg["run"]["steps"],
                          first_step=cfg["sft"]["steps"], seed=seed)
        lora = cfg.get("lora", {})
        if lora.get("rank", 0) > 0:  # train and sample LoRA adapter "default" (docs/lora.md)
            trainer_cfg.update(adapter="default", lora=dict(lora, seed=seed))
            engine_cfg["adapter"] = "default"
        trainer = model.trainer(trainer_cfg)
        engine = model.engine(engine_cfg)
        template = cfg["tokenizer"]["chat_template"]

        env = rt.create("env", cfg["env"]["name"], cfg["env"]["params"])
        loss = rt.create("loss", cfg["loss"]["name"], cfg["loss"]["params"])
        advantage = rt.create("advantage", cfg["advantage"]["name"], cfg["advantage"]["params"])
        filters = [rt.create("filter", f["name"], dict(f["params"], enforce=f["enforce"]))
                   for f in cfg["filters"]]
        buffer_cfg = {k: v for k, v in cfg["buffer"].items() if k != "min_rollouts"}
        buffer = rl.Buffer(dict(buffer_cfg, group_size=cfg["rollout"]["n"]))

        def log(phase, step, total, record, t0):
            record = {k: v for k, v in record.items() if v is not None}
            record.update(phase=phase, step=step, seconds=time.time() - t0)
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            shown = "  ".join(f"{k} {record[k]:.4g}" for k in ("reward", "loss") if k in record)
            print(f"{phase:4} {step}/{total}  {shown}")

        # 1. supervised warm-up
        ce = rt.create("loss", "causallm_loss")
        sft = cfg["sft"]
        for step in range(1, sft["steps"] + 1):
            t0 = time.time()
            tasks = env.sample(sft["batch_size"], rl.seed(seed, "sft", step))
            with model.sft_batch(tasks, info["eos_token_ids"][0], template) as batch:
                out = trainer.forward_backward(batch, ce)
            opt = trainer.optim_step({"learning_rate": sft["learning_rate"]})
            log("sft", step, sft["steps"], {"loss": out.scalars["loss"],
                                            "tokens": out.scalars["tokens"],
                                            "grad_norm": opt.scalars["grad_norm"]}, t0)
        engine.sync_weights(buffer)

        # 2. GRPO
        steps = cfg["run"]["steps"]
        for step in range(1, steps + 1):
            t0 = time.time()
            tasks = env.sample(cfg["rollout"]["prompts_per_step"], rl.seed(seed, "rl", step))
            with engine.rollouts(tasks, chat_template=template, group_offset=step * len(tasks),
                                 sampling=generation_params(cfg, seed=rl.seed(seed, "generate", step))
                                 ) as rollouts:
                rollouts.score(env)
                flagged = rollouts.filter(filters)
                buffer.push_rollouts(rollouts)  # the buffer drops groups without signal
                r = rollouts.info()
            record = {"reward": r.scalars["reward_mean"], "reward_std": r.scalars["reward_std"],
                      "exact": r.scalars.get("env/exact_match"),
                      "flagged": flagged.scalars["flagged"], "masked": flagged.scalars["masked"]}
            batch = buffer.pop_train_batch(cfg["buffer"]["min_rollouts"])
            if batch is not None:
                with batch:
                    batch.compute_advantages(advantage)
                    out = trainer.forward_backward(batch, loss)
                    opt = trainer.optim_step()
                    engine.sync_weights(buffer)
                    record.update(loss_stats(out))
                    if record["mask_frac"] is None:
                        record["mask_frac"] = flagged.scalars["masked"] / r.scalars["rollouts"]
                    record.update(tokens=out.scalars["tokens"], grad_norm=opt.scalars["grad_norm"],
                                  lr=opt.scalars["learning_rate"],
                                  groups=batch.info().scalars["groups"])
            record["dropped_groups"] = buffer.stats(take=True).scalars["dropped_groups"]
            log("rl", step, steps, record, t0)
        buffer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except rl.Error as e:
        print(f"examples/grpo.py: {e} ({e.status})", file=sys.stderr)
        sys.exit(1)
