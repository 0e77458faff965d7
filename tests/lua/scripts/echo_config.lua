-- Prints what the script sees: the resolved configuration and its arguments.
local rl = require("rl")

local cfg = rl.config()
print(("config: %s %d %s"):format(cfg.run.name, cfg.rollout.n, cfg.env.name))
print("args: " .. table.concat({ ... }, " "))
