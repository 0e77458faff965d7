-- rl.tensorboard: TensorBoard event files, written without TensorFlow or
-- protobuf. A file is a sequence of records
--   uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of data
-- (little-endian; masked = rotate right 15, plus 0xa282ead8), each data an
-- `Event` protobuf. The fields written, by number (tensorflow/core/util/event.proto,
-- tensorflow/core/framework/summary.proto):
--   Event: 1 wall_time (double), 2 step (int64), 3 file_version (string),
--          5 summary (Summary), 6 session_log (SessionLog: 1 status, START = 1)
--   Summary: 1 value (repeated Value); Value: 1 tag (string), 2 simple_value (float),
--          8 tensor (TensorProto), 9 metadata (SummaryMetadata)
--   TensorProto: 1 dtype (DT_STRING = 7), 2 tensor_shape (empty: a scalar), 8 string_val
--   SummaryMetadata: 1 plugin_data (PluginData: 1 plugin_name "text", 2 content)
--
-- local tb = require("rl.tensorboard").open(dir [, resumed_step])
-- tb:scalars(step, {["rl/reward"] = 0.5, ...})   -- one Event per call
-- tb:text(step, "rl/samples", "| markdown |")      -- TensorBoard's Text tab
-- tb:close()
local rl = require("rl")
local M = {}

-- CRC-32C (Castagnoli, reflected polynomial 0x82f63b78).
local TABLE = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if c & 1 ~= 0 then c = (c >> 1) ~ 0x82F63B78 else c = c >> 1 end
    end
    TABLE[i] = c
end

local function crc32c(s)
    local c = 0xFFFFFFFF
    for i = 1, #s do c = TABLE[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8) end
    return c ~ 0xFFFFFFFF
end
M.crc32c = crc32c

local function masked(c)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
end

-- Protobuf varint of a non-negative integer.
local function varint(n)
    local out = {}
    repeat
        local b = n & 0x7F
        n = n >> 7
        out[#out + 1] = string.char(n ~= 0 and (b | 0x80) or b)
    until n == 0
    return table.concat(out)
end

-- Field `num` of wire type 2 (length-delimited): bytes, strings, messages.
local function bytes_field(num, s)
    return varint((num << 3) | 2) .. varint(#s) .. s
end

local function record(data)
    local len = string.pack("<I8", #data)
    return len .. string.pack("<I4", masked(crc32c(len))) .. data
        .. string.pack("<I4", masked(crc32c(data)))
end
M.record = record

local function event(step, fields)
    local head = "\x09" .. string.pack("<d", rl.time()) -- 1: wall_time, fixed64
    if step then head = head .. "\x10" .. varint(step) end -- 2: step, varint
    return record(head .. fields)
end

local FLT_MAX = 3.4028234663852886e38

local Writer = {}
Writer.__index = Writer

--- Opens a new event file in `dir` (created if needed). `resumed_step`: the
--- run continues after that step, so TensorBoard drops what an earlier
--- process wrote past it (a SessionLog START event at resumed_step + 1).
function M.open(dir, resumed_step)
    rl.mkdir(dir)
    local t = rl.time()
    local name = ("%s/events.out.tfevents.%d.%06d.rl"):format(dir, math.floor(t),
        math.floor((t % 1) * 1e6))
    local f, err = io.open(name, "wb")
    if not f then error("rl.tensorboard: cannot create " .. name .. ": " .. tostring(err), 2) end
    local self = setmetatable({ file = f, path = name }, Writer)
    f:write(event(nil, bytes_field(3, "brain.Event:2")))
    if resumed_step then f:write(event(resumed_step + 1, bytes_field(6, "\x08\x01"))) end
    f:flush()
    return self
end

--- Writes the numbers of `values` (tag -> number) as one Event at `step`,
--- tags in sorted order.
function Writer:scalars(step, values)
    local tags = {}
    for tag, v in pairs(values) do
        if type(v) == "number" then tags[#tags + 1] = tag end
    end
    if #tags == 0 then return end
    table.sort(tags)
    local parts = {}
    for i, tag in ipairs(tags) do
        local v = values[tag] + 0.0
        -- float32: beyond its range is an infinity (NaN stays NaN).
        if v > FLT_MAX then v = math.huge elseif v < -FLT_MAX then v = -math.huge end
        local value = bytes_field(1, tag) .. "\x15" .. string.pack("<f", v)
        parts[i] = bytes_field(1, value)
    end
    self.file:write(event(step, bytes_field(5, table.concat(parts))))
    self.file:flush()
end

--- Writes `markdown` as a text summary (TensorBoard's Text tab) of `tag` at `step`.
function Writer:text(step, tag, markdown)
    local tensor = "\x08\x07" .. bytes_field(2, "") .. bytes_field(8, markdown)
    local metadata = bytes_field(1, bytes_field(1, "text"))
    local value = bytes_field(1, tag) .. bytes_field(8, tensor) .. bytes_field(9, metadata)
    self.file:write(event(step, bytes_field(5, bytes_field(1, value))))
    self.file:flush()
end

-- A table cell: pipes escaped, line breaks shown as \n.
local function cell(v)
    if v == nil then return "" end
    if type(v) == "number" then return ("%.4g"):format(v) end
    return (tostring(v):gsub("|", "\\|"):gsub("\r?\n", "\\n"))
end

--- samples.jsonl records of one step as a Markdown table (at most `limit` rows).
function M.samples_markdown(recs, limit)
    local lines = { "| group | reward | advantage | prompt | completion |", "|---|---|---|---|---|" }
    for i, r in ipairs(recs) do
        if i > limit then
            lines[#lines + 1] = ("(%d more in samples.jsonl)"):format(#recs - limit)
            break
        end
        local task = r.task
        local prompt = type(task) == "table" and task.prompt or task
        lines[#lines + 1] = ("| %s | %s | %s | %s | %s |"):format(cell(r.group), cell(r.reward),
            cell(r.advantage), cell(prompt), cell(r.completion))
    end
    return table.concat(lines, "\n")
end

function Writer:close()
    if self.file then
        self.file:close()
        self.file = nil
    end
end

--- The numbers of a metrics record as TensorBoard tags: `<phase>/<key>`,
--- nested tables joined with "/"; booleans as 0 / 1; strings skipped.
function M.flatten(phase, rec, skip)
    local out = {}
    local function walk(prefix, t, depth)
        if depth > 8 then return end
        for k, v in pairs(t) do
            local key = prefix .. "/" .. tostring(k)
            if type(v) == "number" then
                out[key] = v
            elseif type(v) == "boolean" then
                out[key] = v and 1 or 0
            elseif type(v) == "table" then
                walk(key, v, depth + 1)
            end
        end
    end
    local top = {}
    for k, v in pairs(rec) do
        if not (skip and skip[k]) then top[k] = v end
    end
    walk(phase, top, 0)
    return out
end

return M
