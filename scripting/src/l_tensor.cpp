// rl.tensor: typed 1-d tensors owned by Lua, the currency for token ids,
// logprobs, masks and advantages between scripts and librl.
#include "l_common.hpp"

#include <cfloat>
#include <climits>
#include <cmath>
#include <string>

namespace rl::lua {

const rl_dtype_t kFloat32{RL_DTYPE_FLOAT, 32, 1};
const rl_dtype_t kFloat64{RL_DTYPE_FLOAT, 64, 1};
const rl_dtype_t kInt64{RL_DTYPE_INT, 64, 1};
const rl_dtype_t kInt32{RL_DTYPE_INT, 32, 1};
const rl_dtype_t kUInt8{RL_DTYPE_UINT, 8, 1};
const rl_dtype_t kBool{RL_DTYPE_BOOL, 8, 1};

namespace {

bool same(rl_dtype_t a, rl_dtype_t b) {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

struct DtypeName {
    const char *name;
    const rl_dtype_t *dt;
};
const DtypeName kNames[] = {{"float32", &kFloat32}, {"float64", &kFloat64}, {"int64", &kInt64},
                            {"int32", &kInt32},     {"uint8", &kUInt8},     {"bool", &kBool}};

bool is_float(rl_dtype_t dt) {
    return same(dt, kFloat32) || same(dt, kFloat64);
}

std::string dtype_list() {
    std::string s;
    for (const auto &d : kNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
    return s;
}

// 1-based Lua index -> 0-based element index, or a Lua error.
int64_t element_index(lua_State *L, TensorHeader *t, int idx) {
    int isnum = 0;
    const lua_Integer i = lua_tointegerx(L, idx, &isnum);
    if (!isnum) luaL_error(L, "rl.tensor index must be an integer, got %s", luaL_typename(L, idx));
    if (i < 1 || i > t->n)
        luaL_error(L, "rl.tensor index %I out of range (the tensor has %I elements)",
                   static_cast<LUAI_UACINT>(i), static_cast<LUAI_UACINT>(t->n));
    return static_cast<int64_t>(i - 1);
}

void push_element(lua_State *L, const TensorHeader *t, int64_t i) {
    if (same(t->dtype, kBool))
        lua_pushboolean(L, tensor_get_int(t, i) != 0);
    else if (dtype_is_integer(t->dtype))
        lua_pushinteger(L, static_cast<lua_Integer>(tensor_get_int(t, i)));
    else
        lua_pushnumber(L, tensor_get(t, i));
}

// Stores the Lua value at idx into element i, checking type and range.
// `what` names the element in errors ("values[3]").
void store_element(lua_State *L, TensorHeader *t, int64_t i, int idx, const char *what) {
    const rl_dtype_t dt = t->dtype;
    if (same(dt, kBool)) {
        if (lua_isboolean(L, idx)) {
            static_cast<uint8_t *>(t->data())[i] = lua_toboolean(L, idx) ? 1 : 0;
            return;
        }
        int isnum = 0;
        const lua_Integer v = lua_tointegerx(L, idx, &isnum);
        if (!isnum || (v != 0 && v != 1))
            luaL_error(L, "%s must be a boolean or 0/1 for a bool tensor, got %s", what,
                       lua_type(L, idx) == LUA_TNUMBER ? lua_tostring(L, idx)
                                                       : luaL_typename(L, idx));
        static_cast<uint8_t *>(t->data())[i] = static_cast<uint8_t>(v);
        return;
    }
    if (lua_type(L, idx) != LUA_TNUMBER)
        luaL_error(L, "%s must be a number, got %s", what, luaL_typename(L, idx));
    if (dtype_is_integer(dt)) {
        int isnum = 0;
        const lua_Integer v = lua_tointegerx(L, idx, &isnum);
        if (!isnum)
            luaL_error(L, "%s must be an integer (the tensor is %s), got %s", what, dtype_name(dt),
                       lua_tostring(L, idx));
        if (same(dt, kInt32) && (v < INT32_MIN || v > INT32_MAX))
            luaL_error(L, "%s (%I) does not fit in int32", what, static_cast<LUAI_UACINT>(v));
        if (same(dt, kUInt8) && (v < 0 || v > 255))
            luaL_error(L, "%s (%I) does not fit in uint8", what, static_cast<LUAI_UACINT>(v));
        if (same(dt, kInt64))
            static_cast<int64_t *>(t->data())[i] = static_cast<int64_t>(v);
        else
            tensor_set(t, i, static_cast<double>(v));
        return;
    }
    const double v = lua_tonumber(L, idx);
    if (same(dt, kFloat32) && std::isfinite(v) && std::fabs(v) > FLT_MAX)
        luaL_error(L, "%s (%g) does not fit in float32", what, v);
    tensor_set(t, i, v);
}

TensorHeader *from_table(lua_State *L, int idx, rl_dtype_t dt, const std::string &what) {
    idx = lua_absindex(L, idx);
    const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, idx));
    TensorHeader *t = push_tensor(L, dt, n);
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, idx, i);
        const std::string item = what + "[" + std::to_string(i) + "]";
        store_element(L, t, i - 1, -1, item.c_str());
        lua_pop(L, 1);
    }
    return t;
}

