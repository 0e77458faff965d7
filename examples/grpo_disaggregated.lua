-- examples/grpo_disaggregated.lua: GRPO with rollouts and training in separate
-- processes (docs/disaggregated.md). One command starts both roles:
--
--   rlhost launch --roles trainer,rollout -- run examples/grpo_disaggregated.lua \
--       --config examples/grpo_disaggregated.yaml
--
-- Each role also runs alone (role=trainer / role=rollout, e.g. on two machines
-- sharing a folder or a network).
--
-- With an orchestrator (Surogate's three roles; docs/disaggregated.md):
--
--   rlhost launch --roles trainer,orchestrator,rollout:2 -- run examples/grpo_disaggregated.lua \
--       --config examples/grpo_disaggregated.yaml
--
-- rollout workers only generate, score and filter: each chunk of rollouts goes
-- to the orchestrator, numbered (worker process, sequence number), when the
-- orchestrator grants a credit. The orchestrator owns the buffer (difficulty
-- filter, staleness), the advantages and the batches; it numbers every batch
-- with the trainer step it is for, keeps it until the trainer's checkpoint
-- covers it, and sends it again to a restarted trainer. The trainer
-- acknowledges every step. The protocol is librl's (rl.disagg; "three roles" below).
--
-- rollout (K workers): engine + env + filters + buffer + advantages. It waits
--   for the trainer's weights, then produces training batches, each tagged
--   with the global step it is for and the policy version that sampled it.
--   Before producing the batch of step s it waits until it holds weights of
--   version >= s - max_async_level, so it runs at most that many steps ahead.
-- trainer: optional SFT warm-up, then for each step: the next batch (batches
--   more than buffer.max_off_policy_steps versions old are dropped and
--   counted), forward_backward, optim_step, and the new weights to every
--   worker. The run folder, metrics and checkpoints are the trainer's.
local rl = require("rl")

-- sft.*: the trainer's optional warm-up; episode.*: multi-turn envs; ref.model: the
-- trainer's frozen reference (ref_logprobs for the loss's KL term); eval.*: the
-- trainer's evaluation of its own weights every eval.every steps
local cfg = rl.config(rl.eval_keys(rl.ref_keys(rl.episode_keys(rl.sft_keys()))))

local role = cfg.role
if role == "auto" then
    role = os.getenv("RL_ROLE")
    if role ~= "trainer" and role ~= "rollout" and role ~= "orchestrator" then
        error("role=auto needs RL_ROLE=trainer|orchestrator|rollout: start the roles with `rlhost launch "
            .. "--roles trainer,rollout -- run ...`, or set role=trainer / role=rollout", 0)
    end
end
-- Three roles when an orchestrator is among the launched roles (or, by hand,
-- with orchestrator=true).
local orchestrated = cfg.orchestrator or role == "orchestrator"
    or ((os.getenv("RL_ROLES") or ""):match("orchestrator") ~= nil)
local workers = tonumber((os.getenv("RL_ROLES") or ""):match("rollout:(%d+)") or "")
    or cfg.rollout_workers
local worker_index = role == "rollout" and tonumber(os.getenv("RL_ROLE_INDEX") or "0") or 0
local run_dir = cfg.run.dir .. "/" .. cfg.run.name
-- One launch, one folder: a stale step of an earlier run is never read.
local launch_id = os.getenv("RL_LAUNCH_ID") or "manual"
local batch_dir = cfg.rollout_transport.dir ~= "" and cfg.rollout_transport.dir
    or (run_dir .. "/transport/" .. launch_id)
local weight_dir = cfg.weight_broadcast.dir ~= "" and cfg.weight_broadcast.dir or batch_dir
local ms = function(seconds) return math.floor(seconds * 1000) end
local max_gap = cfg.buffer.max_off_policy_steps -- nil: never drop
if max_gap ~= nil and max_gap < cfg.max_async_level then
    error(("buffer.max_off_policy_steps (%d) is below max_async_level (%d): the trainer would "
        .. "drop batches the workers are allowed to produce"):format(max_gap, cfg.max_async_level), 0)
end

-- The transports of this role: batches (workers -> trainer) and weights
-- (trainer -> workers).
local function batch_transport(k, sending)
    local t = cfg.rollout_transport
    if t.type == "filesystem" then
        return rl.transport("filesystem", { dir = batch_dir, channel = "rollouts_" .. k,
            poll_ms = 10 })
    end
    return rl.transport("zmq", { host = t.host, port = t.port, hwm = t.hwm,
        role = sending and "push" or "pull", timeout_ms = ms(t.timeout) })
