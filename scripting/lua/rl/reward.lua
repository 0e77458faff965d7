-- rl/reward.lua: rewards that come from models instead of rules. A reward
-- model (a Hugging Face ...ForSequenceClassification folder: its score head
-- read at the conversation's last token) and an LLM judge (a second model,
-- in process or behind an inference server, asked with a rubric and its
-- reply parsed for a score). Both score the rollouts the env has scored and
-- give each rollout
--
--   reward = reward.env_weight * env + reward_model.weight * score + judge.weight * verdict
--
-- through rollouts:set_rewards. docs/scripting.md, "Reward models and judges".
local rl = require("rl")

local M = {}

M.DEFAULT_RUBRIC = "You grade answers. Rate how well the response answers the request, "
    .. "from 0 (useless or wrong) to 10 (fully correct and helpful).\n\n"
    .. "Request:\n{prompt}\n\nResponse:\n{completion}\n\n"
    .. "Reply with one line: Score: N"

--- The declarations of reward.env_weight, reward_model.* and judge.*.
function M.keys()
    return {
        { "reward.env_weight", "number", 1.0,
          "Weight of the env's own reward when a reward model or a judge adds theirs (0: theirs alone)." },
        { "reward_model.path", "string", "",
          "A ...ForSequenceClassification model folder (a reward model) that scores every rollout ('' none)." },
        { "reward_model.weight", "number", 1.0, "Weight of the reward model's score in the reward." },
        { "reward_model.label", "integer", 0,
          "Which output of the score head is the reward (0-based; reward models have one).", min = 0 },
        { "reward_model.chat_template", "string", "model",
          "How the reward model sees a rollout: 'model' renders [user: prompt, assistant: completion] "
          .. "with its own chat template, 'none' is prompt and completion as plain text.",
          choices = { "model", "none" } },
        { "judge.model", "string", "",
          "An LLM judge's model folder ('' none): its tokenizer and chat template, and its weights "
          .. "unless judge.url is set." },
        { "judge.url", "string", "",
          "An inference server (rlhost serve, SGLang) serving judge.model ('' the judge runs in process)." },
        { "judge.api_key", "string", "", "The judge server's API key." },
        { "judge.timeout", "number", 120, "Seconds the judge server may take per request.", min = 0, min_open = true },
        { "judge.prompt", "string", M.DEFAULT_RUBRIC,
          "The rubric sent to the judge as one user turn; {prompt}, {completion} and {answer} "
          .. "(the task's answer, '' when it has none) are replaced." },
        { "judge.pattern", "string", "[Ss]core%s*:%s*(%-?%d+%.?%d*)",
          "Lua pattern whose capture is the score; the reply's last match counts." },
        { "judge.min", "number", 0, "The lowest score of the rubric (maps to 0)." },
        { "judge.max", "number", 10, "The highest score of the rubric (maps to 1)." },
        { "judge.invalid_reward", "number", 0,
          "The judge's verdict when its reply has no score in [judge.min, judge.max] (counted in judge/invalid_frac)." },
        { "judge.weight", "number", 1.0, "Weight of the judge's verdict in the reward." },
        { "judge.max_tokens", "integer", 64, "Tokens the judge may write.", min = 1 },
        { "judge.temperature", "number", 0, "The judge's sampling temperature (0: greedy).", min = 0 },
    }
end

--- rl.judge_score(reply, pattern, lo, hi) -> the verdict in [0, 1], or nil:
--- the last capture of `pattern` in `reply`, a number in [lo, hi], mapped
--- linearly onto [0, 1].
function M.judge_score(reply, pattern, lo, hi)
    if not (hi > lo) then error(("judge.max (%s) must be greater than judge.min (%s)"):format(hi, lo), 2) end
    local last
    for s in tostring(reply):gmatch(pattern) do last = s end
    local x = last and tonumber(last)
    if x == nil or x ~= x or x < lo or x > hi then return nil end
    return (x - lo) / (hi - lo)
end

