// rlhost: the command-line host. A client of the C API (librl) like any embedder.
#include "launch.hpp"
#include "report.hpp"
#include "run.hpp"
#include "serve.hpp"
#include "training_server.hpp"

#include <rl_api.h>

#include <nlohmann/json.hpp>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "usage: rlhost [--log-level LEVEL] [--plugin-path PATH]... COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  run SCRIPT.lua [--config FILE] [--set K=V]... [-- ARGS]\n"
    "                                      run a Lua training script (see rlhost run --help)\n"
    "  launch --nproc-per-node N [...] -- COMMAND [ARGS]\n"
    "                                      run N ranks of a distributed run (rlhost launch "
    "--help)\n"
    "  serve --model DIR [--host H] [--port P] [--api-key K] [...]\n"
    "                                      serve the model over HTTP: OpenAI-compatible and\n"
    "                                      SGLang-native routes (rlhost serve --help)\n"
    "  training-server --model DIR [--port P] [--checkpoint-dir D] [...]\n"
    "                                      train the model over HTTP with the Tinker API\n"
    "                                      (rlhost training-server --help)\n"
    "  init-model --preset tiny|tiny-moe|tiny-reward --out DIR [--seed N]\n"
    "                                      write the built-in model as a Hugging Face folder\n"
    "  report RUN_DIR [--out FILE]         one HTML page of a run folder: charts, samples\n"
    "  plugins [--json]                    list loaded plugins and refused libraries\n"
    "  config [--config FILE] [--set K=V]...  print the resolved run configuration (JSON)\n"
    "  config --schema                     print every configuration key (JSON)\n"
    "  config --markdown                   the key tables of docs/configuration.md\n"
    "  --version                           print the runtime and ABI versions\n"
    "  --help                              this text\n"
    "\n"
    "Plugins are found in --plugin-path entries, then RL_PLUGIN_PATH, then the build's\n"
    "and install's plugin folders.\n";

std::string abi_string(uint32_t v) {
    return std::to_string(RL_VERSION_MAJOR(v)) + "." + std::to_string(RL_VERSION_MINOR(v)) + "." +
           std::to_string(RL_VERSION_PATCH(v));
}

int fail(const std::string &what) {
    std::cerr << "rlhost: " << what << "\n";
    return 1;
}

int fail_rl(const std::string &what) {
    return fail(what + ": " + rl_last_error());
}

// rlhost init-model --preset tiny|tiny-moe|tiny-reward --out DIR [--seed N]: a model folder without
// writing a script (docs/model.md, "The tiny preset").
int cmd_init_model(const std::vector<std::string> &args) {
    const char *usage =
        "usage: rlhost init-model --preset tiny|tiny-moe|tiny-reward --out DIR [--seed N]";
    std::string preset, out;
    uint64_t seed = 0;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--help" || a == "-h") {
            std::cout << usage << "\n";
            return 0;
        }
        if (i + 1 >= args.size()) return fail("init-model: " + a + " needs a value\n" + usage);
        const std::string &v = args[++i];
        if (a == "--preset") {
            preset = v;
        } else if (a == "--out") {
            out = v;
        } else if (a == "--seed") {
            size_t used = 0;
            try {
                seed = std::stoull(v, &used);
            } catch (const std::exception &) {
                used = 0;
            }
            if (used == 0 || used != v.size() || v[0] == '-')
                return fail("init-model: --seed must be an integer >= 0, got '" + v + "'");
        } else {
            return fail("init-model: unknown option '" + a + "'\n" + usage);
        }
    }
    if (preset.empty() || out.empty())
        return fail(std::string("init-model: --preset and --out are required\n") + usage);
    if (rl_model_init_preset(preset.c_str(), out.c_str(), seed) != RL_OK)
        return fail_rl("init-model");
    std::cout << "rlhost init-model: wrote the '" << preset << "' model to " << out << "\n";
    return 0;
}

std::string text_of(rl_result_t *r, const char *name) {
    rl_string_view_t s{};
    if (rl_result_text(r, name, &s) != RL_OK) return {};
    return std::string(s.data, static_cast<size_t>(s.length));
}

struct Options {
    std::string log_level = "warn";
    bool log_level_given = false;
    std::string plugin_path;
    std::vector<std::string> args; // after the command
    std::string command;
};

int cmd_plugins(const Options &o) {
    bool as_json = false;
    for (const auto &a : o.args) {
        if (a == "--json")
            as_json = true;
        else
            return fail("plugins: unknown option '" + a + "'");
    }
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.plugin_path = o.plugin_path.empty() ? nullptr : o.plugin_path.c_str();
    desc.log_level = o.log_level.c_str();
    rl_runtime_t *rt = nullptr;
    if (rl_runtime_create(&desc, &rt) != RL_OK) return fail_rl("cannot create the runtime");
    rl_result_t *res = nullptr;
    if (rl_runtime_list_plugins(rt, &res) != RL_OK) {
        rl_runtime_destroy(rt);
        return fail_rl("cannot list plugins");
    }
    const std::string text = text_of(res, "plugins");
    rl_result_destroy(res);
    rl_runtime_destroy(rt);
    if (as_json) {
        std::cout << text << "\n";
        return 0;
    }
    // librl writes valid UTF-8 (descriptors with bad strings are refused, reasons
    // escaped); control characters, as in a file name, are still escaped here.
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("plugins") || !j.contains("refused"))
        return fail("plugins: the runtime's plugin list is not valid JSON");
    auto field = [](const nlohmann::json &o, const char *key) {
        std::string out;
        for (const char c : o.value(key, std::string())) {
            const auto b = static_cast<unsigned char>(c);
            if (b < 0x20 || b == 0x7F) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02x", b);
                out += buf;
            } else {
                out += c;
            }
        }
        return out;
    };
    std::printf("%-10s %-22s %-8s %-6s %s\n", "KIND", "NAME", "VERSION", "ABI", "PATH");
    for (const auto &p : j["plugins"])
        std::printf("%-10s %-22s %-8s %-6s %s\n", field(p, "kind").c_str(),
                    field(p, "name").c_str(), field(p, "version").c_str(),
                    field(p, "abi_version").c_str(), field(p, "path").c_str());
    if (!j["refused"].empty()) {
        std::printf("\nrefused:\n");
        for (const auto &r : j["refused"])
            std::printf("  %s: %s\n", field(r, "path").c_str(), field(r, "reason").c_str());
    }
    return 0;
}

