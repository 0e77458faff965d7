-- rl/rollout.lua: helpers that keep RL loops short. Every function here is
-- plain Lua over the module's objects; the numbers come from librl.
--
-- A rollout is a table
--   { task, group, prompt_ids, token_ids, logprobs, text, finish_reason,
--     policy_version, reward, metrics, masked, flags }
-- where `group` (1-based) is the index of its prompt in this step, token_ids
-- and logprobs (rl.tensor) are the completion's tokens and the log-probs of
-- the distribution they were sampled from.
local rl = require("rl")

local M = {}

local function check_table(v, what, level)
    if type(v) ~= "table" then
        error(("%s must be a table, got %s"):format(what, type(v)), level + 1)
    end
end

--- rl.encode_prompts(tokenizer, tasks [, chat_template]) -> list of int64 tensors.
--- chat_template "none" (or nil) encodes task.prompt as it is; "chatml" /
--- "llama3" wrap it as one user turn with the assistant prompt after it.
function M.encode_prompts(tok, tasks, chat_template)
    check_table(tasks, "tasks", 2)
    local out = {}
    for i, task in ipairs(tasks) do
        if type(task.prompt) ~= "string" then
            error(("tasks[%d].prompt must be a string"):format(i), 2)
        end
        local text = task.prompt
        if chat_template and chat_template ~= "none" then
            text = tok:apply_chat_template({ { role = "user", content = task.prompt } },
                { template = chat_template, add_generation_prompt = true })
        end
        out[i] = tok:encode(text)
    end
    return out
end

--- rl.generate_rollouts{engine=, env=, tokenizer=, tasks=, params=, chat_template=}
--- Encodes the tasks' prompts, generates params.n samples per prompt, scores
--- every sample with env:score and returns the list of rollouts (prompt-major).
function M.generate_rollouts(args)
    check_table(args, "rl.generate_rollouts: arguments", 2)
    for _, k in ipairs { "engine", "env", "tokenizer", "tasks" } do
        if args[k] == nil then error("rl.generate_rollouts: missing '" .. k .. "'", 2) end
    end
    local prompts = M.encode_prompts(args.tokenizer, args.tasks, args.chat_template)
    local out = args.engine:generate(prompts, args.params or {})
    local rollouts = rl.samples(out)
    for _, r in ipairs(rollouts) do
        r.task = args.tasks[r.prompt_index]
        r.group = r.prompt_index
        r.prompt_ids = prompts[r.prompt_index]
        r.reward, r.metrics = args.env:score(r.task, r.text)
        r.masked = false
        r.flags = {}
    end
    return rollouts
end