end
local model_device = "cpu" -- set once the role has loaded its model
local function weight_transport(k, sending)
    local t = cfg.weight_broadcast
    if t.type == "filesystem" then
        return rl.transport("filesystem", { dir = weight_dir, channel = "broadcasts",
            mode = "latest", keep = 3, poll_ms = 10 })
    elseif t.type == "nccl" then
        -- One collective group: the trainer is rank 0, worker K rank K + 1.
        -- NCCL for a model on a GPU, Gloo for one on the CPU.
        local device = model_device
        return rl.transport("nccl", { host = t.host, port = t.port, world_size = workers + 1,
            rank = sending and 0 or k + 1, role = sending and "push" or "pull",
            timeout = t.timeout, mode = "latest",
            backend = device:match("^cuda") and "nccl" or "gloo" })
    end
    return rl.transport("zmq", { host = t.host, port = t.port + k, hwm = 2,
        role = sending and "push" or "pull", timeout_ms = ms(t.timeout) })
end

-- ---- rollout worker -----------------------------------------------------------------

-- A rollout worker's model and engine (the trainer creates the built-in model:
-- wait for it).
local function worker_model()
    if cfg.model.path == "" then
        local deadline = rl.clock() + cfg.weight_broadcast.timeout
        while not rl.exists(cfg.model.init_dir .. "/config.json") do
            if rl.clock() > deadline then error("rollout: no model appeared in " .. cfg.model.init_dir, 0) end
            rl.sleep(0.05)
        end
    end
    local model = rl.load_model(cfg)
    model_device = model:info().device
    return model, model:engine(rl.engine_config(cfg))
end

