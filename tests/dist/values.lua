-- One rank of the rl.dist value test (tests/python/test_dist.py starts two).
local rl = require("rl")
local d = rl.dist
d.init({ timeout = 30 })
local r, w = d.rank(), d.world_size()
assert(w == 2, "world size " .. w)
assert(d.is_main() == (r == 0))
local got = d.broadcast(r == 1 and { name = "x", t = rl.tensor({ 1.5, 2.5 }, "float64"), n = 3 } or nil, 1)
assert(got.name == "x" and got.n == 3, "broadcast table")
assert(rl.tensor.is(got.t) and got.t:dtype() == "float64" and got.t[2] == 2.5, "broadcast tensor")
local all = d.all_gather({ rank = r })
assert(#all == 2 and all[1].rank == 0 and all[2].rank == 1, "all_gather")
local g = d.gather(r * 10, 0)
if r == 0 then assert(g[2] == 10, "gather on root") else assert(g == nil, "gather elsewhere") end
d.barrier()
print("lua dist ok " .. r)
