// rl-validate: conformance checks for plugin libraries (clap-validator's role).
//
//   rl-validate [--params KIND/NAME=JSON]... PLUGIN.so...
//
// Loads each library with the real host loader (librl), checks its entry,
// factory and descriptors, creates every plugin with default parameters (the
// host checks the kind's interface table), runs a small smoke call per kind and
// destroys it. One line per check: "PASS|FAIL|SKIP <file> <check>: <detail>".
// Exit status: 0 when nothing failed, 1 when a check failed, 2 on bad usage.
#include <rl_api.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;

// `s` with every byte outside a valid UTF-8 sequence, and every control
// character, written as \xNN: what a plugin put in a name, a reason or a
// message is printed, never sent to the terminal as is.
std::string printable(const std::string &s) {
    std::string out;
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    for (size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        size_t len = c < 0x80                 ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : c >= 0xE0 && c <= 0xEF ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
        if (len > n - i) len = 0;
        for (size_t k = 1; k < len; ++k) {
            // the second byte's range excludes overlong forms, surrogates and > U+10FFFF
            const unsigned char lo = k > 1 ? 0x80 : c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            const unsigned char hi = k > 1 ? 0xBF : c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (p[i + k] < lo || p[i + k] > hi) len = 0;
        }
        const bool control = (len == 1 && (c < 0x20 || c == 0x7F)) ||
                             (len == 2 && c == 0xC2 && p[i + 1] <= 0x9F); // C0, DEL, C1
        if (len == 0 || control) {
            const size_t bad = len == 0 ? 1 : len;
            for (size_t k = 0; k < bad; ++k) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02x", p[i + k]);
                out += buf;
            }
            i += bad;
        } else {
            out.append(s, i, len);
            i += len;
        }
    }
    return out;
}

struct Report {
    int failed = 0;
    std::string file;
    void line(const char *verdict, const std::string &check, const std::string &detail) {
        std::printf("%s %s %s%s%s\n", verdict, printable(file).c_str(), printable(check).c_str(),
                    detail.empty() ? "" : ": ", printable(detail).c_str());
        std::fflush(stdout);
    }
    void pass(const std::string &check, const std::string &detail = "") {
        line("PASS", check, detail);
    }
    void fail(const std::string &check, const std::string &detail) {
        ++failed;
        line("FAIL", check, detail);
    }
    void skip(const std::string &check, const std::string &detail) { line("SKIP", check, detail); }
};

// A result handle freed on scope exit.
struct Result {
    rl_result_t *r = nullptr;
    ~Result() { rl_result_destroy(r); }
    std::string text(const char *name) const {
        rl_string_view_t s{};
        if (!r || rl_result_text(r, name, &s) != RL_OK) return {};
        return std::string(s.data, static_cast<size_t>(s.length));
    }
    bool scalar(const char *name, double *out) const {
        return r && rl_result_scalar(r, name, out) == RL_OK;
    }
    bool tensor(const char *name, rl_tensor_view_t *out) const {
        return r && rl_result_tensor(r, name, out) == RL_OK;
    }
};

std::string status_msg(rl_status_t st) {
    std::string msg = rl_last_error();
    return std::string(rl_status_name(st)) + (msg.empty() ? "" : ": " + msg);
}

// A call's failure: refusing the synthetic input with RL_ERR_INVALID_ARG and a
// message is what the contract asks of a plugin that needs other inputs or
// parameters; anything else is a failure.
void judge_refusal(Report &rep, const std::string &check, rl_status_t st) {
    const std::string msg = rl_last_error();
    if (st == RL_ERR_INVALID_ARG && !msg.empty())
        rep.pass(check, "refused the synthetic input with a message: " + msg);
    else
        rep.fail(check, status_msg(st));
}

// One float64 or int64 vector viewed as a 1-d CPU tensor.
struct Vec {
    std::vector<double> f;
    std::vector<int64_t> i;
    int64_t n = 0;
    rl_tensor_view_t view() {
        rl_tensor_view_t v{};
        v.device = {RL_DEVICE_CPU, 0};
        v.ndim = 1;
        v.shape = &n;
        if (!i.empty()) {
            n = static_cast<int64_t>(i.size());
            v.data = i.data();
            v.dtype = {RL_DTYPE_INT, 64, 1};
        } else {
            n = static_cast<int64_t>(f.size());
            v.data = f.data();
            v.dtype = {RL_DTYPE_FLOAT, 64, 1};
        }
        return v;
    }
};

