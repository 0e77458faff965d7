-- examples/agent.lua: GRPO on a multi-turn environment (guess_number by
-- default: the env answers every guess with "higher" or "lower") with the
-- co-located rollout engine. Every episode is one token sequence: the model's
-- turns are trained, the env's observations are not (loss mask 0); the engine
-- continues each episode from its KV cache after an observation.
--
--   rlhost run examples/agent.lua --config examples/agent.yaml
--
-- 1. supervised warm-up on the env's reference episodes (sft.steps > 0: the
--    tasks' metadata.reference_turns played against the env): the fresh model
--    learns the turn format (a number, a newline, end of sequence) and to go
--    on after an answer, not yet how to use the answers;
-- 2. each RL step: rollout.prompts_per_step tasks, rollout.n episodes each,
--    rewarded by the env per turn (summed per episode), groups without signal
--    dropped, group-relative advantages over the trained tokens, one update.
local rl = require("rl")

local cfg = rl.config(rl.eval_keys(rl.episode_keys(rl.sft_keys())))
if cfg.inference_server and cfg.inference_server.url ~= "" then
    error("multi-turn episodes need the co-located engine: unset inference_server.url", 0)
end
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok = model:tokenizer()
local trainer = model:trainer(rl.trainer_config(cfg))
run:attach(trainer)
local engine = rl.rollout_engine(model, cfg, run)

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
local filters = rl.filters(cfg.filters)
local buffer = rl.buffer(rl.buffer_config(cfg))

rl.sft_warmup(cfg, run, trainer, tok, env)
engine:sync_weights(buffer)

for step in run:steps("rl", cfg.run.steps) do
    local episodes = rl.scored_episodes(engine, env, cfg, step)
    local flagged = episodes:filter(filters)
    buffer:push_rollouts(episodes)

    local r = episodes:info()
    local record = {
        reward = r.reward_mean, reward_std = r.reward_std, turns = r.turns_mean,
        solved = r["env/solved"], episode_errors = r.episode_errors,
        flagged = flagged.flagged, masked = flagged.masked,
    }
    -- The env's own metrics (calculator: env/correct, env/tool_calls, env/tool_errors).
    for k, v in pairs(r) do
        if k:sub(1, 4) == "env/" then record[k] = v end
    end
    local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
    if batch then
        batch:compute_advantages(advantage)
        run:log_samples(batch)
        local out = trainer:forward_backward(batch, loss)
        local opt = trainer:optim_step()
        engine:sync_weights(buffer)
        for k, v in pairs(rl.loss_stats(out)) do record[k] = v end
        record.tokens, record.grad_norm, record.lr = out.tokens, opt.grad_norm, opt.learning_rate
        record.groups = batch:info().groups
    end
    record.dropped_groups = buffer:stats(true).dropped_groups
    -- eval.every: the same tasks' episodes, greedy by default: eval/reward_mean, eval/pass_at_k
    for k, v in pairs(rl.evaluate(engine, env, cfg, step) or {}) do record["eval/" .. k] = v end
    run:log(record)
end

run:finish()