int cmd_config(const Options &o) {
    std::string file;
    std::vector<std::string> sets;
    for (size_t i = 0; i < o.args.size(); ++i) {
        const std::string &a = o.args[i];
        if ((a == "--config" || a == "--set") && i + 1 >= o.args.size())
            return fail("config: " + a + " needs a value");
        if (a == "--schema" || a == "--markdown") {
            rl_result_t *res = nullptr;
            if (rl_config_schema(&res) != RL_OK) return fail(rl_last_error());
            if (a == "--schema")
                std::cout << nlohmann::json::parse(text_of(res, "schema")).dump(2) << "\n";
            else
                std::cout << text_of(res, "markdown");
            rl_result_destroy(res);
            return 0;
        }
        if (a == "--config")
            file = o.args[++i];
        else if (a == "--set")
            sets.push_back(o.args[++i]);
        else
            return fail("config: unknown option '" + a + "'");
    }
    std::vector<const char *> ptrs;
    for (const auto &s : sets) ptrs.push_back(s.c_str());
    rl_result_t *res = nullptr;
    if (rl_config_load(file.empty() ? nullptr : file.c_str(), ptrs.data(), ptrs.size(), &res) !=
        RL_OK)
        return fail(rl_last_error());
    std::cout << nlohmann::json::parse(text_of(res, "config")).dump(2) << "\n";
    const auto undeclared = nlohmann::json::parse(text_of(res, "undeclared"));
    rl_result_destroy(res);
    for (const auto &name : undeclared)
        std::cerr << "note: section '" << name.get<std::string>()
                  << "' is not in the schema; the script that reads it declares and checks it\n";
    return 0;
}

} // namespace

// Keeps freed tensor memory in the heap. With glibc's defaults every tensor
// above the mmap threshold (128 KiB, adapting up to 32 MiB) is a fresh
// mapping whose pages the kernel zeroes on first touch, on every training
// and decoding step: a quarter of a decode step's time on the tiny model
// (docs/performance.md). rlhost owns its process, so it sets this; embedders
// decide for theirs (or preload jemalloc / tcmalloc).
static void keep_freed_memory() {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);   // glibc's largest threshold
    ::mallopt(M_TRIM_THRESHOLD, 1024 << 20); // give the heap top back past 1 GiB free
}

int main(int argc, char **argv) {
    keep_freed_memory();
    Options o;
    int i = 1;
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--version") {
            std::printf("rlhost %s (plugin ABI %s, API %s)\n", rl_get_version(),
                        abi_string(rl_get_abi_version()).c_str(),
                        abi_string(rl_get_api_version()).c_str());
            const auto platform = nlohmann::json::parse(rl_platform_info(), nullptr, false);
            if (platform.is_object() && platform.contains("summary"))
                std::printf("%s\n", platform["summary"].get<std::string>().c_str());
            return 0;
        }
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (a == "--log-level" || a == "--plugin-path") {
            if (i + 1 >= argc) return fail(a + " needs a value");
            const std::string v = argv[++i];
            if (a == "--log-level") {
                o.log_level = v;
                o.log_level_given = true;
            } else {
                o.plugin_path += (o.plugin_path.empty() ? "" : ":") + v;
            }
            continue;
        }
        if (a.rfind("--", 0) == 0) return fail("unknown option '" + a + "'\n" + kUsage);
        o.command = a;
        ++i;
        break;
    }
    for (; i < argc; ++i) o.args.emplace_back(argv[i]);
    if (o.command.empty()) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    if (o.command == "plugins") return cmd_plugins(o);
    if (o.command == "init-model") return cmd_init_model(o.args);
    if (o.command == "report") return rlhost::cmd_report(o.args);
    if (o.command == "config") return cmd_config(o);
    if (o.command == "launch") {
        std::vector<std::string> host_args;
        if (o.log_level_given) host_args.insert(host_args.end(), {"--log-level", o.log_level});
        size_t start = 0;
        while (start < o.plugin_path.size()) {
            const size_t end = std::min(o.plugin_path.find(':', start), o.plugin_path.size());
            host_args.insert(host_args.end(),
                             {"--plugin-path", o.plugin_path.substr(start, end - start)});
            start = end + 1;
        }
        return rlhost::cmd_launch(o.args, host_args);
    }
    if (o.command == "serve") return rlhost::cmd_serve(o.args);
    if (o.command == "training-server")
        return rlhost::cmd_training_server(o.args, o.plugin_path, o.log_level);
    if (o.command == "run")
        return rlhost::cmd_run(o.args, o.plugin_path, o.log_level_given ? o.log_level : "");
    return fail("unknown command '" + o.command + "'\n" + kUsage);
}