Vec floats(std::vector<double> xs) {
    Vec v;
    v.f = std::move(xs);
    return v;
}
Vec ints(std::vector<int64_t> xs) {
    Vec v;
    v.i = std::move(xs);
    return v;
}

// A plausible per-token input of `name` over 4 tokens in 2 sequences.
Vec synthetic_input(const std::string &name) {
    if (name == "labels") return ints({1, 2, 3, 4});
    if (name == "loss_mask") return floats({1, 1, 1, 1});
    if (name == "advantages") return floats({1.0, -1.0, 0.5, -0.5});
    if (name.find("logprobs") != std::string::npos) return floats({-1.0, -0.5, -2.0, -0.25});
    if (name == "entropy") return floats({1.0, 0.5, 2.0, 0.25});
    return floats({0.1, 0.2, 0.3, 0.4}); // values, old_values, returns, ...
}

void smoke_loss(Report &rep, const std::string &who, rl_instance_t *inst) {
    Result sig;
    rl_status_t st = rl_loss_signature(inst, &sig.r);
    if (st != RL_OK) return rep.fail(who + " signature", status_msg(st));
    const json j = json::parse(sig.text("signature"), nullptr, false);
    if (!j.is_object() || !j["required"].is_array() || !j["optional"].is_array() ||
        !j["differentiable"].is_array())
        return rep.fail(who + " signature", "not {required, optional, differentiable} lists");
    std::set<std::string> accepted;
    for (const auto &k : {"required", "optional"})
        for (const auto &n : j[k]) accepted.insert(n.get<std::string>());
    for (const auto &n : j["differentiable"])
        if (!accepted.count(n.get<std::string>()))
            return rep.fail(who + " signature", "differentiable input '" + n.get<std::string>() +
                                                    "' is neither required nor optional");
    rep.pass(who + " signature", j.dump());

    std::vector<Vec> store;
    std::vector<std::string> names;
    for (const auto &n : j["required"]) {
        names.push_back(n.get<std::string>());
        store.push_back(synthetic_input(names.back()));
    }
    std::vector<rl_tensor_arg_t> args;
    for (size_t k = 0; k < store.size(); ++k) args.push_back({names[k].c_str(), store[k].view()});
    Vec cu = ints({0, 2, 4});
    rl_loss_inputs_t in{};
    in.struct_size = sizeof(in);
    in.tensors = {args.empty() ? nullptr : args.data(), args.size()};
    in.cu_seqlens = cu.view();
    Result out;
    st = rl_loss_compute(inst, &in, 1, &out.r);
    if (st != RL_OK) return judge_refusal(rep, who + " compute", st);
    double loss = 0;
    if (!out.scalar("loss", &loss) || !std::isfinite(loss))
        return rep.fail(who + " compute", "no finite scalar 'loss'");
    for (const auto &n : j["differentiable"]) {
        const std::string name = n.get<std::string>();
        if (std::find(names.begin(), names.end(), name) == names.end()) continue;
        rl_tensor_view_t g{};
        if (!out.tensor(("grad." + name).c_str(), &g) || g.ndim != 1 || g.shape[0] != 4)
            return rep.fail(who + " compute", "no gradient 'grad." + name + "' of 4 tokens");
    }
    rep.pass(who + " compute", "loss " + std::to_string(loss) + " over the required inputs");
}

void smoke_advantage(Report &rep, const std::string &who, rl_instance_t *inst) {
    Vec rewards = floats({1.0, 0.0, 1.0, 0.0}), groups = ints({0, 0, 1, 1});
    Vec cu = ints({0, 2, 4, 6, 8});
    rl_advantage_inputs_t in{};
    in.struct_size = sizeof(in);
    in.rewards = rewards.view();
    in.group_ids = groups.view();
    in.cu_seqlens = cu.view();
    Result out;
    rl_status_t st = rl_advantage_compute(inst, &in, &out.r);
    if (st != RL_OK) return judge_refusal(rep, who + " compute", st);
    rl_tensor_view_t a{};
    if (!out.tensor("advantages", &a) || a.ndim != 1 || a.shape[0] != 8)
        return rep.fail(who + " compute", "no tensor 'advantages' of 8 tokens");
    rep.pass(who + " compute", "4 sequences in 2 groups");
}

