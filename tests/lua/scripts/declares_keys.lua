-- Declares keys of its own (section "demo") and prints what it resolved.
local rl = require("rl")

local cfg = rl.config {
    { "demo.rounds", "integer", 3, "Rounds.", min = 1 },
    { "demo.mode", "string", "fast", "Mode.", choices = { "fast", "slow" } },
    { "demo.enabled", "boolean", false, "A switch whose default is false." },
}
print(("demo: %d %s %s"):format(cfg.demo.rounds, cfg.demo.mode, tostring(cfg.demo.enabled)))
