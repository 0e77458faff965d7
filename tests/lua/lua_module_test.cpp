// The `rl` Lua module in process: errors (file and line, wrong argument
// types, C-side failures), the tensor userdata, configuration access, JSON,
// handle lifetimes, and env / loss / advantage calls from Lua against the same
// calls through the C API.
#include <rl/lua.hpp>
#include <rl_api.h>

#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using json = nlohmann::json;

// A Lua state with the module, the test plugins and an optional config.
class Lua {
public:
    explicit Lua(const std::string &config_json = "") {
        rl::lua::HostOptions o;
        o.config_json = config_json;
        o.plugin_path = RL_TEST_PLUGIN_DIR;
        o.log_level = "warn";
        L_ = rl::lua::new_state(o);
    }
    ~Lua() { lua_close(L_); }
    Lua(const Lua &) = delete;
    Lua &operator=(const Lua &) = delete;

    // Runs `code` (chunk name "=test"); "" on success, else the error message.
    // Results stay on the stack (nresults of them).
    std::string run(const std::string &code, int nresults = 0) {
        lua_settop(L_, 0);
        if (luaL_loadbuffer(L_, code.data(), code.size(), "=test") != LUA_OK ||
            lua_pcall(L_, 0, nresults, 0) != LUA_OK) {
            std::string msg = lua_tostring(L_, -1) ? lua_tostring(L_, -1) : "(no message)";
            lua_settop(L_, 0);
            return msg.empty() ? "(empty error)" : msg;
        }
        return "";
    }
    // Runs code that returns one string.
    std::string eval_string(const std::string &code) {
        const std::string err = run(code, 1);
        if (!err.empty()) return "ERROR: " + err;
        const char *s = lua_tostring(L_, -1);
        return s ? s : "(not a string)";
    }
    double eval_number(const std::string &code) {
        const std::string err = run(code, 1);
        EXPECT_EQ(err, "");
        return lua_tonumber(L_, -1);
    }
    // Sets global `name` to the string `value` (e.g. DIR, a test's folder).
    void set_global(const char *name, const std::string &value) {
        lua_pushstring(L_, value.c_str());
        lua_setglobal(L_, name);
    }
    lua_State *state() { return L_; }

private:
    lua_State *L_ = nullptr;
};

std::string temp_dir() {
    return rl_test::temp_dir("rl_lua_test_");
}

std::string write_file(const std::string &dir, const std::string &name, const std::string &text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
}

// ---- script errors ------------------------------------------------------------------

// Writes script `name` with `text` into a fresh folder (its path in *path) and
// runs it, which must fail: the error message.
std::string script_error(const std::string &name, const std::string &text, std::string *path) {
    *path = write_file(temp_dir(), name, text);
    Lua lua;
    std::string err;
    EXPECT_FALSE(rl::lua::run_file(lua.state(), *path, {}, &err));
    return err;
}

TEST(LuaScript, RuntimeErrorReportsFileAndLine) {
    std::string path;
    const std::string err = script_error("broken.lua",
                                         "local rl = require('rl')\n"
                                         "local x = 1\n"
                                         "error('something went wrong')\n",
                                         &path);
    EXPECT_EQ(err.rfind(path + ":3: something went wrong", 0), 0u) << err;
    EXPECT_NE(err.find("stack traceback"), std::string::npos) << err;
}

TEST(LuaScript, SyntaxErrorReportsFileAndLine) {
    std::string path;
    const std::string err = script_error("syntax.lua", "local a = 1\nlocal b = = 2\n", &path);
    EXPECT_EQ(err.rfind(path + ":2:", 0), 0u) << err;
}

TEST(LuaScript, ErrorFromAModuleCallNamesTheScriptLine) {
    std::string path;
    const std::string err = script_error("calls.lua",
                                         "local rl = require('rl')\n"
                                         "\n"
                                         "local env = rl.env('reverse_text', {max_len = 0})\n",
                                         &path);
    EXPECT_EQ(err.rfind(path + ":3: ", 0), 0u) << err;
    EXPECT_NE(err.find("parameter 'max_len'"), std::string::npos) << err;
}

TEST(LuaScript, MissingScriptIsAnErrorNamingTheFile) {
    Lua lua;
    std::string err;
    EXPECT_FALSE(rl::lua::run_file(lua.state(), "/nonexistent/x.lua", {}, &err));
    EXPECT_NE(err.find("/nonexistent/x.lua"), std::string::npos) << err;
}

TEST(LuaScript, ArgumentsReachTheScript) {
    const std::string dir = temp_dir();
    const std::string out = dir + "/out.txt";
    const std::string path =
        write_file(dir, "args.lua",
                   "local a, b = ...\n"
                   "local f = assert(io.open('" +
                       out +
                       "', 'w'))\n"
                       "f:write(a, ',', b, ',', arg[1], ',', arg[0]) f:close()\n");
    Lua lua;
    std::string err;
    ASSERT_TRUE(rl::lua::run_file(lua.state(), path, {"x", "y"}, &err)) << err;
    std::ifstream in(out);
    std::string text;
    std::getline(in, text);
    EXPECT_EQ(text, "x,y,x," + path);
}

// ---- wrong argument types ----------------------------------------------------------------