void smoke_filter(Report &rep, const std::string &who, rl_instance_t *inst) {
    Vec ids = ints({1, 2, 3, 4}), lps = floats({-0.5, -1.0, -0.25, -2.0});
    rl_rollout_view_t ro{};
    ro.struct_size = sizeof(ro);
    ro.token_ids = ids.view();
    ro.logprobs = lps.view();
    ro.vocab_size = 16;
    Result out;
    rl_status_t st = rl_filter_check(inst, &ro, &out.r);
    if (st != RL_OK) return judge_refusal(rep, who + " check", st);
    double flagged = -1;
    if (!out.scalar("flagged", &flagged)) return rep.fail(who + " check", "no verdict");
    rep.pass(who + " check", flagged != 0 ? "flagged '" + out.text("reason") + "'" : "not flagged");
}

void smoke_env(Report &rep, const std::string &who, rl_instance_t *inst) {
    Result tasks;
    rl_status_t st = rl_env_sample(inst, 2, 0, &tasks.r);
    if (st != RL_OK) return judge_refusal(rep, who + " sample", st);
    const json j = json::parse(tasks.text("tasks"), nullptr, false);
    if (!j.is_array() || j.size() != 2 || !j[0].is_object() || !j[0].contains("prompt"))
        return rep.fail(who + " sample", "'tasks' is not an array of 2 {prompt, ...} objects");
    rep.pass(who + " sample", "2 tasks");
    const std::string task = j[0].dump();
    Result score;
    st = rl_env_score(inst, rl_string_view_t{task.data(), task.size()}, rl_string_view_t{"", 0},
                      &score.r);
    if (st != RL_OK) return judge_refusal(rep, who + " score", st);
    double reward = NAN;
    if (!score.scalar("reward", &reward)) return rep.fail(who + " score", "no reward");
    rep.pass(who + " score", "empty completion scores " + std::to_string(reward));
}

const std::regex &reverse_dns() {
    // At least three labels (tld.vendor.name), lowercase start, no empty label.
    static const std::regex re("^[a-z][a-z0-9-]*(\\.[A-Za-z0-9_-]+){2,}$");
    return re;
}
const std::regex &semver() {
    static const std::regex re("^[0-9]+\\.[0-9]+\\.[0-9]+([-+][0-9A-Za-z.+-]*)?$");
    return re;
}

void validate_plugin(Report &rep, rl_runtime_t *rt, const json &p,
                     const std::map<std::string, std::string> &params) {
    const std::string kind = p.value("kind", ""), name = p.value("name", "");
    const std::string id = p.value("id", ""), version = p.value("version", "");
    const std::string who = kind + " '" + name + "'";
    if (std::regex_match(id, reverse_dns()))
        rep.pass(who + " id", id);
    else
        rep.fail(who + " id",
                 "'" + id + "' is not reverse-DNS (e.g. org.example.loss.my_loss: 3+ labels)");
    if (std::regex_match(version, semver()))
        rep.pass(who + " version", version);
    else
        rep.fail(who + " version", "'" + version + "' does not parse as MAJOR.MINOR.PATCH");
    const std::string abi = p.value("abi_version", "");
    unsigned maj = 0, min = 0, pat = 0;
    const uint32_t host = rl_get_abi_version();
    if (std::sscanf(abi.c_str(), "%u.%u.%u", &maj, &min, &pat) != 3)
        rep.fail(who + " abi", "ABI version '" + abi + "' does not parse");
    else if (!RL_ABI_COMPATIBLE(host, RL_MAKE_VERSION(maj, min, pat)))
        rep.fail(who + " abi", "ABI " + abi + " is incompatible with the host's " +
                                   std::to_string(RL_VERSION_MAJOR(host)) + "." +
                                   std::to_string(RL_VERSION_MINOR(host)));
    else
        rep.pass(who + " abi", "ABI " + abi + ", major matches the host's");

    const auto given = params.find(kind + "/" + name);
    const std::string args = given == params.end() ? "{}" : given->second;
    rl_instance_t *inst = nullptr;
    rl_status_t st = rl_instance_create(rt, kind.c_str(), name.c_str(), args.c_str(), &inst);
    if (st != RL_OK) {
        const std::string msg = rl_last_error();
        if (st == RL_ERR_INVALID_ARG && given == params.end() &&
            msg.find("parameter") != std::string::npos) {
            rep.skip(who + " create", "needs parameters (" + msg + "); pass --params " + kind +
                                          "/" + name + "='{...}'");
            return;
        }
        rep.fail(who + " create", status_msg(st));
        return;
    }
    rep.pass(who + " create", "params " + args + "; interface present and well-formed");
    {
        Result pr;
        st = rl_instance_params(inst, &pr.r);
        double from_plugin = 0;
        const json j = json::parse(pr.text("params"), nullptr, false);
        if (st != RL_OK)
            rep.fail(who + " params", status_msg(st));
        else if (!j.is_object())
            rep.fail(who + " params", "not a JSON object");
        else
            rep.pass(who + " params",
                     j.dump() + (pr.scalar("from_plugin", &from_plugin) && from_plugin != 0
                                     ? " (get_params)"
                                     : " (as given; the plugin has no get_params)"));
    }
    if (kind == RL_KIND_LOSS)
        smoke_loss(rep, who, inst);
    else if (kind == RL_KIND_ADVANTAGE)
        smoke_advantage(rep, who, inst);
    else if (kind == RL_KIND_FILTER)
        smoke_filter(rep, who, inst);
    else if (kind == RL_KIND_ENV)
        smoke_env(rep, who, inst);
    else
        rep.skip(who + " smoke", "no smoke call for kind " + kind + " (needs a peer)");
    rl_instance_destroy(inst);
    rep.pass(who + " destroy");
}

