-- rl/init.lua: the pure-Lua half of the `rl` module. The C half (scripting/src)
-- has already filled the module table with the objects over librl's C API;
-- this file adds the conveniences scripts use: the configuration, a default
-- runtime with shortcuts, model loading from the configuration, rollout and
-- batch helpers, and the run object (rl.run).
local rl = require("rl")

-- ---- configuration ------------------------------------------------------------

local config_cache

--- rl.config([keys]): the resolved run configuration (a table). Under
--- `rlhost run` it is the --config file plus --set overrides; elsewhere the
--- defaults. A script with settings of its own declares them on the first
--- call, one entry per key, and gets them checked (type, choices, range) and
--- defaulted like the host's keys:
---
---   local cfg = rl.config {
---       { "ppo.epochs", "integer", 2, "Passes over each step's rollouts.", min = 1 },
---   }
---
--- Entry fields: key, type (string, integer, number, boolean, strings,
--- mapping, mappings), default, doc (positional or named), and optional
--- choices, min, max, min_open, max_open, nullable. Sections in the
--- configuration that neither the host nor the script declares are errors.
function rl.config(keys)
    if config_cache and keys == nil then return config_cache end
    if config_cache then
        error("rl.config: the configuration was already resolved; declare the script's keys "
            .. "in the first rl.config{...} call", 2)
    end
    local host = rl.host()
    local text = host.config_json
    if not text or text == "" then text = rl.json.encode(rl.config_load()) end
    local decl = rl.array({})
    for i, k in ipairs(keys or {}) do
        if type(k) ~= "table" then
            error(("rl.config: key declaration %d must be a table, got %s"):format(i, type(k)), 2)
        end
        local default = k.default
        if default == nil then default = k[3] end
        decl[i] = {
            key = k.key or k[1], type = k.type or k[2], default = default, doc = k.doc or k[4], choices = k.choices and rl.array(k.choices) or nil,
            min = k.min, max = k.max, min_open = k.min_open, max_open = k.max_open,
            nullable = k.nullable,
        }
    end
    local ok, cfg = pcall(rl.config_declare, text, decl)
    if not ok then rl.rethrow(cfg, 2) end
    config_cache = cfg
    return config_cache
end

-- ---- errors ------------------------------------------------------------------

