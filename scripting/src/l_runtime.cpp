// rl.runtime and plugin instances (loss, advantage, filter, env) over
// abi/rl/runtime.h.
#include "l_common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace rl::lua {
namespace {

constexpr const char *kLossMT = "rl.loss";
constexpr const char *kAdvantageMT = "rl.advantage";
constexpr const char *kFilterMT = "rl.filter";
constexpr const char *kEnvMT = "rl.env";
constexpr const char *kTransportMT = "rl.transport";

char kTaskTextKey = 0; // registry: weak-keyed {task table -> its JSON text}

void destroy_runtime(void *p) {
    rl_runtime_destroy(static_cast<rl_runtime_t *>(p));
}
void destroy_instance(void *p) {
    rl_instance_destroy(static_cast<rl_instance_t *>(p));
}

void set_name(Handle *h, const std::string &name) {
    std::snprintf(h->name, sizeof(h->name), "%s", name.c_str());
}

bool is_id_name(const std::string &n) {
    return n == "input_ids" || n == "labels" || n == "cu_seqlens" || n == "group_ids" ||
           n == "token_ids" || n == "prompt_index" || n == "position_ids";
}

// A view of field `name` of a tensor table: ids are int64; masks any dtype;
// everything else float (tables become float64, the exact Lua numbers).
rl_tensor_view_t field_view(lua_State *L, int value_idx, const std::string &name,
                            const std::string &what) {
    if (is_id_name(name)) return to_view(L, value_idx, kInt64, DtypeRule::Exact, what);
    if (name == "loss_mask" && test_tensor(L, value_idx))
        return to_view(L, value_idx, kFloat64, DtypeRule::Any, what);
    return to_view(L, value_idx, kFloat64, DtypeRule::AnyFloat, what);
}

} // namespace

void read_tensor_table(lua_State *L, int idx, const char *what,
                       const std::vector<std::string> &skip, TensorTable *out) {
    idx = lua_absindex(L, idx);
    std::vector<std::string> keys;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            lua_pushvalue(L, -1);
            const std::string k = luaL_tolstring(L, -1, nullptr);
            luaL_error(L, "%s: keys must be tensor names (strings), got %s", what, k.c_str());
        }
        const std::string k = lua_tostring(L, -1);
        bool skipped = false;
        for (const auto &s : skip) skipped = skipped || s == k;
        if (!skipped) keys.push_back(k);
    }
    std::sort(keys.begin(), keys.end()); // a deterministic order
    out->names = keys;
    out->args.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        luaL_checkstack(L, 4, "rl: too many tensors");
        lua_getfield(L, idx, keys[i].c_str());
        const std::string w = std::string(what) + "." + keys[i];
        out->args[i].view = field_view(L, lua_gettop(L), keys[i], w);
    }
    for (size_t i = 0; i < keys.size(); ++i) out->args[i].name = out->names[i].c_str();
}

// Field `name` of table idx as a view (pushing what it needs); raises when
// absent and required.
bool table_field_view(lua_State *L, int idx, const char *name, const char *what, bool required,
                      rl_tensor_view_t *out) {
    lua_getfield(L, idx, name);
    if (lua_isnil(L, -1)) {
        if (required) luaL_error(L, "%s: missing field '%s'", what, name);
        return false;
    }
    *out = field_view(L, lua_gettop(L), name, std::string(what) + "." + name);
    return true;
}

