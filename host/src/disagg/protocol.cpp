// The messages and channels of the three-role protocol (protocol.hpp).
#include "protocol.hpp"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <thread>

namespace rl::host::disagg {

namespace {

std::string key_error(const char *fn, const std::string &key, const std::string &want) {
    return std::string(fn) + ": config key '" + key + "' must be " + want;
}

int64_t int_key(const json &c, const char *fn, const std::string &key, int64_t def, int64_t lo) {
    if (!c.contains(key) || c[key].is_null()) return def;
    const json &v = c[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo)
        throw HostError{
            RL_ERR_INVALID_ARG,
            key_error(fn, key, "an integer >= " + std::to_string(lo) + ", got " + v.dump())};
    return v.get<int64_t>();
}

std::string str_key(const json &c, const char *fn, const std::string &key, const std::string &def) {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_string())
        throw HostError{RL_ERR_INVALID_ARG, key_error(fn, key, "a string, got " + c[key].dump())};
    return c[key].get<std::string>();
}

// Who sends messages of header kind `kind`.
std::string sender_of(const json &h) {
    const std::string kind = h.value("kind", std::string("?"));
    if (kind == "rl.hello" || kind == "rl.rollouts")
        return "worker " + (h.contains("worker") ? h["worker"].dump() : std::string("?"));
    if (kind == "rl.trainer") return "the trainer";
    return "the orchestrator";
}

} // namespace

Settings Settings::parse(const char *config_json, const char *fn) {
    json c;
    try {
        c = json::parse(config_json ? config_json : "{}");
    } catch (const json::exception &e) {
        throw HostError{RL_ERR_INVALID_ARG, std::string(fn) + ": config_json: " + e.what()};
    }
    if (!c.is_object())
        throw HostError{RL_ERR_INVALID_ARG, std::string(fn) + ": config_json must be an object"};
    static const char *const known[] = {
        "transport",       "dir",          "host",    "port",     "hwm",
        "timeout",         "timeout_name", "workers", "steps",    "checkpoint_every",
        "max_async_level", "min_rollouts", "resume",  "state_dir"};
    for (const auto &kv : c.items()) {
        bool ok = false;
        for (const char *k : known) ok = ok || kv.key() == k;
        if (!ok)
            throw HostError{RL_ERR_INVALID_ARG, std::string(fn) + ": unknown config key '" +
                                                    kv.key() +
                                                    "' (abi/rl/disagg.h lists the keys)"};
    }
    Settings s;
    s.transport = str_key(c, fn, "transport", "zmq");
    if (s.transport != "zmq" && s.transport != "filesystem")
        throw HostError{RL_ERR_INVALID_ARG,
                        key_error(fn, "transport", "zmq or filesystem, got '" + s.transport + "'")};
    s.dir = str_key(c, fn, "dir", "");
    s.host = str_key(c, fn, "host", "127.0.0.1");
    s.port = int_key(c, fn, "port", 0, 0);
    if (s.transport == "zmq" && (s.port <= 0 || s.port > 65535))
        throw HostError{RL_ERR_INVALID_ARG,
                        key_error(fn, "port",
                                  "a TCP port in 1..65535 for the zmq transport, got " +
                                      std::to_string(s.port))};
    if (s.dir.empty() && s.transport == "filesystem")
        throw HostError{RL_ERR_INVALID_ARG,
                        key_error(fn, "dir",
                                  "the shared folder of the filesystem transport; got "
                                  "none")};
    s.hwm = int_key(c, fn, "hwm", 64, 1);
    s.workers = int_key(c, fn, "workers", 1, 1);
    s.steps = int_key(c, fn, "steps", 0, 0);
    s.checkpoint_every = int_key(c, fn, "checkpoint_every", 0, 0);
    s.max_async_level = int_key(c, fn, "max_async_level", 1, 0);
    s.min_rollouts = int_key(c, fn, "min_rollouts", 1, 1);
    if (c.contains("timeout")) {
        if (!c["timeout"].is_number() || !(c["timeout"].get<double>() > 0))
            throw HostError{
                RL_ERR_INVALID_ARG,
                key_error(fn, "timeout", "a number of seconds > 0, got " + c["timeout"].dump())};
        s.timeout = c["timeout"].get<double>();
    }
    s.timeout_name = str_key(c, fn, "timeout_name", "timeout");
    if (c.contains("resume")) {
        if (!c["resume"].is_boolean())
            throw HostError{RL_ERR_INVALID_ARG,
                            key_error(fn, "resume", "a boolean, got " + c["resume"].dump())};
        s.resume = c["resume"].get<bool>();
    }
    s.state_dir = str_key(c, fn, "state_dir", s.dir.empty() ? "" : s.dir + "/orchestrator");
    return s;
}

std::string Settings::timeout_text() const {
    return fmt("%s (%gs)", timeout_name.c_str(), timeout);
}

int64_t Settings::checkpoint_floor(int64_t version) const {
    if (checkpoint_every <= 0 || version <= 0) return 0;
    return ((version - 1) / checkpoint_every) * checkpoint_every;
}