// Each snippet runs in pcall; it must fail with a message holding `want`.
struct BadCall {
    const char *code;
    const char *want;
};

TEST(LuaArguments, WrongTypesAreLuaErrorsNotCrashes) {
    Lua lua;
    ASSERT_EQ(lua.run("rl = require('rl')\n"
                      "env = rl.env('reverse_text')\n"
                      "loss = rl.loss('policy_loss')\n"
                      "adv = rl.advantage('grpo')\n"
                      "filt = rl.filter('repetition')\n"
                      "rt = rl.runtime()\n"
                      "t = rl.tensor({1, 2, 3}, 'int64')\n"),
              "");
    const BadCall cases[] = {
        {"env:sample('many')", "bad argument #1 to 'sample' (number expected, got string)"},
        {"env:sample(-1)", "bad argument #1 to 'sample' (n must be >= 0)"},
        {"env:score(42, 'x')", "bad argument #1 to 'score'"},
        {"env:score({prompt = 'p'}, nil)", "bad argument #2 to 'score' (string expected, got nil)"},
        {"env.sample(loss, 1)", "rl.env expected, got rl.loss"},
        {"env.sample(nil, 1)", "rl.env expected, got nil"},
        {"env.sample({}, 1)", "rl.env expected, got table"},
        {"loss:compute(5)", "bad argument #1 to 'compute' (table expected, got number)"},
        {"loss:compute({cu_seqlens = 'abc'})", "inputs.cu_seqlens must be an rl.tensor or a table"},
        {"loss:compute({cu_seqlens = {0, 1}, logprobs = {'a'}})",
         "inputs.logprobs[1] must be a number, got string"},
        {"loss:compute({cu_seqlens = {0, 1.5}})", "cu_seqlens[2] must be an integer"},
        {"loss:compute({cu_seqlens = {0, 1}}, {want_grads = 'yes'})",
         "field 'want_grads' must be a boolean, got string"},
        {"adv:compute({rewards = {1}})", "missing field 'group_ids'"},
        {"filt:check({1, 2}, {-1, -1})",
         "bad argument #3 to 'check' (number expected, got no value)"},
        {"rt:loss({})", "bad argument #1 to 'loss' (string expected, got table)"},
        {"rt:loss('policy_loss', 42)", "params must be a table or a JSON string, got number"},
        {"rt:instance('gizmo', 'x')", "kind must be one of loss, advantage, filter, env"},
        {"rl.runtime(5)", "bad argument #1 to 'runtime' (table expected, got number)"},
        {"rl.runtime({plugin_path = 5})", "field 'plugin_path' must be a string or a list"},
        {"rl.model(nil)", "bad argument #1 to 'model' (string expected, got nil)"},
        {"rl.model('/tmp', 7)", "options must be a table or a JSON string, got number"},
        {"rl.init_model('tiny')",
         "bad argument #2 to 'init_model' (string expected, got no value)"},
        {"rl.buffer(3)", "buffer config must be a table or a JSON string, got number"},
        {"rl.tensor('x')", "table or rl.tensor expected, got string"},
        {"rl.tensor({1}, 'complex128')", "unknown dtype 'complex128'"},
        {"rl.tensor({1, {}})", "values[2] must be a number, got table"},
        {"rl.tensor({300}, 'uint8')", "values[1] (300) does not fit in uint8"},
        {"rl.tensor.zeros(-1)", "size must be >= 0"},
        {"rl.tensor.cat({t, 'x'})", "part 2 must be an rl.tensor or a table, got string"},
        {"t:slice('a')", "bad argument #1 to 'slice' (number expected, got string)"},
        {"t:slice(2, 9)", "end out of range"},
        {"t[0] = 1", "rl.tensor index 0 out of range"},
        {"return t[4]", "rl.tensor index 4 out of range (the tensor has 3 elements)"},
        {"t[1] = 'x'", "must be a number, got string"},
        {"t[1] = 0.5", "must be an integer (the tensor is int64)"},
        {"t.size = 1", "cannot set field 'size'"},
        {"return t[1.5]", "rl.tensor index must be an integer"},
        {"t.totable(env)", "rl.tensor expected, got rl.env"},
        {"rl.json.encode({[true] = 1})", "non-string key"},
        {"rl.json.encode({f = print})", "'f' is a function, which cannot be written as JSON"},
        {"rl.json.encode({x = 0/0})", "which JSON cannot hold"},
        {"rl.json.decode('{')", "invalid JSON"},
        {"rl.buffer():load('/nonexistent/buffer.json')", "/nonexistent/buffer.json"},
        {"rl.json.decode(string.rep('[', 100000) .. string.rep(']', 100000))",
         "nested deeper than 128 levels"},
        {"rl.config_load(nil, {5})", "overrides[1] must be a string, got number"},
        {"rl.mkdir('')", "empty path"},
        {"rl.seed('x')", "rl.seed: base must be an integer"},
        {"rl.run(5)", "rl.run: expected the run configuration"},
    };
    for (const auto &c : cases) {
        const std::string code = std::string("local ok, err = pcall(function() ") + c.code +
                                 " end)\nassert(not ok, 'no error')\nreturn tostring(err)";
        const std::string msg = lua.eval_string(code);
        EXPECT_NE(msg.find(c.want), std::string::npos)
            << "snippet: " << c.code << "\nmessage: " << msg << "\nwanted: " << c.want;
        EXPECT_EQ(msg.find("ERROR:"), std::string::npos) << c.code << ": " << msg;
    }
}