namespace {

// ---- runtime ------------------------------------------------------------------------

// rl.runtime([{plugin_path = "a:b" | {"a", "b"}, log_level = "warn", default_plugins = true}])
int r_new(lua_State *L) {
    std::string path;
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        lua_getfield(L, 1, "plugin_path");
        if (lua_type(L, -1) == LUA_TSTRING) {
            path = lua_tostring(L, -1);
        } else if (lua_istable(L, -1)) {
            const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, -1));
            for (lua_Integer i = 1; i <= n; ++i) {
                lua_rawgeti(L, -1, i);
                if (lua_type(L, -1) != LUA_TSTRING)
                    arg_error(L, 1, "field 'plugin_path' must list strings");
                path += (path.empty() ? "" : ":") + std::string(lua_tostring(L, -1));
                lua_pop(L, 1);
            }
        } else if (!lua_isnil(L, -1)) {
            arg_error(L, 1,
                      std::string("field 'plugin_path' must be a string or a list, got ") +
                          luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    const std::string level = opt_string_field(L, 1, "log_level", "warn");
    const bool defaults = opt_bool_field(L, 1, "default_plugins", true);
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.flags = defaults ? 0u : static_cast<uint32_t>(RL_RUNTIME_NO_DEFAULT_PLUGINS);
    desc.plugin_path = path.empty() ? nullptr : path.c_str();
    desc.log_level = level.c_str();
    Handle *h = push_handle(L, kRuntimeMT, nullptr, destroy_runtime, 0);
    rl_runtime_t *rt = nullptr;
    check_status(L, rl_runtime_create(&desc, &rt), "rl.runtime");
    h->ptr = rt;
    return 1;
}

rl_runtime_t *runtime_of(lua_State *L, int idx) {
    return static_cast<rl_runtime_t *>(check_handle(L, idx, kRuntimeMT)->ptr);
}

int r_load_plugin(lua_State *L) {
    rl_runtime_t *rt = runtime_of(L, 1);
    check_status(L, rl_runtime_load_plugin(rt, luaL_checkstring(L, 2)), "runtime:load_plugin");
    return 0;
}

int r_plugins(lua_State *L) {
    rl_runtime_t *rt = runtime_of(L, 1);
    rl_result_t *res = nullptr;
    check_status(L, rl_runtime_list_plugins(rt, &res), "runtime:plugins");
    return push_json_field(L, res, "plugins");
}

int make_instance(lua_State *L, const char *kind, const char *mt, int name_arg) {
    rl_runtime_t *rt = runtime_of(L, 1);
    const std::string name = luaL_checkstring(L, name_arg);
    const std::string params = json_arg(L, name_arg + 1, "params");
    Handle *h = push_handle(L, mt, nullptr, destroy_instance, 1);
    h->kind = kind;
    set_name(h, name);
    rl_instance_t *inst = nullptr;
    const std::string what = std::string("runtime:") + kind;
    check_status(L, rl_instance_create(rt, kind, name.c_str(), params.c_str(), &inst),
                 what.c_str());
    h->ptr = inst;
    return 1;
}

int r_loss(lua_State *L) {
    return make_instance(L, RL_KIND_LOSS, kLossMT, 2);
}
int r_advantage(lua_State *L) {
    return make_instance(L, RL_KIND_ADVANTAGE, kAdvantageMT, 2);
}
int r_filter(lua_State *L) {
    return make_instance(L, RL_KIND_FILTER, kFilterMT, 2);
}
int r_env(lua_State *L) {
    return make_instance(L, RL_KIND_ENV, kEnvMT, 2);
}
int r_transport(lua_State *L) {
    return make_instance(L, RL_KIND_TRANSPORT, kTransportMT, 2);
}
// runtime:instance(kind, name [, params])
int r_instance(lua_State *L) {
    const std::string kind = luaL_checkstring(L, 2);
    struct {
        const char *kind, *mt;
    } const kinds[] = {{RL_KIND_LOSS, kLossMT},
                       {RL_KIND_ADVANTAGE, kAdvantageMT},
                       {RL_KIND_FILTER, kFilterMT},
                       {RL_KIND_ENV, kEnvMT},
                       {RL_KIND_TRANSPORT, kTransportMT}};
    for (const auto &k : kinds)
        if (kind == k.kind) {
            lua_remove(L, 2);
            return make_instance(L, k.kind, k.mt, 2);
        }
    arg_error(L, 2,
              "kind must be one of loss, advantage, filter, env, transport; got '" + kind + "'");
}

// ---- loss ---------------------------------------------------------------------------

// loss:compute(inputs [, {want_grads = true, global_tokens = 0, global_seqs = 0}])
// inputs: {cu_seqlens = ..., logprobs = ..., advantages = ..., ...}
int loss_compute(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kLossMT)->ptr);
    luaL_checktype(L, 2, LUA_TTABLE);
    const bool want_grads = opt_bool_field(L, 3, "want_grads", true);
    double global_tokens = 0, global_seqs = 0;
    if (!lua_isnoneornil(L, 3)) {
        lua_getfield(L, 3, "global_tokens");
        global_tokens = lua_isnil(L, -1) ? 0.0 : luaL_checknumber(L, -1);
        lua_getfield(L, 3, "global_seqs");
        global_seqs = lua_isnil(L, -1) ? 0.0 : luaL_checknumber(L, -1);
        lua_pop(L, 2);
    }
    rl_loss_inputs_t in{};
    in.struct_size = sizeof(in);
    table_field_view(L, 2, "cu_seqlens", "loss:compute: inputs", true, &in.cu_seqlens);
    TensorTable tt;
    read_tensor_table(L, 2, "loss:compute: inputs", {"cu_seqlens"}, &tt);
    in.tensors = tt.list();
    in.global_tokens = global_tokens;
    in.global_seqs = global_seqs;
    return call_and_push(L, "loss:compute", [&](rl_result_t **res) {
        return rl_loss_compute(inst, &in, want_grads ? 1u : 0u, res);
    });
}

