-- tests/lua/scripts/train_judge.lua OUT_DIR: makes a tiny "judge" that always
-- replies "Score: 7": the built-in tiny model trained with causallm_loss on
-- the default rubric (rl/reward.lua) filled with random requests and
-- responses, then saved to OUT_DIR. The LLM-judge tests use it where a judge
-- must reply with a score the parser reads.
local rl = require("rl")
local out = assert(arg[1], "usage: train_judge.lua OUT_DIR")
local base = out .. ".base"
rl.mkdir(base)
rl.init_model("tiny", base, 5)
local model = rl.model(base, { threads = 1 })
local tok = model:tokenizer()
local trainer = model:trainer { learning_rate = 3e-3, lr_schedule = "constant" }
local ce = rl.loss("causallm_loss")
local rubric = require("rl.reward").DEFAULT_RUBRIC
local eos = model:info().eos_token_ids[1]
local rng = 12345
local function word()
    local s = {}
    for _ = 1, 3 + rng % 6 do
        rng = (rng * 1103515245 + 12345) % 2147483648
        s[#s + 1] = string.char(97 + rng % 26)
    end
    return table.concat(s)
end
local loss
for _ = 1, 50 do
    local tasks = {}
    for i = 1, 8 do
        local prompt = rubric:gsub("{prompt}", "reverse: " .. word() .. "\n")
            :gsub("{completion}", word() .. "\n"):gsub("{answer}", "")
        tasks[i] = { prompt = prompt, answer = "Score: 7" }
    end
    local batch = rl.sft_batch(tok, tasks, eos, "model")
    loss = trainer:forward_backward(batch, ce).loss
    trainer:optim_step()
end
model:save(out)
print(("trained the judge: last loss %.4f"):format(loss))
