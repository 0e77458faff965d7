-- rl/metrics.lua: a small accumulator for per-step metrics, and number /
-- duration formatting shared with rl.run.
local M = {}

local Metrics = {}
Metrics.__index = Metrics

--- rl.metrics(): an empty accumulator.
---   m:add(name, value [, weight])   weighted running mean per name
---   m:merge(tbl [, prefix])         add every numeric field of tbl
---   m:get(name)                     the mean so far (nil when never added)
---   m:means()                       {name = mean}
---   m:reset()
function M.new()
    return setmetatable({ sums = {}, weights = {} }, Metrics)
end

function Metrics:add(name, value, weight)
    if type(name) ~= "string" then error("metrics:add: name must be a string", 2) end
    if type(value) ~= "number" then
        error(("metrics:add: value of '%s' must be a number, got %s"):format(name, type(value)), 2)
    end
    weight = weight or 1
    self.sums[name] = (self.sums[name] or 0) + value * weight
    self.weights[name] = (self.weights[name] or 0) + weight
    return self
end

function Metrics:merge(tbl, prefix)
    for k, v in pairs(tbl or {}) do
        if type(v) == "number" and type(k) == "string" then self:add((prefix or "") .. k, v) end
    end
    return self
end

function Metrics:get(name)
    local w = self.weights[name]
    if not w or w == 0 then return nil end
    return self.sums[name] / w
end

function Metrics:means()
    local out = {}
    for k in pairs(self.sums) do out[k] = self:get(k) end
    return out
end

function Metrics:reset()
    self.sums, self.weights = {}, {}
    return self
end

--- M.duration(seconds) -> "0.84s", "12.3s", "4m05s", "1h02m"
function M.duration(s)
    if s < 10 then return ("%.2fs"):format(s) end
    if s < 60 then return ("%.1fs"):format(s) end
    if s < 3600 then return ("%dm%02ds"):format(s // 60, math.floor(s % 60)) end
    return ("%dh%02dm"):format(s // 3600, math.floor((s % 3600) / 60))
end

--- M.number(x) -> a short rendering: 4 significant digits, a k / M suffix
--- from 10000 up.
function M.number(x)
    if x == nil then return "-" end
    if math.type(x) == "integer" then return tostring(x) end
    if x ~= x then return "nan" end
    local a = math.abs(x)
    if a >= 1e6 then return ("%.1fM"):format(x / 1e6) end
    if a >= 1e4 then return ("%.1fk"):format(x / 1e3) end
    return ("%.4g"):format(x)
end

return M
