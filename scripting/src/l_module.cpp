// The `rl` module: handles, results, option helpers and luaopen_rl.
#include "l_common.hpp"
#include "rl/lua.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <new>

namespace rl::lua {

// Embedded pure-Lua parts (generated from scripting/lua/rl/*.lua).
struct EmbeddedFile {
    const char *module; // "rl.run"
    const char *chunk;  // "@scripting/lua/rl/run.lua"
    const unsigned char *data;
    size_t size;
};
extern const EmbeddedFile kEmbeddedLua[];
extern const size_t kEmbeddedLuaCount;

// ---- errors ----------------------------------------------------------------------

void check_status(lua_State *L, rl_status_t st, const char *what) {
    if (st == RL_OK) return;
    const char *msg = rl_last_error();
    luaL_error(L, "%s: %s", what, (msg && *msg) ? msg : rl_status_name(st));
}

[[noreturn]] void arg_error(lua_State *L, int arg, const std::string &msg) {
    luaL_argerror(L, arg, msg.c_str());
    throw std::logic_error("unreachable"); // luaL_argerror never returns
}

std::string json_arg(lua_State *L, int arg, const char *what) {
    if (lua_isnoneornil(L, arg)) return "{}";
    if (lua_type(L, arg) == LUA_TSTRING) return lua_tostring(L, arg);
    if (!lua_istable(L, arg))
        arg_error(L, arg,
                  std::string(what) + " must be a table or a JSON string, got " +
                      luaL_typename(L, arg));
    return to_json(L, arg, what);
}

// ---- handles -----------------------------------------------------------------------

void Handle::close() {
    if (children) {
        std::vector<Handle *> kids;
        kids.swap(*children);
        delete children;
        children = nullptr;
        for (Handle *c : kids) {
            c->parent = nullptr;
            c->close();
        }
    }
    if (ptr && destroy) destroy(ptr);
    ptr = nullptr;
    if (parent && parent->children) {
        auto &v = *parent->children;
        v.erase(std::remove(v.begin(), v.end(), this), v.end());
    }
    parent = nullptr;
}

Handle *push_handle(lua_State *L, const char *mt, void *ptr, void (*destroy)(void *),
                    int parent_index) {
    if (parent_index) parent_index = lua_absindex(L, parent_index);
    // Reserve the children slot of the parent first, so a failing allocation
    // cannot leave a registered child without a userdata.
    Handle *parent = nullptr;
    if (parent_index) {
        parent = static_cast<Handle *>(lua_touserdata(L, parent_index));
        if (!parent->children) parent->children = new std::vector<Handle *>();
        parent->children->reserve(parent->children->size() + 1);
    }
    void *mem = lua_newuserdatauv(L, sizeof(Handle), 1);
    auto *h = new (mem) Handle();
    h->ptr = ptr;
    h->destroy = destroy;
    luaL_setmetatable(L, mt);
    if (parent) {
        lua_pushvalue(L, parent_index);
        lua_setiuservalue(L, -2, 1);
        h->parent = parent;
        parent->children->push_back(h);
    }
    return h;
}

Handle *check_handle(lua_State *L, int idx, const char *mt) {
    auto *h = static_cast<Handle *>(luaL_testudata(L, idx, mt));
    if (!h) {
        const char *got = luaL_typename(L, idx);
        if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) got = lua_tostring(L, -1);
        luaL_argerror(L, idx, lua_pushfstring(L, "%s expected, got %s", mt, got));
    }
    if (!h->ptr) luaL_argerror(L, idx, lua_pushfstring(L, "%s is closed", mt));
    return h;
}