int validate_file(const std::string &path, const std::map<std::string, std::string> &params) {
    Report rep;
    rep.file = path;
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
    desc.log_level = "off";
    rl_runtime_t *rt = nullptr;
    rl_status_t st = rl_runtime_create(&desc, &rt);
    if (st != RL_OK) {
        rep.fail("runtime", status_msg(st));
        return rep.failed;
    }
    st = rl_runtime_load_plugin(rt, path.c_str());
    if (st != RL_OK) {
        rep.fail("load", status_msg(st));
        rl_runtime_destroy(rt);
        return rep.failed;
    }
    rep.pass("load", "entry, ABI version, init and factory accepted");
    Result list;
    st = rl_runtime_list_plugins(rt, &list.r);
    const json j = st == RL_OK ? json::parse(list.text("plugins"), nullptr, false) : json();
    if (!j.is_object() || !j.contains("plugins") || !j.contains("refused")) {
        rep.fail("descriptors", st == RL_OK ? "the plugin list is not valid JSON"
                                            : "cannot list the plugins: " + status_msg(st));
        rl_runtime_destroy(rt);
        return rep.failed;
    }
    for (const auto &r : j["refused"]) rep.fail("descriptor", r.value("reason", ""));
    if (j["plugins"].empty() && j["refused"].empty())
        rep.fail("descriptors", "the library holds no plugins");
    std::set<std::string> ids;
    for (const auto &p : j["plugins"])
        if (!ids.insert(p.value("id", "")).second)
            rep.fail("descriptors", "duplicate id '" + p.value("id", "") + "'");
    for (const auto &p : j["plugins"]) validate_plugin(rep, rt, p, params);
    rl_runtime_destroy(rt);
    rep.pass("unload");
    return rep.failed;
}

int usage(FILE *to) {
    std::fprintf(to,
                 "usage: rl-validate [--params KIND/NAME=JSON]... PLUGIN.so...\n"
                 "Runs the plugin conformance checks on each library; one line per check\n"
                 "(PASS, FAIL or SKIP); exits 1 when a check failed.\n"
                 "  --params KIND/NAME=JSON  parameters for creating that plugin (default {})\n");
    return 2;
}

} // namespace

int main(int argc, char **argv) {
    std::vector<std::string> files;
    std::map<std::string, std::string> params;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") return usage(stdout), 0;
        if (a == "--params") {
            if (i + 1 >= argc) return usage(stderr);
            const std::string kv = argv[++i];
            const size_t eq = kv.find('=');
            if (eq == std::string::npos || kv.find('/') > eq) return usage(stderr);
            params[kv.substr(0, eq)] = kv.substr(eq + 1);
        } else if (!a.empty() && a[0] == '-') {
            std::fprintf(stderr, "rl-validate: unknown option '%s'\n", a.c_str());
            return usage(stderr);
        } else {
            files.push_back(a);
        }
    }
    if (files.empty()) return usage(stderr);
    int failed = 0;
    for (const auto &f : files) failed += validate_file(f, params);
    std::printf("%s: %d check(s) failed in %zu librar%s\n", failed ? "FAILED" : "OK", failed,
                files.size(), files.size() == 1 ? "y" : "ies");
    return failed ? 1 : 0;
}