--- rl.apply_filters(filters, rollouts, vocab_size) -> {flagged = n, masked = n, reasons = {}}
--- Runs every filter on every rollout; a flagged rollout records the reason in
--- r.flags and, when the filter enforces, gets r.masked = true (no loss tokens).
function M.apply_filters(filters, rollouts, vocab_size)
    local stats = { flagged = 0, masked = 0, reasons = {} }
    for _, r in ipairs(rollouts) do
        local flagged = false
        for _, f in ipairs(filters or {}) do
            local v = f:check(r.token_ids, r.logprobs, vocab_size)
            if v.flagged then
                flagged = true
                r.flags[#r.flags + 1] = v.reason
                stats.reasons[v.reason] = (stats.reasons[v.reason] or 0) + 1
                if v.enforce then r.masked = true end
            end
        end
        if flagged then stats.flagged = stats.flagged + 1 end
        if r.masked then stats.masked = stats.masked + 1 end
    end
    return stats
end

--- rl.groups(rollouts) -> list of lists of rollouts sharing r.group, in order.
function M.groups(rollouts)
    local by, order = {}, {}
    for _, r in ipairs(rollouts) do
        if not by[r.group] then
            by[r.group] = {}
            order[#order + 1] = r.group
        end
        local g = by[r.group]
        g[#g + 1] = r
    end
    local out = {}
    for i, id in ipairs(order) do out[i] = by[id] end
    return out
end

--- rl.drop_uninformative(rollouts, buffer_cfg) -> kept rollouts, stats
--- Online difficulty filtering: drops whole groups whose every reward is >=
--- easy_threshold or <= hard_threshold, or whose rewards are all equal (no
--- relative signal for a group-normalized advantage). stats: {groups, kept,
--- too_easy, too_hard, zero_variance} (counts of groups).
function M.drop_uninformative(rollouts, buffer_cfg)
    buffer_cfg = buffer_cfg or {}
    local easy = buffer_cfg.easy_threshold or math.huge
    local hard = buffer_cfg.hard_threshold or -math.huge
    local kept = {}
    local stats = { groups = 0, kept = 0, too_easy = 0, too_hard = 0, zero_variance = 0 }
    for _, g in ipairs(M.groups(rollouts)) do
        stats.groups = stats.groups + 1
        local lo, hi = math.huge, -math.huge
        for _, r in ipairs(g) do
            lo, hi = math.min(lo, r.reward), math.max(hi, r.reward)
        end
        if lo >= easy then
            stats.too_easy = stats.too_easy + 1
        elseif hi <= hard then
            stats.too_hard = stats.too_hard + 1
        elseif #g > 1 and hi - lo <= 0 then
            stats.zero_variance = stats.zero_variance + 1
        else
            stats.kept = stats.kept + 1
            for _, r in ipairs(g) do kept[#kept + 1] = r end
        end
    end
    return kept, stats
end

--- rl.rl_batch(rollouts) -> batch, seqs
--- The training batch of the rollouts, one sequence each: input_ids = prompt
--- ids then completion ids; loss_mask 1 on completion tokens (0 for masked
--- rollouts); old_logprobs holds each completion token's sampling log-prob at
--- that token's position (the rl_batch_t convention: position t is token t
--- predicted from the tokens before it) and 0 on prompt tokens.
--- seqs = {rewards = float64 [n_seqs], group_ids = int64 [n_seqs]} for
--- advantage:compute.
function M.rl_batch(rollouts)
    check_table(rollouts, "rollouts", 2)
    local ids, mask, old, cu = {}, {}, {}, { 0 }
    local rewards, groups = {}, {}
    local n = 0
    for i, r in ipairs(rollouts) do
        local p, c, lp = r.prompt_ids, r.token_ids, r.logprobs
        if #c ~= #lp then
            error(("rollout %d has %d tokens but %d logprobs"):format(i, #c, #lp), 2)
        end
        for k = 1, #p do
            n = n + 1
            ids[n], mask[n], old[n] = p[k], 0, 0.0
        end
        local m = r.masked and 0 or 1
        for k = 1, #c do
            n = n + 1
            ids[n], mask[n], old[n] = c[k], m, lp[k]
        end
        cu[#cu + 1] = n
        rewards[i] = r.reward
        groups[i] = r.group
    end
    local batch = {
        input_ids = rl.tensor(ids, "int64"),
        cu_seqlens = rl.tensor(cu, "int64"),
        loss_mask = rl.tensor(mask, "float32"),
        old_logprobs = rl.tensor(old, "float32"),
    }
    return batch, { rewards = rl.tensor(rewards, "float64"), group_ids = rl.tensor(groups, "int64") }
end

--- rl.push_rollouts(buffer, rollouts [, group_offset]) -> number pushed
--- Pushes each rollout into an rl.buffer as one sequence: token_ids = prompt
--- then completion, logprobs = 0 on the prompt then the sampling log-probs,
--- loss_mask = 0 on the prompt, 1 on the completion (0 when r.masked). The
--- group id is group_offset + r.group, so offsets must keep groups of
--- different steps apart (e.g. step * prompts_per_step).
function M.push_rollouts(buffer, rollouts, group_offset)
    check_table(rollouts, "rollouts", 2)
    group_offset = group_offset or 0
    for _, r in ipairs(rollouts) do
        local p, c = #r.prompt_ids, #r.token_ids
        buffer:push({
            group_id = group_offset + r.group,
            reward = r.reward,
            policy_version = r.policy_version or 0,
            completion = r.text,
        }, {
            token_ids = rl.tensor.cat { r.prompt_ids, r.token_ids },
            logprobs = rl.tensor.cat({ rl.tensor.zeros(p, "float32"), r.logprobs }, "float32"),
            loss_mask = rl.tensor.cat({ rl.tensor.zeros(p, "float32"),
                rl.tensor.full(c, r.masked and 0 or 1, "float32") }, "float32"),
        })
    end
    return #rollouts
end

--- rl.pop_all(buffer [, min_rollouts]) -> every ready group as one
--- pop_batch result, or nil when fewer than min_rollouts (default 1) rollouts
--- are ready (they stay in the buffer for a later step).
function M.pop_all(buffer, min_rollouts)
    local ready = math.tointeger(buffer:stats().ready_rollouts) or 0
    if ready == 0 or ready < (min_rollouts or 1) then return nil end
    return buffer:pop_batch(ready)
end

--- rl.batch_from_buffer(popped) -> batch, seqs
--- The trainer batch of a buffer:pop_batch result: input_ids, cu_seqlens,
--- loss_mask, old_logprobs (the sampling log-probs, which are the old policy's
--- in a co-located loop) and any extra per-token tensors pushed; seqs =
--- {rewards, group_ids, policy_versions} for advantage:compute.
function M.batch_from_buffer(popped)
    check_table(popped, "popped", 2)
    local n = #popped.input_ids
    local batch = {}
    local skip = { rewards = true, group_ids = true, policy_versions = true, cu_seqlens = true,
        rollout_logprobs = true }
    for k, v in pairs(popped) do
        if rl.tensor.is(v) and not skip[k] and #v == n then batch[k] = v end
    end
    batch.cu_seqlens = popped.cu_seqlens
    batch.old_logprobs = popped.rollout_logprobs
    return batch, { rewards = popped.rewards, group_ids = popped.group_ids,
        policy_versions = popped.policy_versions }
end

--- rl.split_batch(batch, k [, group_ids]) -> list of batches
--- Splits a batch into at most k minibatches of consecutive sequences, about
--- equal in sequence count; with group_ids (one id per sequence) a group is
--- never split. Per-token tensors are sliced, cu_seqlens rebuilt; the seqs
--- tables of the parts come back as a second list.
function M.split_batch(batch, k, group_ids)
    check_table(batch, "batch", 2)
    if math.type(k) ~= "integer" or k < 1 then error("rl.split_batch: k must be an integer >= 1", 2) end
    local cu = batch.cu_seqlens
    local n_seqs = #cu - 1
    -- Cut points: sequence indices where a part may start.
    local starts = { 1 }
    local target = n_seqs / k
    for s = 2, n_seqs do
        local boundary = not group_ids or group_ids[s] ~= group_ids[s - 1]
        if boundary and #starts < k and (s - 1) >= target * #starts then starts[#starts + 1] = s end
    end
    starts[#starts + 1] = n_seqs + 1
    local parts, seq_parts = {}, {}
    for p = 1, #starts - 1 do
        local a, b = starts[p], starts[p + 1] - 1 -- sequences a..b
        local t0, t1 = cu[a] + 1, cu[b + 1]       -- tokens t0..t1
        local part = {}
        for name, v in pairs(batch) do
            if name ~= "cu_seqlens" then part[name] = v:slice(t0, t1) end
        end
        local offs = {}
        for s = a, b + 1 do offs[#offs + 1] = cu[s] - cu[a] end
        part.cu_seqlens = rl.tensor(offs, "int64")
        parts[p] = part
        seq_parts[p] = { first = a, last = b }
    end
    return parts, seq_parts
end

--- rl.sft_batch(tokenizer, tasks, eos_id [, chat_template]) -> batch
--- Supervised batch on the tasks' reference answers: prompt, then the answer
--- and a newline, then the end-of-sequence token; loss_mask on the answer,
--- newline and EOS tokens.
function M.sft_batch(tok, tasks, eos_id, chat_template)
    check_table(tasks, "tasks", 2)
    if math.type(eos_id) ~= "integer" then error("rl.sft_batch: eos_id must be an integer", 2) end
    local prompts = M.encode_prompts(tok, tasks, chat_template)
    local ids, mask, cu = {}, {}, { 0 }
    local n = 0
    for i, task in ipairs(tasks) do
        if type(task.answer) ~= "string" then
            error(("tasks[%d] has no reference answer (a string)"):format(i), 2)
        end
        local p, a = prompts[i], tok:encode(task.answer .. "\n")
        for k = 1, #p do
            n = n + 1
            ids[n], mask[n] = p[k], 0
        end
        for k = 1, #a do
            n = n + 1
            ids[n], mask[n] = a[k], 1
        end
        n = n + 1
        ids[n], mask[n] = eos_id, 1
        cu[#cu + 1] = n
    end
    return {
        input_ids = rl.tensor(ids, "int64"),
        cu_seqlens = rl.tensor(cu, "int64"),
        loss_mask = rl.tensor(mask, "float32"),
    }
end

--- rl.per_token(batch, values [, dtype]) -> tensor [n_tokens]
--- Broadcasts one value per sequence to that sequence's loss tokens (0 elsewhere).
function M.per_token(batch, values, dtype)
    local cu, mask = batch.cu_seqlens, batch.loss_mask
    if #values ~= #cu - 1 then
        error(("rl.per_token: %d values for %d sequences"):format(#values, #cu - 1), 2)
    end
    local out = {}
    for s = 1, #cu - 1 do
        for t = cu[s] + 1, cu[s + 1] do out[t] = mask[t] ~= 0 and values[s] or 0.0 end
    end
    return rl.tensor(out, dtype or "float32")
end

--- rl.reward_stats(rollouts) -> {mean, std, min, max, n} over r.reward, plus
--- the mean of every env metric (prefixed "env/").
function M.reward_stats(rollouts)
    local n, sum, sq, lo, hi = #rollouts, 0.0, 0.0, math.huge, -math.huge
    local msum = {}
    for _, r in ipairs(rollouts) do
        sum, sq = sum + r.reward, sq + r.reward * r.reward
        lo, hi = math.min(lo, r.reward), math.max(hi, r.reward)
        for k, v in pairs(r.metrics or {}) do msum[k] = (msum[k] or 0) + v end
    end
    local s = { n = n }
    if n > 0 then
        s.mean = sum / n
        s.std = math.sqrt(math.max(sq / n - s.mean * s.mean, 0))
        s.min, s.max = lo, hi
        for k, v in pairs(msum) do s["env/" .. k] = v / n end
    end
    return s
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