TEST(LuaArguments, ClosedHandlesAreErrorsAndCloseTheirChildren) {
    Lua lua;
    EXPECT_EQ(lua.eval_string("local rl = require('rl')\n"
                              "local rt = rl.runtime()\n"
                              "local env = rt:env('reverse_text')\n"
                              "rt:close()\n"
                              "assert(tostring(env) == 'rl.env (closed)', tostring(env))\n"
                              "local ok, err = pcall(env.sample, env, 1)\n"
                              "assert(not ok)\n"
                              "rt:close() -- a second close is harmless\n"
                              "return err"),
              "bad argument #1 to '?' (rl.env is closed)");
}

TEST(LuaArguments, ToBeClosedVariablesReleaseHandles) {
    Lua lua;
    EXPECT_EQ(lua.eval_string("local rl = require('rl')\n"
                              "local keep\n"
                              "do\n"
                              "  local rt <close> = rl.runtime()\n"
                              "  keep = rt:loss('policy_loss')\n"
                              "end\n"
                              "return tostring(keep)"),
              "rl.loss (closed)");
}

TEST(LuaArguments, GarbageCollectionInAnyOrderIsSafe) {
    Lua lua;
    // Parents and children dropped together, many times: the collector may
    // finalize them in any order; ASan builds check no handle is freed twice.
    EXPECT_EQ(lua.run("local rl = require('rl')\n"
                      "for i = 1, 20 do\n"
                      "  local rt = rl.runtime()\n"
                      "  local a, b = rt:env('reverse_text'), rt:loss('policy_loss')\n"
                      "  if i % 2 == 0 then rt = nil end\n"
                      "  a, b = nil, nil\n"
                      "  collectgarbage()\n"
                      "end\n"),
              "");
}

// ---- C errors ------------------------------------------------------------------------------

TEST(LuaErrors, CFailuresCarryTheRuntimeMessage) {
    // The same bad call through the C API, for the expected message.
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.plugin_path = RL_TEST_PLUGIN_DIR;
    desc.log_level = "warn";
    rl_runtime_t *rt = nullptr;
    ASSERT_EQ(rl_runtime_create(&desc, &rt), RL_OK);
    rl_instance_t *inst = nullptr;
    ASSERT_NE(
        rl_instance_create(rt, "env", "reverse_text", "{\"min_len\": 5, \"max_len\": 2}", &inst),
        RL_OK);
    const std::string c_message = rl_last_error();
    rl_runtime_destroy(rt);
    ASSERT_FALSE(c_message.empty());

    Lua lua;
    const std::string msg = lua.eval_string(
        "local rl = require('rl')\n"
        "local ok, err = pcall(rl.env, 'reverse_text', {min_len = 5, max_len = 2})\n"
        "return err");
    EXPECT_NE(msg.find(c_message), std::string::npos) << msg << "\nC: " << c_message;

    EXPECT_NE(lua.eval_string("local rl = require('rl')\n"
                              "local ok, err = pcall(rl.loss, 'no_such_loss')\n"
                              "return err")
                  .find("no loss plugin named 'no_such_loss'"),
              std::string::npos);
    EXPECT_NE(lua.eval_string("local rl = require('rl')\n"
                              "local loss = rl.loss('policy_loss')\n"
                              "local ok, err = pcall(loss.compute, loss, {cu_seqlens = {0, 2},\n"
                              "  logprobs = {-1, -1}, advantages = {1, 1}})\n"
                              "return err")
                  .find("loss:compute: loss 'policy_loss': missing required input 'old_logprobs'"),
              std::string::npos);
    EXPECT_NE(lua.eval_string("local rl = require('rl')\n"
                              "local ok, err = pcall(rl.model, '/nonexistent/model')\n"
                              "return err")
                  .find("/nonexistent/model"),
              std::string::npos);
}

// ---- tensors --------------------------------------------------------------------------------