namespace {

int h_gc(lua_State *L) {
    // __gc and __close: the metatable guarantees the type.
    if (auto *h = static_cast<Handle *>(lua_touserdata(L, 1))) h->close();
    return 0;
}

int h_tostring(lua_State *L) {
    auto *h = static_cast<Handle *>(lua_touserdata(L, 1));
    luaL_getmetafield(L, 1, "__name");
    const char *mt = lua_tostring(L, -1);
    if (!h->ptr)
        lua_pushfstring(L, "%s (closed)", mt);
    else if (h->name[0])
        lua_pushfstring(L, "%s '%s'", mt, h->name);
    else
        lua_pushfstring(L, "%s: %p", mt, h->ptr);
    return 1;
}

int h_close(lua_State *L) {
    auto *h = static_cast<Handle *>(luaL_checkudata(L, 1, lua_tostring(L, lua_upvalueindex(1))));
    h->close();
    return 0;
}

} // namespace

void define_handle_type(lua_State *L, const char *mt, const luaL_Reg *methods) {
    luaL_newmetatable(L, mt);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_pushstring(L, mt);
    lua_pushcclosure(L, guarded<h_close>, 1);
    lua_setfield(L, -2, "close");
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, h_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, h_gc);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, guarded<h_tostring>);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
}

// ---- results -------------------------------------------------------------------------

void push_result(lua_State *L, rl_result_t *result, const char *const *json_texts) {
    ResultGuard guard{result};
    rl_string_view_t js{};
    check_status(L, rl_result_json(result, &js), "reading a result");
    const nlohmann::json j = nlohmann::json::parse(js.data, js.data + js.length, nullptr, false);
    if (j.is_discarded()) luaL_error(L, "reading a result: librl returned invalid JSON");
    lua_newtable(L);
    const int out = lua_gettop(L);
    if (j.contains("scalars"))
        for (auto it = j["scalars"].begin(); it != j["scalars"].end(); ++it) {
            double v = 0;
            check_status(L, rl_result_scalar(result, it.key().c_str(), &v), "reading a result");
            lua_pushnumber(L, v);
            lua_setfield(L, out, it.key().c_str());
        }
    lua_newtable(L);
    if (j.contains("metrics"))
        for (auto it = j["metrics"].begin(); it != j["metrics"].end(); ++it) {
            double v = 0;
            check_status(L, rl_result_metric(result, it.key().c_str(), &v), "reading a result");
            lua_pushnumber(L, v);
            lua_setfield(L, -2, it.key().c_str());
        }
    lua_setfield(L, out, "metrics");
    if (j.contains("texts"))
        for (auto it = j["texts"].begin(); it != j["texts"].end(); ++it) {
            rl_string_view_t s{};
            check_status(L, rl_result_text(result, it.key().c_str(), &s), "reading a result");
            const std::string text(s.data ? s.data : "", static_cast<size_t>(s.length));
            bool as_json = false;
            for (const char *const *n = json_texts; n && *n; ++n)
                as_json = as_json || it.key() == *n;
            if (as_json)
                push_json(L, text, ("result text '" + it.key() + "'").c_str());
            else
                lua_pushlstring(L, text.data(), text.size());
            lua_setfield(L, out, it.key().c_str());
        }
    if (j.contains("tensors"))
        for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
            rl_tensor_view_t v{};
            check_status(L, rl_result_tensor(result, it.key().c_str(), &v), "reading a result");
            const std::string what = "result tensor '" + it.key() + "'";
            push_tensor_copy(L, v, what.c_str());
            lua_setfield(L, out, it.key().c_str());
        }
}

int push_json_field(lua_State *L, rl_result_t *result, const char *name) {
    const char *const texts[] = {name, nullptr};
    push_result(L, result, texts);
    lua_getfield(L, -1, name);
    return 1;
}

// ---- option helpers -------------------------------------------------------------------

namespace {

// Pushes opts[field] (nil when opts is nil); raises when opts is not a table.
bool get_opt(lua_State *L, int idx, const char *field) {
    if (lua_isnoneornil(L, idx)) return false;
    if (!lua_istable(L, idx))
        arg_error(L, idx, std::string("options table expected, got ") + luaL_typename(L, idx));
    lua_getfield(L, idx, field);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return false;
    }
    return true;
}

[[noreturn]] void field_error(lua_State *L, int idx, const char *field, const char *want) {
    arg_error(L, idx,
              std::string("field '") + field + "' must be " + want + ", got " +
                  luaL_typename(L, -1));
}

} // namespace