// Converts tensor at idx into a new tensor of dtype dt (pushed).
TensorHeader *convert(lua_State *L, int idx, rl_dtype_t dt, const std::string &what) {
    idx = lua_absindex(L, idx);
    TensorHeader *src = check_tensor(L, idx);
    TensorHeader *out = push_tensor(L, dt, src->n);
    for (int64_t i = 0; i < src->n; ++i) {
        if (dtype_is_integer(dt) && !dtype_is_integer(src->dtype)) {
            const double v = tensor_get(src, i);
            if (v != std::floor(v) || !std::isfinite(v))
                luaL_error(L, "%s[%I] (%g) is not an integer; cannot convert %s to %s",
                           what.c_str(), static_cast<LUAI_UACINT>(i + 1), v, dtype_name(src->dtype),
                           dtype_name(dt));
        }
        if (same(dt, kBool)) {
            static_cast<uint8_t *>(out->data())[i] = tensor_get(src, i) != 0 ? 1 : 0;
        } else if (dtype_is_integer(dt)) {
            const int64_t v = dtype_is_integer(src->dtype)
                                  ? tensor_get_int(src, i)
                                  : static_cast<int64_t>(tensor_get(src, i));
            if ((same(dt, kInt32) && (v < INT32_MIN || v > INT32_MAX)) ||
                (same(dt, kUInt8) && (v < 0 || v > 255)))
                luaL_error(L, "%s[%I] (%I) does not fit in %s", what.c_str(),
                           static_cast<LUAI_UACINT>(i + 1), static_cast<LUAI_UACINT>(v),
                           dtype_name(dt));
            if (same(dt, kInt64))
                static_cast<int64_t *>(out->data())[i] = v;
            else
                tensor_set(out, i, static_cast<double>(v));
        } else {
            tensor_set(out, i,
                       dtype_is_integer(src->dtype) ? static_cast<double>(tensor_get_int(src, i))
                                                    : tensor_get(src, i));
        }
    }
    return out;
}

rl_dtype_t opt_dtype(lua_State *L, int arg, rl_dtype_t def) {
    if (lua_isnoneornil(L, arg)) return def;
    const char *name = luaL_checkstring(L, arg);
    rl_dtype_t dt{};
    if (!dtype_from_name(name, &dt))
        luaL_argerror(
            L, arg,
            lua_pushfstring(L, "unknown dtype '%s' (one of %s)", name, dtype_list().c_str()));
    return dt;
}

// Default dtype of a Lua table: int64 when every entry is a Lua integer,
// bool when every entry is a boolean, float32 otherwise.
rl_dtype_t infer_dtype(lua_State *L, int idx) {
    const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, idx));
    if (n == 0) return kFloat32;
    bool all_int = true, all_bool = true;
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, idx, i);
        all_int = all_int && lua_isinteger(L, -1);
        all_bool = all_bool && lua_isboolean(L, -1);
        lua_pop(L, 1);
    }
    return all_bool ? kBool : all_int ? kInt64 : kFloat32;
}

// ---- constructors ---------------------------------------------------------------

