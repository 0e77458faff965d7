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
--    engine's weights.
local rl = require("rl")

local cfg = rl.config { -- this script's own settings, checked like the host's
    { "sft.steps", "integer", 0, "Supervised warm-up steps on the env's reference answers before RL.", min = 0 },
    { "sft.batch_size", "integer", 32, "Examples per warm-up step.", min = 1 },
    { "sft.learning_rate", "number", 1e-3, "Warm-up learning rate.", min = 0 },
}
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok, info = model:tokenizer(), model:info()
local trainer = model:trainer(rl.trainer_config(cfg))
run:attach(trainer) -- restores the last checkpoint when run.resume is set
local engine = rl.rollout_engine(model, cfg, run) -- co-located, or inference_server.url
local template = cfg.tokenizer.chat_template

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
local buffer = rl.buffer(rl.buffer_config(cfg))

-- 1. supervised warm-up ------------------------------------------------------------
if cfg.sft.steps > 0 then
    local ce = rl.loss("causallm_loss")
    for step in run:steps("sft", cfg.sft.steps, { checkpoint_every = 0 }) do
        local tasks = env:sample(cfg.sft.batch_size, rl.seed(cfg.run.seed, "sft", step))
        local batch = rl.sft_batch(tok, tasks, info.eos_token_ids[1], template)
        local out = trainer:forward_backward(batch, ce)
        local opt = trainer:optim_step { learning_rate = cfg.sft.learning_rate }
        run:log { loss = out.loss, tokens = out.tokens, grad_norm = opt.grad_norm }
    end
end
engine:sync_weights(buffer)

-- 2. GRPO ----------------------------------------------------------------------------
for step in run:steps("rl", cfg.run.steps) do
    local tasks = env:sample(cfg.rollout.prompts_per_step, rl.seed(cfg.run.seed, "rl", step))
    local rollouts = engine:rollouts(tasks, {
        chat_template = template, group_offset = step * #tasks,
        sampling = rl.generation_params(cfg, { seed = rl.seed(cfg.run.seed, "generate", step) }),
    })
    rollouts:score(env)
    local flagged = rollouts:filter(filters)
    buffer:push_rollouts(rollouts) -- the buffer drops groups without signal

    local r = rollouts:info()
    local record = {
        reward = r.reward_mean, reward_std = r.reward_std,
        exact = r["env/exact_match"], flagged = flagged.flagged, masked = flagged.masked,
    }
    local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
    if batch then
        batch:compute_advantages(advantage)
        local out = trainer:forward_backward(batch, loss)
        local opt = trainer:optim_step()
        engine:sync_weights(buffer)
        for k, v in pairs(rl.loss_stats(out)) do record[k] = v end
        record.mask_frac = record.mask_frac or flagged.masked / r.rollouts
        record.tokens, record.grad_norm, record.lr = out.tokens, opt.grad_norm, opt.learning_rate
        record.groups = batch:info().groups
    end
    local drops = buffer:stats(true)
    record.dropped_groups = drops.dropped_groups
    run:log(record)
end

run:finish()