int loss_signature(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kLossMT)->ptr);
    rl_result_t *res = nullptr;
    check_status(L, rl_loss_signature(inst, &res), "loss:signature");
    return push_json_field(L, res, "signature");
}

// ---- advantage ----------------------------------------------------------------------

// adv:compute{rewards = ..., group_ids = ..., cu_seqlens = ..., loss_mask = ..., values = ...}
int adv_compute(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kAdvantageMT)->ptr);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *what = "advantage:compute: inputs";
    rl_advantage_inputs_t in{};
    in.struct_size = sizeof(in);
    table_field_view(L, 2, "rewards", what, true, &in.rewards);
    table_field_view(L, 2, "group_ids", what, true, &in.group_ids);
    table_field_view(L, 2, "cu_seqlens", what, true, &in.cu_seqlens);
    TensorTable tt;
    read_tensor_table(L, 2, what, {"rewards", "group_ids", "cu_seqlens"}, &tt);
    in.tensors = tt.list();
    return call_and_push(L, "advantage:compute",
                         [&](rl_result_t **res) { return rl_advantage_compute(inst, &in, res); });
}

// ---- filter ----------------------------------------------------------------------------

// filter:check(token_ids, logprobs, vocab_size) -> {flagged, enforce, reason, metrics}
int filter_check(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kFilterMT)->ptr);
    const lua_Integer vocab = luaL_checkinteger(L, 4);
    rl_rollout_view_t r{};
    r.struct_size = sizeof(r);
    r.token_ids = to_view(L, 2, kInt64, DtypeRule::Exact, "filter:check: token_ids");
    r.logprobs = to_view(L, 3, kFloat64, DtypeRule::AnyFloat, "filter:check: logprobs");
    r.vocab_size = static_cast<int64_t>(vocab);
    call_and_push(L, "filter:check",
                  [&](rl_result_t **res) { return rl_filter_check(inst, &r, res); });
    for (const char *f : {"flagged", "enforce"}) {
        lua_getfield(L, -1, f);
        const bool b = lua_tonumber(L, -1) != 0;
        lua_pop(L, 1);
        lua_pushboolean(L, b);
        lua_setfield(L, -2, f);
    }
    return 1;
}