// rl.tensor(values [, dtype]) / rl.tensor.new(values [, dtype])
int t_new(lua_State *L) {
    if (TensorHeader *src = test_tensor(L, 1)) {
        convert(L, 1, opt_dtype(L, 2, src->dtype), "values");
        return 1;
    }
    luaL_argexpected(L, lua_istable(L, 1), 1, "table or rl.tensor");
    const rl_dtype_t dt = lua_isnoneornil(L, 2) ? infer_dtype(L, 1) : opt_dtype(L, 2, kFloat32);
    from_table(L, 1, dt, "values");
    return 1;
}

int t_call(lua_State *L) {
    lua_remove(L, 1); // the rl.tensor table itself
    return t_new(L);
}

int64_t check_count(lua_State *L, int arg) {
    const lua_Integer n = luaL_checkinteger(L, arg);
    luaL_argcheck(L, n >= 0, arg, "size must be >= 0");
    luaL_argcheck(L, n <= (int64_t(1) << 40), arg, "size is too large");
    return static_cast<int64_t>(n);
}

// rl.tensor.zeros(n [, dtype])
int t_zeros(lua_State *L) {
    const int64_t n = check_count(L, 1);
    TensorHeader *t = push_tensor(L, opt_dtype(L, 2, kFloat32), n);
    std::memset(t->data(), 0, static_cast<size_t>(n) * dtype_size(t->dtype));
    return 1;
}

// rl.tensor.full(n, value [, dtype])
int t_full(lua_State *L) {
    const int64_t n = check_count(L, 1);
    luaL_checkany(L, 2);
    TensorHeader *t = push_tensor(L, opt_dtype(L, 3, kFloat32), n);
    for (int64_t i = 0; i < n; ++i) store_element(L, t, i, 2, "value");
    return 1;
}

// rl.tensor.arange(first, last [, dtype]): first, first+1, ..., last (inclusive, like for).
int t_arange(lua_State *L) {
    const lua_Integer a = luaL_checkinteger(L, 1), b = luaL_checkinteger(L, 2);
    const int64_t n = b >= a ? static_cast<int64_t>(b - a + 1) : 0;
    luaL_argcheck(L, n <= (int64_t(1) << 40), 2, "range is too large");
    TensorHeader *t = push_tensor(L, opt_dtype(L, 3, kInt64), n);
    for (int64_t i = 0; i < n; ++i) {
        lua_pushinteger(L, a + i);
        store_element(L, t, i, -1, "value");
        lua_pop(L, 1);
    }
    return 1;
}

