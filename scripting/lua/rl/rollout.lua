-- rl/rollout.lua: small helpers around the RL step. The step itself is typed
-- values in librl (abi/rl/step.h): engine:rollouts, rollouts:score /
-- filter / info / to_batch, buffer:push_rollouts / pop_train_batch,
-- batch:compute_advantages / split / set, engine:sync_weights(buffer); no
-- per-token work of the RL step is done in Lua. What stays here: prompt
-- encoding, the supervised batch of the warm-up (a call into librl), and
-- reading loss metrics.
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