Transport open_transport(rl_runtime_t *runtime, const std::string &name, const json &params) {
    rl_instance_t *inst = nullptr;
    const std::string p = params.dump();
    const rl_status_t st = rl_instance_create(runtime, "transport", name.c_str(), p.c_str(), &inst);
    if (st != RL_OK) throw HostError{st, rl_last_error()};
    return Transport(inst);
}

namespace {

Transport fs_end(rl_runtime_t *rt, const Settings &s, const std::string &channel) {
    return open_transport(rt, "filesystem",
                          json{{"dir", s.dir}, {"channel", channel}, {"poll_ms", 10}});
}

Transport zmq_end(rl_runtime_t *rt, const Settings &s, int64_t port, bool sending, bool bind,
                  int64_t hwm) {
    return open_transport(rt, "zmq",
                          json{{"host", s.host},
                               {"port", port},
                               {"hwm", hwm},
                               {"bind", bind},
                               {"role", sending ? "push" : "pull"},
                               {"timeout_ms", s.timeout_ms()}});
}

} // namespace

Transport to_trainer(rl_runtime_t *rt, const Settings &s, bool reading) {
    if (s.transport == "filesystem") return fs_end(rt, s, "batches");
    return zmq_end(rt, s, s.port, !reading, reading, s.hwm);
}

Transport to_orchestrator(rl_runtime_t *rt, const Settings &s, const std::string &who,
                          bool reading) {
    if (s.transport == "filesystem") return fs_end(rt, s, "to_orch_" + who);
    return zmq_end(rt, s, s.port + 1, !reading, reading, s.hwm);
}

Transport to_worker(rl_runtime_t *rt, const Settings &s, int64_t k, bool reading) {
    if (s.transport == "filesystem") return fs_end(rt, s, "credits_" + std::to_string(k));
    return zmq_end(rt, s, s.port + 2 + k, !reading, reading, 64);
}

void clear(const std::string &dir, const std::vector<std::string> &names) {
    for (const auto &n : names) {
        std::error_code probe, ec;
        const std::filesystem::path p = std::filesystem::path(dir) / n;
        if (std::filesystem::is_directory(p, probe)) std::filesystem::remove_all(p, ec);
        if (ec) throw HostError{RL_ERR_IO, "cannot remove '" + p.string() + "': " + ec.message()};
    }
}

void send(rl_instance_t *t, const Msg &m, const std::string &what) {
    json h = m.header;
    h["protocol"] = RL_DISAGG_PROTOCOL_VERSION;
    const std::string text = h.dump(-1, ' ', false, json::error_handler_t::replace);
    std::vector<rl_tensor_arg_t> args;
    for (const auto &kv : m.tensors) args.push_back({kv.first.c_str(), kv.second.view()});
    const rl_tensor_list_t list{args.empty() ? nullptr : args.data(), args.size()};
    const rl_status_t st = rl_transport_send(t, rl_string_view_t{text.data(), text.size()}, &list);
    if (st != RL_OK) throw HostError{st, what + ": " + rl_last_error()};
}

std::optional<Msg> recv(rl_instance_t *t, int64_t timeout_ms, const std::string &who) {
    rl_result_t *res = nullptr;
    const rl_status_t st = rl_transport_recv(t, timeout_ms, &res);
    if (st == RL_ERR_TIMEOUT) return std::nullopt;
    if (st != RL_OK) throw HostError{st, who + ": receiving: " + rl_last_error()};
    std::unique_ptr<rl_result_t, void (*)(rl_result_t *)> owned(res, rl_result_destroy);
    Msg m;
    const auto it = res->sink.texts.find("header");
    try {
        m.header = json::parse(it == res->sink.texts.end() ? std::string("{}") : it->second);
    } catch (const json::exception &e) {
        throw HostError{RL_ERR_INVALID_ARG,
                        who + ": a message whose header is not JSON: " + e.what()};
    }
    if (!m.header.is_object())
        throw HostError{RL_ERR_INVALID_ARG, who + ": a message whose header is not an object"};
    const json &v = m.header.contains("protocol") ? m.header["protocol"] : json();
    if (!v.is_number_integer() || v.get<int64_t>() != RL_DISAGG_PROTOCOL_VERSION)
        throw HostError{RL_ERR_INCOMPATIBLE,
                        who + ": a '" + m.header.value("kind", std::string("?")) + "' message of " +
                            sender_of(m.header) + " speaks protocol version " +
                            (v.is_null() ? std::string("none (a peer older than the versioned "
                                                       "protocol)")
                                         : v.dump()) +
                            ", this side version " + std::to_string(RL_DISAGG_PROTOCOL_VERSION) +
                            " (run every role from the same release)"};
    m.tensors = std::move(res->sink.tensors);
    return m;
}

double clock_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void sleep_s(double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

void say(const std::string &line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
}

std::string fmt(const char *format, ...) {
    va_list a;
    va_start(a, format);
    char buf[1024];
    const int n = std::vsnprintf(buf, sizeof buf, format, a);
    va_end(a);
    return n < 0 ? std::string() : std::string(buf, std::min<size_t>(n, sizeof buf - 1));
}

} // namespace rl::host::disagg
