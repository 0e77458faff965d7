-- examples/sft.lua: supervised fine-tuning on an environment's reference
-- answers (causallm_loss), with a greedy evaluation of the env's reward at
-- every checkpoint. The trained model is saved as an HF folder in
-- <run folder>/model (the teacher of examples/distill.lua); with lora.rank > 0
-- the adapter goes to <run folder>/adapter and the merged model to model/.
--
--   rlhost run examples/sft.lua --config examples/sft.yaml
local rl = require("rl")

local cfg = rl.config(rl.sft_keys()) -- this script's own settings, checked like the host's
local run = rl.run(cfg)
local model = rl.load_model(cfg)
local tok, info = model:tokenizer(), model:info()
local trainer = model:trainer(rl.trainer_config(cfg, { total_steps = cfg.sft.steps }))
run:attach(trainer)
local engine = model:engine(rl.engine_config(cfg))
local env = rl.env(cfg.env.name, cfg.env.params)
local ce = rl.loss("causallm_loss")
local template = cfg.tokenizer.chat_template
local eval_tasks = env:sample(32, rl.seed(cfg.run.seed, "eval"))

-- Mean reward of greedy completions on held-out tasks.
local function evaluate()
    engine:sync_weights()
    local rollouts = engine:rollouts(eval_tasks, {
        chat_template = template, sampling = rl.generation_params(cfg, { n = 1, temperature = 0 }),
    })
    rollouts:score(env)
    return rollouts:info()
end

local every = cfg.run.checkpoint_every
for step in run:steps("sft", cfg.sft.steps) do
    local tasks = env:sample(cfg.sft.batch_size, rl.seed(cfg.run.seed, "sft", step))
    local out = trainer:forward_backward(rl.sft_batch(tok, tasks, info.eos_token_ids[1], template), ce)
    local opt = trainer:optim_step { learning_rate = cfg.sft.learning_rate }
    local record = { loss = out.loss, perplexity = out.metrics.perplexity, tokens = out.tokens,
        grad_norm = opt.grad_norm }
    if (every > 0 and step % every == 0) or step == cfg.sft.steps then
        local ev = evaluate()
        record.eval_reward, record.eval_exact = ev.reward_mean, ev["env/exact_match"]
        run:print(("eval at step %d: reward %.3f, exact match %.3f"):format(step, ev.reward_mean,
            ev["env/exact_match"] or 0))
    end
    run:log(record)
end

if cfg.lora.rank > 0 then -- a LoRA run: the adapter (PEFT folder) and the merged model
    model:save_adapter("default", run.dir .. "/adapter")
    model:export_merged("default", run.dir .. "/model")
    run:print("adapter saved in " .. run.dir .. "/adapter, merged model in " .. run.dir .. "/model")
else
    model:save(run.dir .. "/model")
    run:print("model saved in " .. run.dir .. "/model")
end
run:finish()
