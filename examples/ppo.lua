-- examples/ppo.lua: PPO with the clipped policy_loss. Each step's rollouts are
-- trained on for ppo.epochs passes of ppo.minibatches minibatches, one
-- optimizer step each; after the first step the policy has moved away from
-- the one that sampled, so the ratio leaves 1 and the clip engages (clip
-- fraction in the step line). Advantages: the configured estimator (GRPO's
-- group normalization by default; the tiny model has no value head).
--
--   rlhost run examples/ppo.lua --config examples/ppo.yaml
local rl = require("rl")

local cfg = rl.config { -- this script's own settings, checked like the host's
    { "sft.steps", "integer", 0, "Supervised warm-up steps on the env's reference answers before RL.", min = 0 },
    { "sft.batch_size", "integer", 32, "Examples per warm-up step.", min = 1 },
    { "sft.learning_rate", "number", 1e-3, "Warm-up learning rate.", min = 0 },
    { "ppo.epochs", "integer", 2, "Passes over each step's rollouts (one optimizer step per minibatch per pass).", min = 1 },
    { "ppo.minibatches", "integer", 1, "Minibatches per pass (whole groups each).", min = 1 },
}
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok, info = model:tokenizer(), model:info()
local optimizer_steps = cfg.run.steps * cfg.ppo.epochs * cfg.ppo.minibatches
local trainer = model:trainer(rl.trainer_config(cfg, { total_steps = optimizer_steps }))
run:attach(trainer)
local engine = model:engine(rl.engine_config(cfg))
local template = cfg.tokenizer.chat_template

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
local buffer = rl.buffer(rl.buffer_config(cfg))

if cfg.sft.steps > 0 then -- optional supervised warm-up
    local ce = rl.loss("causallm_loss")
    for step in run:steps("sft", cfg.sft.steps, { checkpoint_every = 0 }) do
        local tasks = env:sample(cfg.sft.batch_size, rl.seed(cfg.run.seed, "sft", step))
        local out = trainer:forward_backward(rl.sft_batch(tok, tasks, info.eos_token_ids[1], template), ce)
        trainer:optim_step { learning_rate = cfg.sft.learning_rate }
        run:log { loss = out.loss, tokens = out.tokens }
    end
end
engine:sync_weights(buffer)

for step in run:steps("rl", cfg.run.steps) do
    local tasks = env:sample(cfg.rollout.prompts_per_step, rl.seed(cfg.run.seed, "rl", step))
    local rollouts = engine:rollouts(tasks, {
        chat_template = template, group_offset = step * #tasks,
        sampling = rl.generation_params(cfg, { seed = rl.seed(cfg.run.seed, "generate", step) }),
    })
    rollouts:score(env)
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
