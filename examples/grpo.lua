-- examples/grpo.lua: GRPO on an environment (reverse_text by default) with the
-- co-located rollout engine. `make run` runs it on the built-in tiny model:
--
--   rlhost run examples/grpo.lua --config examples/grpo.yaml
--
-- 1. supervised warm-up on the env's reference answers (sft.steps > 0), so the
--    policy starts with some reward to improve on;
-- 2. each RL step: sample prompts, generate rollout.n completions per prompt,
--    score them, run the filters, drop groups without signal (the buffer),
--    compute group-relative advantages, take one optimizer step and sync the
--    engine's weights. With ref.model set, a frozen reference scores the
--    batch's tokens first (ref_logprobs) for the loss's KL term
--    (loss.params.kl_coef) and the ref_kl metric. With reward_model.path or
--    judge.model set, a reward model / an LLM judge adds its score to each
--    rollout's reward. Every eval.every steps the same eval tasks are answered
--    (greedy by default) and scored by the env: eval/*.
local rl = require("rl")

-- This script's own settings (sft.*, ref.*, eval.*, reward.*), checked like the host's.
local cfg = rl.config(rl.episode_keys(rl.reward_keys(rl.eval_keys(rl.ref_keys(rl.sft_keys())))))
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok = model:tokenizer()
local trainer = model:trainer(rl.trainer_config(cfg))
run:attach(trainer) -- restores the last checkpoint when run.resume is set
local engine = rl.rollout_engine(model, cfg, run) -- co-located, or inference_server.url

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
local buffer = rl.buffer(rl.buffer_config(cfg))

-- 1. supervised warm-up (sft.steps > 0) -----------------------------------------------
rl.sft_warmup(cfg, run, trainer, tok, env)
engine:sync_weights(buffer)
local ref = rl.reference(cfg, model, run) -- nil unless ref.model is set
local scorers = rl.reward_scorers(cfg) -- reward_model.path, judge.model (none by default)

-- 2. GRPO ----------------------------------------------------------------------------
for step in run:steps("rl", cfg.run.steps) do
    local rollouts = rl.scored_rollouts(engine, env, cfg, step)
    local scored = rl.apply_reward_scorers(cfg, scorers, rollouts) -- {} without either
    local overlong = rl.shape_overlong(cfg, rollouts) -- DAPO's, when reward.overlong_buffer > 0
    local flagged = rollouts:filter(filters)
    buffer:push_rollouts(rollouts) -- the buffer drops groups without signal

    local r = rollouts:info()
    local record = {
        reward = r.reward_mean, reward_std = r.reward_std,
        exact = r["env/exact_match"], flagged = flagged.flagged, masked = flagged.masked,
        overlong_penalty = overlong,
    }
    for k, v in pairs(scored) do record[k] = v end
    local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
    if batch then
        batch:compute_advantages(advantage)
        run:log_samples(batch) -- every run.samples_every steps, to samples.jsonl
        if ref then ref:score(batch) end
        local out = trainer:forward_backward(batch, loss)
        local opt = trainer:optim_step()
        engine:sync_weights(buffer)
        for k, v in pairs(rl.loss_stats(out)) do record[k] = v end
        record.ref_kl = out.metrics and out.metrics.ref_kl
        -- An MoE model's router (model.preset tiny-moe, Qwen3-MoE): moe/aux_loss,
        -- moe/z_loss and the experts' load ratios, overall and per layer.
        for k, v in pairs(out.metrics or {}) do
            if k:sub(1, 4) == "moe/" then record[k] = v end
        end
        record.mask_frac = record.mask_frac or flagged.masked / r.rollouts
        record.tokens, record.grad_norm, record.lr = out.tokens, opt.grad_norm, opt.learning_rate
        record.groups = batch:info().groups
    end
    local drops = buffer:stats(true)
    record.dropped_groups = drops.dropped_groups
    for k, v in pairs(rl.evaluate(engine, env, cfg, step) or {}) do record["eval/" .. k] = v end
    run:log(record)
end

run:finish()