local function rollout_worker()
    local model, engine = worker_model()
    local env = rl.env(cfg.env.name, cfg.env.params)
    local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
    local filters = rl.filters(cfg.filters)
    local buffer = rl.buffer(rl.buffer_config(cfg))
    local weights_in = weight_transport(worker_index, false)
    local batches_out = batch_transport(worker_index, true)
    local tag = ("[rollout %d/%d]"):format(worker_index, workers)
    -- Names this worker process in every batch (a restarted worker is a new run).
    local worker_run = ("%d-%d"):format(worker_index, math.floor(rl.time() * 1000))

    local version = -1
    local function take(wait_s)
        local got, why = model:recv_weights(weights_in, ms(wait_s))
        if not got then return false end
        version = got.version
        engine:sync_weights(buffer)
        print(("%s weights version %d (%.0f MB in %.2fs)"):format(tag, version,
            got.metrics["sync/bytes"] / 1e6, got.metrics["sync/seconds"]))
        return true
    end

    local final = cfg.run.steps -- the trainer's last version
    local b, round = 0, 0
    -- The first weights say where the trainer is (a restarted worker joins
    -- at the trainer's step, not at 0).
    if not take(cfg.weight_broadcast.timeout) then
        error(tag .. " no weights from the trainer within weight_broadcast.timeout; is it running?", 0)
    end
    b = math.max(0, math.ceil((version - worker_index) / workers))
    round = b
    while version < final do
        local s = b * workers + worker_index -- the global step this batch is for
        if s >= final then -- nothing left to produce: wait for the end
            if not take(cfg.weight_broadcast.timeout) then
                error(tag .. " no weights from the trainer within weight_broadcast.timeout", 0)
            end
        else
            -- Run at most max_async_level steps ahead of the weights in use.
            while version < math.max(0, s - cfg.max_async_level) do
                if not take(cfg.weight_broadcast.timeout) then
                    error(("%s waited weight_broadcast.timeout (%gs) for weights version %d; is the trainer running?")
                        :format(tag, cfg.weight_broadcast.timeout, s - cfg.max_async_level), 0)
                end
            end
            while take(0) do end -- adopt anything newer that is already there
            round = round + 1
            local seed_step = round * workers + worker_index
            local rollouts = rl.scored_rollouts(engine, env, cfg, seed_step)
            local flagged = rollouts:filter(filters)
            buffer:push_rollouts(rollouts)
            local r = rollouts:info()
            local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
            if batch then
                batch:compute_advantages(advantage)
                local info = batch:info()
                local header = {
                    kind = "rl.batch", step = s, worker = worker_index, worker_run = worker_run,
                    policy_version = version,
                    reward = r.reward_mean, reward_std = r.reward_std, exact = r["env/exact_match"],
                    flagged = flagged.flagged, masked = flagged.masked, groups = info.groups,
                    rollouts = r.rollouts, turns = r.turns_mean, -- multi-turn envs
                    episode_errors = r.episode_errors,
                }
                -- The env's own metrics (calculator: env/tool_calls, ...), logged by the trainer.
                for k, v in pairs(r) do
                    if k:sub(1, 4) == "env/" then header[k] = v end
                end
                batches_out:send(header, batch:tensors())
                b = b + 1
            end
        end
    end
    print(("%s done: %d batches, final weights version %d"):format(tag, b, version))
end

-- ---- trainer --------------------------------------------------------------------------

-- The trainer side of both modes: the run, the model, its tokenizer, the
-- trainer (attached to the run: with run.resume, its last checkpoint) and the
-- loss.
local function load_trainer()
    local run = rl.run(cfg)
    local model = rl.load_model(cfg)
    model_device = model:info().device
    local trainer = model:trainer(rl.trainer_config(cfg))
    run:attach(trainer)
    return run, model, model:tokenizer(), trainer, rl.loss(cfg.loss.name, cfg.loss.params)
end

-- broadcast(version[, worker]) -> the last send's metrics: the model's weights
-- to the rollout workers (zmq: point to point, one sender per worker; else one
-- for all), or again to one worker that asked for them (zmq only: the
-- filesystem's newest step stays readable, and a collective is sent to all).
local function weight_broadcaster(model)
    local outbox = {}
    if cfg.weight_broadcast.type == "zmq" then
        for k = 0, workers - 1 do outbox[#outbox + 1] = weight_transport(k, true) end
    else
        outbox[1] = weight_transport(0, true)
    end
    return function(version, worker)
        if worker ~= nil then
            if cfg.weight_broadcast.type ~= "zmq" or outbox[worker + 1] == nil then return nil end
            return model:send_weights(outbox[worker + 1], version).metrics
        end
        local sent
        for _, t in ipairs(outbox) do sent = model:send_weights(t, version) end
        return sent.metrics
    end
end

-- What the trainer adds after its warm-up: the frozen reference of ref.model
-- (nil when '') and evaluate(step) -> the eval/* fields of the record (empty
-- unless step is a multiple of eval.every): the env's tasks answered by an
-- engine over the trainer's own weights, the step's policy.
local function trainer_extras(model, run)
    local ref = rl.reference(cfg, model, run)
    local engine, env
    local function evaluate(step)
        local e = cfg.eval
        if e.every <= 0 or step % e.every ~= 0 then return {} end
        if not engine then
            engine = model:engine(rl.engine_config(cfg))
            env = rl.env(cfg.env.name, cfg.env.params)
        end
        engine:sync_weights()
        local out = {}
        for k, v in pairs(rl.evaluate(engine, env, cfg, step) or {}) do out["eval/" .. k] = v end
        return out
    end
    return ref, evaluate
end

-- Mean |a - b| over the loss tokens: how far the proximal policy's logprobs
-- are from the behaviour policy's.
local function mean_abs_gap(a, b, mask)
    local sum, n = 0.0, 0
    for i = 1, #a do
        if not mask or mask[i] > 0 then
            sum, n = sum + math.abs(a[i] - b[i]), n + 1
        end
    end
    return n > 0 and sum / n or 0.0
end

-- One trainer step on a received batch message (waited for `wait` seconds),
-- then the weights of `version` broadcast: the batch's header and the step's
-- record (loss stats, tokens, grad norm, lr, sync metrics and what both modes
-- log of the header).
local function train_on(trainer, loss, msg, broadcast, version, wait, ref)
    local h = msg.header
    msg.header, msg.metrics = nil, nil
    if ref then msg.ref_logprobs = ref:logprobs(msg) end -- the KL term's reference
    -- AReaL's decoupled PPO: the proximal policy is the trainer's weights as
    -- they are now, its logprobs recomputed for the batch before the update;
    -- old_logprobs stay the behaviour policy's (the rollout's, up to
    -- max_async_level versions old).
    local prox_gap
    if cfg.loss.name == "decoupled_ppo" then
        msg.prox_logprobs = trainer:forward(msg).logprobs
        prox_gap = mean_abs_gap(msg.prox_logprobs, msg.old_logprobs, msg.loss_mask)
    end
    local out = trainer:forward_backward(msg, loss)
    local opt = trainer:optim_step()
    local sync = broadcast(version)
    local record = {
        reward = h.reward, groups = h.groups, batch_step = h.step, wait_s = wait,
        off_policy_gap = version - 1 - h.policy_version,
        ["sync/bytes"] = sync["sync/bytes"], ["sync/seconds"] = sync["sync/seconds"],
        ["sync/version"] = sync["sync/version"],
    }
    for k, v in pairs(rl.loss_stats(out)) do record[k] = v end
    record.tokens, record.grad_norm, record.lr = out.tokens, opt.grad_norm, opt.learning_rate
    record.prox_gap = prox_gap
    record.ref_kl = out.metrics and out.metrics.ref_kl
    return h, record
end

local function trainer_role()
    local run, model, tok, trainer, loss = load_trainer() -- resumed: re-broadcast below
    -- Nothing of an earlier run in the shared folders (start the trainer first
    -- when the roles are started by hand with the same folder).
    local ours = { weight_dir .. "/broadcasts" }
    for k = 0, workers - 1 do ours[#ours + 1] = batch_dir .. "/rollouts_" .. k end
    for _, d in ipairs(ours) do
        if rl.exists(d) == "dir" then rl.remove_tree(d) end
    end
    local inbox = {}
    if cfg.rollout_transport.type == "zmq" then
        inbox[1] = batch_transport(0, false)
    else
        for k = 0, workers - 1 do inbox[#inbox + 1] = batch_transport(k, false) end
    end
    local broadcast = weight_broadcaster(model)
    local version = 0

    if cfg.sft.steps > 0 then
        rl.sft_warmup(cfg, run, trainer, tok, rl.env(cfg.env.name, cfg.env.params))
    end
    version = run.phases.rl or 0 -- a resumed run continues its versions
    local ref, evaluate = trainer_extras(model, run)
    broadcast(version)

    -- The next batch from any worker; nil after rollout_transport.timeout.
    local function next_batch()
        local deadline = rl.clock() + cfg.rollout_transport.timeout
        while true do
            for _, t in ipairs(inbox) do
                local msg = t:recv(#inbox == 1 and 200 or 0)
                if msg then return msg end
            end
            if rl.clock() > deadline then return nil end
            if #inbox > 1 then rl.sleep(0.01) end
        end
    end

    local dropped = 0
    for step in run:steps("rl", cfg.run.steps) do
        local t0, msg = rl.clock(), nil
        while true do
            msg = next_batch()
            if not msg then
                error(("trainer: no batch from the rollout workers within rollout_transport.timeout "
                    .. "(%gs) at step %d; are they running?"):format(cfg.rollout_transport.timeout, step), 0)
            end
            local gap = version - msg.header.policy_version
            if max_gap == nil or gap <= max_gap then break end
            dropped = dropped + 1 -- too far off-policy: counted, never trained on
        end
        version = version + 1
        local h, record = train_on(trainer, loss, msg, broadcast, version, rl.clock() - t0, ref)
        record.reward_std, record.exact, record.flagged, record.masked, record.turns =
            h.reward_std, h.exact, h.flagged, h.masked, h.turns
        record.episode_errors = h.episode_errors
        record.dropped_batches, record.worker, record.worker_run = dropped, h.worker, h.worker_run
        for k, v in pairs(h) do
            if k:sub(1, 4) == "env/" then record[k] = v end
        end
        for k, v in pairs(evaluate(step)) do record[k] = v end
        run:log(record)
    end
    run:finish()
end

-- ---- three roles: rollout workers -> orchestrator -> trainer ---------------------------
--
-- The protocol is librl's (rl.disagg, abi/rl/disagg.h; docs/disaggregated.md):
-- versioned messages, a credit for each chunk of scored rollouts numbered
-- (worker process, sequence number), the orchestrator's buffer, advantages and
-- batches (kept until the trainer's checkpoint covers them, sent again to a
-- restarted trainer; its state in <transport dir>/orchestrator, taken back with
-- run.resume), the trainer's acknowledgements, every step trained once and in
-- order, and any peer silent past its timeout named in an error. What is left
-- here is the model work: sampling and scoring, training, the weights.
local protocol = rl.disagg.config(cfg, batch_dir, workers)

local function orchestrated_worker()
    local model, engine = worker_model()
    local env = rl.env(cfg.env.name, cfg.env.params)
    local filters = rl.filters(cfg.filters)
    local tag = ("[rollout %d/%d]"):format(worker_index, workers)
    local orchestrator = rl.disagg.worker(protocol, worker_index)
    local weights_in = weight_transport(worker_index, false)
    local version, floor, chunks = -1, nil, 0
    local function take(wait_s)
        local got = model:recv_weights(weights_in, ms(wait_s), floor and { newer_than = floor } or nil)
        if not got then return false end
        version, floor = got.version, nil
        engine:sync_weights()
        return true
    end
    -- Hello first: the trainer sent its newest weights before this process
    -- existed; the orchestrator asks it to send them again for this worker.
    orchestrator:hello()
    if not take(cfg.weight_broadcast.timeout) then
        error(tag .. " no weights from the trainer within weight_broadcast.timeout; is it running?", 0)
    end
    while true do
        local credit = orchestrator:credit() -- for the next chunk, or the end
        if credit.done then break end
        if credit.trainer_restarted then -- from a checkpoint: take its (older) weights
            print(("%s the trainer restarted at version %d"):format(tag, credit.trainer_version))
            floor = credit.trainer_version - 1
            if cfg.weight_broadcast.type == "filesystem" then
                weights_in = weight_transport(worker_index, false) -- read from the newest again
            end
        end
        while take(0) do end -- the newest weights there are, at least min_version
        while version < credit.min_version or floor ~= nil do
            if not take(cfg.weight_broadcast.timeout) then
                error(("%s waited weight_broadcast.timeout (%gs) for weights version %d; is the trainer running?")
                    :format(tag, cfg.weight_broadcast.timeout, credit.min_version), 0)
            end
        end
        local run, seq = credit.worker_run, credit.seq
        local tasks = env:sample(cfg.rollout.prompts_per_step, rl.seed(cfg.run.seed, "rl", run, seq))
        local rollouts = rl.scored(engine, env, tasks, cfg, { -- episodes for a multi-turn env
            chat_template = cfg.tokenizer.chat_template,
            sampling = rl.generation_params(cfg, { seed = rl.seed(cfg.run.seed, "generate", run, seq) }),
        })
        rollouts:filter(filters)
        orchestrator:send(rollouts, version)
        chunks = chunks + 1
    end
    print(("%s done: %d chunks, final weights version %d"):format(tag, chunks, version))
end

local function orchestrator_role()
    rl.disagg.orchestrator(protocol, rl.buffer(rl.buffer_config(cfg)),
        rl.advantage(cfg.advantage.name, cfg.advantage.params))
end

local function orchestrated_trainer()
    local run, model, tok, trainer, loss = load_trainer()
    if rl.exists(weight_dir .. "/broadcasts") == "dir" then rl.remove_tree(weight_dir .. "/broadcasts") end
    local orchestrator = rl.disagg.trainer(protocol)
    local broadcast = weight_broadcaster(model)
    rl.sft_warmup(cfg, run, trainer, tok, rl.env(cfg.env.name, cfg.env.params))
    local version = run.phases.rl or 0
    local ref, evaluate = trainer_extras(model, run)
    orchestrator:hello(version)
    broadcast(version)
    for step in run:steps("rl", cfg.run.steps) do
        local t0, msg = rl.clock(), orchestrator:next(version)
        while msg.header.kind == "rl.weights_wanted" do -- a worker (re)started: the weights in use
            if broadcast(version, msg.header.worker) then
                print(("trainer: weights version %d sent again to worker %d"):format(version, msg.header.worker))
            end
            msg = orchestrator:next(version)
        end
        version = version + 1
        local h, record = train_on(trainer, loss, msg, broadcast, version, rl.clock() - t0, ref)
        orchestrator:ack(version)
        for _, k in ipairs { "rollouts", "duplicate_batches", "chunks", "lost_chunks", "worker_restarts",
            "trainer_restarts", "orchestrator_restarts" } do record[k] = h[k] end
        for k, v in pairs(evaluate(step)) do record[k] = v end
        run:log(record)
    end
    run:finish()
end

if orchestrated then
    if role == "trainer" then orchestrated_trainer()
    elseif role == "orchestrator" then orchestrator_role()
    else orchestrated_worker() end
elseif role == "orchestrator" then
    error("role=orchestrator: the two-role mode has none (start trainer,orchestrator,rollout)", 0)
elseif role == "trainer" then trainer_role() else rollout_worker() end
