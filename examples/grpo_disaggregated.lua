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
-- acknowledges every step. See the protocol under "three roles" below.
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
-- Channels (zmq: ports from rollout_transport.port = P; filesystem: channels
-- of the shared folder):
--   orchestrator -> trainer   batches          zmq: trainer binds P       fs: batches
--   workers, trainer -> orch. rollouts, acks   zmq: orchestrator binds P+1 fs: to_orch_w<K>, to_orch_trainer
--   orchestrator -> worker K  credits          zmq: worker K binds P+2+K  fs: credits_<K>
--   trainer -> workers        weights          weight_broadcast (filesystem, zmq or nccl)
-- Messages (header "kind"):
--   rl.hello    worker -> orch.: {worker, worker_run} when a worker process starts
--   rl.rollouts worker -> orch.: {worker, worker_run, seq, policy_version} + a chunk of
--               scored rollouts (one per credit; seq 1, 2, ... per worker process)
--   rl.credit   orch. -> worker: {worker_run, seq: may send up to this one, min_version:
--               sample with weights at least this new, trainer_run, trainer_version, done}
--   rl.batch    orch. -> trainer: {step, ...}: the batch the trainer trains at version step
--   rl.weights_wanted orch. -> trainer: {worker, worker_run}: a worker said hello; the
--               trainer sends it the weights in use again (zmq weights)
--   rl.orchestrator_hello orch. -> trainer: a restarted orchestrator (run.resume=true,
--               its state from <transport dir>/orchestrator); the trainer answers with
--               an rl.trainer acknowledgement, the orchestrator sends its kept batches
--               from that version on again
--   rl.trainer  trainer -> orch.: {trainer_run, version, checkpoint, hello, done}
-- Guarantees: the orchestrator takes a chunk once (a repeated (worker_run, seq) is
-- skipped, a gap is counted as lost); the trainer trains every step once, in order
-- (a batch for a past step is skipped, one for a later step waits); the orchestrator
-- keeps every batch from the trainer's last checkpoint on and sends them again when a
-- trainer says hello at an older version. Any peer silent past its timeout is an
-- error naming it, never a hang.

local P = cfg.rollout_transport.port
local function zmq_end(port, sending, bind, hwm)
    local t = cfg.rollout_transport
    return rl.transport("zmq", { host = t.host, port = port, hwm = hwm or t.hwm, bind = bind,
        role = sending and "push" or "pull", timeout_ms = ms(t.timeout) })
end
local function fs_end(channel, reading)
    return rl.transport("filesystem", { dir = batch_dir, channel = channel, poll_ms = 10 })
end
local fs = cfg.rollout_transport.type == "filesystem"
-- Channels of the three roles.
local function to_trainer(reading) -- batches
    if fs then return fs_end("batches", reading) end
    return zmq_end(P, not reading, reading)
end
local function to_orchestrator(who, reading) -- who: "w<K>" or "trainer"
    if fs then return fs_end("to_orch_" .. who, reading) end
    return zmq_end(P + 1, not reading, reading)
end
local function to_worker(k, reading) -- credits
    if fs then return fs_end("credits_" .. k, reading) end
    return zmq_end(P + 2 + k, not reading, reading, 64)
end
-- Removes the folders `names` of `dir` (default: the shared transport folder).
local function clear(names, dir)
    for _, c in ipairs(names) do
        local d = (dir or batch_dir) .. "/" .. c
        if rl.exists(d) == "dir" then rl.remove_tree(d) end
    end
