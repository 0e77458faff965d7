// rl.buffer, rollouts, training batches and inference-server clients over
// abi/rl/train.h, abi/rl/step.h and abi/rl/inference.h.
#include "l_common.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace rl::lua {
namespace {

void destroy_buffer(void *p) {
    rl_buffer_destroy(static_cast<rl_buffer_t *>(p));
}

// ---- rollout buffer ----------------------------------------------------------------------

constexpr const char *kBufferMT = "rl.buffer";

rl_buffer_t *buffer_of(lua_State *L) {
    return static_cast<rl_buffer_t *>(check_handle(L, 1, kBufferMT)->ptr);
}

// rl.buffer([config]) -> rl.buffer
int b_new(lua_State *L) {
    const std::string cfg = json_arg(L, 1, "buffer config");
    Handle *h = push_handle(L, kBufferMT, nullptr, destroy_buffer, 0);
    rl_buffer_t *b = nullptr;
    check_status(L, rl_buffer_create(cfg.c_str(), &b), "rl.buffer");
    h->ptr = b;
    return 1;
}

int b_set_policy_version(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const lua_Integer v = luaL_checkinteger(L, 2);
    check_status(L, rl_buffer_set_policy_version(b, static_cast<int64_t>(v)),
                 "buffer:set_policy_version");
    return 0;
}

// buffer:push(rollout [, tensors]): rollout {group_id, reward, policy_version,
// task, completion}; tensors {token_ids, logprobs, loss_mask, ...}. With one
// table, its rl.tensor fields are the tensors and the rest the rollout.
int b_push(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    int info = 2, tensors = 3;
    if (lua_isnoneornil(L, 3)) {
        // Split one table: tensors to a new table at index 3, the rest to index 4.
        lua_settop(L, 2);
        lua_newtable(L); // 3: tensors
        lua_newtable(L); // 4: info
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            const bool is_tensor = test_tensor(L, -1) != nullptr;
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, is_tensor ? 3 : 4);
        }
        info = 4;
    } else {
        luaL_checktype(L, 3, LUA_TTABLE);
    }
    const std::string rollout = to_json(L, info, "buffer:push: rollout");
    TensorTable tt;
    read_tensor_table(L, tensors, "buffer:push: tensors", {}, &tt);
    const rl_tensor_list_t list = tt.list();
    check_status(L, rl_buffer_push(b, rollout.c_str(), &list), "buffer:push");
    return 0;
}

// buffer:close_group(group_id) -> whether such a group was pending
int b_close_group(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const lua_Integer id = luaL_checkinteger(L, 2);
    uint32_t found = 0;
    check_status(L, rl_buffer_close_group(b, static_cast<int64_t>(id), &found),
                 "buffer:close_group");
    lua_pushboolean(L, found != 0);
    return 1;
}

// buffer:pop_batch(min_rollouts [, timeout_ms]) -> result table, or nil when
// nothing was taken
int b_pop_batch(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0, 2, "min_rollouts must be >= 0");
    const lua_Integer timeout = luaL_optinteger(L, 3, 0);
    luaL_argcheck(L, timeout >= 0, 3, "timeout_ms must be >= 0");
    static const char *const texts[] = {"tasks", "completions", nullptr};
    call_and_push(L, "buffer:pop_batch", texts, [&](rl_result_t **res) {
        return rl_buffer_pop_batch(b, static_cast<uint64_t>(n), static_cast<uint64_t>(timeout),
                                   res);
    });
    lua_getfield(L, -1, "rollouts");
    const bool empty = lua_tonumber(L, -1) == 0;
    lua_pop(L, 1);
    if (empty) lua_pushnil(L);
    return 1;
}

// buffer:stats([take]) -> counters (and drop_log when take)
int b_stats(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const bool take = lua_toboolean(L, 2) != 0;
    static const char *const texts[] = {"drop_log", nullptr};
    return call_and_push(L, "buffer:stats", texts, [&](rl_result_t **res) {
        return rl_buffer_stats(b, take ? 1u : 0u, res);
    });
}

// buffer:save(path): everything the buffer holds, atomically (rl_buffer_save).
int b_save(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const char *path = luaL_checkstring(L, 2);
    check_status(L, rl_buffer_save(b, path), "buffer:save");
    return 0;
}

// buffer:load(path): back into a buffer that took nothing yet (rl_buffer_load).
int b_load(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const char *path = luaL_checkstring(L, 2);
    check_status(L, rl_buffer_load(b, path), "buffer:load");
    return 0;
}

