#include "server.hpp"

#include "weight_routes.hpp"
#include "weight_update.hpp"

#include "api.hpp"

#include "rl/core/error.hpp"
#include "rl/core/lora.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <list>
#include <mutex>
#include <random>

namespace rl::serve {

ServerConfig ServerConfig::from_json(const std::string &text) {
    ServerConfig c;
    read_options(text, "server options", [&](const Fields &f) {
        f.only(http_options_and({"served_model_name", "max_tokens_limit", "request_timeout_s",
                                 "reasoning_parser", "max_running", "max_queued", "max_context",
                                 "kv_cache_fraction", "noise_total_steps", "noise_sigma_start",
                                 "noise_sigma_end", "noise_num_stages", "noise_first_step",
                                 "noise_seed"}));
        read_http_options(f, c);
        if (auto v = f.string("served_model_name")) c.served_model_name = *v;
        if (auto v = f.integer("max_tokens_limit", 1, int64_t{1} << 40)) c.max_tokens_limit = *v;
        if (auto v = f.number("request_timeout_s", 0.001, 1e9)) c.request_timeout_s = *v;
        if (auto v = f.string("reasoning_parser")) {
            if (!v->empty() && *v != "qwen3")
                throw core::Error("server options: reasoning_parser must be \"qwen3\" (or \"\": "
                                  "none), not '" +
                                  *v + "'");
            c.reasoning_parser = *v;
        }
        if (auto v = f.integer("max_running", 1, 1 << 20)) c.scheduler.max_running = *v;
        if (auto v = f.integer("max_queued", 0, 1 << 30)) c.scheduler.max_queued = *v;
        if (auto v = f.integer("max_context", 0, int64_t{1} << 40)) c.scheduler.max_context = *v;
        if (auto v = f.number("kv_cache_fraction", 1e-6, 1.0)) c.scheduler.kv_cache_fraction = *v;
        // QeRL noise (docs/moe.md): the run's length turns it on.
        core::SchedulerConfig &sc = c.scheduler;
        if (auto v = f.integer("noise_total_steps", 1, int64_t{1} << 40)) {
            sc.noise.enabled = true;
            sc.total_steps = *v;
        }
        if (auto v = f.number("noise_sigma_start", 1e-30, 1e30)) sc.noise.sigma_start = *v;
        if (auto v = f.number("noise_sigma_end", 1e-30, 1e30)) sc.noise.sigma_end = *v;
        if (auto v = f.integer("noise_num_stages", 2, int64_t{1} << 40)) sc.noise.num_stages = *v;
        if (auto v = f.integer("noise_first_step", 0, int64_t{1} << 40)) sc.first_step = *v;
        if (auto v = f.integer("noise_seed", 0, INT64_MAX)) sc.seed = static_cast<uint64_t>(*v);
        for (const char *k : {"noise_sigma_start", "noise_sigma_end", "noise_num_stages",
                              "noise_first_step", "noise_seed"})
            if (f.has(k) && !sc.noise.enabled)
                throw core::Error(std::string("server options: ") + k +
                                  " sets QeRL noise, which needs noise_total_steps (the run's "
                                  "optimizer steps; --noise-total-steps)");
    });
    return c;
}

struct Server::Impl {
    struct Live {
        uint64_t ticket;
        std::string rid;
        std::vector<uint64_t> ids;
    };
    std::mutex mu;
    std::list<Live> live;
    uint64_t next_ticket = 1;
    std::string weight_label;
    std::unique_ptr<WeightUpdater> updater; // the weight-update routes' state
    std::mutex rng_mu;
    std::mt19937_64 rng{std::random_device{}()};
    mutable std::mutex adapters_mu; // loads and unloads, one at a time
    std::map<std::string, std::string> adapter_paths;
};

namespace {

std::string default_model_name(const ServerConfig &c) {
    if (!c.served_model_name.empty()) return c.served_model_name;
    std::filesystem::path p(c.model_path);
    while (!p.empty() && p.filename().empty()) p = p.parent_path();
    const std::string name = p.filename().string();
    return name.empty() || name == "." || name == ".." ? "model" : name;
}

} // namespace

Server::Server(std::shared_ptr<core::Policy> policy, ServerConfig config)
    : policy_(std::move(policy)), config_(std::move(config)), impl_(std::make_unique<Impl>()) {
    if (!policy_) throw core::Error("server: the policy is null");
    model_name_ = default_model_name(config_);
    scheduler_ = std::make_unique<core::Scheduler>(policy_, config_.scheduler);
    if (!config_.api_key.empty()) {
        router_.set_guard([key = "Bearer " + config_.api_key](const Request &req, Responder &r) {
            if (req.method == "GET" && req.path == "/health") return true;
            if (req.header("authorization") == key) return true;
            send_error(r, 401,
                       req.header("authorization").empty()
                           ? "this server needs an API key: send 'Authorization: Bearer <key>'"
                           : "the API key is not valid",
                       "", "authentication_error", {{"WWW-Authenticate", "Bearer"}});
            return false;
        });
    }
    add_openai_routes(*this);
    add_sglang_routes(*this);
    impl_->updater = std::make_unique<WeightUpdater>(policy_, *scheduler_);
    add_weight_routes(*this, *impl_->updater);
}

Server::~Server() {
    stop();
}

void Server::start() {
    http_ = std::make_unique<HttpServer>(http_config_of(config_), router_);
    http_->start();
}

int Server::port() const {
    return http_ ? http_->port() : 0;
}

std::string Server::url() const {
    const bool v6 = config_.host.find(':') != std::string::npos;
    return "http://" + (v6 ? "[" + config_.host + "]" : config_.host) + ":" +
           std::to_string(port());
}

void Server::stop() {
    // Requests in flight end (their handlers answer or see the connection
    // closed); then no connection is left to reach the scheduler.
    abort_all();
    if (http_) http_->stop();
}

void Server::wait() {
    if (http_) http_->wait();
}

std::string Server::weight_version() const {
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        if (!impl_->weight_label.empty()) return impl_->weight_label;
    }
    return std::to_string(scheduler_->stats().version);
}