end
-- The last checkpoint surely saved at `version` (run.checkpoint_every; 0: none before the end).
local function checkpoint_floor(version)
    local every = cfg.run.checkpoint_every
    if every <= 0 or version <= 0 then return 0 end
    return ((version - 1) // every) * every
end

local function orchestrated_worker()
    local model, engine = worker_model()
    local env = rl.env(cfg.env.name, cfg.env.params)
    local filters = rl.filters(cfg.filters)
    local tag = ("[rollout %d/%d]"):format(worker_index, workers)
    local worker_run = ("%d-%d"):format(worker_index, math.floor(rl.time() * 1000))
    if fs then clear({ "credits_" .. worker_index }) end
    local credits = to_worker(worker_index, true)
    local out = to_orchestrator("w" .. worker_index, false)
    local weights_in = weight_transport(worker_index, false)

    local version, floor = -1, nil
    local function take(wait_s)
        local got = model:recv_weights(weights_in, ms(wait_s), floor and { newer_than = floor } or nil)
        if not got then return false end
        version, floor = got.version, nil
        engine:sync_weights()
        return true
    end
    -- Hello first: the trainer may have sent its newest weights before this
    -- process existed (or into the connection of the process it replaces), and
    -- sends nothing new until rollouts come; the orchestrator asks it to send
    -- them again for this worker.
    -- An orchestrator that starts at the same time clears its shared folders: a
    -- send can fail, or the hello vanish; it is sent again (below) until the
    -- first credit comes.
    local function hello()
        for attempt = 1, 50 do
            local ok, err = pcall(out.send, out, { kind = "rl.hello", worker = worker_index,
                worker_run = worker_run })
            if ok then return end
            if attempt == 50 then error(err, 0) end
            rl.sleep(0.1)
        end
    end
    hello()
    if not take(cfg.weight_broadcast.timeout) then
        error(tag .. " no weights from the trainer within weight_broadcast.timeout; is it running?", 0)
    end
    local seq, allowed, min_version, trainer_run, done = 0, 0, 0, nil, false
    local chunks, credited = 0, false
    while true do
        -- A credit for the next chunk (or the end).
        local waited_since = rl.clock()
        while allowed <= seq and not done do
            -- Before the first credit, in slices of 2 s with the hello again.
            local msg = credits:recv(ms(credited and cfg.rollout_transport.timeout or 2))
            if not msg then
                if credited or rl.clock() - waited_since > cfg.rollout_transport.timeout then
                    error(("%s no credit from the orchestrator within rollout_transport.timeout (%gs); is it running?")
                        :format(tag, cfg.rollout_transport.timeout), 0)
                end
                hello()
            elseif msg.header.worker_run == worker_run then -- credits for an earlier process are void
                local h = msg.header
                credited = true
                if trainer_run ~= nil and h.trainer_run ~= trainer_run then
                    -- The trainer restarted from a checkpoint: take its (older) weights.
                    print(("%s the trainer restarted at version %d"):format(tag, h.trainer_version))
                    floor = h.trainer_version - 1
                    if cfg.weight_broadcast.type == "filesystem" then
                        weights_in = weight_transport(worker_index, false) -- read from the newest again
                    end
                end
                trainer_run = h.trainer_run
                done = h.done
                allowed = math.max(allowed, h.seq)
                min_version = h.min_version
            end
        end
        if done then break end
        -- Weights: the newest there is, at least min_version.
        while take(0) do end
        while version < min_version or floor ~= nil do
            if not take(cfg.weight_broadcast.timeout) then
                error(("%s waited weight_broadcast.timeout (%gs) for weights version %d; is the trainer running?")
                    :format(tag, cfg.weight_broadcast.timeout, min_version), 0)
            end
        end
        seq = seq + 1
        local tasks = env:sample(cfg.rollout.prompts_per_step, rl.seed(cfg.run.seed, "rl", worker_run, seq))
        local rollouts = rl.scored(engine, env, tasks, cfg, { -- episodes for a multi-turn env
            chat_template = cfg.tokenizer.chat_template,
            sampling = rl.generation_params(cfg, { seed = rl.seed(cfg.run.seed, "generate", worker_run, seq) }),
        })
        local flagged = rollouts:filter(filters)
        local r = rollouts:info()
        local b = rollouts:to_batch():info()
        local tensors = { input_ids = b.input_ids, cu_seqlens = b.cu_seqlens, loss_mask = b.loss_mask,
            rewards = b.rewards, group_ids = b.group_ids, policy_versions = b.policy_versions }
        if b.rollout_logprobs then tensors.rollout_logprobs = b.rollout_logprobs end
        out:send({ kind = "rl.rollouts", worker = worker_index, worker_run = worker_run, seq = seq,
            policy_version = version, sampling_temperature = b.sampling_temperature,
            reward = r.reward_mean, exact = r["env/exact_match"], flagged = flagged.flagged,
            masked = flagged.masked }, tensors)
        chunks = chunks + 1
    end
    print(("%s done: %d chunks, final weights version %d"):format(tag, chunks, version))
end

local function orchestrator_role()
    local advantage = rl.advantage(cfg.advantage.name, cfg.advantage.params)
    local buffer = rl.buffer(rl.buffer_config(cfg))
    local tag = "[orchestrator]"
    -- Its state (buffer, kept batches, credits, steps) lives in state_dir,
    -- saved after every change; run.resume=true takes it back after a crash.
    local state_dir = batch_dir .. "/orchestrator"
    local resuming = cfg.run.resume and rl.exists(state_dir .. "/state.json") == "file"
    if not resuming and rl.exists(state_dir) == "dir" then rl.remove_tree(state_dir) end
    rl.mkdir(state_dir)
    local inboxes = {}
    if fs then
        -- Messages waiting in the shared folder are real after a restart.
        if not resuming then clear({ "to_orch_trainer" }) end
        inboxes[1] = to_orchestrator("trainer", true)
        for k = 0, workers - 1 do
            if not resuming then clear({ "to_orch_w" .. k }) end
            inboxes[#inboxes + 1] = to_orchestrator("w" .. k, true)
        end
    else
        inboxes[1] = to_orchestrator(nil, true)
    end
    local batches = to_trainer(false)
    local credit_out = {}
    for k = 0, workers - 1 do credit_out[k] = to_worker(k, false) end

    local total, A = cfg.run.steps, cfg.max_async_level
    local trainer = { run = nil, version = -1, checkpoint = 0, done = false }
    local w = {} -- per worker index: run, seq (last taken), granted
    local stats = { chunks = 0, duplicates = 0, lost_chunks = 0, worker_restarts = 0,
        trainer_restarts = 0, resent = 0, orchestrator_restarts = 0 }
    local sent = {}  -- step -> {header, tensors}, kept until the trainer's checkpoint covers it
    local next_step = nil
    local gid, gid_map = 0, {}
    local last_heard = rl.clock()

    -- ---- persistence: state.json names the buffer file of its generation (the
    -- commit point); each kept batch is a message in its own folder.
    local generation = 0
    local function kept_channel(step)
        return rl.transport("filesystem", { dir = state_dir, channel = "kept_" .. step,
            mode = "latest", keep = 1, poll_ms = 10 })
    end
    local function save()
        generation = generation + 1
        buffer:save(("%s/buffer_%d.json"):format(state_dir, generation))
        local workers_state, kept = {}, {}
        for k, s in pairs(w) do
            workers_state[#workers_state + 1] = { worker = k, run = s.run, seq = s.seq, granted = s.granted }
        end
        for step in pairs(sent) do kept[#kept + 1] = step end
        table.sort(kept)
        rl.write_file(state_dir .. "/state.json", rl.json.encode({
            format = "rl.orchestrator_state/1", generation = generation, next_step = next_step or rl.null,
            trainer = { run = trainer.run or rl.null, version = trainer.version,
                checkpoint = trainer.checkpoint, done = trainer.done },
            workers = rl.json.array(workers_state), kept = rl.json.array(kept), stats = stats,
            gid = gid, gid_map = next(gid_map) and gid_map or rl.null }))
        local old = ("%s/buffer_%d.json"):format(state_dir, generation - 1)
        if rl.exists(old) == "file" then os.remove(old) end
    end
    local function remove_kept(steps)
        local names = {}
        for _, step in ipairs(steps) do names[#names + 1] = "kept_" .. step end
        clear(names, state_dir)
    end
    local function keep(step, header, tensors)
        remove_kept({ step }) -- of an attempt that did not commit
        kept_channel(step):send(header, tensors)
        sent[step] = { header = header, tensors = tensors }
    end
    local function forget_before(checkpoint)
        local gone = {}
        for step in pairs(sent) do
            if step < checkpoint then gone[#gone + 1] = step end
        end
        for _, step in ipairs(gone) do sent[step] = nil end
        return gone
    end
    local resync = false -- after a restart: the trainer's next acknowledgement says what it lacks
    local obsolete = {} -- kept batches the trainer's checkpoint covers, removed after the next save
    if resuming then
        local f = assert(io.open(state_dir .. "/state.json", "rb"))
        local st = rl.json.decode(f:read("a"))
        f:close()
        if st.format ~= "rl.orchestrator_state/1" then
            error(("%s %s/state.json is not an orchestrator state"):format(tag, state_dir), 0)
        end
        generation = st.generation
        buffer:load(("%s/buffer_%d.json"):format(state_dir, generation))
        next_step = st.next_step ~= rl.null and st.next_step or nil
        trainer.run = st.trainer.run ~= rl.null and st.trainer.run or nil
        trainer.version, trainer.checkpoint, trainer.done =
            st.trainer.version, st.trainer.checkpoint, st.trainer.done
        for _, s in ipairs(st.workers) do w[s.worker] = { run = s.run, seq = s.seq, granted = s.granted } end
        for key, value in pairs(st.stats) do stats[key] = value end
        gid = st.gid
        if st.gid_map ~= rl.null then gid_map = st.gid_map end
        for _, step in ipairs(st.kept) do
            local msg = kept_channel(step):recv(1000)
            if not msg then
                error(("%s the kept batch of step %d is missing from %s"):format(tag, step, state_dir), 0)
            end
            local tensors = {} -- a received message holds its tensors by name beside its header
            for name, t in pairs(msg) do
                if rl.tensor.is(t) then tensors[name] = t end
            end
            sent[step] = { header = msg.header, tensors = tensors }
        end
        stats.orchestrator_restarts = stats.orchestrator_restarts + 1
        print(("%s resumed: next batch for step %s, %d kept batch(es), %d rollout(s) in the buffer")
            :format(tag, tostring(next_step), #st.kept, buffer:stats().ready_rollouts
                + buffer:stats().pending_rollouts))
        resync = true
    end

    local function credit(k, done)
        local s = w[k]
        credit_out[k]:send({ kind = "rl.credit", worker_run = s.run, seq = s.granted, done = done or false,
            min_version = math.max(0, (next_step or 0) - A), trainer_run = trainer.run,
            trainer_version = trainer.version })
    end
    local function send_batch(step)
        local b = sent[step]
        batches:send(b.header, b.tensors)
    end
    local function take_rollouts(h, msg)
        local k = h.worker
        local s = w[k]
        if s == nil or s.run ~= h.worker_run then
            -- A chunk of a process we never heard hello from (its hello was lost): adopt it.
            if s ~= nil then stats.worker_restarts = stats.worker_restarts + 1 end
            s = { run = h.worker_run, seq = 0, granted = h.seq }
            w[k] = s
        end
        if h.seq <= s.seq then
            stats.duplicates = stats.duplicates + 1 -- taken before: never twice
            return
        end
        if h.seq > s.seq + 1 then stats.lost_chunks = stats.lost_chunks + (h.seq - s.seq - 1) end
        s.seq = h.seq
        stats.chunks = stats.chunks + 1
        -- A chunk's weights prove the trainer reached their version (a restarted
        -- orchestrator may not have heard of it yet).
        buffer:set_policy_version(math.max(trainer.version, 0, h.policy_version or 0))
        local cu = msg.cu_seqlens:totable()
        local rewards, groups, versions = msg.rewards:totable(), msg.group_ids:totable(),
            msg.policy_versions:totable()
        for i = 1, #cu - 1 do
            -- Group ids of the orchestrator: unique over workers and their restarts.
            local key = h.worker_run .. ":" .. string.format("%d", groups[i])
            if gid_map[key] == nil then gid, gid_map[key] = gid + 1, gid + 1 end
            local a, b = cu[i] + 1, cu[i + 1]
            local t = { token_ids = msg.input_ids:slice(a, b), loss_mask = msg.loss_mask:slice(a, b) }
            if msg.rollout_logprobs then t.logprobs = msg.rollout_logprobs:slice(a, b) end
            buffer:push({ group_id = gid_map[key], reward = rewards[i],
                policy_version = math.tointeger(versions[i]) or math.floor(versions[i]),
                sampling_temperature = h.sampling_temperature }, t)
        end
    end
    local function handle(msg)
        local h = msg.header
        last_heard = rl.clock()
        if h.kind == "rl.trainer" then
            if h.hello then
                if trainer.run ~= nil and h.trainer_run ~= trainer.run then
                    stats.trainer_restarts = stats.trainer_restarts + 1
                    print(("%s the trainer restarted at version %d"):format(tag, h.version))
                end
                trainer.run = h.trainer_run
                if next_step == nil then next_step = h.version end
                -- Batches it lost with its process: again, in order.
                for s = h.version, next_step - 1 do
                    if sent[s] == nil then
                        error(("%s the trainer restarted at version %d but the batch of step %d is gone "
                            .. "(run.checkpoint_every too far apart?)"):format(tag, h.version, s), 0)
                    end
                    send_batch(s)
                    stats.resent = stats.resent + 1
                end
            end
            if h.trainer_run == trainer.run then
                trainer.version, trainer.checkpoint, trainer.done = h.version, h.checkpoint, h.done
                obsolete = forget_before(trainer.checkpoint) -- removed once the state is saved
                if resync then
                    -- Restarted: batches sent into the dead process's socket may
                    -- never have arrived; the trainer skips those it has.
                    resync = false
                    for s = h.version, (next_step or 0) - 1 do
                        if sent[s] then
                            send_batch(s)
                            stats.resent = stats.resent + 1
                        end
                    end
                end
            end
            -- Every worker hears of the trainer's run (after a restart they
            -- take its older weights).
            if h.hello then
                for k in pairs(w) do credit(k) end
            end
        elseif h.kind == "rl.hello" or h.kind == "rl.rollouts" then
            if type(h.worker) ~= "number" or h.worker % 1 ~= 0 or h.worker < 0 or h.worker >= workers then
                error(("%s a message from worker %s, but there are %d (rollout_workers / --roles rollout:K)")
                    :format(tag, tostring(h.worker), workers), 0)
            end
        end
        if h.kind == "rl.trainer" then
        elseif h.kind == "rl.hello" then
            local old = w[h.worker]
            if old ~= nil and old.run ~= h.worker_run then
                stats.worker_restarts = stats.worker_restarts + 1
                local lost = old.granted - old.seq
                stats.lost_chunks = stats.lost_chunks + math.max(0, lost)
                print(("%s worker %d restarted (%s -> %s); %d chunk(s) in flight lost, none trained")
                    :format(tag, h.worker, old.run, h.worker_run, math.max(0, lost)))
            end
            if old == nil or old.run ~= h.worker_run then
                w[h.worker] = { run = h.worker_run, seq = 0, granted = 0 }
                -- Its first weights: the trainer sends the ones in use again.
                batches:send({ kind = "rl.weights_wanted", worker = h.worker, worker_run = h.worker_run })
            end
        elseif h.kind == "rl.rollouts" then
            take_rollouts(h, msg)
        else
            error(("%s unexpected message kind '%s'"):format(tag, tostring(h.kind)), 0)
        end
        save()
        remove_kept(obsolete)
        obsolete = {}
    end

    if resuming then
        -- The trainer's acknowledgements and the workers' chunks sent while this
        -- process was down may be lost: ask the trainer where it is, and give
        -- every worker a fresh credit (a chunk that never comes is counted lost).
        -- The fresh credit numbers and this restart are saved before anything
        -- goes out: an orchestrator killed right after this one resumes above
        -- them, never granting again a number a worker has already used.
        for _, s in pairs(w) do s.granted = math.max(s.granted, s.seq) + 1 end
        save()
        batches:send({ kind = "rl.orchestrator_hello" })
        for k in pairs(w) do credit(k) end
    else
        save()
    end

    while not trainer.done do
        -- Everything that arrived.
        local got = false
        for _, t in ipairs(inboxes) do
            local msg = t:recv(0)
            while msg do
                got = true
                handle(msg)
                msg = t:recv(0)
            end
        end
        if not got then
            if next_step ~= nil and next_step < total and trainer.version >= next_step - A then
                local batch = buffer:pop_train_batch(cfg.buffer.min_rollouts)
                if batch then
                    batch:compute_advantages(advantage)
                    local info = batch:info()
                    local tensors = batch:tensors()
                    local rs = info.rewards:totable()
                    local sum = 0
                    for _, x in ipairs(rs) do sum = sum + x end
                    keep(next_step, { kind = "rl.batch", step = next_step,
                        policy_version = info.min_policy_version, reward = sum / #rs,
                        groups = info.groups, rollouts = info.rollouts,
                        chunks = stats.chunks, duplicates = stats.duplicates,
                        lost_chunks = stats.lost_chunks, worker_restarts = stats.worker_restarts,
                        trainer_restarts = stats.trainer_restarts, resent = stats.resent,
                        orchestrator_restarts = stats.orchestrator_restarts },
                        tensors)
                    next_step = next_step + 1
                    save() -- committed before it leaves: a crash regenerates the same batch
                    send_batch(next_step - 1)
                    last_heard = rl.clock()
                else
                    -- Rollouts needed: one credit per worker with none in flight.
                    for k, s in pairs(w) do
                        if s.granted <= s.seq then
                            s.granted = s.seq + 1
                            save() -- before it leaves: a restart grants past every credit sent
                            credit(k)
                        end
                    end
                end
            end
            if rl.clock() - last_heard > cfg.rollout_transport.timeout then
                error(("%s nothing from the trainer or the workers within rollout_transport.timeout (%gs) "
                    .. "(trainer at version %d, next batch for step %s); are they running?")
                    :format(tag, cfg.rollout_transport.timeout, trainer.version, tostring(next_step)), 0)
            end
            rl.sleep(0.005)
        end
    end
    for k, s in pairs(w) do credit(k, true) end
    print(("%s done: %d chunks, %d batches, %d duplicate(s) skipped, %d chunk(s) lost, %d worker restart(s), %d trainer restart(s)")
        :format(tag, stats.chunks, next_step or 0, stats.duplicates, stats.lost_chunks,
            stats.worker_restarts, stats.trainer_restarts))
end

local function orchestrated_trainer()
    local run, model, tok, trainer, loss = load_trainer()
    local trainer_run = tostring(math.floor(rl.time() * 1000))
    if rl.exists(weight_dir .. "/broadcasts") == "dir" then rl.remove_tree(weight_dir .. "/broadcasts") end
    if fs then clear({ "batches" }) end
    local inbox = to_trainer(true)
    local acks = to_orchestrator("trainer", false)
    local broadcast = weight_broadcaster(model)
    local version = 0
    rl.sft_warmup(cfg, run, trainer, tok, rl.env(cfg.env.name, cfg.env.params))
    version = run.phases.rl or 0
    local ref, evaluate = trainer_extras(model, run)
    acks:send({ kind = "rl.trainer", trainer_run = trainer_run, version = version, hello = true,
        checkpoint = version, done = false })
    broadcast(version)

    local waiting, duplicates = {}, 0 -- batches for later steps; batches for past steps skipped
    for step in run:steps("rl", cfg.run.steps) do
        local t0, msg = rl.clock(), waiting[version]
        waiting[version] = nil
        while msg == nil do
            local m = inbox:recv(200)
            if m and m.header.kind == "rl.weights_wanted" then
                -- A worker (re)started: the weights in use, to it alone.
                if broadcast(version, m.header.worker) then
                    print(("trainer: weights version %d sent again to worker %d"):format(version, m.header.worker))
                end
            elseif m and m.header.kind == "rl.orchestrator_hello" then
                -- The orchestrator restarted: where this trainer is (its batches follow).
                acks:send({ kind = "rl.trainer", trainer_run = trainer_run, version = version,
                    checkpoint = checkpoint_floor(version), hello = false, done = false })
                print(("trainer: the orchestrator restarted; at version %d"):format(version))
            elseif m then
                local s = m.header.step
                if s == version then msg = m
                elseif s < version then duplicates = duplicates + 1
                else waiting[s] = m end
            elseif rl.clock() - t0 > cfg.rollout_transport.timeout then
                error(("trainer: no batch for step %d from the orchestrator within rollout_transport.timeout "
                    .. "(%gs); is it running?"):format(version, cfg.rollout_transport.timeout), 0)
            end
        end
        version = version + 1
        local h, record = train_on(trainer, loss, msg, broadcast, version, rl.clock() - t0, ref)
        acks:send({ kind = "rl.trainer", trainer_run = trainer_run, version = version,
            checkpoint = checkpoint_floor(version), hello = false, done = version >= cfg.run.steps })
        record.rollouts, record.duplicate_batches, record.chunks, record.lost_chunks =
            h.rollouts, duplicates, h.chunks, h.lost_chunks
        record.worker_restarts, record.trainer_restarts = h.worker_restarts, h.trainer_restarts
        record.orchestrator_restarts = h.orchestrator_restarts
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
