-- rl/run.lua: the run object. It owns the run folder (run.dir/run.name):
--   config.json     the resolved configuration
--   metrics.jsonl   one JSON object per step: {phase, step, time, step_time, ...}
--   checkpoints/    trainer checkpoints (step_<N>/), with the run's progress
--   summary.json    written by run:finish()
-- and the console: one line per step (reward, KL, clip / mask fractions,
-- tokens/s, step time), a progress bar when stdout is a terminal, a summary at
-- the end. Ctrl-C asks the loop to stop: the step in flight completes, a
-- checkpoint is saved and the steps iterator ends; a second Ctrl-C aborts.
--
-- In a distributed run (docs/distributed.md) every rank makes the same calls;
-- rank 0 alone owns the folder and the console. A step's record is merged
-- over the ranks: numbers are averaged, counts and the loss summed, the step
-- time is the slowest rank's; a stop asked on any rank stops them all.
-- (SUMMED below lists the summed fields.)
--
--   local run = rl.run(cfg)
--   run:attach(trainer)                 -- resumes when run.resume is set
--   for step in run:steps("rl", cfg.run.steps) do
--       ...
--       run:log { reward = ..., kl = ..., tokens = ... }
--   end
--   run:finish()
local rl = require("rl")
local fmt = require("rl.metrics")
local tensorboard = require("rl.tensorboard")
-- Fields of a step record that are not curves.
local TB_SKIP = { phase = true, step = true }

local M = {}

local Run = {}
Run.__index = Run

-- Console columns: record field, label.
local COLUMNS = {
    { "reward", "reward" }, { "kl", "kl" }, { "clip_frac", "clip" }, { "mask_frac", "mask" },
    { "loss", "loss" },
}

