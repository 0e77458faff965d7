// scripting/src/l_common.hpp: shared pieces of the `rl` Lua module.
//
// Error discipline. The module links Debian's liblua5.4-c++, where lua_error
// unwinds with a C++ exception instead of longjmp, so a Lua error raised from
// any of our frames runs the destructors on its way out. Our own C++
// exceptions never reach Lua: every function registered with Lua goes through
// guarded<F>, which turns std::exception into a Lua error after F's frames are
// gone. Calls into librl return a status; a failure becomes a Lua error
// carrying rl_last_error(). Nothing here is ever called from inside librl, so
// neither kind of unwinding crosses a C frame.
#pragma once

#include <lua.hpp>
#include <rl_api.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rl::lua {

// ---- errors -------------------------------------------------------------------

// Raises a Lua error "<what>: <rl_last_error()>" unless st is RL_OK.
void check_status(lua_State *L, rl_status_t st, const char *what);

// Registered functions are wrapped with this: a std::exception thrown by F is
// re-raised as a Lua error once F has unwound.
template <lua_CFunction F>
int guarded(lua_State *L) {
    std::string msg;
    try {
        return F(L);
    } catch (const std::exception &e) {
        msg = e.what();
    }
    return luaL_error(L, "%s", msg.c_str());
}

// luaL_Reg list of guarded functions.
#define RL_LUA_FN(name, fn)                                                                        \
    { name, ::rl::lua::guarded<fn> }

// ---- owned handles ---------------------------------------------------------------
//
// Every C handle lives in a userdata holding a Handle. A handle whose C object
// must die before its parent's (an instance before its runtime, a trainer or
// engine before its model) is registered with the parent: closing the parent
// first closes the children. The child userdata also keeps the parent userdata
// alive through its user value, so the garbage collector never frees a parent
// under a live child.

struct Handle {
    void *ptr = nullptr;                       // the C handle; NULL once closed
    void (*destroy)(void *) = nullptr;         // how to release ptr
    Handle *parent = nullptr;                  // registered with this handle
    std::vector<Handle *> *children = nullptr; // owned; created on first child
    const char *kind = "";                     // "loss", "env", ... for instances
    char name[64] = {0};                       // plugin name, model path tail, ... (for messages)

    void close();
};

// Metatable names.
constexpr const char *kRuntimeMT = "rl.runtime";
constexpr const char *kInstanceMT = "rl.instance";
constexpr const char *kModelMT = "rl.model";
constexpr const char *kTokenizerMT = "rl.tokenizer";
constexpr const char *kTrainerMT = "rl.trainer";
constexpr const char *kEngineMT = "rl.engine";
constexpr const char *kRolloutsMT = "rl.rollouts";
constexpr const char *kTrainBatchMT = "rl.train_batch";
constexpr const char *kTensorMT = "rl.tensor";

// Pushes a new handle userdata with metatable `mt`. When parent_index != 0 the
// value there (a handle userdata) becomes the parent: its user value slot 1
// keeps it alive and it closes the new handle first when it closes.
Handle *push_handle(lua_State *L, const char *mt, void *ptr, void (*destroy)(void *),
                    int parent_index);
// The open handle at idx with metatable mt; a Lua argument error otherwise
// ("rl.trainer expected, got number", "rl.trainer is closed").
Handle *check_handle(lua_State *L, int idx, const char *mt);
// Creates metatable `mt` with methods, __gc / __close releasing the handle,
// __index = methods and __tostring. Leaves nothing on the stack.
void define_handle_type(lua_State *L, const char *mt, const luaL_Reg *methods);

// Destroyers of the handles more than one file pushes.
inline void destroy_rollouts(void *p) {
    rl_rollouts_destroy(static_cast<rl_rollouts_t *>(p));
}
inline void destroy_train_batch(void *p) {
    rl_train_batch_destroy(static_cast<rl_train_batch_t *>(p));
}
// The model behind argument idx: an rl.model or an rl.tokenizer.
rl_model_t *model_of(lua_State *L, int idx);

// ---- tensors --------------------------------------------------------------------
//
// rl.tensor: a typed, 1-d, owned, contiguous CPU buffer. The data lives in the
// userdata block itself, so Lua's allocator owns it and no __gc is needed.

struct TensorHeader {
    rl_dtype_t dtype;
    int64_t n;        // number of elements
    int64_t shape[1]; // {n}; rl_tensor_view_t points here
    void *data() { return this + 1; }
    const void *data() const { return this + 1; }
};

size_t dtype_size(rl_dtype_t dt);
const char *dtype_name(rl_dtype_t dt); // "float32", ...; "?" when unsupported
bool dtype_from_name(const char *name, rl_dtype_t *out);
extern const rl_dtype_t kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBool;

TensorHeader *push_tensor(lua_State *L, rl_dtype_t dt, int64_t n);
TensorHeader *test_tensor(lua_State *L, int idx); // NULL when idx is not a tensor
TensorHeader *check_tensor(lua_State *L, int idx);
// Copies a librl view (CPU; any ndim, flattened; contiguous or strided) into a new tensor.
TensorHeader *push_tensor_copy(lua_State *L, const rl_tensor_view_t &v, const char *what);
double tensor_get(const TensorHeader *t, int64_t i);
void tensor_set(TensorHeader *t, int64_t i, double v);
int64_t tensor_get_int(const TensorHeader *t, int64_t i);
bool dtype_is_integer(rl_dtype_t dt);
rl_tensor_view_t tensor_view(TensorHeader *t);