// buffer:push_rollouts(rollouts) -> number pushed
int b_push_rollouts(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    auto *r = static_cast<rl_rollouts_t *>(check_handle(L, 2, kRolloutsMT)->ptr);
    call_and_push(L, "buffer:push_rollouts",
                  [&](rl_result_t **res) { return rl_buffer_push_rollouts(b, r, res); });
    lua_getfield(L, -1, "pushed");
    return 1;
}

// buffer:pop_train_batch(min_rollouts [, timeout_ms]) -> rl.train_batch, or nil
// when fewer rollouts are ready
int b_pop_train_batch(lua_State *L) {
    rl_buffer_t *b = buffer_of(L);
    const lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 1, 2, "min_rollouts must be >= 1");
    const lua_Integer timeout = luaL_optinteger(L, 3, 0);
    luaL_argcheck(L, timeout >= 0, 3, "timeout_ms must be >= 0");
    Handle *h = push_handle(L, kTrainBatchMT, nullptr, destroy_train_batch, 0);
    rl_train_batch_t *tb = nullptr;
    check_status(
        L,
        rl_buffer_pop_train_batch(b, static_cast<uint64_t>(n), static_cast<uint64_t>(timeout), &tb),
        "buffer:pop_train_batch");
    if (!tb) {
        lua_pushnil(L);
        return 1;
    }
    h->ptr = tb;
    return 1;
}

// ---- rollouts and training batches -------------------------------------------------------

rl_rollouts_t *rollouts_of(lua_State *L) {
    return static_cast<rl_rollouts_t *>(check_handle(L, 1, kRolloutsMT)->ptr);
}

// rollouts:score(env)
int ro_score(lua_State *L) {
    rl_rollouts_t *r = rollouts_of(L);
    auto *env = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.env")->ptr);
    check_status(L, rl_rollouts_score(r, env), "rollouts:score");
    return 0;
}

// rollouts:set_rewards({r1, r2, ...}): one finite number per rollout
// (rl_rollouts_set_rewards): rewards from a reward model, a judge or shaping.
int ro_set_rewards(lua_State *L) {
    rl_rollouts_t *r = rollouts_of(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, 2));
    std::vector<double> rewards;
    rewards.reserve(static_cast<size_t>(n));
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, 2, i);
        if (!lua_isnumber(L, -1))
            return luaL_error(L, "rollouts:set_rewards: rewards[%d] is a %s, not a number",
                              static_cast<int>(i), luaL_typename(L, -1));
        rewards.push_back(static_cast<double>(lua_tonumber(L, -1)));
        lua_pop(L, 1);
    }
    check_status(L, rl_rollouts_set_rewards(r, rewards.data(), rewards.size()),
                 "rollouts:set_rewards");
    return 0;
}

// rollouts:filter(filters) -> {flagged, masked, ["flagged.<reason>"] = n}
int ro_filter(lua_State *L) {
    rl_rollouts_t *r = rollouts_of(L);
    std::vector<rl_instance_t *> filters;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, 2));
        for (lua_Integer i = 1; i <= n; ++i) {
            lua_rawgeti(L, 2, i);
            filters.push_back(
                static_cast<rl_instance_t *>(check_handle(L, lua_gettop(L), "rl.filter")->ptr));
            lua_pop(L, 1);
        }
    }
    return call_and_push(L, "rollouts:filter", [&](rl_result_t **res) {
        return rl_rollouts_filter(r, filters.data(), filters.size(), res);
    });
}

// rollouts:info() -> {rollouts, groups, reward_mean, ..., rewards, completions, ...}
int ro_info(lua_State *L) {
    rl_rollouts_t *r = rollouts_of(L);
    static const char *const texts[] = {"completions", "finish_reasons", "tasks", "flags", nullptr};
    return call_and_push(L, "rollouts:info", texts,
                         [&](rl_result_t **res) { return rl_rollouts_info(r, res); });
}

// rollouts:to_batch() -> rl.train_batch of every rollout (no buffer)
int ro_to_batch(lua_State *L) {
    rl_rollouts_t *r = rollouts_of(L);
    Handle *h = push_handle(L, kTrainBatchMT, nullptr, destroy_train_batch, 0);
    rl_train_batch_t *b = nullptr;
    check_status(L, rl_rollouts_to_batch(r, &b), "rollouts:to_batch");
    h->ptr = b;
    return 1;
}

rl_train_batch_t *train_batch_of(lua_State *L) {
    return static_cast<rl_train_batch_t *>(check_handle(L, 1, kTrainBatchMT)->ptr);
}

// batch:compute_advantages(advantage) -> the advantage plugin's result
int tb_compute_advantages(lua_State *L) {
    rl_train_batch_t *b = train_batch_of(L);
    auto *adv = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.advantage")->ptr);
    return call_and_push(L, "train_batch:compute_advantages", [&](rl_result_t **res) {
        return rl_train_batch_compute_advantages(b, adv, res);
    });
}