-- Record fields summed (not averaged) over the ranks of a distributed run:
-- counts, and the loss (each rank's share is normalized by the global batch).
local SUMMED = { tokens = true, groups = true, rollouts = true, flagged = true, masked = true,
    dropped_groups = true, loss_tokens = true, loss = true }

-- One record from every rank's: see the header.
local function merge_records(recs)
    if #recs == 1 then return recs[1] end
    local out = {}
    for k, v in pairs(recs[1]) do
        if type(v) == "number" then
            local sum, n, most = 0, 0, -math.huge
            for _, r in ipairs(recs) do
                if type(r[k]) == "number" then sum, n, most = sum + r[k], n + 1, math.max(most, r[k]) end
            end
            if k == "step_time" or k == "time" then out[k] = most
            elseif SUMMED[k] then out[k] = sum
            else out[k] = sum / n end
        else
            out[k] = v
        end
    end
    return out
end

local function has_checkpoints(dir)
    if rl.exists(dir) ~= "dir" then return false end
    for _, name in ipairs(rl.list_dir(dir)) do
        if name:match("^step_%d+$") then return true end
    end
    return false
end

--- rl.run([cfg]): creates (or, with run.resume, reopens) the run folder.
function M.new(cfg)
    cfg = cfg or rl.config()
    if type(cfg) ~= "table" or type(cfg.run) ~= "table" then
        error("rl.run: expected the run configuration (rl.config())", 2)
    end
    local r = cfg.run
    local self = setmetatable({}, Run)
    self.cfg = cfg
    self.name = r.name
    self.dir = r.dir .. "/" .. r.name
    self.checkpoint_dir = self.dir .. "/checkpoints"
    self.metrics_path = self.dir .. "/metrics.jsonl"
    self.samples_path = self.dir .. "/samples.jsonl"
    self.samples_every = r.samples_every or 0
    self.checkpoint_every = r.checkpoint_every
    self.tensorboard_dir = r.tensorboard and (self.dir .. "/tensorboard") or nil
    self.resume = r.resume
    self.phases = {}  -- phase -> completed steps
    self.history = {} -- phase -> list of step records (this process)
    self.order = {}   -- phases in order of first use
    self.data = {}    -- the script's own data position, saved with checkpoints
    self.t0 = rl.clock()
    self.stop_requested = false
    local mode = r.progress
    if mode == "auto" then mode = rl.isatty("stdout") and "bar" or "lines" end
    self.use_bar = mode == "bar"
    rl.dist.init(cfg)
    self.main = rl.dist.is_main()
    self.world = rl.dist.world_size()

    -- Rank 0 prepares the folder; every rank learns whether that worked.
    local ok, err = true, nil
    if self.main then ok, err = pcall(self._open_folder, self) end
    if self.world > 1 then
        local outcome = rl.dist.broadcast({ ok = ok, err = ok and "" or tostring(err) }, 0)
        if not outcome.ok then
            error(self.main and err or ("rank 0 could not open the run folder: " .. outcome.err), 2)
        end
    elseif not ok then
        rl.rethrow(err, 2)
    end
    rl.catch_interrupts(true)
    self:print(("run '%s' in %s"):format(self.name, self.dir))
    return self
end

function Run:_open_folder()
    local r = self.cfg.run
    rl.mkdir(self.dir)
    -- One run per folder: a second process on it stops here, before it touches
    -- checkpoints or metrics (the lock ends with this process).
    local ok, lock = pcall(rl.lock_dir, self.dir)
    if not ok then rl.rethrow(lock, 3) end
    self.lock = lock
    if not r.resume and has_checkpoints(self.checkpoint_dir) then
        if r.overwrite then
            rl.remove_tree(self.checkpoint_dir)
        else
            error(("run folder %s holds checkpoints of an earlier run: set run.resume=true to "
                .. "continue it, run.overwrite=true to replace it, or choose another run.name")
                :format(self.dir), 3)
        end
    end
    rl.write_file(self.dir .. "/config.json", rl.json.encode(self.cfg, 2) .. "\n")
    if not r.resume then self:_reset_metrics({}) end
end

-- ---- console -------------------------------------------------------------------------

function Run:_clear_bar()
    if self.bar_shown and self.main then
        io.stdout:write("\r\27[2K")
        self.bar_shown = false
    end
end

function Run:_draw_bar()
    if not self.use_bar or not self.bar_active or not self.main then return end
    local total = self.total or 0
    local done = self.pending and self.step - 1 or self.step
    local width = math.max(10, math.min(40, (rl.terminal_width("stdout") or 80) - 40))
    local filled = total > 0 and math.floor(width * done / total) or 0
    local eta = ""
    local n = #(self.history[self.phase] or {})
    if n > 0 and done < total then
        local spent = 0
        for _, rec in ipairs(self.history[self.phase]) do spent = spent + rec.step_time end
        eta = "  eta " .. fmt.duration(spent / n * (total - done))
    end
    io.stdout:write(("\r\27[2K%s [%s%s] %d/%d%s"):format(self.phase, ("#"):rep(filled),
        ("."):rep(width - filled), done, total, eta))
    io.stdout:flush()
    self.bar_shown = true
end

--- run:print(text): a line on the console (above the progress bar).
function Run:print(text)
    if not self.main then return end
    self:_clear_bar()
    io.stdout:write(text, "\n")
    io.stdout:flush()
    self:_draw_bar()
end

function Run:_step_line(rec)
    local width = #tostring(self.total)
    local parts = { ("%-4s %" .. width .. "d/%d"):format(rec.phase, rec.step, self.total) }
    for _, c in ipairs(COLUMNS) do
        if type(rec[c[1]]) == "number" then parts[#parts + 1] = c[2] .. " " .. fmt.number(rec[c[1]]) end
    end
    if rec.tokens_per_s then parts[#parts + 1] = fmt.number(rec.tokens_per_s) .. " tok/s" end
    parts[#parts + 1] = fmt.duration(rec.step_time)
    return table.concat(parts, "  ")
end

-- ---- trainer and checkpoints ----------------------------------------------------------------

--- run:attach(trainer): the trainer whose checkpoints the run saves. With
--- run.resume it restores the newest complete checkpoint of the run folder
--- (weights, optimizer, step, RNG, and the run's progress) and returns the
--- saved data position (run.data); nil when starting fresh.
function Run:attach(trainer)
    self.trainer = trainer
    if not self.resume then return nil end
    local ck = trainer:load_checkpoint(self.checkpoint_dir)
    if not ck then
        self:print("resume: no checkpoint in " .. self.checkpoint_dir .. "; starting fresh")
        if self.main then self:_reset_metrics({}) end
        return nil
    end
    local state = type(ck.state) == "table" and ck.state or {}
    self.phases = {}
    for k, v in pairs(state.phases or {}) do self.phases[k] = v end
    self.data = type(state.data) == "table" and state.data or {}
    self.last_checkpoint = ck.path
    -- Keep the metric lines the checkpoint covers; later ones are redone.
    if self.main then self:_reset_metrics(self:_covered_lines(self.metrics_path)) end
    local where = {}
    for k, v in pairs(self.phases) do where[#where + 1] = k .. " step " .. v end
    table.sort(where)
    self:print(("resumed from %s (%s)"):format(ck.path, table.concat(where, ", ")))
    return self.data
end

-- metrics.jsonl becomes `lines` (the records a checkpoint covers, or none),
-- and the TensorBoard folder is written again from them, so that both hold
-- the same steps.
function Run:_reset_metrics(lines)
    rl.write_file(self.metrics_path, #lines > 0 and table.concat(lines, "\n") .. "\n" or "")
    local samples = self:_reset_samples()
    if not self.tensorboard_dir then return end
    if self.tb then self.tb:close() end
    if rl.exists(self.tensorboard_dir) then rl.remove_tree(self.tensorboard_dir) end
    self.tb = tensorboard.open(self.tensorboard_dir)
    for _, line in ipairs(lines) do
        local rec = rl.json.decode(line)
        self.tb:scalars(rec.step, tensorboard.flatten(rec.phase, rec, TB_SKIP))
    end
    -- The text summaries of the samples kept, one per (phase, step).
    local steps, order = {}, {}
    for _, line in ipairs(samples) do
        local rec = rl.json.decode(line)
        local key = rec.phase .. "\0" .. rec.step
        if not steps[key] then
            steps[key] = {}
            order[#order + 1] = key
        end
        table.insert(steps[key], rec)
    end
    for _, key in ipairs(order) do self:_tb_samples(steps[key]) end
end

-- The TensorBoard text summary of one step's samples (tag <phase>/samples).
local TB_SAMPLE_ROWS = 8
function Run:_tb_samples(recs)
    if not self.tb or #recs == 0 then return end
    self.tb:text(recs[1].step, recs[1].phase .. "/samples",
        tensorboard.samples_markdown(recs, TB_SAMPLE_ROWS))
end

-- samples.jsonl keeps the lines of the steps the run's progress covers.
function Run:_reset_samples()
    if self.samples_file then
        self.samples_file:close()
        self.samples_file = nil
    end
    local kept = self:_covered_lines(self.samples_path)
    rl.write_file(self.samples_path, #kept > 0 and table.concat(kept, "\n") .. "\n" or "")
    return kept
end

-- The lines of a .jsonl file of the run whose record is of a step the run's
-- progress covers ({phase, step} with step <= the phase's completed steps).
function Run:_covered_lines(path)
    local kept = {}
    local f = io.open(path, "r")
    if not f then return kept end
    for line in f:lines() do
        local ok, rec = pcall(rl.json.decode, line)
        if ok and type(rec) == "table" and rec.phase and self.phases[rec.phase]
            and type(rec.step) == "number" and rec.step <= self.phases[rec.phase] then
            kept[#kept + 1] = line
        end
    end
    f:close()
    return kept
end

-- `s` with every byte that is not part of valid UTF-8 written as \xNN.
local function printable(s)
    local out, i = {}, 1
    while i <= #s do
        local n, bad = utf8.len(s, i)
        if n then
            out[#out + 1] = s:sub(i)
            break
        end
        out[#out + 1] = s:sub(i, bad - 1) .. ("\\x%02x"):format(s:byte(bad))
        i = bad + 1
    end
    return table.concat(out)
end

--- run:log_samples(batch): on every run.samples_every-th step of the phase,
--- each sequence of the training batch as a line of samples.jsonl:
--- {phase, step, group, task, completion, reward, advantage} (the task as the
--- env gave it, the advantage of the sequence's first trained token; bytes
--- that are not UTF-8 as \xNN), and the first 8 as a TensorBoard text
--- summary <phase>/samples. Call it after batch:compute_advantages.
function Run:log_samples(batch)
    local every = self.samples_every
    if not self.main or every <= 0 or not self.step or self.step % every ~= 0 then return end
    local info, t = batch:info(), batch:tensors()
    local cu, mask, adv = t.cu_seqlens, t.loss_mask, t.advantages
    if not self.samples_file then self.samples_file = assert(io.open(self.samples_path, "a")) end
    local recs = {}
    for i = 1, info.rollouts do
        local advantage
        if adv and cu then
            for p = cu[i] + 1, cu[i + 1] do
                if not mask or mask[p] > 0 then
                    advantage = adv[p]
                    break
                end
            end
        end
        local task = info.tasks and info.tasks[i]
        local ok, decoded = pcall(rl.json.decode, task or "null")
        local rec = {
            phase = self.phase, step = self.step,
            group = info.group_ids and info.group_ids[i],
            task = ok and decoded or (task and printable(task)),
            completion = info.completions and printable(info.completions[i]),
            reward = info.rewards and info.rewards[i],
            advantage = advantage,
        }
        self.samples_file:write(rl.json.encode(rec), "\n")
        recs[#recs + 1] = rec
    end
    self.samples_file:flush()
    if self.tensorboard_dir then
        if not self.tb then self.tb = tensorboard.open(self.tensorboard_dir) end
        self:_tb_samples(recs)
    end
end

--- run:checkpoint(): saves a checkpoint now (no-op without an attached
--- trainer); returns its path.
function Run:checkpoint()
    if not self.trainer then
        if not self.warned_no_trainer then
            self:print("warning: no trainer attached to the run; checkpoints are not saved")
            self.warned_no_trainer = true
        end
        return nil
    end
    local phases = {}
    for k, v in pairs(self.phases) do phases[k] = v end
    local path = self.trainer:save_checkpoint(self.checkpoint_dir,
        { phases = phases, data = self.data, run = self.name })
    self.last_checkpoint = path
    self.checkpointed_at = (self.phase or "") .. ":" .. tostring(self.step)
    self:print("checkpoint " .. path)
    return path
end

-- ---- steps ---------------------------------------------------------------------------

--- run:stopping(): true once Ctrl-C was pressed (or run:request_stop() called).
function Run:stopping()
    -- Distributed: only the stop agreed at the end of a step counts, so that
    -- every rank leaves the loop at the same step.
    if self.world > 1 then return self.stop_requested end
    return self.stop_requested or rl.interrupted() > 0
end

function Run:request_stop()
    self.stop_requested = true
end

--- run:log(tbl): adds fields to the current step's record (numbers, strings,
--- booleans or nested tables); the record is written when the step ends.
function Run:log(tbl)
    if not self.pending then error("run:log: no step in progress (call it inside run:steps())", 2) end
    if type(tbl) ~= "table" then error("run:log: expected a table, got " .. type(tbl), 2) end
    for k, v in pairs(tbl) do
        if type(k) ~= "string" then error("run:log: keys must be strings", 2) end
        self.pending[k] = v
    end
end

function Run:_end_step()
    local rec = self.pending
    self.pending = nil
    local now = rl.clock()
    rec.phase, rec.step = self.phase, self.step
    rec.step_time = now - self.step_t0
    rec.time = now - self.t0
    if self.world > 1 then
        local stop = self.stop_requested or rl.interrupted() > 0
        local recs, any_stop = {}, false
        for i, got in ipairs(rl.dist.all_gather({ rec = rec, stop = stop })) do
            recs[i] = got.rec
            any_stop = any_stop or got.stop
        end
        rec = merge_records(recs)
        if any_stop then self.stop_requested = true end
    end
    if type(rec.tokens) == "number" and rec.step_time > 0 then
        rec.tokens_per_s = rec.tokens / rec.step_time
    end
    local h = self.history[self.phase]
    h[#h + 1] = rec
    self.phases[self.phase] = self.step
    if not self.main then return end
    if not self.metrics_file then
        self.metrics_file = assert(io.open(self.metrics_path, "a"))
    end
    self.metrics_file:write(rl.json.encode(rec), "\n")
    self.metrics_file:flush()
    if self.tensorboard_dir then
        if not self.tb then self.tb = tensorboard.open(self.tensorboard_dir) end
        self.tb:scalars(rec.step, tensorboard.flatten(rec.phase, rec, TB_SKIP))
    end
    self:_clear_bar()
    io.stdout:write(self:_step_line(rec), "\n")
    io.stdout:flush()
    self:_draw_bar()
end

--- run:steps([phase [, total [, opts]]]): iterator over the steps of a phase
--- ("rl" and run.steps by default), starting after the steps a resumed
--- checkpoint covers. Ends early when the run is stopping (after a
--- checkpoint). Checkpoints every opts.checkpoint_every steps (default
--- run.checkpoint_every; 0: only at the end) and when the phase completes.
function Run:steps(phase, total, opts)
    phase = phase or "rl"
    total = total or self.cfg.run.steps
    opts = opts or {}
    if math.type(total) ~= "integer" or total < 0 then
        error("run:steps: total must be an integer >= 0", 2)
    end
    local every = opts.checkpoint_every or self.checkpoint_every
    if not self.history[phase] then
        self.history[phase] = {}
        self.order[#self.order + 1] = phase
    end
    self.phase, self.total = phase, total
    local start = self.phases[phase] or 0
    self.step = start
    local ran = false
    local finished = false

    local function finish_phase(stopped)
        if finished then return end
        finished = true
        self.bar_active = false
        local key = phase .. ":" .. tostring(self.step)
        if ran and self.checkpointed_at ~= key then self:checkpoint() end
        self:_clear_bar()
        if stopped and ran then self:print(("%s: stopped at step %d/%d"):format(phase, self.step, total)) end
    end

    local function iter()
        if self.pending then
            self:_end_step()
            ran = true
            if self:stopping() then
                finish_phase(true)
                return nil
            end
            if every > 0 and self.step % every == 0 and self.step < total then self:checkpoint() end
        end
        if self.step >= total or self:stopping() then
            finish_phase(self:stopping() and self.step < total)
            return nil
        end
        self.step = self.step + 1
        self.step_t0 = rl.clock()
        self.pending = {}
        self.bar_active = true
        self:_draw_bar()
        return self.step
    end

    -- Closed when the loop ends by break or error: a step ended by `break`
    -- counts; one ended by an error does not (and gets no checkpoint).
    local closer = setmetatable({}, {
        __close = function(_, err)
            if finished then return end
            if err == nil then
                if self.pending then
                    self:_end_step()
                    ran = true
                end
                finish_phase(self:stopping())
            else
                self.pending = nil
                self.bar_active = false
                self:_clear_bar()
            end
        end,
    })
    return iter, nil, nil, closer
end

-- ---- summary ---------------------------------------------------------------------------

local function mean_of(records, field, first, last)
    local sum, n = 0, 0
    for i = first, last do
        local v = records[i] and records[i][field]
        if type(v) == "number" then sum, n = sum + v, n + 1 end
    end
    return n > 0 and sum / n or nil
end

--- run:summary() -> table: per phase {steps, time, first, last, best, field}
function Run:summary()
    local out = { run = self.name, dir = self.dir, wall_time = rl.clock() - self.t0,
        interrupted = self:stopping(), checkpoint = self.last_checkpoint, phases = {} }
    for _, phase in ipairs(self.order) do
        local h = self.history[phase]
        local s = { steps = self.phases[phase] or 0, ran = #h, time = 0 }
        for _, rec in ipairs(h) do s.time = s.time + rec.step_time end
        local field = (#h > 0 and h[1].reward ~= nil) and "reward" or "loss"
        local k = math.max(1, math.min(5, #h // 4))
        s.field = field
        if #h > 0 then
            s.first = mean_of(h, field, 1, k)
            s.last = mean_of(h, field, #h - k + 1, #h)
            s.window = k
            for _, rec in ipairs(h) do
                local v = rec[field]
                if type(v) == "number" and (s.best == nil or
                        (field == "reward" and v > s.best) or (field ~= "reward" and v < s.best)) then
                    s.best, s.best_step = v, rec.step
                end
            end
        end
        out.phases[phase] = s
    end
    return out
end

--- run:finish(): ends the run: prints the summary, writes summary.json and
--- returns the summary table. Call it after the last loop.
function Run:finish()
    if self.finished then return self.finished end
    self:_clear_bar()
    local s = self:summary()
    self:print(("%s '%s' after %s"):format(s.interrupted and "interrupted" or "finished", self.name,
        fmt.duration(s.wall_time)))
    for _, phase in ipairs(self.order) do
        local p = s.phases[phase]
        local line = ("  %-4s %d steps (%d in this process, %s)"):format(phase, p.steps, p.ran,
            fmt.duration(p.time))
        if p.first then
            line = line .. ("  %s %s (first %d) -> %s (last %d), best %s at step %d"):format(
                p.field, fmt.number(p.first), p.window, fmt.number(p.last), p.window,
                fmt.number(p.best), p.best_step)
        end
        self:print(line)
    end
    if s.checkpoint then self:print("  checkpoint " .. s.checkpoint) end
    self:print("  metrics    " .. self.metrics_path)
    if self.main then rl.write_file(self.dir .. "/summary.json", rl.json.encode(s, 2) .. "\n") end
    if self.metrics_file then
        self.metrics_file:close()
        self.metrics_file = nil
    end
    if self.lock then self.lock:release() end
    self.finished = s
    return s
end

return M