// rl.tensor.cat(list [, dtype]): concatenation of tensors and/or tables.
int t_cat(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    const lua_Integer parts = static_cast<lua_Integer>(lua_rawlen(L, 1));
    rl_dtype_t dt = kFloat32;
    bool have = !lua_isnoneornil(L, 2);
    if (have) dt = opt_dtype(L, 2, kFloat32);
    int64_t n = 0;
    for (lua_Integer i = 1; i <= parts; ++i) {
        lua_rawgeti(L, 1, i);
        if (TensorHeader *t = test_tensor(L, -1)) {
            n += t->n;
            if (!have) dt = t->dtype, have = true;
        } else if (lua_istable(L, -1)) {
            n += static_cast<int64_t>(lua_rawlen(L, -1));
            if (!have && lua_rawlen(L, -1) > 0) dt = infer_dtype(L, lua_gettop(L)), have = true;
        } else {
            luaL_error(L, "rl.tensor.cat: part %I must be an rl.tensor or a table, got %s",
                       static_cast<LUAI_UACINT>(i), luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    TensorHeader *out = push_tensor(L, dt, n);
    const int out_idx = lua_gettop(L);
    int64_t at = 0;
    const size_t es = dtype_size(dt);
    for (lua_Integer i = 1; i <= parts; ++i) {
        lua_rawgeti(L, 1, i);
        const std::string what = "part " + std::to_string(i);
        rl_tensor_view_t v = to_view(L, -1, dt, DtypeRule::Exact, what);
        const int64_t m = v.shape[0];
        if (m > 0)
            std::memcpy(static_cast<char *>(out->data()) + static_cast<size_t>(at) * es, v.data,
                        static_cast<size_t>(m) * es);
        at += m;
        lua_settop(L, out_idx);
    }
    return 1;
}

int t_is(lua_State *L) {
    lua_pushboolean(L, test_tensor(L, 1) != nullptr);
    return 1;
}

// ---- methods ------------------------------------------------------------------------

int m_len(lua_State *L) {
    lua_pushinteger(L, static_cast<lua_Integer>(check_tensor(L, 1)->n));
    return 1;
}

int m_index(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    if (lua_type(L, 2) == LUA_TNUMBER) {
        push_element(L, t, element_index(L, t, 2));
        return 1;
    }
    // Methods live in the metatable's "methods" table (upvalue 1).
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    return 1;
}

int m_newindex(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    if (lua_type(L, 2) != LUA_TNUMBER)
        return luaL_error(L, "rl.tensor: cannot set field '%s' (only integer indices)",
                          luaL_tolstring(L, 2, nullptr));
    const int64_t i = element_index(L, t, 2);
    const std::string what = "rl.tensor element " + std::to_string(i + 1);
    store_element(L, t, i, 3, what.c_str());
    return 0;
}

int m_tostring(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    lua_pushfstring(L, "rl.tensor(%s, %I)[", dtype_name(t->dtype), static_cast<LUAI_UACINT>(t->n));
    luaL_addvalue(&b);
    const int64_t show = t->n <= 8 ? t->n : 6;
    for (int64_t i = 0; i < show; ++i) {
        if (i) luaL_addstring(&b, ", ");
        push_element(L, t, i);
        luaL_tolstring(L, -1, nullptr);
        lua_remove(L, -2);
        luaL_addvalue(&b);
    }
    if (show < t->n) {
        lua_pushfstring(L, ", ... (%I more)", static_cast<LUAI_UACINT>(t->n - show));
        luaL_addvalue(&b);
    }
    luaL_addstring(&b, "]");
    luaL_pushresult(&b);
    return 1;
}

int m_totable(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    luaL_argcheck(L, t->n < INT32_MAX, 1, "tensor too large for a table");
    lua_createtable(L, static_cast<int>(t->n), 0);
    for (int64_t i = 0; i < t->n; ++i) {
        push_element(L, t, i);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

int m_dtype(lua_State *L) {
    lua_pushstring(L, dtype_name(check_tensor(L, 1)->dtype));
    return 1;
}

double value_as_double(const TensorHeader *t, int64_t i) {
    return dtype_is_integer(t->dtype) ? static_cast<double>(tensor_get_int(t, i))
                                      : tensor_get(t, i);
}

int m_sum(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    double s = 0;
    for (int64_t i = 0; i < t->n; ++i) s += value_as_double(t, i);
    lua_pushnumber(L, s);
    return 1;
}

int m_mean(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    if (t->n == 0) return luaL_error(L, "rl.tensor:mean: the tensor is empty");
    double s = 0;
    for (int64_t i = 0; i < t->n; ++i) s += value_as_double(t, i);
    lua_pushnumber(L, s / static_cast<double>(t->n));
    return 1;
}

int minmax(lua_State *L, bool want_max) {
    TensorHeader *t = check_tensor(L, 1);
    if (t->n == 0)
        return luaL_error(L, "rl.tensor:%s: the tensor is empty", want_max ? "max" : "min");
    int64_t best = 0;
    for (int64_t i = 1; i < t->n; ++i) {
        const double a = value_as_double(t, i), b = value_as_double(t, best);
        if (want_max ? a > b : a < b) best = i;
    }
    push_element(L, t, best);
    return 1;
}
int m_min(lua_State *L) {
    return minmax(L, false);
}
int m_max(lua_State *L) {
    return minmax(L, true);
}

// t:slice(i [, j]): elements i..j (1-based, inclusive; negative counts from the end).
int m_slice(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    lua_Integer i = luaL_checkinteger(L, 2);
    lua_Integer j = luaL_optinteger(L, 3, -1);
    const lua_Integer n = static_cast<lua_Integer>(t->n);
    if (i < 0) i = n + i + 1;
    if (j < 0) j = n + j + 1;
    luaL_argcheck(L, i >= 1 && i <= n + 1, 2, "start out of range");
    luaL_argcheck(L, j >= i - 1 && j <= n, 3, "end out of range");
    const int64_t m = static_cast<int64_t>(j - i + 1);
    TensorHeader *out = push_tensor(L, t->dtype, m);
    const size_t es = dtype_size(t->dtype);
    if (m > 0)
        std::memcpy(out->data(), static_cast<char *>(t->data()) + static_cast<size_t>(i - 1) * es,
                    static_cast<size_t>(m) * es);
    return 1;
}

int m_clone(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    convert(L, 1, t->dtype, "tensor");
    return 1;
}

int m_to(lua_State *L) {
    TensorHeader *t = check_tensor(L, 1);
    convert(L, 1, opt_dtype(L, 2, t->dtype), "tensor");
    return 1;
}

} // namespace

// ---- shared helpers ----------------------------------------------------------------

size_t dtype_size(rl_dtype_t dt) {
    return dt.code == RL_DTYPE_BOOL ? 1 : static_cast<size_t>(dt.bits / 8);
}

const char *dtype_name(rl_dtype_t dt) {
    for (const auto &d : kNames)
        if (same(*d.dt, dt)) return d.name;
    return "?";
}

bool dtype_from_name(const char *name, rl_dtype_t *out) {
    for (const auto &d : kNames)
        if (std::strcmp(d.name, name) == 0) {
            *out = *d.dt;
            return true;
        }
    return false;
}

bool dtype_is_integer(rl_dtype_t dt) {
    return !is_float(dt);
}

TensorHeader *push_tensor(lua_State *L, rl_dtype_t dt, int64_t n) {
    const size_t bytes = sizeof(TensorHeader) + static_cast<size_t>(n) * dtype_size(dt);
    auto *t = static_cast<TensorHeader *>(lua_newuserdatauv(L, bytes, 0));
    t->dtype = dt;
    t->n = n;
    t->shape[0] = n;
    luaL_setmetatable(L, kTensorMT);
    return t;
}

TensorHeader *test_tensor(lua_State *L, int idx) {
    return static_cast<TensorHeader *>(luaL_testudata(L, idx, kTensorMT));
}

TensorHeader *check_tensor(lua_State *L, int idx) {
    return static_cast<TensorHeader *>(luaL_checkudata(L, idx, kTensorMT));
}

double tensor_get(const TensorHeader *t, int64_t i) {
    const void *d = t->data();
    switch (t->dtype.code) {
        case RL_DTYPE_FLOAT:
            return t->dtype.bits == 32 ? static_cast<const float *>(d)[i]
                                       : static_cast<const double *>(d)[i];
        default:
            return static_cast<double>(tensor_get_int(t, i));
    }
}

int64_t tensor_get_int(const TensorHeader *t, int64_t i) {
    const void *d = t->data();
    if (t->dtype.code == RL_DTYPE_INT)
        return t->dtype.bits == 64 ? static_cast<const int64_t *>(d)[i]
                                   : static_cast<const int32_t *>(d)[i];
    if (t->dtype.code == RL_DTYPE_FLOAT) return static_cast<int64_t>(tensor_get(t, i));
    return static_cast<const uint8_t *>(d)[i];
}

void tensor_set(TensorHeader *t, int64_t i, double v) {
    void *d = t->data();
    switch (t->dtype.code) {
        case RL_DTYPE_FLOAT:
            if (t->dtype.bits == 32)
                static_cast<float *>(d)[i] = static_cast<float>(v);
            else
                static_cast<double *>(d)[i] = v;
            return;
        case RL_DTYPE_INT:
            if (t->dtype.bits == 64)
                static_cast<int64_t *>(d)[i] = static_cast<int64_t>(v);
            else
                static_cast<int32_t *>(d)[i] = static_cast<int32_t>(v);
            return;
        default:
            static_cast<uint8_t *>(d)[i] = static_cast<uint8_t>(v);
    }
}

rl_tensor_view_t tensor_view(TensorHeader *t) {
    rl_tensor_view_t v{};
    v.data = t->n ? t->data() : nullptr;
    v.device = rl_device_t{RL_DEVICE_CPU, 0};
    v.ndim = 1;
    v.dtype = t->dtype;
    v.shape = t->shape;
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

TensorHeader *push_tensor_copy(lua_State *L, const rl_tensor_view_t &v, const char *what) {
    if (v.device.type != RL_DEVICE_CPU)
        luaL_error(L, "%s: tensor is not in CPU memory (device type %d)", what, v.device.type);
    bool known = false;
    for (const auto &d : kNames) known = known || same(*d.dt, v.dtype);
    if (!known)
        luaL_error(L, "%s: unsupported dtype (code %d, %d bits)", what, v.dtype.code, v.dtype.bits);
    if (v.ndim < 0 || v.ndim > 8) luaL_error(L, "%s: unsupported ndim %d", what, v.ndim);
    int64_t n = 1;
    for (int32_t d = 0; d < v.ndim; ++d) {
        if (v.shape[d] < 0) luaL_error(L, "%s: negative dimension", what);
        n *= v.shape[d];
    }
    TensorHeader *t = push_tensor(L, v.dtype, n);
    if (n == 0) return t;
    const size_t es = dtype_size(v.dtype);
    const char *base = static_cast<const char *>(v.data) + v.byte_offset;
    if (!v.strides) {
        std::memcpy(t->data(), base, static_cast<size_t>(n) * es);
        return t;
    }
    // Strided: walk the index space in row-major order.
    std::vector<int64_t> idx(static_cast<size_t>(v.ndim), 0);
    for (int64_t k = 0; k < n; ++k) {
        int64_t off = 0;
        for (int32_t d = 0; d < v.ndim; ++d) off += idx[static_cast<size_t>(d)] * v.strides[d];
        std::memcpy(static_cast<char *>(t->data()) + static_cast<size_t>(k) * es,
                    base + off * static_cast<int64_t>(es), es);
        for (int32_t d = v.ndim - 1; d >= 0; --d) {
            if (++idx[static_cast<size_t>(d)] < v.shape[d]) break;
            idx[static_cast<size_t>(d)] = 0;
        }
    }
    return t;
}

rl_tensor_view_t to_view(lua_State *L, int idx, rl_dtype_t dt, DtypeRule rule,
                         const std::string &what) {
    luaL_checkstack(L, 4, "rl: stack overflow while converting tensors");
    idx = lua_absindex(L, idx);
    if (TensorHeader *t = test_tensor(L, idx)) {
        const bool ok =
            rule == DtypeRule::Any || same(t->dtype, dt) ||
            (rule == DtypeRule::AnyFloat && is_float(t->dtype)) ||
            (rule == DtypeRule::AnyInt && dtype_is_integer(t->dtype) && !same(t->dtype, kBool));
        if (ok) return tensor_view(t);
        return tensor_view(convert(L, idx, dt, what));
    }
    if (lua_istable(L, idx)) return tensor_view(from_table(L, idx, dt, what));
    luaL_error(L, "%s must be an rl.tensor or a table of numbers, got %s", what.c_str(),
               luaL_typename(L, idx));
    return {};
}

void open_tensor(lua_State *L) {
    static const luaL_Reg methods[] = {
        RL_LUA_FN("totable", m_totable), RL_LUA_FN("dtype", m_dtype), RL_LUA_FN("sum", m_sum),
        RL_LUA_FN("mean", m_mean),       RL_LUA_FN("min", m_min),     RL_LUA_FN("max", m_max),
        RL_LUA_FN("slice", m_slice),     RL_LUA_FN("clone", m_clone), RL_LUA_FN("to", m_to),
        RL_LUA_FN("numel", m_len),       {nullptr, nullptr}};
    luaL_newmetatable(L, kTensorMT);
    luaL_newlib(L, methods);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "methods");
    lua_pushcclosure(L, guarded<m_index>, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, guarded<m_newindex>);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, guarded<m_len>);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, guarded<m_tostring>);
    lua_setfield(L, -2, "__tostring");
    lua_pushstring(L, "rl.tensor");
    lua_setfield(L, -2, "__name");
    lua_pop(L, 1);

    static const luaL_Reg ctors[] = {RL_LUA_FN("new", t_new),   RL_LUA_FN("zeros", t_zeros),
                                     RL_LUA_FN("full", t_full), RL_LUA_FN("arange", t_arange),
                                     RL_LUA_FN("cat", t_cat),   RL_LUA_FN("is", t_is),
                                     {nullptr, nullptr}};
    luaL_newlib(L, ctors);
    lua_newtable(L);
    lua_pushcfunction(L, guarded<t_call>);
    lua_setfield(L, -2, "__call");
    lua_setmetatable(L, -2);
}

} // namespace rl::lua