// The value at idx as a tensor view: a tensor is used as it is (when
// dtype_ok accepts its dtype, else converted to `dt`), a Lua table of numbers
// is copied into a new tensor of dtype `dt`. A new tensor is left on the
// stack (the returned view borrows it), so callers keep the stack until the C
// call returned. `what` names the argument in errors.
enum class DtypeRule { Exact, AnyFloat, AnyInt, Any };
rl_tensor_view_t to_view(lua_State *L, int idx, rl_dtype_t dt, DtypeRule rule,
                         const std::string &what);

// Named per-token tensors of the table at idx (all fields but those in `skip`):
// ids (input_ids, labels, cu_seqlens, group_ids, token_ids, ...) as int64, a
// loss_mask tensor as it is, everything else as float (tables: float64).
// Views borrow values left on the Lua stack.
struct TensorTable {
    std::vector<std::string> names;
    std::vector<rl_tensor_arg_t> args;
    rl_tensor_list_t list() const {
        return rl_tensor_list_t{args.empty() ? nullptr : args.data(), args.size()};
    }
};
void read_tensor_table(lua_State *L, int idx, const char *what,
                       const std::vector<std::string> &skip, TensorTable *out);
// Field `name` of the table at idx as a view (same dtype rules); false when
// absent, a Lua error when absent and required.
bool table_field_view(lua_State *L, int idx, const char *name, const char *what, bool required,
                      rl_tensor_view_t *out);

void open_tensor(lua_State *L); // leaves the rl.tensor constructor table on the stack

// ---- JSON -----------------------------------------------------------------------

// Lua value -> JSON text. Tables with keys 1..n (or marked with rl.array) are
// arrays, other tables objects with string keys; rl.null is null; tensors are
// arrays. Errors name the offending key path.
std::string to_json(lua_State *L, int idx, const std::string &what);
// JSON text -> Lua value on the stack. null is rl.null; arrays carry the
// array marker metatable so they stay arrays when written back.
void push_json(lua_State *L, const std::string &text, const char *what);
// Argument `arg` as JSON text: nil is "{}", a table is written as JSON, a
// string is taken as it is; anything else raises naming `what`.
std::string json_arg(lua_State *L, int arg, const char *what);
void push_null(lua_State *L);
bool is_null(lua_State *L, int idx);
void set_array_mt(lua_State *L, int idx);
void open_json(lua_State *L); // leaves the rl.json table on the stack

// ---- results --------------------------------------------------------------------

// Converts an rl_result_t into a Lua table: scalars, texts and tensors as
// fields, metrics in field "metrics". Texts named in json_texts (a
// NULL-terminated list) are decoded from JSON. Destroys the result (also on
// error).
void push_result(lua_State *L, rl_result_t *result, const char *const *json_texts = nullptr);
// Pushes the result (as push_result) and on top of it its text `name`,
// decoded from JSON; returns 1 (the decoded value is the Lua call's result).
int push_json_field(lua_State *L, rl_result_t *result, const char *name);
// Runs one C call that writes a result (call(&result) -> rl_status_t), raises
// naming `what` when it fails, else pushes the result (as push_result, with
// json_texts). Returns 1.
template <class Call>
int call_and_push(lua_State *L, const char *what, const char *const *json_texts, Call &&call) {
    rl_result_t *res = nullptr;
    check_status(L, call(&res), what);
    push_result(L, res, json_texts);
    return 1;
}
template <class Call>
int call_and_push(lua_State *L, const char *what, Call &&call) {
    return call_and_push(L, what, nullptr, std::forward<Call>(call));
}

// RAII for results while other Lua calls may raise.
struct ResultGuard {
    rl_result_t *r = nullptr;
    ~ResultGuard() { rl_result_destroy(r); }
    rl_result_t *release() {
        rl_result_t *x = r;
        r = nullptr;
        return x;
    }
};

// ---- small helpers -------------------------------------------------------------

// Optional table field readers for option tables at idx (nil allowed: the
// default). They raise "bad argument #i to 'fn' (field 'x' must be ...)".
bool opt_bool_field(lua_State *L, int idx, const char *field, bool def);
lua_Integer opt_int_field(lua_State *L, int idx, const char *field, lua_Integer def);
std::string opt_string_field(lua_State *L, int idx, const char *field, const std::string &def);
// Raises a "bad argument" style error for argument arg.
[[noreturn]] void arg_error(lua_State *L, int arg, const std::string &msg);

// Module parts.
void open_runtime(lua_State *L, int module_index);
void open_train(lua_State *L, int module_index);
void open_rollouts(lua_State *L, int module_index); // buffer, rollouts, batches, servers
void open_system(lua_State *L, int module_index);
void open_disagg(lua_State *L, int module_index); // after open_runtime

} // namespace rl::lua
