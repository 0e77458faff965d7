// JSON <-> Lua for parameters, configs, tasks and results; rl.json for scripts.
#include "l_common.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

namespace rl::lua {
namespace {

using json = nlohmann::json;

// Registry keys (addresses of these statics).
char kNullKey = 0;
char kArrayMtKey = 0;

constexpr int kMaxDepth = 64;
// The deepest JSON text rl.json.decode (and every result read into Lua)
// takes: the runtime's own limit for JSON from outside (docs/reliability.md).
constexpr int kMaxDecodeDepth = 128;

std::string path_join(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
}

json to_json_value(lua_State *L, int idx, const std::string &path, int depth);

// True when the table at idx holds exactly the keys 1..n (n >= 1), or is
// empty and carries the array marker.
bool table_is_array(lua_State *L, int idx, lua_Integer *n_out) {
    const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, idx));
    lua_Integer count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        ++count;
        if (!lua_isinteger(L, -1)) {
            lua_pop(L, 1);
            *n_out = 0;
            return false;
        }
    }
    *n_out = n;
    if (count == 0) {
        if (!lua_getmetatable(L, idx)) return false;
        lua_rawgetp(L, LUA_REGISTRYINDEX, &kArrayMtKey);
        const bool marked = lua_rawequal(L, -1, -2);
        lua_pop(L, 2);
        return marked;
    }
    return count == n;
}

json to_json_value(lua_State *L, int idx, const std::string &path, int depth) {
    idx = lua_absindex(L, idx);
    const std::string where = path.empty() ? "value" : "'" + path + "'";
    if (depth > kMaxDepth)
        luaL_error(L, "the value is nested more than %d levels deep (a cycle?)", kMaxDepth);
    switch (lua_type(L, idx)) {
        case LUA_TNIL:
            return nullptr;
        case LUA_TBOOLEAN:
            return lua_toboolean(L, idx) != 0;
        case LUA_TNUMBER:
            if (lua_isinteger(L, idx)) return static_cast<int64_t>(lua_tointeger(L, idx));
            {
                const double v = lua_tonumber(L, idx);
                if (!std::isfinite(v))
                    luaL_error(L, "%s is %f, which JSON cannot hold", where.c_str(), v);
                return v;
            }
        case LUA_TSTRING: {
            size_t len = 0;
            const char *s = lua_tolstring(L, idx, &len);
            return std::string(s, len);
        }
        case LUA_TLIGHTUSERDATA:
            if (is_null(L, idx)) return nullptr;
            break;
        case LUA_TUSERDATA:
            if (TensorHeader *t = test_tensor(L, idx)) {
                json a = json::array();
                for (int64_t i = 0; i < t->n; ++i) {
                    if (dtype_is_integer(t->dtype))
                        a.push_back(tensor_get_int(t, i));
                    else
                        a.push_back(tensor_get(t, i));
                }
                return a;
            }
            break;
        case LUA_TTABLE: {
            luaL_checkstack(L, 4, "rl.json: stack overflow");
            lua_Integer n = 0;
            if (table_is_array(L, idx, &n)) {
                json a = json::array();
                for (lua_Integer i = 1; i <= n; ++i) {
                    lua_rawgeti(L, idx, i);
                    a.push_back(
                        to_json_value(L, -1, path + "[" + std::to_string(i) + "]", depth + 1));
                    lua_pop(L, 1);
                }
                return a;
            }
            json o = json::object();
            lua_pushnil(L);
            while (lua_next(L, idx)) {
                if (lua_type(L, -2) != LUA_TSTRING) {
                    lua_pushvalue(L, -2);
                    const std::string key = luaL_tolstring(L, -1, nullptr);
                    luaL_error(L, "%s has a non-string key (%s) and is not a list", where.c_str(),
                               key.c_str());
                }
                size_t len = 0;
                const char *k = lua_tolstring(L, -2, &len);
                const std::string key(k, len);
                o[key] = to_json_value(L, -1, path_join(path, key), depth + 1);
                lua_pop(L, 1);
            }
            return o;
        }
        default:
            break;
    }
    luaL_error(L, "%s is a %s, which cannot be written as JSON", where.c_str(),
               luaL_typename(L, idx));
    return nullptr;
}

