-- examples/ppo.lua: PPO with the clipped policy_loss. Each step's rollouts are
-- trained on for ppo.epochs passes of ppo.minibatches minibatches, one
-- optimizer step each; after the first step the policy has moved away from
-- the one that sampled, so the ratio leaves 1 and the clip engages (clip
-- fraction in the step line).
--
-- With model.value_head: true (examples/ppo.yaml) the policy carries a critic
-- head on its trunk: before training on a step's rollouts, the trainer's
-- forward gives the critic's values of every token, the advantage estimator
-- (gae) turns rewards and values into advantages and returns, and each
-- minibatch is trained with the policy loss and with value_loss (returns as
-- targets, old_values for vf_clip) before its optimizer step. Without a value
-- head the configured estimator runs on rewards alone (grpo, ...).
--
--   rlhost run examples/ppo.lua --config examples/ppo.yaml
local rl = require("rl")

local cfg = rl.config(rl.eval_keys(rl.sft_keys { -- this script's own settings, checked like the host's
    { "ppo.epochs", "integer", 2, "Passes over each step's rollouts (one optimizer step per minibatch per pass).", min = 1 },
    { "ppo.minibatches", "integer", 1, "Minibatches per pass (whole groups each).", min = 1 },
    { "ppo.vf_coef", "number", 0.5, "Weight of the critic's value_loss (with model.value_head).", min = 0 },
    { "ppo.vf_clip", "number", 0, "value_loss vf_clip around the rollout's values (0: none).", min = 0 },
}))
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok, info = model:tokenizer(), model:info()
local optimizer_steps = cfg.run.steps * cfg.ppo.epochs * cfg.ppo.minibatches
local trainer = model:trainer(rl.trainer_config(cfg, { total_steps = optimizer_steps }))
run:attach(trainer)
local engine = model:engine(rl.engine_config(cfg))

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
local critic = info.value_head
local value_loss = nil
if critic then
    value_loss = rl.loss("value_loss", {
        vf_coef = cfg.ppo.vf_coef, vf_clip = cfg.ppo.vf_clip > 0 and cfg.ppo.vf_clip or nil,
    })
end

-- The batch tensors one loss reads: a minibatch as a table without the
-- critic's tensors (for the policy loss), or with only them (for value_loss).
local critic_names = { returns = true, old_values = true }
local function policy_part(mb)
    local t = mb:tensors()
    for name in pairs(critic_names) do t[name] = nil end
    t.sampling_temperature = mb:info().sampling_temperature
    return t
end
local function critic_part(mb)
    local t = mb:tensors()
    local v = { input_ids = t.input_ids, cu_seqlens = t.cu_seqlens, loss_mask = t.loss_mask,
                returns = t.returns }
    if cfg.ppo.vf_clip > 0 then v.old_values = t.old_values end
    return v
end
local buffer = rl.buffer(rl.buffer_config(cfg))

rl.sft_warmup(cfg, run, trainer, tok, env) -- optional (sft.steps > 0)
engine:sync_weights(buffer)

for step in run:steps("rl", cfg.run.steps) do
    local rollouts = rl.scored_rollouts(engine, env, cfg, step)
    local flagged = rollouts:filter(filters)
    buffer:push_rollouts(rollouts)
    local r = rollouts:info()
    local record = { reward = r.reward_mean, exact = r["env/exact_match"], masked = flagged.masked }

    local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
    if batch then
        if critic then
            -- GAE on the critic's values of these rollouts, before training.
            local values = trainer:forward(batch).values
            local t, bi = batch:tensors(), batch:info()
            local a = advantage:compute {
                rewards = bi.rewards, group_ids = bi.group_ids, cu_seqlens = t.cu_seqlens,
                loss_mask = t.loss_mask, values = values,
            }
            batch:set("advantages", a.advantages)
            batch:set("returns", a.returns)
            batch:set("old_values", values)
            record.value_mean = a.metrics.values_mean
        else
            batch:compute_advantages(advantage)
        end
        local stats = rl.metrics()
        local minibatches = batch:split(cfg.ppo.minibatches) -- whole groups each
        for _ = 1, cfg.ppo.epochs do
            for _, mb in ipairs(minibatches) do
                local out = trainer:forward_backward(critic and policy_part(mb) or mb, loss)
                if critic then
                    local v = trainer:forward_backward(critic_part(mb), value_loss)
                    stats:add("value_loss", v.loss):add("value_error_sq", v.metrics.value_error_sq_mean)
                end
                local opt = trainer:optim_step()
                stats:merge(rl.loss_stats(out)):add("grad_norm", opt.grad_norm)
                stats:add("ratio_max", out.metrics.ratio_max or 1):add("tokens", out.tokens)
            end
        end
        engine:sync_weights(buffer)
        for k, v in pairs(stats:means()) do record[k] = v end
        record.tokens = stats:get("tokens") * cfg.ppo.epochs * #minibatches
    end
    record.dropped_groups = buffer:stats(true).dropped_groups
    for k, v in pairs(rl.evaluate(engine, env, cfg, step) or {}) do record["eval/" .. k] = v end
    run:log(record)
end

run:finish()
