-- examples/grpo_disaggregated.lua: GRPO with rollouts and training in separate
-- processes (docs/disaggregated.md). One command starts both roles:
--
--   rlhost launch --roles trainer,rollout -- run examples/grpo_disaggregated.lua \
--       --config examples/grpo_disaggregated.yaml
--
-- Each role also runs alone (role=trainer / role=rollout, e.g. on two machines
-- sharing a folder or a network).
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

local cfg = rl.config(rl.sft_keys()) -- sft.*: the trainer's optional warm-up

local role = cfg.role
if role == "auto" then
    role = os.getenv("RL_ROLE")
    if role ~= "trainer" and role ~= "rollout" then
        error("role=auto needs RL_ROLE=trainer|rollout: start the roles with `rlhost launch "
            .. "--roles trainer,rollout -- run ...`, or set role=trainer / role=rollout", 0)
    end
end
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
local function weight_transport(k, sending)
    local t = cfg.weight_broadcast
    if t.type == "filesystem" then
        return rl.transport("filesystem", { dir = weight_dir, channel = "broadcasts",
            mode = "latest", keep = 3, poll_ms = 10 })
    end
    return rl.transport("zmq", { host = t.host, port = t.port + k, hwm = 2,
        role = sending and "push" or "pull", timeout_ms = ms(t.timeout) })
end

-- ---- rollout worker -----------------------------------------------------------------

local function rollout_worker()
    local path = cfg.model.path
    if path == "" then -- the trainer creates the built-in model: wait for it
        local deadline = rl.clock() + cfg.weight_broadcast.timeout
        while not rl.exists(cfg.model.init_dir .. "/config.json") do
            if rl.clock() > deadline then error("rollout: no model appeared in " .. cfg.model.init_dir, 0) end
            rl.sleep(0.05)
        end
    end
    local model = rl.load_model(cfg)
    local engine = model:engine(rl.engine_config(cfg))
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
                batches_out:send({
                    kind = "rl.batch", step = s, worker = worker_index, worker_run = worker_run,
                    policy_version = version,
                    reward = r.reward_mean, reward_std = r.reward_std, exact = r["env/exact_match"],
                    flagged = flagged.flagged, masked = flagged.masked, groups = info.groups,
                    rollouts = r.rollouts,
                }, batch:tensors())
                b = b + 1
            end
        end
    end
    print(("%s done: %d batches, final weights version %d"):format(tag, b, version))
end

-- ---- trainer --------------------------------------------------------------------------

local function trainer_role()
    local run = rl.run(cfg)
    local model = rl.load_model(cfg)
    local tok = model:tokenizer()
    local trainer = model:trainer(rl.trainer_config(cfg))
    run:attach(trainer) -- with run.resume: the last checkpoint, re-broadcast below
    local loss = rl.loss(cfg.loss.name, cfg.loss.params)
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
    local outbox = {}
    if cfg.weight_broadcast.type == "zmq" then
        for k = 0, workers - 1 do outbox[#outbox + 1] = weight_transport(k, true) end
    else
        outbox[1] = weight_transport(0, true)
    end
    local version = 0
    local function broadcast()
        local sent
        for _, t in ipairs(outbox) do sent = model:send_weights(t, version) end
        return sent.metrics
    end

    if cfg.sft.steps > 0 then
        rl.sft_warmup(cfg, run, trainer, tok, rl.env(cfg.env.name, cfg.env.params))
    end
    version = run.phases.rl or 0 -- a resumed run continues its versions
    broadcast()

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
        local wait = rl.clock() - t0
        local h = msg.header
        msg.header, msg.metrics = nil, nil
        local out = trainer:forward_backward(msg, loss)
        local opt = trainer:optim_step()
        version = version + 1
        local sync = broadcast()
        local record = {
            reward = h.reward, reward_std = h.reward_std, exact = h.exact,
            flagged = h.flagged, masked = h.masked, groups = h.groups,
            off_policy_gap = version - 1 - h.policy_version, dropped_batches = dropped,
            batch_step = h.step, worker = h.worker, worker_run = h.worker_run, wait_s = wait,
            ["sync/bytes"] = sync["sync/bytes"], ["sync/seconds"] = sync["sync/seconds"],
            ["sync/version"] = sync["sync/version"],
        }
        for k, v in pairs(rl.loss_stats(out)) do record[k] = v end
        record.tokens, record.grad_norm, record.lr = out.tokens, opt.grad_norm, opt.learning_rate
        run:log(record)
    end
    run:finish()
end

if role == "trainer" then trainer_role() else rollout_worker() end
