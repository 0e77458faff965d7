-- examples/distill.lua: on-policy distillation. The student samples; a
-- teacher (a second model, e.g. the SFT'd model of examples/sft.lua) scores
-- the student's tokens with its log-probs; the grpo loss's teacher term
-- (teacher_tau * (teacher_logprobs - logprobs), a per-token reverse-KL
-- signal) pulls the student toward the teacher. adv_tau mixes in the env
-- reward's advantage (0: pure distillation). The student is the
-- configuration's model, optionally warmed up first (sft.steps).
--
--   rlhost run examples/sft.lua --config examples/sft.yaml        # the teacher
--   rlhost run examples/distill.lua --config examples/distill.yaml
local rl = require("rl")

local cfg = rl.config(rl.eval_keys(rl.sft_keys { -- this script's own settings, checked like the host's
    { "distill.teacher_path", "string", "", "Teacher model folder (e.g. runs/sft/model, written by examples/sft.lua)." },
}))
if cfg.distill.teacher_path == "" then
    error("set distill.teacher_path to the teacher's model folder "
        .. "(runs/sft/model after examples/sft.lua)")
end
if (cfg.loss.params.teacher_tau or 0) <= 0 then
    error("distillation needs loss.params.teacher_tau > 0 (the grpo loss's teacher term)")
end

local run = rl.run(cfg)
local student = rl.load_model(cfg)
local teacher = rl.model(cfg.distill.teacher_path, { threads = cfg.model.threads })
local tok, info = student:tokenizer(), student:info()
if teacher:info().vocab_size ~= info.vocab_size then
    error("the teacher and the student must share a vocabulary")
end
local trainer = student:trainer(rl.trainer_config(cfg))
run:attach(trainer)
local teacher_forward = teacher:trainer {} -- forward passes only; never stepped
local engine = student:engine(rl.engine_config(cfg))

local env = rl.env(cfg.env.name, cfg.env.params)
local loss = rl.loss(cfg.loss.name, cfg.loss.params)
local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)

-- Optional supervised warm-up of the student (sft.steps > 0), as in grpo.lua:
-- a student that already answers in the right format gets a useful teacher
-- signal on every token it samples.
rl.sft_warmup(cfg, run, trainer, tok, env)
engine:sync_weights()

for step in run:steps("rl", cfg.run.steps) do
    local rollouts = rl.scored_rollouts(engine, env, cfg, step)
    -- Every rollout trains here (the teacher signal needs no reward spread).
    local batch = rollouts:to_batch()
    batch:compute_advantages(advantage)
    batch:set("teacher_logprobs", teacher_forward:forward(batch).logprobs)
    local out = trainer:forward_backward(batch, loss)
    local opt = trainer:optim_step()
    engine:sync_weights()

    local r = rollouts:info()
    local record = rl.loss_stats(out)
    record.reward, record.exact = r.reward_mean, r["env/exact_match"]
    record.teacher_kl = out.metrics.teacher_kl
    record.tokens, record.grad_norm = out.tokens, opt.grad_norm
    for k, v in pairs(rl.evaluate(engine, env, cfg, step) or {}) do record["eval/" .. k] = v end
    run:log(record)
end

run:finish()
