-- Syncs the model at arg[2] into the server at arg[1] from Lua (distributed,
-- then disk into arg[3]) and prints the server's greedy tokens as JSON.
local rl = require("rl")
local url, model_dir, shared = arg[1], arg[2], arg[3]
local model = rl.model(model_dir)
local server = rl.inference_client{url = url}
local out = server:sync(model, 7, {mode = "distributed"})
assert(out.skipped == 0, "the first sync must not be skipped")
assert(out.server_version == "7", "server reports " .. tostring(out.server_version))
assert(out.metrics["sync/bytes"] > 0)
assert(server:sync(model, 7, {mode = "distributed"}).skipped == 1, "the handshake skips version 7")
assert(server:sync(model, 8, {mode = "disk", dir = shared}).skipped == 0)
local reply = server:generate{input_ids = {104, 101, 108, 108, 111, 10},
                              sampling_params = {temperature = 0, max_new_tokens = 12,
                                                 stop_token_ids = rl.json.array{}}}
print("TOKENS " .. rl.json.encode(reply.output_ids))
print("VERSION " .. server:call("GET", "/get_model_info").weight_version)
