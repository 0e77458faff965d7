// rl/lua.hpp: the `rl` Lua module (scripting/) for hosts that run Lua scripts,
// such as `rlhost run`. The module is a client of librl's C API only.
//
// The module is built against Debian's liblua5.4-c++ (Lua compiled as C++), so
// a Lua error unwinds C++ frames with destructors run; hosts link the same
// library (target rl_lua brings it along).
#pragma once

#include <lua.hpp>

#include <string>
#include <vector>

// require("rl"): the module table (rl.runtime, rl.model, rl.tensor, rl.run, ...).
extern "C" int luaopen_rl(lua_State *L);

namespace rl::lua {

// What the host hands to scripts.
struct HostOptions {
    std::string config_json; // the resolved run configuration: rl.config(); "" = defaults
    std::string plugin_path; // extra plugin paths for the default runtime (':'-separated)
    std::string log_level;   // the default runtime's log level; "" = the config's log_level
    std::string script;      // the script path, for messages
};

// A new Lua state with the standard libraries, `rl` preloaded (require "rl")
// and `options` in place. Never NULL (throws std::bad_alloc).
lua_State *new_state(const HostOptions &options);

// Runs the script at `path` with `args` as the global table `arg` (arg[0] is
// the path) and as the chunk's varargs. On failure returns false and sets
// *error to the message (which starts with "file:line:") plus a traceback.
bool run_file(lua_State *L, const std::string &path, const std::vector<std::string> &args,
              std::string *error);

// SIGINT handling for runs: install() makes the first Ctrl-C set a stop flag
// that scripts read through rl.interrupted() / run:stopping(); the second one
// ends the process at once (exit status 130). uninstall() restores the
// previous handler.
void install_interrupt_handler();
void uninstall_interrupt_handler();
int interrupt_count(); // SIGINTs received since install (or reset)
void reset_interrupts();

} // namespace rl::lua
