// rl.model, tokenizer, trainer, engine and buffer over abi/rl/train.h.
#include "l_common.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace rl::lua {
namespace {

void destroy_model(void *p) {
    rl_model_destroy(static_cast<rl_model_t *>(p));
}
void destroy_trainer(void *p) {
    rl_trainer_destroy(static_cast<rl_trainer_t *>(p));
}
void destroy_engine(void *p) {
    rl_engine_destroy(static_cast<rl_engine_t *>(p));
}

// ---- models ---------------------------------------------------------------------------

// rl.init_model(preset, dir [, seed])
int m_init_preset(lua_State *L) {
    const char *preset = luaL_checkstring(L, 1);
    const char *dir = luaL_checkstring(L, 2);
    const lua_Integer seed = luaL_optinteger(L, 3, 0);
    luaL_argcheck(L, seed >= 0, 3, "seed must be >= 0");
    check_status(L, rl_model_init_preset(preset, dir, static_cast<uint64_t>(seed)),
                 "rl.init_model");
    return 0;
}

// rl.model(path [, {threads = 0}])
int m_load(lua_State *L) {
    const std::string path = luaL_checkstring(L, 1);
    const std::string opts = json_arg(L, 2, "options");
    Handle *h = push_handle(L, kModelMT, nullptr, destroy_model, 0);
    const size_t slash = path.find_last_of('/', path.size() > 1 ? path.size() - 2 : 0);
    std::snprintf(h->name, sizeof(h->name), "%s",
                  (slash == std::string::npos ? path : path.substr(slash + 1)).c_str());
    rl_model_t *m = nullptr;
    const std::string what = "rl.model('" + path + "')";
    check_status(L, rl_model_load(path.c_str(), opts.c_str(), &m), what.c_str());
    h->ptr = m;
    return 1;
}

int m_info(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    rl_result_t *res = nullptr;
    check_status(L, rl_model_info(m, &res), "model:info");
    return push_json_field(L, res, "info");
}

int m_save(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    check_status(L, rl_model_save(m, luaL_checkstring(L, 2)), "model:save");
    return 0;
}

// LoRA adapters (docs/lora.md).
// model:create_adapter(name [, {rank, alpha, dropout, target_modules, use_rslora, seed}])
int m_create_adapter(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    const char *name = luaL_checkstring(L, 2);
    const std::string cfg = json_arg(L, 3, "model:create_adapter: lora config");
    check_status(L, rl_adapter_create(m, name, cfg.c_str()), "model:create_adapter");
    return 0;
}

// model:load_adapter / save_adapter / export_merged(name, dir): a C verb on
// an adapter and a folder.
int adapter_folder_verb(lua_State *L, rl_status_t (*verb)(rl_model_t *, const char *, const char *),
                        const char *what) {
    rl_model_t *m = model_of(L, 1);
    check_status(L, verb(m, luaL_checkstring(L, 2), luaL_checkstring(L, 3)), what);
    return 0;
}
int m_load_adapter(lua_State *L) {
    return adapter_folder_verb(L, rl_adapter_load, "model:load_adapter");
}
int m_save_adapter(lua_State *L) {
    return adapter_folder_verb(L, rl_adapter_save, "model:save_adapter");
}
int m_export_merged(lua_State *L) {
    return adapter_folder_verb(L, rl_adapter_export_merged, "model:export_merged");
}

// model:remove_adapter(name)
int m_remove_adapter(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    check_status(L, rl_adapter_remove(m, luaL_checkstring(L, 2)), "model:remove_adapter");
    return 0;
}

// model:adapter_info([name]) -> table: the adapter's info, or the list of names
int m_adapter_info(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    const char *name = luaL_optstring(L, 2, nullptr);
    static const char *const texts[] = {"info", "adapters", nullptr};
    call_and_push(L, "model:adapter_info", texts,
                  [&](rl_result_t **res) { return rl_adapter_info(m, name, res); });
    lua_getfield(L, -1, name ? "info" : "adapters");
    return 1;
}

// model:send_weights(transport, version [, {retries, dtype}]) -> {metrics}
int m_send_weights(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    rl_instance_t *tx = nullptr;
    if (!lua_isnil(L, 2))
        tx = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.transport")->ptr);
    const lua_Integer version = luaL_checkinteger(L, 3);
    const std::string opts = json_arg(L, 4, "model:send_weights: options");
    return call_and_push(L, "model:send_weights", [&](rl_result_t **res) {
        return rl_weights_send(m, tx, static_cast<int64_t>(version),
                               opts.empty() ? nullptr : opts.c_str(), res);
    });
}

// model:recv_weights(transport [, timeout_ms [, {retries, newer_than}]]) -> {version, metrics},
// or nil, "timeout" when no newer weights came in time
int m_recv_weights(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    auto *tx = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.transport")->ptr);
    const lua_Integer timeout = luaL_optinteger(L, 3, -1);
    const std::string opts = json_arg(L, 4, "model:recv_weights: options");
    rl_result_t *res = nullptr;
    const rl_status_t st = rl_weights_recv(m, tx, static_cast<int64_t>(timeout),
                                           opts.empty() ? nullptr : opts.c_str(), &res);
    if (st == RL_ERR_TIMEOUT) {
        lua_pushnil(L);
        lua_pushliteral(L, "timeout");
        return 2;
    }
    check_status(L, st, "model:recv_weights");
    push_result(L, res);
    return 1;
}

// x:encode(text [, {add_special = false, plain_text = false}]) -> int64 tensor;
// plain_text: special-token text in `text` stays text (RL_ENCODE_PLAIN_TEXT)
int m_encode(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    size_t len = 0;
    const char *text = luaL_checklstring(L, 2, &len);
    const bool special = opt_bool_field(L, 3, "add_special", false);
    const bool plain = opt_bool_field(L, 3, "plain_text", false);
    const uint32_t flags = (special ? static_cast<uint32_t>(RL_ENCODE_ADD_SPECIAL) : 0u) |
                           (plain ? static_cast<uint32_t>(RL_ENCODE_PLAIN_TEXT) : 0u);
    call_and_push(L, "tokenizer:encode", [&](rl_result_t **res) {
        return rl_tokenizer_encode(m, rl_string_view_t{text, len}, flags, res);
    });
    lua_getfield(L, -1, "ids");
    return 1;
}

// x:decode(ids [, {skip_special_tokens = false}]) -> string
int m_decode(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    const rl_tensor_view_t v = to_view(L, 2, kInt64, DtypeRule::Exact, "tokenizer:decode: ids");
    const bool skip = opt_bool_field(L, 3, "skip_special_tokens", false);
    call_and_push(L, "tokenizer:decode", [&](rl_result_t **res) {
        return rl_tokenizer_decode_v2(
            m, static_cast<const int64_t *>(v.data), static_cast<uint64_t>(v.shape[0]),
            skip ? static_cast<uint32_t>(RL_DECODE_SKIP_SPECIAL) : 0u, res);
    });
    lua_getfield(L, -1, "text");
    return 1;
}

// x:apply_chat_template(messages [, {template = "model", add_generation_prompt = true,
//                                    tools = nil, chat_template_kwargs = nil}]) -> string
int m_chat(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const std::string messages = to_json(L, 2, "messages");
    const std::string opts = json_arg(L, 3, "tokenizer:apply_chat_template: options");
    call_and_push(L, "tokenizer:apply_chat_template", [&](rl_result_t **res) {
        return rl_tokenizer_render_chat(m, messages.c_str(), opts.c_str(), res);
    });
    lua_getfield(L, -1, "prompt");
    return 1;
}

// x:encode_chat(messages [, {template = nil, add_generation_prompt = true,
// plain_text = true}]) -> ids (int64 tensor), prompt (string); plain_text
// keeps special-token text inside the contents plain
int m_encode_chat(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const std::string messages = to_json(L, 2, "messages");
    const std::string tmpl = opt_string_field(L, 3, "template", "");
    const bool gen = opt_bool_field(L, 3, "add_generation_prompt", true);
    const bool plain = opt_bool_field(L, 3, "plain_text", true);
    call_and_push(L, "tokenizer:encode_chat", [&](rl_result_t **res) {
        return rl_tokenizer_encode_chat(
            m, messages.c_str(), tmpl.empty() ? nullptr : tmpl.c_str(), gen ? 1u : 0u,
            plain ? static_cast<uint32_t>(RL_ENCODE_PLAIN_TEXT) : 0u, res);
    });
    lua_getfield(L, -1, "ids");
    lua_getfield(L, -2, "prompt");
    return 2;
}

int m_tokenizer(lua_State *L) {
    Handle *model = check_handle(L, 1, kModelMT);
    Handle *h = push_handle(L, kTokenizerMT, model->ptr, nullptr, 1);
    std::snprintf(h->name, sizeof(h->name), "%s", model->name);
    return 1;
}

// rl.tokenizer(dir) -> rl.tokenizer without a model (rl_tokenizer_load)
int m_tokenizer_load(lua_State *L) {
    const std::string dir = luaL_checkstring(L, 1);
    Handle *h = push_handle(L, kTokenizerMT, nullptr, destroy_model, 0);
    const size_t slash = dir.find_last_of('/', dir.size() > 1 ? dir.size() - 2 : 0);
    std::snprintf(h->name, sizeof(h->name), "%s",
                  (slash == std::string::npos ? dir : dir.substr(slash + 1)).c_str());
    rl_model_t *m = nullptr;
    const std::string what = "rl.tokenizer('" + dir + "')";
    check_status(L, rl_tokenizer_load(dir.c_str(), &m), what.c_str());
    h->ptr = m;
    return 1;
}

// ---- distributed runs -------------------------------------------------------------

// (rank, world size) of this process (0, 1 without a distributed launch).
std::pair<int, int> rank_and_world(lua_State *L) {
    rl_result_t *res = nullptr;
    check_status(L, rl_dist_info(&res), "rl.dist");
    double rank = 0, world = 1;
    rl_result_scalar(res, "rank", &rank);
    rl_result_scalar(res, "world_size", &world);
    rl_result_destroy(res);
    return {static_cast<int>(rank), static_cast<int>(world)};
}

// In a distributed run the task list is the whole step's: this rank keeps its
// contiguous share (n * r / W .. n * (r + 1) / W), unless the options say
// {share = false}. The "share" key is removed from `opts`.
std::string rank_share(lua_State *L, const std::string &tasks, std::string &opts,
                       const char *what) {
    bool share = true;
    if (!opts.empty()) {
        nlohmann::json o = nlohmann::json::parse(opts, nullptr, false);
        if (o.is_object() && o.contains("share")) {
            if (!o["share"].is_boolean())
                luaL_error(L, "%s: option 'share' must be a boolean", what);
            share = o["share"].get<bool>();
            o.erase("share");
            opts = o.dump();
        }
    }
    if (!share) return tasks;
    const auto [rank, world] = rank_and_world(L);
    if (world <= 1) return tasks;
    nlohmann::json all = nlohmann::json::parse(tasks, nullptr, false);
    if (!all.is_array()) return tasks; // the C API reports the error
    const size_t n = all.size();
    if (n < static_cast<size_t>(world))
        luaL_error(L,
                   "%s: %d task(s) for %d ranks; each rank needs at least one (sample at least "
                   "as many tasks per step as there are ranks, or pass {share = false})",
                   what, static_cast<int>(n), world);
    const size_t a = n * static_cast<size_t>(rank) / static_cast<size_t>(world);
    const size_t b = n * static_cast<size_t>(rank + 1) / static_cast<size_t>(world);
    return nlohmann::json(std::vector<nlohmann::json>(all.begin() + static_cast<long>(a),
                                                      all.begin() + static_cast<long>(b)))
        .dump();
}

// rl.dist_init([dist config [, device]]) -> {rank, world_size, ...}
int d_init(lua_State *L) {
    const std::string cfg = lua_isnoneornil(L, 1) ? "" : json_arg(L, 1, "rl.dist.init: config");
    const char *device = luaL_optstring(L, 2, nullptr);
    return call_and_push(L, "rl.dist.init", [&](rl_result_t **res) {
        return rl_dist_init(cfg.empty() ? nullptr : cfg.c_str(), device, res);
    });
}

int d_info(lua_State *L) {
    return call_and_push(L, "rl.dist.info", [&](rl_result_t **res) { return rl_dist_info(res); });
}

int d_barrier(lua_State *L) {
    check_status(L, rl_dist_barrier(), "rl.dist.barrier");
    return 0;
}

// rl.dist_broadcast_text(text, root) -> text
int d_broadcast(lua_State *L) {
    size_t len = 0;
    const char *text = luaL_checklstring(L, 1, &len);
    const lua_Integer root = luaL_checkinteger(L, 2);
    rl_result_t *res = nullptr;
    check_status(L,
                 rl_dist_broadcast(rl_string_view_t{text, static_cast<uint64_t>(len)},
                                   static_cast<int32_t>(root), &res),
                 "rl.dist.broadcast");
    rl_string_view_t v{};
    rl_result_text(res, "value", &v);
    lua_pushlstring(L, v.data, static_cast<size_t>(v.length));
    rl_result_destroy(res);
    return 1;
}

// rl.dist_all_gather_text(text) -> {text of rank 0, text of rank 1, ...}
int d_all_gather(lua_State *L) {
    size_t len = 0;
    const char *text = luaL_checklstring(L, 1, &len);
    rl_result_t *res = nullptr;
    check_status(L, rl_dist_all_gather(rl_string_view_t{text, static_cast<uint64_t>(len)}, &res),
                 "rl.dist.all_gather");
    double world = 1;
    rl_result_scalar(res, "world_size", &world);
    lua_createtable(L, static_cast<int>(world), 0);
    for (int r = 0; r < static_cast<int>(world); ++r) {
        rl_string_view_t v{};
        rl_result_text(res, std::to_string(r).c_str(), &v);
        lua_pushlstring(L, v.data, static_cast<size_t>(v.length));
        lua_rawseti(L, -2, r + 1);
    }
    rl_result_destroy(res);
    return 1;
}

// x:sft_batch(tasks [, {chat_template, eos_token_id, share}]) -> rl.train_batch:
// the supervised batch on the tasks' reference answers (this rank's share in
// a distributed run)
int m_sft_batch(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    std::string opts = json_arg(L, 3, "sft_batch: options");
    const std::string tasks = rank_share(L, json_arg(L, 2, "sft_batch: tasks"), opts, "sft_batch");
    Handle *h = push_handle(L, kTrainBatchMT, nullptr, destroy_train_batch, 0);
    rl_train_batch_t *b = nullptr;
    check_status(L, rl_train_batch_supervised(m, tasks.c_str(), opts.c_str(), &b), "sft_batch");
    h->ptr = b;
    return 1;
}

// model:sft_episodes_batch(env, tasks [, options]) -> rl.train_batch: the tasks'
// reference episodes (metadata.reference_turns) played against `env`.
int m_sft_episodes_batch(lua_State *L) {
    rl_model_t *m = model_of(L, 1);
    auto *env = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.env")->ptr);
    std::string opts = json_arg(L, 4, "sft_episodes_batch: options");
    const std::string tasks =
        rank_share(L, json_arg(L, 3, "sft_episodes_batch: tasks"), opts, "sft_episodes_batch");
    Handle *h = push_handle(L, kTrainBatchMT, nullptr, destroy_train_batch, 0);
    rl_train_batch_t *b = nullptr;
    check_status(L, rl_train_batch_supervised_episodes(m, env, tasks.c_str(), opts.c_str(), &b),
                 "sft_episodes_batch");
    h->ptr = b;
    return 1;
}

// model:trainer([config]) -> rl.trainer
int m_trainer(lua_State *L) {
    Handle *model = check_handle(L, 1, kModelMT);
    const std::string cfg = json_arg(L, 2, "trainer config");
    Handle *h = push_handle(L, kTrainerMT, nullptr, destroy_trainer, 1);
    rl_trainer_t *t = nullptr;
    check_status(L, rl_trainer_create(static_cast<rl_model_t *>(model->ptr), cfg.c_str(), &t),
                 "model:trainer");
    h->ptr = t;
    return 1;
}

// model:engine([config]) -> rl.engine
int m_engine(lua_State *L) {
    Handle *model = check_handle(L, 1, kModelMT);
    const std::string cfg = json_arg(L, 2, "engine config");
    Handle *h = push_handle(L, kEngineMT, nullptr, destroy_engine, 1);
    rl_engine_t *e = nullptr;
    check_status(L, rl_engine_create(static_cast<rl_model_t *>(model->ptr), cfg.c_str(), &e),
                 "model:engine");
    h->ptr = e;
    return 1;
}

// ---- trainer --------------------------------------------------------------------------

rl_trainer_t *trainer_of(lua_State *L) {
    return static_cast<rl_trainer_t *>(check_handle(L, 1, kTrainerMT)->ptr);
}

// Reads the batch at idx (an rl.train_batch, or a table of tensors with an
// optional number sampling_temperature) into *b; views borrow the batch or
// values pushed on the stack.
void read_batch(lua_State *L, int idx, const char *what, rl_batch_t *b, TensorTable *tt) {
    if (luaL_testudata(L, idx, kTrainBatchMT)) {
        *b = rl_batch_t{};
        b->struct_size = sizeof(*b);
        auto *tb = static_cast<rl_train_batch_t *>(check_handle(L, idx, kTrainBatchMT)->ptr);
        check_status(L, rl_train_batch_view(tb, b), what);
        return;
    }
    if (!lua_istable(L, idx))
        arg_error(L, idx,
                  std::string("batch (a table of tensors) expected, got ") + luaL_typename(L, idx));
    *b = rl_batch_t{};
    b->struct_size = sizeof(*b);
    table_field_view(L, idx, "input_ids", what, true, &b->input_ids);
    table_field_view(L, idx, "cu_seqlens", what, true, &b->cu_seqlens);
    lua_getfield(L, idx, "sampling_temperature");
    if (!lua_isnil(L, -1)) {
        if (!lua_isnumber(L, -1))
            luaL_error(L, "%s: sampling_temperature must be a number (0: greedy), got %s", what,
                       luaL_typename(L, -1));
        b->flags = RL_BATCH_HAS_SAMPLING_TEMPERATURE;
        b->sampling_temperature = static_cast<double>(lua_tonumber(L, -1));
    }
    lua_pop(L, 1);
    read_tensor_table(L, idx, what, {"input_ids", "cu_seqlens", "sampling_temperature"}, tt);
    b->tensors = tt->list();
}

rl_instance_t *loss_arg(lua_State *L, int idx, bool optional) {
    if (optional && lua_isnoneornil(L, idx)) return nullptr;
    return static_cast<rl_instance_t *>(check_handle(L, idx, "rl.loss")->ptr);
}

// trainer:forward_backward(batch, loss) -> {loss, tokens, seqs, metrics, ...}
int t_forward_backward(lua_State *L) {
    rl_trainer_t *t = trainer_of(L);
    rl_instance_t *loss = loss_arg(L, 3, false);
    rl_batch_t b;
    TensorTable tt;
    read_batch(L, 2, "trainer:forward_backward: batch", &b, &tt);
    return call_and_push(L, "trainer:forward_backward", [&](rl_result_t **res) {
        return rl_trainer_forward_backward(t, &b, loss, res);
    });
}

// trainer:forward(batch [, loss]) -> {logprobs, entropy, ...}
int t_forward(lua_State *L) {
    rl_trainer_t *t = trainer_of(L);
    rl_instance_t *loss = loss_arg(L, 3, true);
    rl_batch_t b;
    TensorTable tt;
    read_batch(L, 2, "trainer:forward: batch", &b, &tt);
    return call_and_push(L, "trainer:forward",
                         [&](rl_result_t **res) { return rl_trainer_forward(t, &b, loss, res); });
}

// trainer:optim_step([{learning_rate = ..., gradient_clip = ...}])
int t_optim_step(lua_State *L) {
    rl_trainer_t *t = trainer_of(L);
    const std::string params = json_arg(L, 2, "optimizer parameters");
    return call_and_push(L, "trainer:optim_step", [&](rl_result_t **res) {
        return rl_trainer_optim_step(t, params.c_str(), res);
    });
}

// trainer:save_checkpoint(dir [, state]) -> path
int t_save_checkpoint(lua_State *L) {
    rl_trainer_t *t = trainer_of(L);
    const char *dir = luaL_checkstring(L, 2);
    const std::string state = json_arg(L, 3, "state");
    call_and_push(L, "trainer:save_checkpoint", [&](rl_result_t **res) {
        return rl_trainer_save_checkpoint(t, dir, state.c_str(), res);
    });
    lua_getfield(L, -1, "path");
    return 1;
}

// trainer:load_checkpoint(dir) -> nil (none) | {state, step, path}
int t_load_checkpoint(lua_State *L) {
    rl_trainer_t *t = trainer_of(L);
    const char *dir = luaL_checkstring(L, 2);
    rl_result_t *res = nullptr;
    const rl_status_t st = rl_trainer_load_checkpoint(t, dir, &res);
    if (st == RL_ERR_NOT_FOUND) {
        lua_pushnil(L);
        return 1;
    }
    check_status(L, st, "trainer:load_checkpoint");
    static const char *const texts[] = {"state", nullptr};
    push_result(L, res, texts);
    return 1;
}

// ---- engine ----------------------------------------------------------------------------

rl_engine_t *engine_of(lua_State *L) {
    return static_cast<rl_engine_t *>(check_handle(L, 1, kEngineMT)->ptr);
}

// engine:generate(prompts, params): prompts is a list of token-id tensors
// (or tables), or {ids = ..., cu_seqlens = ...} with the prompts back to back.
int e_generate(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    const std::string params = json_arg(L, 3, "generation parameters");
    rl_tensor_view_t ids{}, cu{};
    lua_getfield(L, 2, "ids");
    const bool packed = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (packed) {
        lua_getfield(L, 2, "ids");
        ids = to_view(L, -1, kInt64, DtypeRule::Exact, "engine:generate: prompts.ids");
        table_field_view(L, 2, "cu_seqlens", "engine:generate: prompts", true, &cu);
    } else {
        const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, 2));
        TensorHeader *offsets = push_tensor(L, kInt64, n + 1);
        auto *off = static_cast<int64_t *>(offsets->data());
        off[0] = 0;
        std::vector<rl_tensor_view_t> parts;
        for (lua_Integer i = 1; i <= n; ++i) {
            lua_rawgeti(L, 2, i);
            const std::string what = "engine:generate: prompts[" + std::to_string(i) + "]";
            parts.push_back(to_view(L, lua_gettop(L), kInt64, DtypeRule::Exact, what));
            off[i] = off[i - 1] + parts.back().shape[0];
        }
        TensorHeader *all = push_tensor(L, kInt64, off[n]);
        auto *dst = static_cast<int64_t *>(all->data());
        for (lua_Integer i = 0; i < n; ++i)
            if (parts[static_cast<size_t>(i)].shape[0] > 0)
                std::memcpy(dst + off[i], parts[static_cast<size_t>(i)].data,
                            static_cast<size_t>(off[i + 1] - off[i]) * sizeof(int64_t));
        ids = tensor_view(all);
        cu = tensor_view(offsets);
    }
    static const char *const texts[] = {"completions", "finish_reasons", nullptr};
    return call_and_push(L, "engine:generate", texts, [&](rl_result_t **res) {
        return rl_engine_generate(e, &ids, &cu, params.c_str(), res);
    });
}

