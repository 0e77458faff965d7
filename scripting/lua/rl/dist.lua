-- rl/dist.lua: rl.dist, the ranks of a distributed run (docs/distributed.md).
--
--   rl.dist.rank(), rl.dist.world_size(), rl.dist.local_rank(), rl.dist.is_main()
--   rl.dist.barrier()
--   rl.dist.broadcast(value [, root])   -> root's value on every rank
--   rl.dist.all_gather(value)           -> {value of rank 0, value of rank 1, ...}
--   rl.dist.gather(value [, root])      -> that list on root, nil elsewhere
--
-- Values are nil, booleans, numbers, strings, rl.tensor values and tables of
-- these. Every call but the first four is a collective: all ranks make it, in
-- the same order. In a single process they return at once.
local rl = require("rl")

local M = {}
local info

local function get_info()
    if not info then info = rl.dist_info() end
    return info
end

--- rl.dist.init([cfg]): joins the process group with the run configuration's
--- dist section (rl.run does this); later calls return the same group.
function M.init(cfg)
    local section, device = nil, nil
    if type(cfg) == "table" then
        section = cfg.dist or cfg
        device = cfg.model and cfg.model.device or nil
    end
    info = rl.dist_init(section, device)
    return info
end

function M.rank() return math.tointeger(get_info().rank) end
function M.world_size() return math.tointeger(get_info().world_size) end
function M.local_rank() return math.tointeger(get_info().local_rank) end
function M.is_main() return get_info().rank == 0 end
function M.barrier() rl.dist_barrier() end

-- Values travel as JSON; tensors as {dtype, values}.
local TENSOR = "__rl_tensor"

local function pack(v)
    if rl.tensor.is(v) then return { [TENSOR] = v:dtype(), values = v:totable() } end
    if type(v) == "table" then
        local out = {}
        for k, x in pairs(v) do out[k] = pack(x) end
        return out
    end
    return v
end

local function unpack_value(v)
    if type(v) ~= "table" then return v end
    if v[TENSOR] then return rl.tensor.new(v.values, v[TENSOR]) end
    for k, x in pairs(v) do v[k] = unpack_value(x) end
    return v
end

local function encode(v) return rl.json.encode({ v = pack(v) }) end
local function decode(text) return unpack_value(rl.json.decode(text).v) end

function M.broadcast(value, root)
    root = root or 0
    local text = M.rank() == root and encode(value) or ""
    return decode(rl.dist_broadcast_text(text, root))
end

function M.all_gather(value)
    local out = {}
    for r, text in ipairs(rl.dist_all_gather_text(encode(value))) do out[r] = decode(text) end
    return out
end

function M.gather(value, root)
    local all = M.all_gather(value)
    if M.rank() == (root or 0) then return all end
    return nil
end

return M
