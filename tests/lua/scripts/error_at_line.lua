-- A script with a bug on line 6: rlhost must report this file and line.
local rl = require("rl")

local t = rl.tensor({1, 2, 3})
print(#t)
print(t[7])