void push_json_value(lua_State *L, const json &j) {
    luaL_checkstack(L, 3, "rl.json: document nested too deeply");
    switch (j.type()) {
        case json::value_t::null:
            push_null(L);
            return;
        case json::value_t::boolean:
            lua_pushboolean(L, j.get<bool>());
            return;
        case json::value_t::number_integer:
            lua_pushinteger(L, static_cast<lua_Integer>(j.get<int64_t>()));
            return;
        case json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u <= static_cast<uint64_t>(INT64_MAX))
                lua_pushinteger(L, static_cast<lua_Integer>(u));
            else
                lua_pushnumber(L, static_cast<double>(u));
            return;
        }
        case json::value_t::number_float:
            lua_pushnumber(L, j.get<double>());
            return;
        case json::value_t::string: {
            const auto &s = j.get_ref<const std::string &>();
            lua_pushlstring(L, s.data(), s.size());
            return;
        }
        case json::value_t::array: {
            lua_createtable(L, static_cast<int>(j.size()), 0);
            lua_Integer i = 1;
            for (const auto &x : j) {
                push_json_value(L, x);
                lua_rawseti(L, -2, i++);
            }
            set_array_mt(L, -1);
            return;
        }
        case json::value_t::object: {
            lua_createtable(L, 0, static_cast<int>(j.size()));
            for (auto it = j.begin(); it != j.end(); ++it) {
                lua_pushlstring(L, it.key().data(), it.key().size());
                push_json_value(L, it.value());
                lua_rawset(L, -3);
            }
            return;
        }
        default:
            lua_pushnil(L);
    }
}

// rl.json.encode(value [, indent])
int j_encode(lua_State *L) {
    luaL_checkany(L, 1);
    const int indent = static_cast<int>(luaL_optinteger(L, 2, -1));
    const json j = to_json_value(L, 1, "", 0);
    // dump() throws on invalid UTF-8; guarded<> turns that into a Lua error.
    const std::string s = j.dump(indent);
    lua_pushlstring(L, s.data(), s.size());
    return 1;
}

// rl.json.decode(text)
int j_decode(lua_State *L) {
    size_t len = 0;
    const char *s = luaL_checklstring(L, 1, &len);
    push_json(L, std::string(s, len), "rl.json.decode");
    return 1;
}

// rl.array([table]): marks a table as a JSON array (so {} stays []).
int j_array(lua_State *L) {
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    set_array_mt(L, 1);
    return 1;
}

} // namespace

std::string to_json(lua_State *L, int idx, const std::string &what) {
    const json j = to_json_value(L, idx, "", 0);
    try {
        return j.dump();
    } catch (const json::exception &e) {
        throw std::runtime_error(what + ": " + e.what()); // invalid UTF-8 in a string
    }
}

void push_json(lua_State *L, const std::string &text, const char *what) {
    // push_json_value recurses once per level: a text nested 100,000 deep
    // would overflow the C stack, so deeper than kMaxDecodeDepth is refused.
    bool too_deep = false;
    {
        const json j = json::parse(
            text,
            [&](int depth, json::parse_event_t, json &) {
                if (depth > kMaxDecodeDepth) too_deep = true;
                return !too_deep;
            },
            false);
        if (!j.is_discarded() && !too_deep) {
            push_json_value(L, j);
            return;
        }
    } // the document is freed before luaL_error jumps out of this frame
    if (too_deep) luaL_error(L, "%s: JSON nested deeper than %d levels", what, kMaxDecodeDepth);
    luaL_error(L, "%s: invalid JSON text", what);
}

void push_null(lua_State *L) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &kNullKey);
}

bool is_null(lua_State *L, int idx) {
    if (lua_type(L, idx) != LUA_TLIGHTUSERDATA) return false;
    return lua_touserdata(L, idx) == static_cast<void *>(&kNullKey);
}

void set_array_mt(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &kArrayMtKey);
    lua_setmetatable(L, idx);
}

void open_json(lua_State *L) {
    // rl.null: a light userdata that only equals itself.
    lua_pushlightuserdata(L, static_cast<void *>(&kNullKey));
    lua_rawsetp(L, LUA_REGISTRYINDEX, &kNullKey);
    lua_newtable(L);
    lua_pushliteral(L, "rl.array");
    lua_setfield(L, -2, "__name");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &kArrayMtKey);

    static const luaL_Reg fns[] = {
        RL_LUA_FN("encode", j_encode), RL_LUA_FN("decode", j_decode), {nullptr, nullptr}};
    luaL_newlib(L, fns);
    push_null(L);
    lua_setfield(L, -2, "null");
    lua_pushcfunction(L, guarded<j_array>);
    lua_setfield(L, -2, "array");
}

} // namespace rl::lua
