-- tests/lua/scripts/judge_score.lua: rl.judge_score reads the last score in
-- a judge's reply and maps [min, max] onto [0, 1]; no score, a score out of
-- range, or a pattern with no number is nil (an invalid reply).
local rl = require("rl")
local P = "[Ss]core%s*:%s*(%-?%d+%.?%d*)"
local function near(a, b) return a ~= nil and math.abs(a - b) < 1e-12 end
assert(near(rl.judge_score("Score: 7", P, 0, 10), 0.7))
assert(near(rl.judge_score("reasoning... score: 2 then\nScore: 9.5", P, 0, 10), 0.95))
assert(near(rl.judge_score("Score:-1", P, -1, 1), 0.0))
assert(near(rl.judge_score("Score: 10", P, 0, 10), 1.0))
assert(rl.judge_score("Score: 11", P, 0, 10) == nil)
assert(rl.judge_score("no verdict here", P, 0, 10) == nil)
assert(rl.judge_score("", P, 0, 10) == nil)
assert(near(rl.judge_score("[[4]]", "%[%[(%d+)%]%]", 1, 5), 0.75))
assert(rl.judge_score("Score: x", "Score: (%a)", 0, 10) == nil)
local ok, err = pcall(rl.judge_score, "Score: 1", P, 5, 5)
assert(not ok and tostring(err):find("judge.max %(5%) must be greater than judge.min %(5%)"), err)
print("judge_score: ok")