// ---- env --------------------------------------------------------------------------------

void push_task_texts(lua_State *L) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &kTaskTextKey) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &kTaskTextKey);
}

// env:sample(n [, seed]) -> list of tasks {prompt, answer, metadata}
int env_sample(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kEnvMT)->ptr);
    const lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0, 2, "n must be >= 0");
    const lua_Integer seed = luaL_optinteger(L, 3, 0);
    luaL_argcheck(L, seed >= 0, 3, "seed must be >= 0");
    rl_result_t *res = nullptr;
    check_status(L,
                 rl_env_sample(inst, static_cast<uint64_t>(n), static_cast<uint64_t>(seed), &res),
                 "env:sample");
    ResultGuard guard{res};
    rl_string_view_t text{};
    check_status(L, rl_result_text(res, "tasks", &text), "env:sample");
    const auto all = nlohmann::json::parse(text.data, text.data + text.length, nullptr, false);
    if (!all.is_array()) luaL_error(L, "env:sample: the env returned no JSON array of tasks");
    // Each task table remembers its exact JSON, so score() hands the env what it made.
    push_task_texts(L);
    const int texts = lua_gettop(L);
    lua_createtable(L, static_cast<int>(all.size()), 0);
    lua_Integer i = 1;
    for (const auto &task : all) {
        push_json(L, task.dump(), "env:sample: task");
        const std::string dumped = task.dump();
        lua_pushvalue(L, -1);
        lua_pushlstring(L, dumped.data(), dumped.size());
        lua_rawset(L, texts); // texts[task] = its JSON
        lua_rawseti(L, -2, i++);
    }
    set_array_mt(L, -1);
    return 1;
}

// env:score(task, completion) -> reward, metrics
// The task argument of env:score / env:step: a table from env:sample (its
// JSON text as sampled) or JSON text.
std::string task_arg(lua_State *L, int idx) {
    std::string task;
    if (lua_type(L, idx) == LUA_TSTRING) {
        task = lua_tostring(L, idx);
    } else if (lua_istable(L, idx)) {
        push_task_texts(L);
        lua_pushvalue(L, idx);
        lua_rawget(L, -2);
        task = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : to_json(L, idx, "task");
        lua_pop(L, 2);
    } else {
        arg_error(L, idx,
                  std::string("task (a table from env:sample or JSON text) expected, got ") +
                      luaL_typename(L, idx));
    }
    return task;
}

int env_score(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kEnvMT)->ptr);
    const std::string task = task_arg(L, 2);
    size_t clen = 0;
    const char *completion = luaL_checklstring(L, 3, &clen);
    call_and_push(L, "env:score", [&](rl_result_t **res) {
        return rl_env_score(inst, rl_string_view_t{task.data(), task.size()},
                            rl_string_view_t{completion, clen}, res);
    });
    lua_getfield(L, -1, "reward");
    lua_getfield(L, -2, "metrics");
    return 2;
}

// env:multi_turn() -> true when the env has a step() (multi-turn episodes)
int env_multi_turn(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kEnvMT)->ptr);
    rl_result_t *res = nullptr;
    check_status(L, rl_instance_params(inst, &res), "env:multi_turn");
    double v = 0;
    const rl_status_t st = rl_result_scalar(res, "multi_turn", &v);
    rl_result_destroy(res);
    check_status(L, st, "env:multi_turn");
    lua_pushboolean(L, v != 0);
    return 1;
}

// env:step(task, state, completion) -> {done, reward, observation, role, state, metrics}:
// one step of a multi-turn episode (state: JSON text, "null" on the first turn).
int env_step(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kEnvMT)->ptr);
    const std::string task = task_arg(L, 2);
    size_t slen = 0, clen = 0;
    const char *state = luaL_checklstring(L, 3, &slen);
    const char *completion = luaL_checklstring(L, 4, &clen);
    call_and_push(L, "env:step", [&](rl_result_t **res) {
        return rl_env_step(inst, rl_string_view_t{task.data(), task.size()},
                           rl_string_view_t{state, slen}, rl_string_view_t{completion, clen}, res);
    });
    return 1;
}

