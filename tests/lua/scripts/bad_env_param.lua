-- A C-side failure (a bad plugin parameter) raised on line 4.
local rl = require("rl")

local env = rl.env("reverse_text", { max_len = 0 })
print(env)