// engine:sync_weights([buffer]) -> policy version; the buffer (when given)
// learns it in the same call.
int e_sync_weights(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    rl_buffer_t *b = nullptr;
    if (!lua_isnoneornil(L, 2))
        b = static_cast<rl_buffer_t *>(check_handle(L, 2, "rl.buffer")->ptr);
    call_and_push(L, "engine:sync_weights",
                  [&](rl_result_t **res) { return rl_sync_weights(e, b, res); });
    lua_getfield(L, -1, "policy_version");
    return 1;
}

// engine:rollouts(tasks [, {chat_template, group_offset, sampling}]) -> rl.rollouts
int e_rollouts(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    std::string opts = json_arg(L, 3, "engine:rollouts: options");
    const std::string tasks =
        rank_share(L, json_arg(L, 2, "engine:rollouts: tasks"), opts, "engine:rollouts");
    Handle *h = push_handle(L, kRolloutsMT, nullptr, destroy_rollouts, 0);
    rl_rollouts_t *r = nullptr;
    check_status(L, rl_rollouts_generate(e, tasks.c_str(), opts.c_str(), &r), "engine:rollouts");
    h->ptr = r;
    return 1;
}

// engine:episodes(env, tasks [, {chat_template, group_offset, sampling, max_turns,
// max_context}]) -> rl.rollouts: multi-turn episodes, each answered by `env`.
int e_episodes(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    auto *env = static_cast<rl_instance_t *>(check_handle(L, 2, "rl.env")->ptr);
    std::string opts = json_arg(L, 4, "engine:episodes: options");
    const std::string tasks =
        rank_share(L, json_arg(L, 3, "engine:episodes: tasks"), opts, "engine:episodes");
    Handle *h = push_handle(L, kRolloutsMT, nullptr, destroy_rollouts, 0);
    rl_rollouts_t *r = nullptr;
    check_status(L, rl_rollouts_generate_episodes(e, env, tasks.c_str(), opts.c_str(), &r),
                 "engine:episodes");
    h->ptr = r;
    return 1;
}