// ---- transport ------------------------------------------------------------------------

// transport:send([header table or JSON text [, {name = rl.tensor, ...}]])
int transport_send(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kTransportMT)->ptr);
    std::string header = "{}";
    if (lua_type(L, 2) == LUA_TSTRING)
        header = lua_tostring(L, 2);
    else if (!lua_isnoneornil(L, 2))
        header = to_json(L, 2, "transport:send: header");
    TensorTable tt;
    if (!lua_isnoneornil(L, 3)) read_tensor_table(L, 3, "transport:send: tensors", {}, &tt);
    const rl_tensor_list_t list = tt.list();
    check_status(L, rl_transport_send(inst, rl_string_view_t{header.data(), header.size()}, &list),
                 "transport:send");
    return 0;
}

// transport:recv([timeout_ms]) -> {header = table, <tensor name> = rl.tensor, metrics},
// or nil, "timeout" when nothing arrived in time (negative: wait without limit)
int transport_recv(lua_State *L) {
    auto *inst = static_cast<rl_instance_t *>(check_handle(L, 1, kTransportMT)->ptr);
    const lua_Integer timeout = luaL_optinteger(L, 2, -1);
    rl_result_t *res = nullptr;
    const rl_status_t st = rl_transport_recv(inst, static_cast<int64_t>(timeout), &res);
    if (st == RL_ERR_TIMEOUT) {
        lua_pushnil(L);
        lua_pushliteral(L, "timeout");
        return 2;
    }
    check_status(L, st, "transport:recv");
    static const char *const json_texts[] = {"header", nullptr};
    push_result(L, res, json_texts);
    return 1;
}

} // namespace

void open_runtime(lua_State *L, int M) {
    static const luaL_Reg runtime_methods[] = {RL_LUA_FN("load_plugin", r_load_plugin),
                                               RL_LUA_FN("plugins", r_plugins),
                                               RL_LUA_FN("loss", r_loss),
                                               RL_LUA_FN("advantage", r_advantage),
                                               RL_LUA_FN("filter", r_filter),
                                               RL_LUA_FN("env", r_env),
                                               RL_LUA_FN("transport", r_transport),
                                               RL_LUA_FN("instance", r_instance),
                                               {nullptr, nullptr}};
    define_handle_type(L, kRuntimeMT, runtime_methods);
    static const luaL_Reg loss_methods[] = {RL_LUA_FN("compute", loss_compute),
                                            RL_LUA_FN("signature", loss_signature),
                                            {nullptr, nullptr}};
    define_handle_type(L, kLossMT, loss_methods);
    static const luaL_Reg adv_methods[] = {RL_LUA_FN("compute", adv_compute), {nullptr, nullptr}};
    define_handle_type(L, kAdvantageMT, adv_methods);
    static const luaL_Reg filter_methods[] = {RL_LUA_FN("check", filter_check), {nullptr, nullptr}};
    define_handle_type(L, kFilterMT, filter_methods);
    static const luaL_Reg env_methods[] = {RL_LUA_FN("sample", env_sample),
                                           RL_LUA_FN("score", env_score),
                                           RL_LUA_FN("step", env_step),
                                           RL_LUA_FN("multi_turn", env_multi_turn),
                                           {nullptr, nullptr}};
    define_handle_type(L, kEnvMT, env_methods);
    static const luaL_Reg transport_methods[] = {
        RL_LUA_FN("send", transport_send), RL_LUA_FN("recv", transport_recv), {nullptr, nullptr}};
    define_handle_type(L, kTransportMT, transport_methods);

    lua_pushcfunction(L, guarded<r_new>);
    lua_setfield(L, M, "runtime");
}

} // namespace rl::lua
