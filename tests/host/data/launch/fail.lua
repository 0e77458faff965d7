-- Rank 1 (or role rollout 1) fails as asked by `...` ("exit3" or "kill9"); the others spin for a
-- minute, so the test passes only if the launcher stops them.
local how = ...
if os.getenv("RANK") == "1" or (os.getenv("RL_ROLE") == "rollout" and os.getenv("RL_ROLE_INDEX") == "1") then
    if how == "kill9" then os.execute("kill -9 $PPID") end
    os.exit(3)
end
local t = os.time()
while os.time() - t < 60 do end
