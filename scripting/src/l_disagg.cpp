// The three-role protocol of abi/rl/disagg.h in Lua: runtime:disagg_worker,
// runtime:disagg_trainer and runtime:disagg_orchestrator (rl.disagg in
// init.lua binds them to the default runtime). docs/disaggregated.md.
#include "l_common.hpp"

#include <rl/disagg.h>

#include <string>

namespace rl::lua {
namespace {

constexpr const char *kDisaggWorkerMT = "rl.disagg_worker";
constexpr const char *kDisaggTrainerMT = "rl.disagg_trainer";

void destroy_worker(void *p) {
    rl_disagg_worker_destroy(static_cast<rl_disagg_worker_t *>(p));
}
void destroy_trainer(void *p) {
    rl_disagg_trainer_destroy(static_cast<rl_disagg_trainer_t *>(p));
}

rl_runtime_t *runtime_at(lua_State *L, int idx) {
    return static_cast<rl_runtime_t *>(check_handle(L, idx, kRuntimeMT)->ptr);
}

// runtime:disagg_worker(config, index) -> the worker end of worker `index`
int r_worker(lua_State *L) {
    rl_runtime_t *rt = runtime_at(L, 1);
    const std::string cfg = json_arg(L, 2, "runtime:disagg_worker: config");
    const lua_Integer k = luaL_checkinteger(L, 3);
    Handle *h = push_handle(L, kDisaggWorkerMT, nullptr, destroy_worker, 1);
    rl_disagg_worker_t *w = nullptr;
    check_status(L, rl_disagg_worker_create(rt, cfg.c_str(), static_cast<int64_t>(k), &w),
                 "rl.disagg.worker");
    h->ptr = w;
    return 1;
}

rl_disagg_worker_t *worker_at(lua_State *L) {
    return static_cast<rl_disagg_worker_t *>(check_handle(L, 1, kDisaggWorkerMT)->ptr);
}

// worker:hello()
int w_hello(lua_State *L) {
    check_status(L, rl_disagg_worker_hello(worker_at(L)), "worker:hello");
    return 0;
}

// worker:credit() -> {seq, min_version, done, trainer_restarted, trainer_version, worker_run}
int w_credit(lua_State *L) {
    rl_result_t *res = nullptr;
    check_status(L, rl_disagg_worker_credit(worker_at(L), &res), "worker:credit");
    ResultGuard g{res};
    lua_createtable(L, 0, 6);
    for (const char *name : {"seq", "min_version", "trainer_version"}) {
        double v = 0;
        rl_result_scalar(res, name, &v);
        lua_pushinteger(L, static_cast<lua_Integer>(v));
        lua_setfield(L, -2, name);
    }
    for (const char *name : {"done", "trainer_restarted"}) {
        double v = 0;
        rl_result_scalar(res, name, &v);
        lua_pushboolean(L, v != 0);
        lua_setfield(L, -2, name);
    }
    rl_string_view_t run{};
    rl_result_text(res, "worker_run", &run);
    lua_pushlstring(L, run.data, run.length);
    lua_setfield(L, -2, "worker_run");
    return 1;
}

// worker:send(rollouts, policy_version)
int w_send(lua_State *L) {
    rl_disagg_worker_t *w = worker_at(L);
    auto *ro = static_cast<rl_rollouts_t *>(check_handle(L, 2, kRolloutsMT)->ptr);
    const lua_Integer version = luaL_checkinteger(L, 3);
    check_status(L, rl_disagg_worker_send(w, ro, static_cast<int64_t>(version)), "worker:send");
    return 0;
}

// runtime:disagg_trainer(config) -> the trainer end
int r_trainer(lua_State *L) {
    rl_runtime_t *rt = runtime_at(L, 1);
    const std::string cfg = json_arg(L, 2, "runtime:disagg_trainer: config");
    Handle *h = push_handle(L, kDisaggTrainerMT, nullptr, destroy_trainer, 1);
    rl_disagg_trainer_t *t = nullptr;
    check_status(L, rl_disagg_trainer_create(rt, cfg.c_str(), &t), "rl.disagg.trainer");
    h->ptr = t;
    return 1;
}

rl_disagg_trainer_t *trainer_at(lua_State *L) {
    return static_cast<rl_disagg_trainer_t *>(check_handle(L, 1, kDisaggTrainerMT)->ptr);
}

// trainer:hello(version)
int t_hello(lua_State *L) {
    rl_disagg_trainer_t *t = trainer_at(L);
    check_status(L, rl_disagg_trainer_hello(t, luaL_checkinteger(L, 2)), "trainer:hello");
    return 0;
}

// trainer:ack(version)
int t_ack(lua_State *L) {
    rl_disagg_trainer_t *t = trainer_at(L);
    check_status(L, rl_disagg_trainer_ack(t, luaL_checkinteger(L, 2)), "trainer:ack");
    return 0;
}

// trainer:next(version) -> {header = table, <tensor name> = rl.tensor}: the
// batch of step `version` or a worker's request for weights (header.kind)
int t_next(lua_State *L) {
    rl_disagg_trainer_t *t = trainer_at(L);
    const lua_Integer version = luaL_checkinteger(L, 2);
    static const char *const json_texts[] = {"header", nullptr};
    return call_and_push(L, "trainer:next", json_texts, [&](rl_result_t **res) {
        return rl_disagg_trainer_next(t, static_cast<int64_t>(version), res);
    });
}

// runtime:disagg_orchestrator(config, buffer, advantage) -> its counters, once
// the trainer is done
int r_orchestrator(lua_State *L) {
    rl_runtime_t *rt = runtime_at(L, 1);
    const std::string cfg = json_arg(L, 2, "runtime:disagg_orchestrator: config");
    auto *buffer = static_cast<rl_buffer_t *>(check_handle(L, 3, "rl.buffer")->ptr);
    auto *adv = static_cast<rl_instance_t *>(check_handle(L, 4, "rl.advantage")->ptr);
    return call_and_push(L, "rl.disagg.orchestrator", [&](rl_result_t **res) {
        return rl_disagg_orchestrator_run(rt, cfg.c_str(), buffer, adv, res);
    });
}

int r_protocol(lua_State *L) {
    lua_pushinteger(L, static_cast<lua_Integer>(rl_disagg_protocol_version()));
    return 1;
}

} // namespace

void open_disagg(lua_State *L, int M) {
    static const luaL_Reg worker_methods[] = {RL_LUA_FN("hello", w_hello),
                                              RL_LUA_FN("credit", w_credit),
                                              RL_LUA_FN("send", w_send),
                                              {nullptr, nullptr}};
    define_handle_type(L, kDisaggWorkerMT, worker_methods);
    static const luaL_Reg trainer_methods[] = {RL_LUA_FN("hello", t_hello),
                                               RL_LUA_FN("next", t_next),
                                               RL_LUA_FN("ack", t_ack),
                                               {nullptr, nullptr}};
    define_handle_type(L, kDisaggTrainerMT, trainer_methods);
    // Methods of rl.runtime (its metatable exists: open_runtime ran first).
    luaL_getmetatable(L, kRuntimeMT);
    lua_getfield(L, -1, "__index");
    static const luaL_Reg runtime_methods[] = {RL_LUA_FN("disagg_worker", r_worker),
                                               RL_LUA_FN("disagg_trainer", r_trainer),
                                               RL_LUA_FN("disagg_orchestrator", r_orchestrator),
                                               {nullptr, nullptr}};
    luaL_setfuncs(L, runtime_methods, 0);
    lua_pop(L, 2);
    lua_pushcfunction(L, guarded<r_protocol>);
    lua_setfield(L, M, "disagg_protocol_version");
}

} // namespace rl::lua
