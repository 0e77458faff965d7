#include "inference_endpoints.hpp"

#include "fields.hpp"
#include "inference_client.hpp"

#include <algorithm>
#include <cmath>
#include <exception>

namespace rl::serve {

using nlohmann::json;

namespace {

std::string url_of(const std::string &host, int port) {
    const bool v6 = host.find(':') != std::string::npos;
    return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Where the endpoint is: {host, port} of a request body.
std::pair<std::string, int> where(const Fields &f) {
    const auto host = f.string("host");
    if (!host || host->empty()) throw ApiError(400, "host is required", "host");
    const auto port = f.integer("port", 1, 65535);
    if (!port) throw ApiError(400, "port is required", "port");
    return {*host, static_cast<int>(*port)};
}

// The server's model, as xorl's InferenceEndpointServerInfo reads it; throws
// when the server does not answer.
json probe(const std::string &host, int port, int64_t world_size) {
    ClientOptions o;
    o.url = url_of(host, port);
    o.timeout_s = 10;
    const json info = InferenceClient(o).call("GET", "/get_model_info");
    json out = {{"tp_size", world_size}};
    if (info.is_object()) {
        if (info.contains("model_path")) out["model_path"] = info["model_path"];
        if (info.contains("served_model_name"))
            out["served_model_name"] = info["served_model_name"];
    }
    return out;
}

} // namespace

json InferenceEndpoints::Endpoint::to_json() const {
    return {{"host", host},        {"port", port},
            {"worker_port", port}, {"world_size", world_size},
            {"healthy", true},     {"server_info", server_info}};
}

InferenceEndpoints::InferenceEndpoints(std::string own_host) : own_host_(std::move(own_host)) {
    if (own_host_.empty() || own_host_ == "0.0.0.0" || own_host_ == "::") own_host_ = "127.0.0.1";
}

InferenceEndpoints::SyncRequest InferenceEndpoints::SyncRequest::from_json(const json &body) {
    Fields f(body);
    f.only({"master_address", "master_port", "group_name", "buffer_size_mb", "model_id",
            "sync_method"});
    SyncRequest r;
    if (auto v = f.string("master_address")) r.master_address = *v;
    if (auto v = f.integer("master_port", 0, 65535)) r.master_port = static_cast<int>(*v);
    if (auto v = f.string("group_name")) {
        if (v->empty()) throw ApiError(400, "group_name must not be empty", "group_name");
        r.group_name = *v;
    }
    if (auto v = f.integer("buffer_size_mb", 1, 1 << 20)) r.buffer_bytes = *v << 20;
    if (auto v = f.string("model_id")) r.model_id = *v;
    if (auto v = f.string("sync_method"); v && *v != "nccl" && *v != "distributed")
        throw ApiError(400,
                       "sync_method '" + *v +
                           "' is not supported: the weights go over a weight-update group "
                           "(\"nccl\": NCCL on CUDA, Gloo on the CPU)",
                       "sync_method");
    return r;
}

json InferenceEndpoints::add(const json &body) {
    Fields f(body);
    f.only({"host", "port", "world_size", "sync_weights", "master_address", "master_port",
            "group_name", "buffer_size_mb"});
    const auto [host, port] = where(f);
    const int64_t world_size = f.integer("world_size", 1, 4096).value_or(1);
    Endpoint e;
    e.host = host;
    e.port = port;
    e.world_size = world_size;
    try {
        e.server_info = probe(host, port, world_size);
    } catch (const std::exception &ex) {
        return {{"success", false},
                {"message", "the inference server at " + url_of(host, port) +
                                " does not answer: " + ex.what()}};
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto same = [&](const Endpoint &x) { return x.host == host && x.port == port; };
        endpoints_.erase(std::remove_if(endpoints_.begin(), endpoints_.end(), same),
                         endpoints_.end());
        endpoints_.push_back(e);
    }
    return {{"success", true},
            {"message", "added " + url_of(host, port)},
            {"endpoint", e.to_json()},
            {"weights_synced", false}};
}

json InferenceEndpoints::list() {
    json out = json::array();
    std::vector<Endpoint> healthy;
    for (const Endpoint &e : snapshot()) {
        try {
            Endpoint x = e;
            x.server_info = probe(e.host, e.port, e.world_size);
            healthy.push_back(x);
            out.push_back(x.to_json());
        } catch (const std::exception &) {
            // Unhealthy: dropped from the registry, as xorl's server does.
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        endpoints_ = healthy;
    }
    return {{"endpoints", out}, {"count", out.size()}};
}

json InferenceEndpoints::remove(const json &body) {
    Fields f(body);
    f.only({"host", "port"});
    const auto [host, port] = where(f);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(endpoints_.begin(), endpoints_.end(),
                           [&](const Endpoint &x) { return x.host == host && x.port == port; });
    if (it == endpoints_.end())
        return {{"success", false},
                {"message", url_of(host, port) + " is not a registered inference endpoint"}};
    endpoints_.erase(it);
    return {{"success", true}, {"message", "removed " + url_of(host, port)}};
}

bool InferenceEndpoints::empty() const {
    std::lock_guard<std::mutex> lock(mu_);
    return endpoints_.empty();
}

std::vector<InferenceEndpoints::Endpoint> InferenceEndpoints::snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return endpoints_;
}

std::string InferenceEndpoints::load_adapter(const std::string &name, const std::string &path) {
    std::string failures;
    for (const Endpoint &e : snapshot()) {
        ClientOptions co;
        co.url = url_of(e.host, e.port);
        co.timeout_s = 300;
        const InferenceClient client(co);
        try {
            bool loaded = false;
            const json models = client.call("GET", "/v1/models");
            if (models.is_object() && models.contains("data") && models["data"].is_array())
                for (const json &m : models["data"])
                    loaded = loaded || (m.is_object() && m.value("id", json()) == json(name) &&
                                        !m.value("parent", json()).is_null());
            if (loaded) client.call("POST", "/unload_lora_adapter", {{"lora_name", name}});
            client.call("POST", "/load_lora_adapter",
                        {{"lora_name", name}, {"lora_path", path}, {"pinned", false}});
        } catch (const std::exception &ex) {
            failures += (failures.empty() ? "" : "; ") + co.url + ": " + ex.what();
        }
    }
    return failures;
}

json InferenceEndpoints::sync(const core::Policy &policy, int64_t version,
                              const SyncRequest &request) {
    const std::vector<Endpoint> targets = snapshot();
    json results = json::array();
    double seconds = 0;
    uint64_t bytes = 0;
    int64_t tensors = 0, buckets = 0;
    bool all = !targets.empty();
    for (const Endpoint &e : targets) {
        ClientOptions co;
        co.url = url_of(e.host, e.port);
        co.timeout_s = 1800;
        SyncOptions so;
        so.mode = "distributed";
        so.master_address = request.master_address.empty() ? own_host_ : request.master_address;
        so.master_port = request.master_port;
        so.group_name = request.group_name;
        so.bucket_bytes = request.buffer_bytes;
        so.force = true; // xorl's sync always sends the weights
        try {
            const SyncOutcome out = InferenceClient(co).sync(policy, version, so);
            seconds += out.seconds;
            bytes += out.bytes;
            tensors = out.tensors;
            buckets += static_cast<int64_t>(
                std::ceil(static_cast<double>(out.bytes) / static_cast<double>(so.bucket_bytes)));
            results.push_back({{"host", e.host},
                               {"port", e.port},
                               {"success", true},
                               {"message", "weight version " + out.server_version}});
        } catch (const std::exception &ex) {
            all = false;
            results.push_back(
                {{"host", e.host}, {"port", e.port}, {"success", false}, {"message", ex.what()}});
        }
    }
    std::string message;
    if (targets.empty())
        message = "no inference endpoints are registered (add one with /add_inference_endpoint)";
    else if (all)
        message = "synced version " + std::to_string(version) + " to " +
                  std::to_string(targets.size()) + " endpoint(s)";
    else
        message = "the sync failed on some endpoints (see endpoints_synced)";
    return {{"success", all},
            {"message", message},
            {"transfer_time", seconds},
            {"total_bytes", bytes},
            {"num_parameters", tensors},
            {"num_buckets", buckets},
            {"endpoints_synced", results}};
}

} // namespace rl::serve
