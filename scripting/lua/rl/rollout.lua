-- rl/rollout.lua: small helpers around the RL step. The step itself is typed
-- values in librl (abi/rl/step.h): engine:rollouts, rollouts:score /
-- filter / info / to_batch, buffer:push_rollouts / pop_train_batch,
-- batch:compute_advantages / split / set, engine:sync_weights(buffer); no
-- per-token work of the RL step is done in Lua. What stays here: prompt
-- encoding, the supervised warm-up (its batch is a call into librl), the
-- step's scored rollouts, and reading loss metrics.
local rl = require("rl")

local M = {}

local function check_table(v, what, level)
    if type(v) ~= "table" then
        error(("%s must be a table, got %s"):format(what, type(v)), level + 1)
    end
end

--- rl.encode_prompts(tokenizer, tasks [, chat_template]) -> list of int64 tensors.
--- chat_template "none" (or nil) encodes task.prompt as it is; "model" (the
--- model's own Jinja chat template), "chatml" or "llama3" wrap it as one user
--- turn with the assistant prompt after it. The task's text is plain text:
--- special-token text in it ("<|im_end|>") never becomes a control token (as
--- engine:rollouts encodes prompts).
function M.encode_prompts(tok, tasks, chat_template)
    check_table(tasks, "tasks", 2)
    local out = {}
    for i, task in ipairs(tasks) do
        if type(task.prompt) ~= "string" then
            error(("tasks[%d].prompt must be a string"):format(i), 2)
        end
        if chat_template and chat_template ~= "none" then
            out[i] = tok:encode_chat({ { role = "user", content = task.prompt } },
                { template = chat_template, add_generation_prompt = true, plain_text = true })
        else
            out[i] = tok:encode(task.prompt, { plain_text = true })
        end
    end
    return out
end

--- rl.sft_batch(tokenizer, tasks, eos_id [, chat_template]) -> rl.train_batch
--- Supervised batch on the tasks' reference answers: prompt, then the answer
--- and a newline, then the end-of-sequence token; loss_mask on the answer,
--- newline and EOS tokens (built in librl: rl_train_batch_supervised).
function M.sft_batch(tok, tasks, eos_id, chat_template)
    check_table(tasks, "tasks", 2)
    if math.type(eos_id) ~= "integer" then error("rl.sft_batch: eos_id must be an integer", 2) end
    return tok:sft_batch(tasks, { eos_token_id = eos_id, chat_template = chat_template or "none" })
end

--- rl.sft_keys([keys]) -> the declarations of the supervised warm-up's
--- settings (sft.steps, sft.batch_size, sft.learning_rate) followed by the
--- script's own `keys`, for rl.config:
---
---   local cfg = rl.config(rl.sft_keys { { "ppo.epochs", "integer", 2, "...", min = 1 } })
function M.sft_keys(keys)
    local out = {
        { "sft.steps", "integer", 0, "Supervised warm-up steps on the env's reference answers before RL.", min = 0 },
        { "sft.batch_size", "integer", 32, "Examples per warm-up step.", min = 1 },
        { "sft.learning_rate", "number", 1e-3, "Warm-up learning rate.", min = 0 },
    }
    for _, k in ipairs(keys or {}) do out[#out + 1] = k end
    return out
end

--- rl.ref_keys([keys]) -> the declaration of ref.model (the frozen reference
--- model of the KL terms) followed by `keys`, for rl.config:
---
---   local cfg = rl.config(rl.ref_keys(rl.sft_keys()))
function M.ref_keys(keys)
    local out = {
        { "ref.model", "string", "",
          "Frozen reference model whose logprobs the losses' KL terms (loss.params.kl_coef) "
          .. "use: '' none, 'initial' the policy's weights when RL starts (after any warm-up), "
          .. "'base' the LoRA base with the adapter off (lora.rank > 0; no copy), else a model folder." },
    }
    for _, k in ipairs(keys or {}) do out[#out + 1] = k end
    return out
end

--- rl.reference(cfg, model, run) -> ref, or nil when ref.model is '': a second,
--- frozen copy of a model whose forward passes give the batch its
--- `ref_logprobs` (ref:score(batch)). 'initial' saves the policy's weights as
--- they are now to <run folder>/reference (kept on resume: the reference of a
--- resumed run is the one it started with) and loads them; any other value is
--- a model folder. The reference shares the policy's vocabulary, device and
--- dtype; it is never stepped.
function M.reference(cfg, model, run)
    local which = cfg.ref and cfg.ref.model or ""
    if which == "" then return nil end
    local ref_model, dir
    if which == "base" then
        -- The LoRA base with the adapter off: the policy's own weights, no copy.
        if not (cfg.lora and (cfg.lora.rank or 0) > 0) then
            error("ref.model: 'base' is the LoRA base with the adapter off and needs lora.rank > 0; "
                .. "without LoRA use 'initial' (a frozen copy of the starting weights)", 2)
        end
        ref_model, dir = model, "base"
    else
        dir = which
        if which == "initial" then
            dir = run.dir .. "/reference"
            if run.main and not rl.exists(dir .. "/config.json") then model:save(dir) end
            if run.world > 1 then rl.dist.barrier() end -- every rank loads it after rank 0 wrote it
        elseif not rl.exists(dir .. "/config.json") then
            error("ref.model: '" .. dir .. "' is not a model folder (no config.json); use '', "
                .. "'initial', 'base' (LoRA) or a model folder", 2)
        end
        local m = cfg.model
        ref_model = rl.model(dir, { threads = m.threads, device = m.device, dtype = m.dtype })
        if ref_model:info().vocab_size ~= model:info().vocab_size then
            error("ref.model: '" .. dir .. "' has a vocabulary of " .. ref_model:info().vocab_size
                .. " tokens, the policy " .. model:info().vocab_size, 2)
        end
    end
    -- Forward passes only: no optimizer, the weights untouched (a LoRA
    -- policy's base stays frozen); without an adapter it scores the base.
    local forward = ref_model:trainer { forward_only = true }
    local ref = { model = ref_model, dir = dir }
    --- ref:logprobs(batch) -> the reference's logprobs of a batch (an
    --- rl.train_batch or a table of tensors).
    function ref.logprobs(_, batch)
        return forward:forward(batch).logprobs
    end
    --- ref:score(batch): sets an rl.train_batch's ref_logprobs from the reference.
    function ref.score(self, batch)
        batch:set("ref_logprobs", self:logprobs(batch))
    end
    return ref
end

--- rl.eval_keys([keys]) -> the declarations of the online evaluation's
--- settings (eval.*) followed by `keys`, for rl.config.
function M.eval_keys(keys)
    local out = {
        { "eval.every", "integer", 0, "RL steps between evaluations (0: none).", min = 0 },
        { "eval.tasks", "integer", 64, "Env tasks per evaluation (the same ones every time).", min = 1 },
        { "eval.file", "string", "", "JSON-lines file of tasks to evaluate on instead of env tasks." },
        { "eval.samples", "integer", 1, "Completions per task (k of pass@k).", min = 1 },
        { "eval.temperature", "number", 0.0, "Sampling temperature of the evaluation (0: greedy).", min = 0 },
        { "eval.pass_reward", "number", 1.0, "Reward at or above which a completion passes (pass@k)." },
    }
    for _, k in ipairs(keys or {}) do out[#out + 1] = k end
    return out
end

-- The evaluation's tasks: eval.file's lines (JSON objects, as the env's
-- tasks), else eval.tasks env tasks drawn from a stream of their own.
local function eval_tasks(cfg, env)
    local e = cfg.eval
    if e.file == "" then return env:sample(e.tasks, rl.seed(cfg.run.seed, "eval", 0)) end
    local f, err = io.open(e.file, "r")
    if not f then error("eval.file: cannot read '" .. e.file .. "': " .. tostring(err), 3) end
    local tasks, n = {}, 0
    for line in f:lines() do
        n = n + 1
        if line:match("%S") then
            local ok, task = pcall(rl.json.decode, line)
            if not ok or type(task) ~= "table" then
                f:close()
                error(("eval.file: %s:%d is not a JSON object (%s)"):format(e.file, n,
                    ok and type(task) or tostring(task)), 3)
            end
            tasks[#tasks + 1] = task
        end
    end
    f:close()
    if #tasks == 0 then error("eval.file: '" .. e.file .. "' holds no tasks", 3) end
    return tasks
end

--- rl.scored(engine, env, tasks, cfg, opts) -> rl.rollouts: `tasks` sampled with
--- the engine and scored: one completion per sample and env:score for a
--- single-turn env; multi-turn episodes (engine:episodes with episode.max_turns
--- and episode.max_context, defaults 8 and 0 when the script declares no
--- episode.* keys) for an env with a step(). `opts`: the options of
--- engine:rollouts (chat_template, group_offset, sampling).
function M.scored(engine, env, tasks, cfg, opts)
    if env:multi_turn() then
        if not engine.episodes then
            error("multi-turn episodes need the co-located engine (inference_server.url is set)", 2)
        end
        local ep = cfg.episode or {}
        opts.max_turns, opts.max_context = ep.max_turns or 8, ep.max_context or 0
        opts.turn_rewards = ep.turn_rewards or "episode"
        return engine:episodes(env, tasks, opts)
    end
    local rollouts = engine:rollouts(tasks, opts)
    rollouts:score(env)
    return rollouts
end

--- rl.evaluate(engine, env, cfg, step) -> {reward_mean, pass_at_k, k, tasks,
--- [env metrics]} or nil when no evaluation is due at `step` (eval.every).
--- eval.samples completions of each task at eval.temperature (0: greedy),
--- scored by the env; pass_at_k is the share of tasks with a completion whose
--- reward is at least eval.pass_reward.
function M.evaluate(engine, env, cfg, step)
    local e = cfg.eval
    if not e or e.every <= 0 or step % e.every ~= 0 then return nil end
    local tasks = eval_tasks(cfg, env)
    local rollouts = M.scored(engine, env, tasks, cfg, {
        chat_template = cfg.tokenizer.chat_template,
        sampling = rl.generation_params(cfg, {
            n = e.samples, temperature = e.temperature,
            seed = rl.seed(cfg.run.seed, "eval-generate", step),
        }),
    })
    local info = rollouts:info()
    local best = {}
    for i = 1, info.rollouts do
        local g, r = info.group_ids[i], info.rewards[i]
        if best[g] == nil or r > best[g] then best[g] = r end
    end
    local tasks_n, passed = 0, 0
    for _, r in pairs(best) do
        tasks_n = tasks_n + 1
        if r >= e.pass_reward then passed = passed + 1 end
    end
    local out = { reward_mean = info.reward_mean, pass_at_k = passed / tasks_n, k = e.samples,
                  tasks = tasks_n }
    for k, v in pairs(info) do
        if type(k) == "string" and k:sub(1, 4) == "env/" and type(v) == "number" then out[k] = v end
    end
    return out
end

--- rl.sft_warmup(cfg, run, trainer, tokenizer, env): the supervised warm-up
--- on the env's reference answers before RL (cfg.sft.steps steps of
--- cfg.sft.batch_size tasks, causallm_loss, learning rate
--- cfg.sft.learning_rate, phase "sft" of the run, no checkpoints), so the
--- policy starts with some reward to improve on. Nothing when sft.steps is 0.
function M.sft_warmup(cfg, run, trainer, tok, env)
    if cfg.sft.steps <= 0 then return end
    local ce = rl.loss("causallm_loss")
    local eos_id = tok:info().eos_token_ids[1]
    for step in run:steps("sft", cfg.sft.steps, { checkpoint_every = 0 }) do
        local tasks = env:sample(cfg.sft.batch_size, rl.seed(cfg.run.seed, "sft", step))
        local batch
        if (tasks[1].metadata or {}).reference_turns then
            -- A multi-turn env's reference episodes, played against the env.
            batch = tok:sft_episodes_batch(env, tasks,
                { eos_token_id = eos_id, chat_template = cfg.tokenizer.chat_template })
        else
            batch = M.sft_batch(tok, tasks, eos_id, cfg.tokenizer.chat_template)
        end
        local out = trainer:forward_backward(batch, ce)
        local opt = trainer:optim_step { learning_rate = cfg.sft.learning_rate }
        run:log { loss = out.loss, tokens = out.tokens, grad_norm = opt.grad_norm }
    end
end

--- rl.scored_rollouts(engine, env, cfg, step) -> rl.rollouts: the RL step's
--- rollouts: rollout.prompts_per_step tasks of the env (seeded by run.seed
--- and `step`), rollout.n completions each from the engine (chat template
--- tokenizer.chat_template, sampling of the rollout section seeded by
--- `step`, groups numbered from step * #tasks), scored by the env; episodes
--- for a multi-turn env (rl.scored).
function M.scored_rollouts(engine, env, cfg, step)
    local moe = cfg.moe or {}
    if moe.routing_replay_weights and not moe.routing_replay then
        error("moe.routing_replay_weights replays the recorded weights of the recorded experts: "
              .. "it needs moe.routing_replay: true", 2)
    end
    local tasks = env:sample(cfg.rollout.prompts_per_step, rl.seed(cfg.run.seed, "rl", step))
    return M.scored(engine, env, tasks, cfg, {
        chat_template = cfg.tokenizer.chat_template, group_offset = step * #tasks,
        sampling = rl.generation_params(cfg, {
            seed = rl.seed(cfg.run.seed, "generate", step),
            -- moe.routing_replay: the rollouts carry their routing, the batch replays it (R3);
            -- moe.routing_replay_weights: the mixing weights too
            return_routed_experts = moe.routing_replay or nil,
            return_expert_logits = moe.routing_replay_weights or nil,
        }),
    })
end

--- rl.episode_keys([keys]) -> the declarations of the multi-turn settings
--- (episode.max_turns, episode.max_context, episode.turn_rewards) followed
--- by `keys`.
function M.episode_keys(keys)
    local out = {
        { "episode.max_turns", "integer", 8,
          "Assistant turns per episode (the env may end it sooner).", min = 1 },
        { "episode.max_context", "integer", 0,
          "Prompt + turns + observations, in tokens (0: the model's context, at most 4096).", min = 0 },
        { "episode.turn_rewards", "string", "episode",
          "How the turns' rewards reach the advantage estimator: 'episode' (their sum, the "
          .. "episode's reward) or 'tokens' (each turn's reward on its last token; for "
          .. "estimators that read token_rewards: reinforce_pp, gae, remax, areal).",
          choices = { "episode", "tokens" } },
    }
    for _, k in ipairs(keys or {}) do out[#out + 1] = k end
    return out
end

--- rl.scored_episodes(engine, env, cfg, step) -> rl.rollouts: the RL step's
--- multi-turn episodes (rl.scored_rollouts for an env with a step()): every
--- assistant turn is answered by env:step() until it is done,
--- episode.max_turns or episode.max_context (rollout.max_tokens limits one
--- turn). Rewards are the sums of the turns' rewards; observation tokens are
--- never trained. Refuses a single-turn env.
function M.scored_episodes(engine, env, cfg, step)
    if not env:multi_turn() then error("rl.scored_episodes: the env is single-turn (it has no step())", 2) end
    return M.scored_rollouts(engine, env, cfg, step)
end

--- rl.reward_keys([keys]) -> the declarations of the reward settings
--- (reward.overlong_buffer, reward.overlong_penalty_factor; reward.env_weight,
--- reward_model.*, judge.*: rl/reward.lua) followed by `keys`.
function M.reward_keys(keys)
    local out = {
        { "reward.overlong_buffer", "integer", 0,
          "DAPO's soft overlong punishment: the last N tokens of rollout.max_tokens (0: off).", min = 0 },
        { "reward.overlong_penalty_factor", "number", 1.0,
          "The penalty at the budget's end (it grows linearly over the buffer).", min = 0 },
    }
    for _, k in ipairs(require("rl.reward").keys()) do out[#out + 1] = k end
    for _, k in ipairs(keys or {}) do out[#out + 1] = k end
    return out
end

--- rl.overlong_penalty(length, max_tokens, buffer, factor): DAPO's soft
--- overlong punishment of a completion of `length` tokens under a budget of
--- `max_tokens`: 0 up to max_tokens - buffer, then falling linearly to
--- -factor at max_tokens (and on past it, as verl computes it).
function M.overlong_penalty(length, max_tokens, buffer, factor)
    local expected = max_tokens - buffer
    local exceed = length - expected
    if exceed <= 0 then return 0.0 end
    return -exceed / buffer * factor
end

--- rl.shape_overlong(cfg, rollouts) -> the mean penalty, or nil when
--- reward.overlong_buffer is 0: adds DAPO's overlong penalty (over
--- rollout.max_tokens) to every scored rollout's reward.
function M.shape_overlong(cfg, rollouts)
    local r = cfg.reward
    if not r or (r.overlong_buffer or 0) <= 0 then return nil end
    local max_tokens = cfg.rollout.max_tokens
    if r.overlong_buffer > max_tokens then
        error(("reward.overlong_buffer (%d) is larger than rollout.max_tokens (%d)")
            :format(r.overlong_buffer, max_tokens), 2)
    end
    local info = rollouts:info()
    local rewards, sum = {}, 0.0
    for i = 1, info.rollouts do
        local p = M.overlong_penalty(info.completion_lengths[i], max_tokens, r.overlong_buffer,
            r.overlong_penalty_factor)
        rewards[i] = info.rewards[i] + p
        sum = sum + p
    end
    rollouts:set_rewards(rewards)
    return info.rollouts > 0 and sum / info.rollouts or 0.0
end

--- rl.loss_stats(result) -> {loss, kl, clip_frac, mask_frac} read from a
--- forward_backward result, whatever names the loss plugin uses.
function M.loss_stats(result)
    local m = result.metrics or {}
    local function first(...)
        for i = 1, select("#", ...) do
            local v = m[select(i, ...)]
            if v ~= nil then return v end
        end
        return nil
    end
    return {
        loss = result.loss,
        kl = first("kl_sample_train_k3", "kl", "approx_kl", "ref_kl"),
        clip_frac = first("pg_clipfrac", "clip_fraction", "tis_clipfrac"),
        mask_frac = first("masked", "icepop_maskfrac", "behav_maskfrac"),
    }
end

return M