void Server::set_weight_version(const std::string &label) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->weight_label = label;
}

void Server::load_adapter(const std::string &name, const std::string &path) {
    std::lock_guard<std::mutex> lock(impl_->adapters_mu);
    if (name.empty()) throw core::Error(core::ErrorKind::InvalidArgument, "lora_name is empty");
    if (policy_->find_adapter(name)) {
        auto it = impl_->adapter_paths.find(name);
        throw core::Error(
            core::ErrorKind::InvalidArgument,
            "the LoRA adapter '" + name + "' is already loaded" +
                (it == impl_->adapter_paths.end() ? std::string() : " (from " + it->second + ")") +
                "; unload it first to load another folder under that name");
    }
    auto adapter = core::load_adapter(policy_->model(), path, name);
    policy_->add_adapter(adapter);
    impl_->adapter_paths[name] = path;
}

void Server::unload_adapter(const std::string &name) {
    std::lock_guard<std::mutex> lock(impl_->adapters_mu);
    if (!policy_->remove_adapter(name)) {
        std::string known;
        for (const auto &n : policy_->adapter_names())
            known += (known.empty() ? "'" : ", '") + n + "'";
        throw core::Error(core::ErrorKind::NotFound,
                          "no LoRA adapter '" + name +
                              "' is loaded; loaded: " + (known.empty() ? "none" : known));
    }
    impl_->adapter_paths.erase(name);
}

std::map<std::string, std::string> Server::adapters() const {
    std::lock_guard<std::mutex> lock(impl_->adapters_mu);
    return impl_->adapter_paths;
}

uint64_t Server::track(const std::string &rid, const std::vector<uint64_t> &ids) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const uint64_t t = impl_->next_ticket++;
    impl_->live.push_back({t, rid, ids});
    return t;
}

void Server::forget(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->live.remove_if([ticket](const Impl::Live &l) { return l.ticket == ticket; });
}

int Server::abort_all() {
    std::vector<uint64_t> ids;
    int hit = 0;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        for (const auto &l : impl_->live) {
            ids.insert(ids.end(), l.ids.begin(), l.ids.end());
            ++hit;
        }
    }
    for (uint64_t id : ids) scheduler_->cancel(id);
    return hit;
}

int Server::abort(const std::string &rid) {
    std::vector<uint64_t> ids;
    int hit = 0;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        for (const auto &l : impl_->live)
            if (l.rid == rid) {
                ids.insert(ids.end(), l.ids.begin(), l.ids.end());
                ++hit;
            }
    }
    for (uint64_t id : ids) scheduler_->cancel(id);
    return hit;
}

std::string Server::new_request_id(const std::string &prefix) {
    uint64_t a = 0, b = 0;
    {
        std::lock_guard<std::mutex> lock(impl_->rng_mu);
        a = impl_->rng();
        b = impl_->rng();
    }
    char hex[33];
    std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(a),
                  static_cast<unsigned long long>(b));
    return prefix.empty() ? std::string(hex) : prefix + "-" + hex;
}

} // namespace rl::serve