-- The prompt text and reference answer of rollout i (its task as JSON text).
local function task_of(info, i)
    local ok, task = pcall(rl.json.decode, info.tasks[i])
    if not ok or type(task) ~= "table" or type(task.prompt) ~= "string" then
        error(("rollout %d: its task has no string 'prompt' to show a reward model or judge"):format(i), 3)
    end
    return task
end

local function refuse_episodes(info, who)
    if info.turns then
        for i = 1, info.rollouts do
            if (info.turns[i] or 1) > 1 then
                error(who .. ": multi-turn episodes are not scored by " .. who .. " (rollout " .. i
                    .. " has " .. info.turns[i] .. " turns); score them in the env", 3)
            end
        end
    end
end

local function model_options(cfg)
    local m = cfg.model or {}
    return { threads = m.threads, device = m.device, dtype = m.dtype }
end

--- rl.reward_model(cfg) -> scorer, or nil when reward_model.path is '': the
--- reward model loaded once, with scorer:scores(rollouts) -> a list of
--- scores (the score head's output reward_model.label of each rollout's
--- conversation), all rollouts in one forward-only pass.
function M.reward_model(cfg)
    local c = cfg.reward_model
    if not c or c.path == "" then return nil end
    if not rl.exists(c.path .. "/config.json") then
        error("reward_model.path: '" .. c.path .. "' is not a model folder (no config.json)", 2)
    end
    local model = rl.model(c.path, model_options(cfg))
    local info = model:info()
    if info.task ~= "sequence_classification" then
        error("reward_model.path: '" .. c.path .. "' is a " .. info.architecture .. ", not a reward "
            .. "model (a ...ForSequenceClassification folder with a score head)", 2)
    end
    if not info.has_tokenizer then
        error("reward_model.path: '" .. c.path .. "' has no tokenizer.json", 2)
    end
    if c.label >= info.num_labels then
        error(("reward_model.label: %d, but '%s' has %d output(s)"):format(c.label, c.path, info.num_labels), 2)
    end
    local tok = model:tokenizer()
    local forward = model:trainer { forward_only = true }
    local scorer = { model = model, path = c.path }
    function scorer.scores(_, rollouts)
        local r = rollouts:info()
        refuse_episodes(r, "a reward model")
        local seqs, cu = {}, { 0 }
        for i = 1, r.rollouts do
            local task = task_of(r, i)
            local ids
            if c.chat_template == "model" then
                ids = tok:encode_chat({ { role = "user", content = task.prompt },
                    { role = "assistant", content = r.completions[i] } },
                    { add_generation_prompt = false, plain_text = true })
            else
                ids = tok:encode(task.prompt .. r.completions[i], { plain_text = true })
            end
            seqs[i] = ids
            cu[i + 1] = cu[i] + #ids
        end
        if r.rollouts == 0 then return {} end
        local out = forward:forward { input_ids = rl.tensor.cat(seqs, "int64"),
                                      cu_seqlens = rl.tensor(cu, "int64") }
        local labels, scores = math.tointeger(out.num_labels), {}
        for i = 1, r.rollouts do scores[i] = out.scores[(i - 1) * labels + c.label + 1] end
        return scores
    end
    return scorer
end

local function fill(rubric, fields)
    return (rubric:gsub("{(%a+)}", function(name)
        local v = fields[name]
        if v == nil then return nil end -- an unknown {name} stays as written
        return v
    end))
end