// batch:set(name, tensor): a per-token tensor ("teacher_logprobs", ...)
int tb_set(lua_State *L) {
    rl_train_batch_t *b = train_batch_of(L);
    const char *name = luaL_checkstring(L, 2);
    const rl_tensor_view_t v =
        to_view(L, 3, kFloat32, DtypeRule::AnyFloat, "train_batch:set: tensor");
    check_status(L, rl_train_batch_set_tensor(b, name, &v), "train_batch:set");
    return 0;
}

// batch:split(k) -> list of at most k rl.train_batch, never splitting a group
int tb_split(lua_State *L) {
    rl_train_batch_t *b = train_batch_of(L);
    const lua_Integer k = luaL_checkinteger(L, 2);
    luaL_argcheck(L, k >= 1, 2, "k must be an integer >= 1");
    std::vector<rl_train_batch_t *> parts(static_cast<size_t>(k), nullptr);
    uint64_t n = 0;
    check_status(L, rl_train_batch_split(b, static_cast<uint64_t>(k), parts.data(), &n),
                 "train_batch:split");
    lua_createtable(L, static_cast<int>(n), 0);
    for (uint64_t i = 0; i < n; ++i) {
        Handle *h = push_handle(L, kTrainBatchMT, nullptr, destroy_train_batch, 0);
        h->ptr = parts[i];
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

// batch:tensors() -> {input_ids = ..., cu_seqlens = ..., <per-token name> = ...}: copies
// of the batch's tensors, the table trainer:forward_backward also takes (what a
// transport carries between processes)
int tb_tensors(lua_State *L) {
    rl_train_batch_t *b = train_batch_of(L);
    rl_batch_t v{};
    v.struct_size = sizeof v;
    check_status(L, rl_train_batch_view(b, &v), "train_batch:tensors");
    lua_createtable(L, 0, static_cast<int>(v.tensors.count) + 2);
    push_tensor_copy(L, v.input_ids, "train_batch:tensors: input_ids");
    lua_setfield(L, -2, "input_ids");
    push_tensor_copy(L, v.cu_seqlens, "train_batch:tensors: cu_seqlens");
    lua_setfield(L, -2, "cu_seqlens");
    for (uint64_t i = 0; i < v.tensors.count; ++i) {
        const rl_tensor_arg_t &a = v.tensors.items[i];
        push_tensor_copy(L, a.view, a.name);
        lua_setfield(L, -2, a.name);
    }
    return 1;
}

// batch:info() -> {groups, rollouts, tokens, loss_tokens, rewards, group_ids, ...}
int tb_info(lua_State *L) {
    rl_train_batch_t *b = train_batch_of(L);
    static const char *const texts[] = {"tasks", "completions", nullptr};
    return call_and_push(L, "train_batch:info", texts,
                         [&](rl_result_t **res) { return rl_train_batch_info(b, res); });
}

// ---- inference servers (abi/rl/inference.h) --------------------------------------

constexpr const char *kInferenceClientMT = "rl.inference_client";

void destroy_inference_client(void *p) {
    rl_inference_client_destroy(static_cast<rl_inference_client_t *>(p));
}

rl_inference_client_t *inference_client_of(lua_State *L) {
    return static_cast<rl_inference_client_t *>(check_handle(L, 1, kInferenceClientMT)->ptr);
}

// rl.inference_client{url = "http://127.0.0.1:30000" [, api_key, timeout, protocol]}
int ic_new(lua_State *L) {
    const std::string opts = json_arg(L, 1, "rl.inference_client: options");
    Handle *h = push_handle(L, kInferenceClientMT, nullptr, destroy_inference_client, 0);
    rl_inference_client_t *c = nullptr;
    check_status(L, rl_inference_client_create(opts.c_str(), &c), "rl.inference_client");
    h->ptr = c;
    return 1;
}

// The reply of one call, decoded (a table for JSON objects and lists, else a
// string, nil for an empty body).
int push_call(lua_State *L, rl_inference_client_t *c, const char *method, const char *path,
              const std::string &body, const char *what) {
    rl_result_t *res = nullptr;
    check_status(
        L, rl_inference_client_call(c, method, path, body.empty() ? nullptr : body.c_str(), &res),
        what);
    rl_string_view_t text{};
    const rl_status_t st = rl_result_text(res, "body", &text);
    std::string reply = st == RL_OK ? std::string(text.data, static_cast<size_t>(text.length)) : "";
    rl_result_destroy(res);
    if (reply.empty() || reply == "null") {
        lua_pushnil(L);
        return 1;
    }
    if (reply[0] == '{' || reply[0] == '[')
        push_json(L, reply, what);
    else
        lua_pushlstring(L, reply.data(), reply.size());
    return 1;
}

// client:call(method, path [, body]) -> the decoded reply
int ic_call(lua_State *L) {
    rl_inference_client_t *c = inference_client_of(L);
    const char *method = luaL_checkstring(L, 2);
    const char *path = luaL_checkstring(L, 3);
    const std::string body =
        lua_isnoneornil(L, 4) ? std::string() : json_arg(L, 4, "inference_client:call: body");
    return push_call(L, c, method, path, body, "inference_client:call");
}

// client:generate(request) -> POST /generate (SGLang's request and reply)
int ic_generate(lua_State *L) {
    rl_inference_client_t *c = inference_client_of(L);
    const std::string body = json_arg(L, 2, "inference_client:generate: request");
    return push_call(L, c, "POST", "/generate", body, "inference_client:generate");
}

// client:rollouts(model_or_tokenizer, tasks [, options]) -> rl.rollouts, sampled by
// the server (options as engine:rollouts)
int ic_rollouts(lua_State *L) {
    rl_inference_client_t *c = inference_client_of(L);
    rl_model_t *m = model_of(L, 2);
    const std::string tasks = json_arg(L, 3, "inference_client:rollouts: tasks");
    const std::string opts = json_arg(L, 4, "inference_client:rollouts: options");
    Handle *h = push_handle(L, kRolloutsMT, nullptr, destroy_rollouts, 0);
    rl_rollouts_t *r = nullptr;
    check_status(L, rl_inference_client_rollouts(c, m, tasks.c_str(), opts.c_str(), &r),
                 "inference_client:rollouts");
    h->ptr = r;
    return 1;
}

// client:sync(model, version [, {mode, dir, ...}]) -> {skipped, version, tensors,
// server_version, metrics}
int ic_sync(lua_State *L) {
    rl_inference_client_t *c = inference_client_of(L);
    rl_model_t *m = static_cast<rl_model_t *>(check_handle(L, 2, kModelMT)->ptr);
    const lua_Integer version = luaL_checkinteger(L, 3);
    const std::string opts = json_arg(L, 4, "inference_client:sync: options");
    return call_and_push(L, "inference_client:sync", [&](rl_result_t **res) {
        return rl_inference_client_sync(c, m, static_cast<int64_t>(version), opts.c_str(), res);
    });
}

} // namespace

void open_rollouts(lua_State *L, int M) {
    static const luaL_Reg buffer_methods[] = {RL_LUA_FN("set_policy_version", b_set_policy_version),
                                              RL_LUA_FN("push", b_push),
                                              RL_LUA_FN("close_group", b_close_group),
                                              RL_LUA_FN("pop_batch", b_pop_batch),
                                              RL_LUA_FN("push_rollouts", b_push_rollouts),
                                              RL_LUA_FN("pop_train_batch", b_pop_train_batch),
                                              RL_LUA_FN("stats", b_stats),
                                              RL_LUA_FN("save", b_save),
                                              RL_LUA_FN("load", b_load),
                                              {nullptr, nullptr}};
    define_handle_type(L, kBufferMT, buffer_methods);
    static const luaL_Reg rollouts_methods[] = {
        RL_LUA_FN("score", ro_score),       RL_LUA_FN("set_rewards", ro_set_rewards),
        RL_LUA_FN("filter", ro_filter),     RL_LUA_FN("info", ro_info),
        RL_LUA_FN("to_batch", ro_to_batch), {nullptr, nullptr}};
    define_handle_type(L, kRolloutsMT, rollouts_methods);
    static const luaL_Reg train_batch_methods[] = {
        RL_LUA_FN("compute_advantages", tb_compute_advantages),
        RL_LUA_FN("info", tb_info),
        RL_LUA_FN("tensors", tb_tensors),
        RL_LUA_FN("set", tb_set),
        RL_LUA_FN("split", tb_split),
        {nullptr, nullptr}};
    define_handle_type(L, kTrainBatchMT, train_batch_methods);
    static const luaL_Reg inference_client_methods[] = {RL_LUA_FN("call", ic_call),
                                                        RL_LUA_FN("generate", ic_generate),
                                                        RL_LUA_FN("sync", ic_sync),
                                                        RL_LUA_FN("rollouts", ic_rollouts),
                                                        {nullptr, nullptr}};
    define_handle_type(L, kInferenceClientMT, inference_client_methods);

    static const luaL_Reg fns[] = {
        RL_LUA_FN("buffer", b_new), RL_LUA_FN("inference_client", ic_new), {nullptr, nullptr}};
    lua_pushvalue(L, M);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

} // namespace rl::lua