TEST(LuaTensor, ConstructsIndexesAndConverts) {
    Lua lua;
    EXPECT_EQ(lua.eval_string(R"(
        local rl = require('rl')
        local t = rl.tensor{1, 2, 3}
        assert(t:dtype() == 'int64' and #t == 3 and t[2] == 2 and math.type(t[2]) == 'integer')
        local f = rl.tensor{0.5, 1}
        assert(f:dtype() == 'float32' and f[1] == 0.5)
        local b = rl.tensor{true, false}
        assert(b:dtype() == 'bool' and b[1] == true and b[2] == false)
        local d = rl.tensor({0.1}, 'float64')
        assert(d[1] == 0.1)                               -- exact in float64
        assert(rl.tensor({0.1}, 'float32')[1] ~= 0.1)     -- rounded in float32
        t[3] = 30
        assert(t[3] == 30 and t:sum() == 33 and t:max() == 30 and t:min() == 1)
        local tt = t:totable()
        assert(#tt == 3 and tt[3] == 30)
        local s = t:slice(2)
        assert(#s == 2 and s[1] == 2)
        assert(#t:slice(-1) == 1 and t:slice(-1)[1] == 30)
        assert(#t:slice(2, 1) == 0)
        local c = rl.tensor.cat({t, {4, 5}, rl.tensor({6}, 'int32')})
        assert(#c == 6 and c:dtype() == 'int64' and c[6] == 6)
        local z = rl.tensor.zeros(4, 'float64')
        assert(#z == 4 and z:sum() == 0 and z:dtype() == 'float64')
        local full = rl.tensor.full(3, 2.5)
        assert(full:mean() == 2.5)
        local r = rl.tensor.arange(3, 6)
        assert(#r == 4 and r[1] == 3 and r[4] == 6)
        local conv = rl.tensor({1.0, 2.0}, 'float32'):to('int64')
        assert(conv:dtype() == 'int64' and conv[2] == 2)
        assert(not pcall(function() return rl.tensor({1.5}):to('int64') end))
        local cl = t:clone(); cl[1] = 100
        assert(t[1] == 1)
        assert(rl.tensor.is(t) and not rl.tensor.is({}))
        assert(#rl.tensor({}) == 0 and rl.tensor({}):sum() == 0)
        assert(tostring(rl.tensor({1, 2}, 'int64')) == 'rl.tensor(int64, 2)[1, 2]')
        return 'ok')"),
              "ok");
}

TEST(LuaTensor, EmptyTensorReductionsThatNeedElementsAreErrors) {
    Lua lua;
    EXPECT_NE(lua.eval_string("local rl = require('rl')\n"
                              "local ok, err = pcall(function() return rl.tensor({}):mean() end)\n"
                              "return err")
                  .find("the tensor is empty"),
              std::string::npos);
}

// ---- configuration
// -------------------------------------------------------------------------------

TEST(LuaConfig, DefaultsWithoutAHostConfig) {
    Lua lua;
    EXPECT_EQ(lua.eval_string("local rl = require('rl')\n"
                              "local c = rl.config()\n"
                              "return c.run.name .. ' ' .. c.rollout.n .. ' ' .. c.env.name"),
              "run 8 reverse_text");
}

// The host's configuration (its defaults with the `sets` overrides) as JSON text.
std::string host_config(const std::vector<std::string> &sets) {
    std::vector<const char *> overrides;
    for (const auto &x : sets) overrides.push_back(x.c_str());
    rl_result_t *res = nullptr;
    EXPECT_EQ(rl_config_load(nullptr, overrides.data(), overrides.size(), &res), RL_OK)
        << rl_last_error();
    rl_string_view_t text{};
    EXPECT_EQ(rl_result_text(res, "config", &text), RL_OK);
    const std::string cfg(text.data, text.length);
    rl_result_destroy(res);
    return cfg;
}

TEST(LuaConfig, HostConfigIsWhatScriptsSee) {
    const std::string cfg =
        host_config({"run.name=from_host", "rollout.n=3", "env.params={max_len: 4}"});
    Lua lua(cfg);
    EXPECT_EQ(
        lua.eval_string("local rl = require('rl')\n"
                        "local c = rl.config()\n"
                        "return c.run.name .. ' ' .. c.rollout.n .. ' ' .. c.env.params.max_len\n"
                        "  .. ' ' .. c.trainer.lr_schedule"),
        "from_host 3 4 constant");
    // Round trip: the config written back as JSON is the same document.
    const std::string back =
        lua.eval_string("return require('rl').json.encode(require('rl').config())");
    EXPECT_EQ(json::parse(back), json::parse(cfg));
}

TEST(LuaConfig, LoadReportsTheBadKey) {
    Lua lua;
    const std::string msg = lua.eval_string(
        "local ok, err = pcall(require('rl').config_load, nil, {'trainer.learnig_rate=1'})\n"
        "return err");
    EXPECT_NE(msg.find("unknown key 'trainer.learnig_rate'"), std::string::npos) << msg;
}

TEST(LuaConfig, SchemaListsEveryKey) {
    Lua lua;
    EXPECT_GT(lua.eval_number("return #require('rl').config_schema()"), 40);
}

// ---- JSON -----------------------------------------------------------------------------------

TEST(LuaJson, RoundTripsNullArraysAndObjects) {
    Lua lua;
    const std::string out = lua.eval_string(
        "local rl = require('rl')\n"
        "local v = rl.json.decode('{\"a\": null, \"b\": [], \"c\": {}, \"d\": [1, 2.5, \"x\"]}')\n"
        "assert(v.a == rl.null and #v.b == 0 and #v.d == 3)\n"
        "return rl.json.encode(v)");
    EXPECT_EQ(json::parse(out),
              json::parse(R"({"a": null, "b": [], "c": {}, "d": [1, 2.5, "x"]})"));
    EXPECT_EQ(lua.eval_string("local rl = require('rl')\n"
                              "return rl.json.encode({list = rl.array(), t = rl.tensor({1, 2})})"),
              R"({"list":[],"t":[1,2]})");
}

// ---- the same numbers as the C API
// -------------------------------------------------------------------

class LuaMatchesCApi : public ::testing::Test {
protected:
    void SetUp() override {
        rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
        desc.plugin_path = RL_TEST_PLUGIN_DIR;
        desc.log_level = "warn";
        ASSERT_EQ(rl_runtime_create(&desc, &rt_), RL_OK) << rl_last_error();
    }
    void TearDown() override { rl_runtime_destroy(rt_); }
    rl_instance_t *make(const char *kind, const char *name, const char *params) {
        rl_instance_t *i = nullptr;
        EXPECT_EQ(rl_instance_create(rt_, kind, name, params, &i), RL_OK) << rl_last_error();
        return i;
    }
    rl_runtime_t *rt_ = nullptr;
};

rl_tensor_view_t view(std::vector<double> &v, int64_t *shape) {
    *shape = static_cast<int64_t>(v.size());
    return rl_tensor_view_t{
        v.data(), {RL_DEVICE_CPU, 0}, 1, {RL_DTYPE_FLOAT, 64, 1}, shape, nullptr, 0};
}
rl_tensor_view_t view(std::vector<int64_t> &v, int64_t *shape) {
    *shape = static_cast<int64_t>(v.size());
    return rl_tensor_view_t{v.data(), {RL_DEVICE_CPU, 0}, 1, {RL_DTYPE_INT, 64, 1}, shape, nullptr,
                            0};
}

// The values of float64 tensor `name` of a result.
std::vector<double> result_doubles(rl_result_t *res, const char *name) {
    rl_tensor_view_t t{};
    EXPECT_EQ(rl_result_tensor(res, name, &t), RL_OK) << name;
    const auto *p = static_cast<const double *>(t.data);
    int64_t n = 1;
    for (int32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
    return p ? std::vector<double>(p, p + n) : std::vector<double>{};
}

TEST_F(LuaMatchesCApi, EnvSampleAndScore) {
    rl_instance_t *env = make("env", "reverse_text", "{\"max_len\": 6}");
    rl_result_t *res = nullptr;
    ASSERT_EQ(rl_env_sample(env, 5, 42, &res), RL_OK) << rl_last_error();
    rl_string_view_t text{};
    ASSERT_EQ(rl_result_text(res, "tasks", &text), RL_OK);
    const json tasks = json::parse(std::string(text.data, text.length));
    rl_result_destroy(res);
    const std::string task2 = tasks[2].dump();
    const std::string completion = "xyz\nmore";
    ASSERT_EQ(rl_env_score(env, {task2.data(), task2.size()},
                           {completion.data(), completion.size()}, &res),
              RL_OK);
    double reward = 0, exact = 0;
    ASSERT_EQ(rl_result_scalar(res, "reward", &reward), RL_OK);
    ASSERT_EQ(rl_result_metric(res, "exact_match", &exact), RL_OK);
    rl_result_destroy(res);
    const std::string answer = tasks[2]["answer"];
    ASSERT_EQ(rl_env_score(env, {task2.data(), task2.size()}, {answer.data(), answer.size()}, &res),
              RL_OK);
    double perfect = 0;
    ASSERT_EQ(rl_result_scalar(res, "reward", &perfect), RL_OK);
    rl_result_destroy(res);

    Lua lua;
    ASSERT_EQ(lua.run("local rl = require('rl')\n"
                      "local env = rl.env('reverse_text', {max_len = 6})\n"
                      "local tasks = env:sample(5, 42)\n"
                      "local r, m = env:score(tasks[3], 'xyz\\nmore')\n"
                      "local p = env:score(tasks[3], tasks[3].answer)\n"
                      "return rl.json.encode(tasks), r, m.exact_match, p",
                      4),
              "");
    EXPECT_EQ(json::parse(lua_tostring(lua.state(), 1)), tasks);
    EXPECT_EQ(lua_tonumber(lua.state(), 2), reward);
    EXPECT_EQ(lua_tonumber(lua.state(), 3), exact);
    EXPECT_EQ(lua_tonumber(lua.state(), 4), perfect);
    EXPECT_EQ(perfect, 1.0);
    rl_instance_destroy(env);
}

TEST_F(LuaMatchesCApi, LossValueGradientsAndMetrics) {
    rl_instance_t *loss =
        make("loss", "policy_loss", "{\"eps_clip\": 0.1, \"compute_kl_stats\": true}");
    std::vector<double> lp = {-1.0, -0.5, -2.0, -0.25, -1.5, -0.75};
    std::vector<double> old = {-1.1, -0.4, -1.0, -0.5, -1.4, -0.9};
    std::vector<double> adv = {0.5, 0.5, -1.0, -1.0, 2.0, 2.0};
    std::vector<double> mask = {0, 1, 1, 1, 0, 1};
    std::vector<int64_t> cu = {0, 4, 6};
    int64_t s[5];
    rl_tensor_arg_t args[] = {{"logprobs", view(lp, &s[0])},
                              {"old_logprobs", view(old, &s[1])},
                              {"advantages", view(adv, &s[2])},
                              {"loss_mask", view(mask, &s[3])}};
    rl_loss_inputs_t in{};
    in.struct_size = sizeof(in);
    in.tensors = {args, 4};
    in.cu_seqlens = view(cu, &s[4]);
    rl_result_t *res = nullptr;
    ASSERT_EQ(rl_loss_compute(loss, &in, 1, &res), RL_OK) << rl_last_error();
    double value = 0, clipfrac = 0;
    ASSERT_EQ(rl_result_scalar(res, "loss", &value), RL_OK);
    ASSERT_EQ(rl_result_metric(res, "pg_clipfrac", &clipfrac), RL_OK);
    const std::vector<double> g = result_doubles(res, "grad.logprobs");
    rl_result_destroy(res);
    rl_instance_destroy(loss);

    Lua lua;
    ASSERT_EQ(lua.run(R"(
        local rl = require('rl')
        local loss = rl.loss('policy_loss', {eps_clip = 0.1, compute_kl_stats = true})
        local r = loss:compute{
            logprobs = {-1.0, -0.5, -2.0, -0.25, -1.5, -0.75},
            old_logprobs = {-1.1, -0.4, -1.0, -0.5, -1.4, -0.9},
            advantages = {0.5, 0.5, -1.0, -1.0, 2.0, 2.0},
            loss_mask = {0, 1, 1, 1, 0, 1},
            cu_seqlens = {0, 4, 6},
        }
        return r.loss, r.metrics.pg_clipfrac, r['grad.logprobs'])",
                      3),
              "");
    EXPECT_EQ(lua_tonumber(lua.state(), 1), value);
    EXPECT_EQ(lua_tonumber(lua.state(), 2), clipfrac);
    lua_State *L = lua.state();
    ASSERT_EQ(luaL_len(L, 3), 6);
    for (int i = 0; i < 6; ++i) {
        lua_geti(L, 3, i + 1);
        EXPECT_EQ(lua_tonumber(L, -1), g[static_cast<size_t>(i)]) << "token " << i;
        lua_pop(L, 1);
    }
}

TEST_F(LuaMatchesCApi, AdvantagesAndFilterVerdicts) {
    rl_instance_t *adv = make("advantage", "grpo", "{}");
    std::vector<double> rewards = {1.0, 0.0, 0.5, 0.25};
    std::vector<int64_t> groups = {7, 7, 9, 9};
    std::vector<int64_t> cu = {0, 2, 5, 6, 8};
    std::vector<double> mask = {0, 1, 0, 1, 1, 1, 0, 1};
    int64_t s[4];
    rl_tensor_arg_t targs[] = {{"loss_mask", view(mask, &s[3])}};
    rl_advantage_inputs_t in{};
    in.struct_size = sizeof(in);
    in.rewards = view(rewards, &s[0]);
    in.group_ids = view(groups, &s[1]);
    in.cu_seqlens = view(cu, &s[2]);
    in.tensors = {targs, 1};
    rl_result_t *res = nullptr;
    ASSERT_EQ(rl_advantage_compute(adv, &in, &res), RL_OK) << rl_last_error();
    const std::vector<double> want = result_doubles(res, "advantages");
    rl_result_destroy(res);
    rl_instance_destroy(adv);

    Lua lua;
    ASSERT_EQ(lua.run(R"(
        local rl = require('rl')
        local a = rl.advantage('grpo'):compute{
            rewards = {1.0, 0.0, 0.5, 0.25}, group_ids = {7, 7, 9, 9},
            cu_seqlens = {0, 2, 5, 6, 8}, loss_mask = {0, 1, 0, 1, 1, 1, 0, 1}}
        return a.advantages)",
                      1),
              "");
    lua_State *L = lua.state();
    for (int i = 0; i < 8; ++i) {
        lua_geti(L, 1, i + 1);
        EXPECT_EQ(lua_tonumber(L, -1), want[static_cast<size_t>(i)]) << "token " << i;
        lua_pop(L, 1);
    }

    // A repetitive rollout trips the repetition filter the same way from Lua.
    EXPECT_EQ(lua.eval_string(R"(
        local rl = require('rl')
        local f = rl.filter('repetition', {window = 16, enforce = true})
        local ids, lps = {}, {}
        for i = 1, 64 do ids[i] = 7; lps[i] = -0.01 end
        local v = f:check(ids, lps, 259)
        assert(v.flagged == true and v.enforce == true and v.reason ~= '', v.reason)
        local ok = f:check({1, 2, 3, 4}, {-1, -2, -1, -2}, 259)
        assert(ok.flagged == false)
        return 'ok')"),
              "ok");
}

// ---- buffer and batch helpers -------------------------------------------------------------------

TEST(LuaHelpers, SeedsAreStableAndSpread) {
    Lua lua;
    EXPECT_EQ(lua.eval_string(R"(
        local rl = require('rl')
        assert(rl.seed(1, 'rl', 3) == rl.seed(1, 'rl', 3))
        assert(rl.seed(1, 'rl', 3) ~= rl.seed(1, 'rl', 4))
        assert(rl.seed(1, 'rl', 3) ~= rl.seed(2, 'rl', 3))
        assert(rl.seed(1, 'rl', 3) ~= rl.seed(1, 'sft', 3))
        local s = rl.seed(0)
        assert(s >= 0 and s < 2^53)
        return 'ok')"),
              "ok");
}

// ---- model, trainer, engine ------------------------------------------------------------------

// Runs `script` with `rl` required and the tiny model (seed 7) written to
// DIR .. '/tiny', DIR a fresh folder; the script's result.
std::string eval_with_tiny_model(const std::string &script) {
    Lua lua;
    lua.set_global("DIR", temp_dir());
    return lua.eval_string("local rl = require('rl')\n"
                           "rl.init_model('tiny', DIR .. '/tiny', 7)\n" +
                           script);
}

TEST(LuaTraining, TrainerAndEngineWorkThroughTheModule) {
    EXPECT_EQ(eval_with_tiny_model(R"(
        local model = rl.model(DIR .. '/tiny', {threads = 1})
        local info = model:info()
        assert(info.vocab_size == 259 and info.eos_token_ids[1] == 258, rl.json.encode(info))
        local tok = model:tokenizer()
        local ids = tok:encode('abc')
        assert(ids:dtype() == 'int64' and #ids == 3 and tok:decode(ids) == 'abc')
        -- the model's own chat template (ChatML for the tiny preset) by default
        local msgs = {{role = 'user', content = 'hi'}}
        local own = tok:apply_chat_template(msgs, {chat_template_kwargs = {enable_thinking = false}})
        assert(own == '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n', own)
        assert(tok:apply_chat_template(msgs, {template = 'chatml', add_generation_prompt = false})
               == '<|im_start|>user\nhi<|im_end|>\n')
        local cok, cerr = pcall(tok.apply_chat_template, tok, msgs, {template = 'chatml', tools = {{}}})
        assert(not cok and tostring(cerr):find("need the model's own template", 1, true), tostring(cerr))
        assert(#rl.encode_prompts(tok, {{prompt = 'x'}}, 'model')[1] == #tok:encode((own:gsub('hi', 'x'))))
        local engine = model:engine()
        local out = engine:generate({ids, rl.tensor({100, 101})}, {n = 2, max_tokens = 4, seed = 1})
        assert(#out.cu_seqlens == 5 and #out.completions == 4 and #out.finish_reasons == 4)
        local samples = rl.samples(out)
        assert(#samples == 4 and samples[3].prompt_index == 2 and #samples[1].token_ids == #samples[1].logprobs)
        -- wrong argument types on the training objects
        local env = rl.env('reverse_text')
        local bad = {
          {function() return engine:generate('abc') end, "table expected, got string"},
          {function() return engine:generate({{'x'}}) end, "prompts[1][1] must be a number"},
          {function() return engine:generate({ids}, {n = 'many'}) end, "engine:generate"},
          {function() return model:trainer(5) end, "trainer config must be a table"},
          {function() return tok:decode({1.5}) end, "must be an integer"},
          {function() return tok:encode(nil) end, "string expected, got nil"},
          {function() return engine.sync_weights(model) end, "rl.engine expected, got rl.model"},
        }
        for i, b in ipairs(bad) do
          local ok, err = pcall(b[1])
          assert(not ok and tostring(err):find(b[2], 1, true), i .. ': ' .. tostring(err))
        end
        local trainer = model:trainer({learning_rate = 1e-3, seed = 1})
        local ok, err = pcall(trainer.forward_backward, trainer, {input_ids = {1, 2}, cu_seqlens = {0, 2}}, env)
        assert(not ok and err:find('rl.loss expected, got rl.env', 1, true), err)
        ok, err = pcall(trainer.forward_backward, trainer, {input_ids = {1, 2}}, rl.loss('causallm_loss'))
        assert(not ok and err:find("missing field 'cu_seqlens'", 1, true), err)
        ok, err = pcall(trainer.forward_backward, trainer, {input_ids = {1, 2}, cu_seqlens = {0, 2}, junk = 'x'}, rl.loss('causallm_loss'))
        assert(not ok and err:find('batch.junk must be an rl.tensor or a table', 1, true), err)
        -- one GRPO step through the typed verbs
        local buffer = rl.buffer{group_size = 4}
        local tasks = env:sample(2, 5)
        local rollouts = engine:rollouts(tasks, {group_offset = 10,
          sampling = {n = 4, max_tokens = 6, seed = 3, temperature = 1.0}})
        ok, err = pcall(buffer.push_rollouts, buffer, rollouts)
        assert(not ok and err:find('rollout 0 is not scored', 1, true), err)
        rollouts:score(env)
        local flagged = rollouts:filter({rl.filter('repetition', {window = 4, enforce = true})})
        assert(flagged.flagged >= 0 and flagged.masked == flagged.flagged)
        local ri = rollouts:info()
        assert(ri.rollouts == 8 and ri.groups == 2 and ri.group_ids[1] == 10 and ri.group_ids[8] == 11)
        assert(#ri.completions == 8 and ri.reward_mean >= 0)
        assert(buffer:push_rollouts(rollouts) == 8)
        local batch = rollouts:to_batch()   -- every rollout, no buffer
        local bi = batch:info()
        assert(bi.rollouts == 8 and bi.groups == 2 and #bi.input_ids == bi.tokens)
        local adv = batch:compute_advantages(rl.advantage('grpo'))
        assert(#adv.advantages == bi.tokens)
        local fwd = trainer:forward(batch)
        assert(#fwd.logprobs == bi.tokens)
        batch:set('ref_logprobs', fwd.logprobs)
        ok, err = pcall(batch.set, batch, 'input_ids', fwd.logprobs)
        assert(not ok and err:find('cannot be replaced', 1, true), err)
        local r = trainer:forward_backward(batch, rl.loss('importance_sampling'))
        assert(type(r.loss) == 'number' and r.tokens == bi.tokens)
        local parts = batch:split(2)
        assert(#parts == 2 and parts[1]:info().groups == 1 and parts[2]:info().rollouts == 4)
        local o = trainer:optim_step{learning_rate = 1e-3}
        assert(o.step == 1 and o.policy_version >= 1 and o.grad_norm > 0)
        assert(engine:sync_weights(buffer) == o.policy_version)
        assert(buffer:stats().policy_version == o.policy_version)
        local path = trainer:save_checkpoint(DIR .. '/ck', {cursor = 3})
        local back = trainer:load_checkpoint(DIR .. '/ck')
        assert(back.path == path and back.state.cursor == 3 and back.step == 1)
        assert(trainer:load_checkpoint(DIR .. '/none') == nil)
        -- closing the model closes what depends on it
        model:close()
        assert(tostring(trainer) == 'rl.trainer (closed)' and tostring(engine) == 'rl.engine (closed)')
        assert(tostring(tok) == 'rl.tokenizer (closed)')
        ok, err = pcall(trainer.optim_step, trainer)
        assert(not ok and err:find('rl.trainer is closed', 1, true), err)
        return 'ok')"),
              "ok");
}

TEST(LuaTraining, TokenizerFlagsTokenizerWithoutModelAndBatchTemperature) {
    EXPECT_EQ(eval_with_tiny_model(R"(
        local tok = rl.tokenizer(DIR .. '/tiny')
        assert(tok:info().has_model == false)
        local text = 'a<|im_end|>b'
        assert(#tok:encode(text) == 3 and #tok:encode(text, {plain_text = true}) == #text)
        local ids, prompt = tok:encode_chat({{role = 'user', content = text}})
        assert(prompt == '<|im_start|>user\n' .. text .. '<|im_end|>\n<|im_start|>assistant\n', prompt)
        local specials = 0
        for i = 1, #ids do if ids[i] >= 256 then specials = specials + 1 end end
        assert(specials == 3, specials)   -- the template's, not the content's
        assert(tok:decode(ids, {skip_special_tokens = true}) == 'user\n' .. text .. '\nassistant\n')
        local enc = rl.encode_prompts(tok, {{prompt = text}}, 'chatml')[1]
        assert(#enc == #ids)
        -- a table batch carries its sampling temperature to the trainer
        local model = rl.model(DIR .. '/tiny', {threads = 1})
        local trainer = model:trainer()
        local batch = {input_ids = {1, 2, 3}, cu_seqlens = {0, 3}, sampling_temperature = 0.5}
        assert(trainer:forward(batch).logprob_temperature == 0.5)
        batch.sampling_temperature = nil
        assert(trainer:forward(batch).logprob_temperature == 1)
        local ok, err = pcall(function() return model:trainer({logprob_temperature = 0}) end)
        assert(not ok and err:find('logprob_temperature', 1, true), err)
        return 'ok')"),
              "ok");
}

// ---- the run object ----------------------------------------------------------------------------

TEST(LuaRun, WritesConfigAndOneMetricsLinePerStep) {
    const std::string dir = temp_dir();
    Lua lua(host_config({"run.dir=" + dir, "run.name=unit", "run.steps=4", "run.progress=lines"}));
    ASSERT_EQ(lua.run(R"(
        local rl = require('rl')
        local run = rl.run(rl.config())
        for step in run:steps() do
          run:log{reward = step / 10, tokens = 100}
          if step == 3 then run:request_stop() end
        end
        local s = run:finish()
        assert(s.interrupted and s.phases.rl.steps == 3, 'stopped after step 3')
        assert(s.phases.rl.first < s.phases.rl.last))"),
              "");
    std::ifstream in(dir + "/unit/metrics.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        const json rec = json::parse(line);
        ++n;
        EXPECT_EQ(rec["step"], n);
        EXPECT_EQ(rec["phase"], "rl");
        EXPECT_DOUBLE_EQ(rec["reward"].get<double>(), n / 10.0);
        EXPECT_TRUE(rec.contains("step_time") && rec.contains("tokens_per_s"));
    }
    EXPECT_EQ(n, 3);
    std::ifstream c(dir + "/unit/config.json");
    ASSERT_TRUE(c);
    EXPECT_EQ(json::parse(c)["run"]["name"], "unit");
    std::ifstream s(dir + "/unit/summary.json");
    ASSERT_TRUE(s);
    EXPECT_EQ(json::parse(s)["phases"]["rl"]["steps"], 3);
}

TEST(LuaRun, LogOutsideAStepIsAnError) {
    const std::string dir = temp_dir();
    Lua lua;
    const std::string msg = lua.eval_string("local rl = require('rl')\n"
                                            "local cfg = rl.config()\n"
                                            "cfg.run.dir = '" +
                                            dir +
                                            "'\n"
                                            "local run = rl.run(cfg)\n"
                                            "local ok, err = pcall(run.log, run, {x = 1})\n"
                                            "return err");
    EXPECT_NE(msg.find("run:log: no step in progress"), std::string::npos) << msg;
}

} // namespace
