-- examples/ppo.lua: PPO with the clipped policy_loss. Each step's rollouts are
-- trained on for ppo.epochs passes of ppo.minibatches minibatches, one
-- optimizer step each; after the first step the policy has moved away from
-- the one that sampled, so the ratio leaves 1 and the clip engages (clip
-- fraction in the step line). Advantages: the configured estimator (GRPO's
-- group normalization by default; the tiny model has no value head).
--
--   rlhost run examples/ppo.lua --config examples/ppo.yaml
local rl = require("rl")

local cfg = rl.config(rl.sft_keys { -- this script's own settings, checked like the host's
    { "ppo.epochs", "integer", 2, "Passes over each step's rollouts (one optimizer step per minibatch per pass).", min = 1 },
    { "ppo.minibatches", "integer", 1, "Minibatches per pass (whole groups each).", min = 1 },
})
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok = model:tokenizer()
local optimizer_steps = cfg.run.steps * cfg.ppo.epochs * cfg.ppo.minibatches
local trainer = model:trainer(rl.trainer_config(cfg, { total_steps = optimizer_steps }))
run:attach(trainer)
local engine = model:engine(rl.engine_config(cfg))

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
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
        batch:compute_advantages(advantage)
        local stats = rl.metrics()
        local minibatches = batch:split(cfg.ppo.minibatches) -- whole groups each
        for _ = 1, cfg.ppo.epochs do
            for _, mb in ipairs(minibatches) do
                local out = trainer:forward_backward(mb, loss)
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
    run:log(record)
end

run:finish()