--- rl.judge(cfg) -> judge, or nil when judge.model is '': the judge model
--- (an engine over it, or an inference client to judge.url), with
--- judge:scores(rollouts) -> verdicts (each in [0, 1], or judge.invalid_reward
--- when the reply has no valid score), invalid count, and the replies.
function M.judge(cfg)
    local c = cfg.judge
    if not c or c.model == "" then return nil end
    if not (c.max > c.min) then
        error(("judge.max (%s) must be greater than judge.min (%s)"):format(c.max, c.min), 2)
    end
    if not rl.exists(c.model .. "/config.json") then
        error("judge.model: '" .. c.model .. "' is not a model folder (no config.json)", 2)
    end
    local ok, msg = pcall(string.find, "", c.pattern)
    if not ok then error("judge.pattern: '" .. c.pattern .. "' is not a Lua pattern: " .. tostring(msg), 2) end
    local model, generate
    if c.url ~= "" then
        model = rl.tokenizer(c.model)
        local client = rl.inference_client { url = c.url, api_key = c.api_key, timeout = c.timeout }
        generate = function(tasks, opts) return client:rollouts(model, tasks, opts) end
    else
        model = rl.model(c.model, model_options(cfg))
        local engine = model:engine {}
        generate = function(tasks, opts) return engine:rollouts(tasks, opts) end
    end
    local judge, calls = { model = model }, 0
    function judge.scores(_, rollouts)
        local r = rollouts:info()
        refuse_episodes(r, "a judge")
        if r.rollouts == 0 then return {}, 0, {} end
        local tasks = {}
        for i = 1, r.rollouts do
            local task = task_of(r, i)
            local answer = task.answer
            if type(answer) ~= "string" then answer = "" end
            tasks[i] = { prompt = fill(c.prompt, { prompt = task.prompt, completion = r.completions[i],
                                                   answer = answer }) }
        end
        calls = calls + 1
        local ok2, out = pcall(generate, tasks, {
            chat_template = "model",
            sampling = { n = 1, temperature = c.temperature, max_tokens = c.max_tokens,
                         seed = rl.seed(cfg.run and cfg.run.seed or 0, "judge", calls) },
        })
        if not ok2 then
            error("judge (" .. (c.url ~= "" and c.url or c.model) .. "): " .. tostring(out), 2)
        end
        local replies = out:info().completions
        local verdicts, invalid = {}, 0
        for i = 1, r.rollouts do
            local v = M.judge_score(replies[i], c.pattern, c.min, c.max)
            if v == nil then
                invalid = invalid + 1
                v = c.invalid_reward
            end
            verdicts[i] = v
        end
        return verdicts, invalid, replies
    end
    return judge
end

--- rl.reward_scorers(cfg) -> {reward_model = ..., judge = ...} (either nil
--- when not configured), made once before the loop.
function M.reward_scorers(cfg)
    return { reward_model = M.reward_model(cfg), judge = M.judge(cfg) }
end

--- rl.apply_reward_scorers(cfg, scorers, rollouts) -> metrics (a table, empty
--- when neither is configured): sets every rollout's reward to
--- reward.env_weight * env reward + the weighted scores. Metrics:
--- reward_model/score_mean, judge/score_mean (over valid replies),
--- judge/invalid_frac, env_reward_mean.
function M.apply_reward_scorers(cfg, scorers, rollouts)
    local rm, judge = scorers.reward_model, scorers.judge
    if not rm and not judge then return {} end
    local info = rollouts:info()
    local n = info.rollouts
    local metrics = { env_reward_mean = info.reward_mean }
    if n == 0 then return metrics end
    local w = cfg.reward.env_weight
    local rewards = {}
    for i = 1, n do rewards[i] = w * info.rewards[i] end
    if rm then
        local s, sum = rm:scores(rollouts), 0
        for i = 1, n do
            rewards[i] = rewards[i] + cfg.reward_model.weight * s[i]
            sum = sum + s[i]
        end
        metrics["reward_model/score_mean"] = sum / n
    end
    if judge then
        local v, invalid = judge:scores(rollouts)
        local sum = 0
        for i = 1, n do
            rewards[i] = rewards[i] + cfg.judge.weight * v[i]
            sum = sum + v[i]
        end
        metrics["judge/invalid_frac"] = invalid / n
        if invalid < n then
            metrics["judge/score_mean"] = (sum - invalid * cfg.judge.invalid_reward) / (n - invalid)
        end
    end
    rollouts:set_rewards(rewards)
    return metrics
end

return M
