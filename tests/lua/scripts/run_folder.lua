-- Opens the run folder (rl.run) and prints where, so a test can hold its lock.
local rl = require("rl")

local cfg = rl.config()
local run = rl.run(cfg)
print("opened " .. run.dir)
run:finish()