int e_sleep(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    check_status(L, rl_engine_sleep(e), "engine:sleep");
    return 0;
}

int e_wake_up(lua_State *L) {
    rl_engine_t *e = engine_of(L);
    check_status(L, rl_engine_wake_up(e), "engine:wake_up");
    return 0;
}

} // namespace

rl_model_t *model_of(lua_State *L, int idx) {
    if (luaL_testudata(L, idx, kTokenizerMT))
        return static_cast<rl_model_t *>(check_handle(L, idx, kTokenizerMT)->ptr);
    return static_cast<rl_model_t *>(check_handle(L, idx, kModelMT)->ptr);
}

void open_train(lua_State *L, int M) {
    // A tokenizer's methods; a model has them all, and more.
    static const luaL_Reg tokenizer_methods[] = {
        RL_LUA_FN("encode", m_encode),
        RL_LUA_FN("decode", m_decode),
        RL_LUA_FN("apply_chat_template", m_chat),
        RL_LUA_FN("encode_chat", m_encode_chat),
        RL_LUA_FN("sft_batch", m_sft_batch),
        RL_LUA_FN("sft_episodes_batch", m_sft_episodes_batch),
        RL_LUA_FN("info", m_info),
        {nullptr, nullptr}};
    define_handle_type(L, kTokenizerMT, tokenizer_methods);
    static const luaL_Reg model_methods[] = {RL_LUA_FN("save", m_save),
                                             RL_LUA_FN("tokenizer", m_tokenizer),
                                             RL_LUA_FN("trainer", m_trainer),
                                             RL_LUA_FN("engine", m_engine),
                                             RL_LUA_FN("send_weights", m_send_weights),
                                             RL_LUA_FN("recv_weights", m_recv_weights),
                                             RL_LUA_FN("create_adapter", m_create_adapter),
                                             RL_LUA_FN("load_adapter", m_load_adapter),
                                             RL_LUA_FN("save_adapter", m_save_adapter),
                                             RL_LUA_FN("export_merged", m_export_merged),
                                             RL_LUA_FN("remove_adapter", m_remove_adapter),
                                             RL_LUA_FN("adapter_info", m_adapter_info),
                                             {nullptr, nullptr}};
    define_handle_type(L, kModelMT, model_methods);
    luaL_getmetatable(L, kModelMT);
    lua_getfield(L, -1, "__index");
    luaL_setfuncs(L, tokenizer_methods, 0);
    lua_pop(L, 2);
    static const luaL_Reg trainer_methods[] = {RL_LUA_FN("forward_backward", t_forward_backward),
                                               RL_LUA_FN("forward", t_forward),
                                               RL_LUA_FN("optim_step", t_optim_step),
                                               RL_LUA_FN("save_checkpoint", t_save_checkpoint),
                                               RL_LUA_FN("load_checkpoint", t_load_checkpoint),
                                               {nullptr, nullptr}};
    define_handle_type(L, kTrainerMT, trainer_methods);
    static const luaL_Reg engine_methods[] = {RL_LUA_FN("generate", e_generate),
                                              RL_LUA_FN("sync_weights", e_sync_weights),
                                              RL_LUA_FN("episodes", e_episodes),
                                              RL_LUA_FN("rollouts", e_rollouts),
                                              RL_LUA_FN("sleep", e_sleep),
                                              RL_LUA_FN("wake_up", e_wake_up),
                                              {nullptr, nullptr}};
    define_handle_type(L, kEngineMT, engine_methods);

    static const luaL_Reg fns[] = {RL_LUA_FN("model", m_load),
                                   RL_LUA_FN("tokenizer", m_tokenizer_load),
                                   RL_LUA_FN("init_model", m_init_preset),
                                   RL_LUA_FN("dist_init", d_init),
                                   RL_LUA_FN("dist_info", d_info),
                                   RL_LUA_FN("dist_barrier", d_barrier),
                                   RL_LUA_FN("dist_broadcast_text", d_broadcast),
                                   RL_LUA_FN("dist_all_gather_text", d_all_gather),
                                   {nullptr, nullptr}};
    lua_pushvalue(L, M);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

} // namespace rl::lua
