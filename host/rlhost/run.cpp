// rlhost run SCRIPT.lua [--config FILE.yaml] [--set key=value]... [-- ARGS...]
#include "run.hpp"

#include <rl/lua.hpp>
#include <rl_api.h>

#include <cstdio>
#include <iostream>
#include <memory>

namespace rlhost {
namespace {

const char *kRunUsage =
    "usage: rlhost run SCRIPT.lua [--config FILE.yaml] [--set KEY=VALUE]... [-- ARGS...]\n"
    "\n"
    "Runs SCRIPT.lua with the module `rl`; the script reads the resolved configuration\n"
    "(FILE.yaml, then the --set overrides, checked against the schema) as rl.config()\n"
    "and ARGS as `...` / arg. Ctrl-C stops the run after the current step and a\n"
    "checkpoint; a second Ctrl-C aborts. Exit status: 0 done, 1 the script failed,\n"
    "2 bad usage or configuration, 130 stopped by Ctrl-C.\n";

struct LuaCloser {
    void operator()(lua_State *L) const { lua_close(L); }
};

std::string text_of(rl_result_t *r, const char *name) {
    rl_string_view_t s{};
    if (rl_result_text(r, name, &s) != RL_OK) return {};
    return std::string(s.data, static_cast<size_t>(s.length));
}

} // namespace

int cmd_run(const std::vector<std::string> &args, const std::string &plugin_path,
            const std::string &log_level) {
    std::string script, config_file;
    std::vector<std::string> sets, script_args;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--help" || a == "-h") {
            std::fputs(kRunUsage, stdout);
            return 0;
        }
        if (a == "--") {
            script_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
            break;
        }
        if (a == "--config" || a == "--set") {
            if (i + 1 >= args.size()) {
                std::cerr << "rlhost run: " << a << " needs a value\n" << kRunUsage;
                return 2;
            }
            if (a == "--config")
                config_file = args[++i];
            else
                sets.push_back(args[++i]);
            continue;
        }
        if (a.rfind("--", 0) == 0 || !script.empty()) {
            std::cerr << "rlhost run: unexpected argument '" << a << "'\n" << kRunUsage;
            return 2;
        }
        script = a;
    }
    if (script.empty()) {
        std::cerr << "rlhost run: no script given\n" << kRunUsage;
        return 2;
    }

    std::vector<const char *> ptrs;
    for (const auto &s : sets) ptrs.push_back(s.c_str());
    rl_result_t *res = nullptr;
    if (rl_config_load(config_file.empty() ? nullptr : config_file.c_str(), ptrs.data(),
                       ptrs.size(), &res) != RL_OK) {
        std::cerr << "rlhost run: " << rl_last_error() << "\n";
        return 2;
    }
    rl::lua::HostOptions options;
    options.config_json = text_of(res, "config");
    rl_result_destroy(res);
    options.plugin_path = plugin_path;
    options.log_level = log_level;
    options.script = script;

    rl::lua::reset_interrupts();
    rl::lua::install_interrupt_handler();
    std::string error;
    bool ok = false;
    {
        std::unique_ptr<lua_State, LuaCloser> L(rl::lua::new_state(options));
        ok = rl::lua::run_file(L.get(), script, script_args, &error);
    } // lua_close: every handle the script still holds is released here
    rl::lua::uninstall_interrupt_handler();
    std::fflush(stdout);
    if (!ok) {
        std::cerr << "rlhost run: " << error << "\n";
        return 1;
    }
    return rl::lua::interrupt_count() > 0 ? 130 : 0;
}

} // namespace rlhost