--- rl.rethrow(err [, level]): raises err again, its position (when it points
--- into the module's own Lua files) replaced by the caller's at `level`.
function rl.rethrow(err, level)
    if type(err) == "string" then
        err = err:gsub("^scripting/lua/rl/[%w_]+%.lua:%d+: ", "")
        error(err, (level or 1) + 1)
    end
    error(err, 0)
end

-- ---- default runtime -------------------------------------------------------------

local default_runtime

--- rl.default_runtime(): the runtime behind rl.loss / rl.env / ... , created on
--- first use with the host's plugin path plus the configuration's plugins.path.
function rl.default_runtime()
    if default_runtime then return default_runtime end
    local host, cfg = rl.host(), rl.config()
    local paths = {}
    if host.plugin_path and host.plugin_path ~= "" then paths[#paths + 1] = host.plugin_path end
    for _, p in ipairs(cfg.plugins and cfg.plugins.path or {}) do paths[#paths + 1] = p end
    local level = host.log_level
    if not level or level == "" then level = cfg.log_level or "warn" end
    default_runtime = rl.runtime { plugin_path = table.concat(paths, ":"), log_level = level }
    return default_runtime
end

--- rl.loss(name [, params]), rl.advantage(...), rl.filter(...), rl.env(...),
--- rl.transport(...): plugin instances on the default runtime.
for _, kind in ipairs { "loss", "advantage", "filter", "env", "transport" } do
    rl[kind] = function(name, params)
        local rt = rl.default_runtime()
        local ok, obj = pcall(rt[kind], rt, name, params)
        if not ok then
            if type(obj) == "string" then obj = obj:gsub("runtime:" .. kind .. ": ", "rl." .. kind .. ": ", 1) end
            rl.rethrow(obj, 2)
        end
        return obj
    end
end

--- rl.disagg: the three-role protocol (abi/rl/disagg.h, docs/disaggregated.md) on
--- the default runtime: rl.disagg.worker(config, index), rl.disagg.trainer(config),
--- rl.disagg.orchestrator(config, buffer, advantage) (runs until the trainer is
--- done), rl.disagg.protocol_version(). rl.disagg.config(cfg, dir, workers): the
--- protocol's config from a run configuration (rollout_transport, run.steps,
--- run.checkpoint_every, run.resume, max_async_level, buffer.min_rollouts).
rl.disagg = {
    worker = function(config, index) return rl.default_runtime():disagg_worker(config, index) end,
    trainer = function(config) return rl.default_runtime():disagg_trainer(config) end,
    orchestrator = function(config, buffer, advantage)
        return rl.default_runtime():disagg_orchestrator(config, buffer, advantage)
    end,
    protocol_version = function() return rl.disagg_protocol_version() end,
    config = function(cfg, dir, workers)
        local t = cfg.rollout_transport
        return { transport = t.type, dir = dir, host = t.host, port = t.port, hwm = t.hwm,
            timeout = t.timeout, timeout_name = "rollout_transport.timeout", workers = workers,
            steps = cfg.run.steps, checkpoint_every = cfg.run.checkpoint_every,
            max_async_level = cfg.max_async_level, min_rollouts = cfg.buffer.min_rollouts,
            resume = cfg.run.resume }
    end,
}

--- rl.filters(list): instances for the configuration's `filters` list
--- ({name, params, enforce}); enforce is passed to the host, which keeps it.
function rl.filters(list)
    local out = {}
    for i, f in ipairs(list or {}) do
        if type(f) ~= "table" or type(f.name) ~= "string" then
            error(("filters[%d] must be a table with a 'name'"):format(i), 2)
        end
        local params = {}
        for k, v in pairs(f.params or {}) do params[k] = v end
        if f.enforce ~= nil then params.enforce = f.enforce end
        out[#out + 1] = rl.filter(f.name, params)
    end
    return out
end

-- ---- seeds ------------------------------------------------------------------------

-- splitmix64 finalizer over Lua's wrapping 64-bit integers.
local function mix(x)
    x = x + 0x9E3779B97F4A7C15
    x = (x ~ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ~ (x >> 27)) * 0x94D049BB133111EB
    return x ~ (x >> 31)
end

--- rl.seed(base, ...): a seed in [0, 2^53) derived from a base seed and any
--- number of integers or strings ("sft", step), the same on every machine.
function rl.seed(base, ...)
    local h = mix(math.tointeger(base) or error("rl.seed: base must be an integer", 2))
    for i = 1, select("#", ...) do
        local v = select(i, ...)
        if type(v) == "string" then
            for j = 1, #v do h = mix(h ~ v:byte(j)) end
        else
            h = mix(h ~ (math.tointeger(v) or error("rl.seed: arguments must be integers or strings", 2)))
        end
    end
    return h & 0x1FFFFFFFFFFFFF
end

-- ---- models -------------------------------------------------------------------------

--- rl.load_model(cfg): the model of the configuration. With model.path empty
--- the built-in model.preset is created in model.init_dir when that folder
--- holds no model yet (seeded with run.seed), then loaded.
function rl.load_model(cfg)
    cfg = cfg or rl.config()
    local m = cfg.model
    local path = m.path
    if path == nil or path == "" then
        path = m.init_dir
        if not rl.exists(path .. "/config.json") then
            rl.mkdir(path)
            rl.init_model(m.preset, path, cfg.run.seed)
            io.stdout:write(("created the built-in '%s' model in %s\n"):format(m.preset, path))
        end
    end
    local opts = { threads = m.threads, device = m.device, dtype = m.dtype }
    if m.value_head then
        opts.value_head = true
        opts.value_head_seed = cfg.run.seed
    end
    return rl.model(path, opts)
end

-- A copy of a configuration section without the keys in `skip`, then each
-- table of `...` over it, in order.
local function section(values, skip, ...)
    local t = {}
    for k, v in pairs(values) do
        if not (skip and skip[k]) then t[k] = v end
    end
    for i = 1, select("#", ...) do
        for k, v in pairs(select(i, ...) or {}) do t[k] = v end
    end
    return t
end

--- rl.trainer_config(cfg [, extra]): the trainer section of the configuration
--- plus total_steps (for schedules) and seed, as rl_trainer_create wants it.
function rl.trainer_config(cfg, extra)
    cfg = cfg or rl.config()
    local t = section(cfg.trainer, nil, { total_steps = cfg.run.steps, seed = cfg.run.seed })
    -- lora.rank > 0: train adapter "default" (created here) instead of the weights.
    if cfg.lora and (cfg.lora.rank or 0) > 0 then
        t.lora = {
            rank = cfg.lora.rank, alpha = cfg.lora.alpha, dropout = cfg.lora.dropout,
            target_modules = cfg.lora.target_modules, use_rslora = cfg.lora.use_rslora,
            seed = cfg.run.seed,
        }
        t.adapter = "default"
    end
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
end

--- rl.buffer_config(cfg [, extra]): the buffer section of the configuration
--- (without min_rollouts, which the loop uses) plus group_size = rollout.n, as
--- rl_buffer_create wants it.
function rl.buffer_config(cfg, extra)
    cfg = cfg or rl.config()
    return section(cfg.buffer, { min_rollouts = true }, { group_size = cfg.rollout.n }, extra)
end

--- rl.engine_config(cfg [, extra]): the engine section of the configuration
--- plus total_steps, first_step and seed (the QeRL noise schedule's length,
--- its start after a supervised warm-up of sft.steps, its seed), as
--- rl_engine_create wants it.
function rl.engine_config(cfg, extra)
    cfg = cfg or rl.config()
    local e = section(cfg.engine, nil, {
        total_steps = cfg.run.steps, seed = cfg.run.seed,
        first_step = (cfg.sft and cfg.sft.steps) or 0,
    })
    -- lora.rank > 0: sample with the adapter the trainer trains.
    if cfg.lora and (cfg.lora.rank or 0) > 0 then e.adapter = "default" end
    for k, v in pairs(extra or {}) do e[k] = v end
    return e
end

-- QeRL noise with an inference server (docs/moe.md): the server samples with
-- noise only when it was started with the run's schedule (rlhost serve
-- --noise-*); its /get_server_info says which. Anything else is an error naming
-- the setting, the run's value, the server's, and the flag that sets it.
local function check_server_noise(client, url, engine)
    local want = engine.noise_scheduler
    local ok, info = pcall(client.call, client, "GET", "/get_server_info")
    local got = ok and type(info) == "table" and info.noise_scheduler or nil
    local off = "engine.noise_scheduler.enabled (QeRL noise) with inference_server.url needs a server "
        .. "that applies the same schedule: "
    if type(got) ~= "table" then
        error(off .. "the server at " .. url .. " does not report one (" .. tostring(ok and "no "
            .. "noise_scheduler in /get_server_info" or info) .. "); start rlhost serve with --noise-"
            .. "total-steps N ... (docs/moe.md) or leave the noise off here", 3)
    end
    if not got.enabled then
        error(off .. "the server at " .. url .. " samples without noise; start it with rlhost serve "
            .. "--noise-total-steps " .. engine.total_steps .. " ... (docs/moe.md) or leave the noise "
            .. "off here", 3)
    end
    local pairs_to_check = {
        { "engine.noise_scheduler.sigma_start", want.sigma_start, got.sigma_start, "--noise-sigma-start" },
        { "engine.noise_scheduler.sigma_end", want.sigma_end, got.sigma_end, "--noise-sigma-end" },
        { "engine.noise_scheduler.num_stages", want.num_stages, got.num_stages, "--noise-num-stages" },
        { "run.steps", engine.total_steps, got.total_steps, "--noise-total-steps" },
        { "sft.steps", engine.first_step, got.first_step, "--noise-first-step" },
        { "run.seed", engine.seed, got.seed, "--noise-seed" },
    }
    for _, c in ipairs(pairs_to_check) do
        local key, a, b, flag = c[1], c[2], c[3], c[4]
        if type(b) ~= "number" or math.abs(a - b) > 1e-12 * math.max(math.abs(a), math.abs(b)) then
            error(("%s%s is %s in this run but %s on the server at %s (%s)"):format(off, key,
                tostring(a), tostring(b), url, flag), 3)
        end
    end
end

--- rl.rollout_engine(model, cfg [, run]): what generates the rollouts. The
--- co-located engine (model:engine) unless inference_server.url is set; then
--- an object with the same rollouts(tasks, opts) and sync_weights(buffer)
--- whose rollouts come from that server (rlhost serve, SGLang) and whose
--- sync_weights brings the server to the model's weights (the sync state
--- machine of docs/serving.md) and tells the buffer the version.
function rl.rollout_engine(model, cfg, run)
    cfg = cfg or rl.config()
    local s = cfg.inference_server
    if s == nil or s.url == "" then return model:engine(rl.engine_config(cfg)) end
    if cfg.lora and (cfg.lora.rank or 0) > 0 then
        error("lora.rank > 0 needs the co-located engine: an inference server (inference_server.url) "
            .. "receives the base weights, not the adapter", 2)
    end
    local client = rl.inference_client { url = s.url, api_key = s.api_key, timeout = s.timeout }
    if cfg.engine and cfg.engine.noise_scheduler and cfg.engine.noise_scheduler.enabled then
        check_server_noise(client, s.url, rl.engine_config(cfg))
    end
    local sync = { mode = s.sync }
    if s.sync == "disk" then
        sync.dir = s.dir ~= "" and s.dir or ((run and run.dir or ".") .. "/broadcasts")
    end
    local remote = { client = client }
    local synced = false
    function remote:rollouts(tasks, opts) return client:rollouts(model, tasks, opts) end
    function remote:sync_weights(buffer)
        local version = model:info().policy_version
        sync.force = not synced -- the server may have started from other weights
        client:sync(model, version, sync)
        synced = true
        if buffer then buffer:set_policy_version(version) end
        return version
    end
    function remote:generate(...) return client:generate(...) end
    return remote
end

--- rl.generation_params(cfg [, extra]): engine:generate parameters from the
--- rollout section (n, temperature, top_p, top_k, max_tokens, stop).
function rl.generation_params(cfg, extra)
    cfg = cfg or rl.config()
    local r = cfg.rollout
    return section({
        n = r.n, temperature = r.temperature, top_p = r.top_p, top_k = r.top_k,
        max_tokens = r.max_tokens, stop = rl.array(r.stop or {}),
    }, nil, extra)
end

-- ---- engine results as samples -----------------------------------------------------------

--- rl.samples(out): the samples of an engine:generate result as a list of
--- {prompt_index (1-based), token_ids, logprobs (tensors), text, finish_reason}.
function rl.samples(out)
    local cu, pi = out.cu_seqlens, out.prompt_index
    local list = {}
    for i = 1, #cu - 1 do
        local a, b = cu[i] + 1, cu[i + 1]
        list[i] = {
            prompt_index = pi[i] + 1,
            token_ids = out.token_ids:slice(a, b),
            logprobs = out.logprobs:slice(a, b),
            text = out.completions[i],
            finish_reason = out.finish_reasons[i],
            policy_version = math.tointeger(out.policy_version) or out.policy_version,
        }
    end
    return list
end

-- ---- the rest ----------------------------------------------------------------------------

local rollout = require("rl.rollout")
for k, v in pairs(rollout) do rl[k] = v end
local reward = require("rl.reward")
rl.reward_model, rl.judge, rl.judge_score = reward.reward_model, reward.judge, reward.judge_score
rl.reward_scorers, rl.apply_reward_scorers = reward.reward_scorers, reward.apply_reward_scorers
rl.metrics = require("rl.metrics").new
rl.dist = require("rl.dist")
rl.run = require("rl.run").new

return rl