bool opt_bool_field(lua_State *L, int idx, const char *field, bool def) {
    if (!get_opt(L, idx, field)) return def;
    if (!lua_isboolean(L, -1)) field_error(L, idx, field, "a boolean");
    const bool v = lua_toboolean(L, -1) != 0;
    lua_pop(L, 1);
    return v;
}

lua_Integer opt_int_field(lua_State *L, int idx, const char *field, lua_Integer def) {
    if (!get_opt(L, idx, field)) return def;
    if (!lua_isinteger(L, -1)) {
        int isnum = 0;
        const lua_Integer v = lua_tointegerx(L, -1, &isnum);
        if (!isnum || lua_type(L, -1) != LUA_TNUMBER) field_error(L, idx, field, "an integer");
        lua_pop(L, 1);
        return v;
    }
    const lua_Integer v = lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

std::string opt_string_field(lua_State *L, int idx, const char *field, const std::string &def) {
    if (!get_opt(L, idx, field)) return def;
    if (lua_type(L, -1) != LUA_TSTRING) field_error(L, idx, field, "a string");
    std::string v = lua_tostring(L, -1);
    lua_pop(L, 1);
    return v;
}

// ---- module ------------------------------------------------------------------------------

namespace {

int l_version(lua_State *L) {
    lua_pushstring(L, rl_get_version());
    for (const uint32_t v : {rl_get_abi_version(), rl_get_api_version()})
        lua_pushfstring(L, "%d.%d.%d", static_cast<int>(RL_VERSION_MAJOR(v)),
                        static_cast<int>(RL_VERSION_MINOR(v)),
                        static_cast<int>(RL_VERSION_PATCH(v)));
    return 3;
}

int load_embedded(lua_State *L) {
    const auto *f = static_cast<const EmbeddedFile *>(lua_touserdata(L, lua_upvalueindex(1)));
    if (luaL_loadbufferx(L, reinterpret_cast<const char *>(f->data), f->size, f->chunk, "t") !=
        LUA_OK)
        return lua_error(L);
    lua_pushvalue(L, 1); // module name
    lua_call(L, 1, 1);
    return 1;
}

} // namespace

} // namespace rl::lua

extern "C" int luaopen_rl(lua_State *L) {
    using namespace rl::lua;
    luaL_checkversion(L);
    lua_newtable(L);
    const int M = lua_gettop(L);

    open_tensor(L);
    lua_setfield(L, M, "tensor");
    open_json(L);
    lua_getfield(L, -1, "null");
    lua_setfield(L, M, "null");
    lua_getfield(L, -1, "array");
    lua_setfield(L, M, "array");
    lua_setfield(L, M, "json");
    lua_pushcfunction(L, guarded<l_version>);
    lua_setfield(L, M, "version");
    open_runtime(L, M);
    open_train(L, M);
    open_rollouts(L, M);
    open_system(L, M);
    open_disagg(L, M);

    // require("rl") from the helpers returns this table while it is being built.
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_pushvalue(L, M);
    lua_setfield(L, -2, "rl");
    lua_pop(L, 1);

    // The pure-Lua parts are preloaded modules "rl.<name>"; rl.init extends M.
    lua_getglobal(L, "package");
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "preload");
        if (lua_istable(L, -1)) {
            for (size_t i = 0; i < kEmbeddedLuaCount; ++i) {
                lua_pushlightuserdata(L, const_cast<EmbeddedFile *>(&kEmbeddedLua[i]));
                lua_pushcclosure(L, load_embedded, 1);
                lua_setfield(L, -2, kEmbeddedLua[i].module);
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    for (size_t i = 0; i < kEmbeddedLuaCount; ++i) {
        if (std::strcmp(kEmbeddedLua[i].module, "rl.init") != 0) continue;
        lua_pushlightuserdata(L, const_cast<EmbeddedFile *>(&kEmbeddedLua[i]));
        lua_pushcclosure(L, load_embedded, 1);
        lua_pushstring(L, "rl");
        lua_call(L, 1, 0);
    }
    lua_settop(L, M);
    return 1;
}
