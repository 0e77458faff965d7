#include "inference_client.hpp"

#include "http.hpp"
#include "vllm_transfer.hpp"
#include "weight_update.hpp"

#include "rl/core/error.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/update_group.hpp"
#include "rl/core/json.hpp"
#include "rl/core/text.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

namespace rl::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;
using core::Error;
using core::ErrorKind;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void bad_option(const std::string &what) {
    throw Error(ErrorKind::InvalidArgument, what);
}

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A port the kernel considers free on `address` now.
int free_port(const std::string &address) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw Error(ErrorKind::Io, "cannot open a socket to find a free port");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = INADDR_ANY;
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0;
    ::close(fd);
    if (!ok) throw Error(ErrorKind::Io, "cannot find a free port on " + address);
    return ntohs(a.sin_port);
}

// The server's message in an error body, else the body itself (short).
std::string message_of(const std::string &body) {
    const json j = rl::core::parse_json_or_discarded(body);
    if (j.is_object()) {
        if (j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
            return j["error"]["message"].dump();
        if (j.contains("message") && j["message"].is_string()) return j["message"];
        // SGLang's LoRA routes: {success, error_message, loaded_adapters}.
        if (j.contains("error_message") && j["error_message"].is_string())
            return j["error_message"];
        if (j.contains("error") && j["error"].is_string()) return j["error"];
    }
    return body.substr(0, 500);
}

// SGLang answers {"success": false, "message": ...} with 200 or 400.
void require_success(const json &reply, const std::string &what) {
    if (reply.is_object() && reply.contains("success") && !reply.value("success", false))
        throw Error(ErrorKind::Io, what + " refused by the server: " + reply.value("message", ""));
}

at::ScalarType wire_dtype(const std::string &name, at::ScalarType native) {
    if (name == "float32") return at::kFloat;
    if (name == "bfloat16") return at::kBFloat16;
    return native;
}

} // namespace

ClientOptions ClientOptions::from_json(const json &j) {
    ClientOptions o;
    if (!j.is_object()) bad_option("inference client: options must be an object");
    for (const auto &[k, v] : j.items()) {
        if (k == "url" && v.is_string())
            o.url = v;
        else if (k == "api_key" && v.is_string())
            o.api_key = v;
        else if (k == "timeout" && v.is_number() && v.get<double>() > 0)
            o.timeout_s = v;
        else if (k == "protocol" && v.is_string() && (v == "sglang" || v == "vllm"))
            o.protocol = v;
        else
            bad_option("inference client: key '" + k +
                       "' is unknown or has a bad value (url: string, api_key: string, timeout: "
                       "seconds > 0, protocol: sglang | vllm)");
    }
    if (o.url.rfind("http://", 0) != 0)
        bad_option("inference client: url must start with http:// (got '" + o.url + "')");
    return o;
}

SyncOptions SyncOptions::from_json(const json &j) {
    SyncOptions o;
    if (j.is_null()) return o;
    if (!j.is_object()) bad_option("sync options must be an object");
    for (const auto &[k, v] : j.items()) {
        const bool ok =
            (k == "mode" && v.is_string() && (v == "disk" || v == "distributed")) ||
            (k == "dir" && v.is_string()) || (k == "keep" && v.is_number_integer() && v >= 1) ||
            (k == "master_address" && v.is_string()) ||
            (k == "master_port" && v.is_number_integer() && v >= 0 && v <= 65535) ||
            (k == "group_name" && v.is_string() && !v.get<std::string>().empty()) ||
            (k == "backend" && v.is_string() && (v == "auto" || v == "gloo" || v == "nccl")) ||
            (k == "bucket_bytes" && v.is_number_integer() && v >= 1) ||
            (k == "flattened" && v.is_boolean()) || (k == "force" && v.is_boolean()) ||
            (k == "checksums" && (v.is_boolean() || v == "auto")) ||
            (k == "dtype" && v.is_string() &&
             (v == "native" || v == "float32" || v == "bfloat16")) ||
            (k == "rendezvous" && v.is_string() && (v == "store" || v == "unique_id"));
        if (!ok)
            bad_option("sync options: key '" + k +
                       "' is unknown or has a bad value (mode: disk | distributed, dir, keep >= 1, "
                       "master_address, master_port 0..65535, group_name, backend: auto | gloo | "
                       "nccl, bucket_bytes >= 1, flattened: bool, checksums: auto | bool, dtype: "
                       "native | float32 | bfloat16, force: bool, rendezvous: store | unique_id)");
        if (k == "mode") o.mode = v;
        if (k == "dir") o.dir = v;
        if (k == "keep") o.keep = v;
        if (k == "master_address") o.master_address = v;
        if (k == "master_port") o.master_port = v;
        if (k == "group_name") o.group_name = v;
        if (k == "backend") o.backend = v;
        if (k == "bucket_bytes") o.bucket_bytes = v;
        if (k == "flattened") o.flattened = v;
        if (k == "force") o.force = v;
        if (k == "checksums")
            o.checksums = v.is_boolean() ? (v.get<bool>() ? "true" : "false") : "auto";
        if (k == "dtype") o.dtype = v;
        if (k == "rendezvous") o.rendezvous = v;
    }
    return o;
}

InferenceClient::InferenceClient(ClientOptions options) : options_(std::move(options)) {
    if (options_.url.rfind("http://", 0) != 0)
        bad_option("inference client: url must start with http:// (got '" + options_.url + "')");
}

json InferenceClient::call(const std::string &method, const std::string &path, const json &body,
                           double timeout_s) const {
    Headers headers;
    if (!options_.api_key.empty())
        headers.emplace_back("Authorization", "Bearer " + options_.api_key);
    HttpResponse r;
    try {
        r = http_request(options_.url, method, path, body.is_null() ? std::string() : body.dump(),
                         headers, timeout_s > 0 ? timeout_s : options_.timeout_s);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, method + " " + options_.url + path + ": " + e.what());
    }
    if (r.status < 200 || r.status >= 300)
        throw Error(r.status == 400 || r.status == 404 || r.status == 422
                        ? ErrorKind::InvalidArgument
                        : ErrorKind::Io,
                    method + " " + options_.url + path + ": HTTP " + std::to_string(r.status) +
                        ": " + message_of(r.body));
    if (r.body.empty()) return nullptr;
    json j = rl::core::parse_json_or_discarded(r.body);
    if (j.is_discarded()) return r.body; // plain text (SGLang's /flush_cache)
    return j;
}

std::string InferenceClient::weight_version() const {
    if (options_.protocol != "sglang") return {};
    const json info = call("GET", "/get_model_info");
    if (!info.is_object() || !info.contains("weight_version")) return {};
    const json &v = info["weight_version"];
    return v.is_string() ? v.get<std::string>() : v.is_null() ? std::string() : v.dump();
}

void InferenceClient::pause() const {
    if (options_.protocol == "vllm")
        call("POST", "/pause?mode=keep&clear_cache=false");
    else
        call("POST", "/pause_generation", json{{"mode", "retract"}});
}

void InferenceClient::resume() const {
    if (options_.protocol == "vllm")
        call("POST", "/resume");
    else
        call("POST", "/continue_generation", json::object());
}

SyncOutcome InferenceClient::sync(const core::Policy &policy, int64_t version,
                                  const SyncOptions &options) const {
    if (version < 0) bad_option("sync: version must be >= 0, got " + std::to_string(version));
    if (policy.model().weight_hooks() != nullptr)
        throw Error(ErrorKind::BadState,
                    "sync: the model is sharded (trainer.parallel fsdp); gather it first");
    if (options.rendezvous != "store" &&
        (options_.protocol != "vllm" || options.mode != "distributed"))
        bad_option("sync: rendezvous '" + options.rendezvous +
                   "' is for vLLM's NCCL weight transfer (protocol 'vllm', mode 'distributed': "
                   "the id goes in init_info.nccl_unique_id_b64); this sync is protocol '" +
                   options_.protocol + "', mode '" + options.mode + "'");
    const auto t0 = Clock::now();
    // Handshake: a server already at this version (or newer) is left alone.
    const std::string before = weight_version();
    if (!before.empty() && !options.force) {
        try {
            size_t used = 0;
            const long long v = std::stoll(before, &used);
            if (used == before.size() && v >= version) {
                SyncOutcome out;
                out.skipped = true;
                out.version = version;
                out.server_version = before;
                return out;
            }
        } catch (const std::exception &) {
        }
    }
    pause();
    SyncOutcome out;
    try {
        if (options.mode == "disk")
            out = sync_disk(policy, version, options);
        else if (options.mode == "distributed")
            out = sync_distributed(policy, version, options);
        else
            bad_option("sync: mode must be disk or distributed, got '" + options.mode + "'");
    } catch (...) {
        try {
            resume();
        } catch (const std::exception &) {
        }
        throw;
    }
    resume();
    out.version = version;
    out.server_version = weight_version();
    if (options_.protocol == "sglang" && out.server_version != std::to_string(version))
        throw Error(ErrorKind::Io, "sync: the server reports weight_version '" +
                                       out.server_version + "' after the update to version " +
                                       std::to_string(version));
    out.seconds = seconds_since(t0);
    return out;
}

SyncOutcome InferenceClient::sync_disk(const core::Policy &policy, int64_t version,
                                       const SyncOptions &o) const {
    if (o.dir.empty()) bad_option("sync: mode 'disk' needs 'dir' (a folder the server can read)");
    const fs::path root = fs::absolute(o.dir);
    fs::create_directories(root);
    const fs::path folder = root / ("step_" + std::to_string(version));
    const fs::path tmp = root / (".step_" + std::to_string(version) + ".tmp");
    fs::remove_all(tmp);
    core::SaveOptions so;
    if (o.dtype != "native") so.dtype = wire_dtype(o.dtype, policy.model().dtype());
    core::save_pretrained(policy.model(), tmp.string(), so);
    write_checksums_file(tmp.string());
    fs::remove_all(folder);
    fs::rename(tmp, folder);
    { // prime-rl's readiness marker, written last
        std::FILE *f = std::fopen((folder / "STABLE").c_str(), "w");
        if (f) std::fclose(f);
    }
    SyncOutcome out;
    for (const auto &e : fs::directory_iterator(folder))
        if (e.is_regular_file() && e.path().extension() == ".safetensors")
            out.bytes += static_cast<uint64_t>(e.file_size());
    out.tensors = static_cast<int64_t>(policy.model().named_weights().size());
    if (options_.protocol == "vllm") {
        call("POST", "/update_weights", json{{"weight_dir", folder.string()}});
    } else {
        const json reply = call("POST", "/update_weights_from_disk",
                                json{{"model_path", folder.string()},
                                     {"weight_version", std::to_string(version)},
                                     {"flush_cache", true}});
        require_success(reply, "update_weights_from_disk");
    }
    // Keep the newest `keep` steps.
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const auto &e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
        try {
            steps.emplace_back(std::stoll(n.substr(5)), e.path());
        } catch (const std::exception &) {
        }
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + static_cast<size_t>(o.keep) < steps.size(); ++i)
        fs::remove_all(steps[i].second);
    return out;
}

json vllm_init_info(const SyncOptions &o, int workers, int master_port,
                    const std::array<uint8_t, 128> *unique_id) {
    json info = {{"rank_offset", 1},
                 {"world_size", 1 + workers},
                 {"packed", o.flattened},
                 {"packed_buffer_size_bytes", o.bucket_bytes},
                 {"packed_num_buffers", 2}};
    if (unique_id != nullptr) {
        // vLLM decodes it with b64decode(validate=True): the standard
        // alphabet, padded, never the URL-safe one.
        info["nccl_unique_id_b64"] = core::base64_encode(unique_id->data(), unique_id->size());
    } else {
        info["master_address"] = o.master_address;
        info["master_port"] = master_port;
    }
    return info;
}

SyncOutcome InferenceClient::sync_distributed(const core::Policy &policy, int64_t version,
                                              const SyncOptions &o) const {
    if (options_.protocol == "vllm") return sync_vllm_nccl(policy, version, o);
    const core::CausalLM &model = policy.model();
    const bool cuda = model.device().is_cuda();
    const std::string backend = o.backend == "auto" ? (cuda ? "nccl" : "gloo") : o.backend;
    if (backend == "nccl" && !cuda)
        bad_option("sync: backend 'nccl' needs the trainer's model on CUDA; it is on the CPU "
                   "(use gloo)");
    const json info = call("GET", "/get_server_info");
    const bool ours = info.is_object() && info.contains("rl_version");
    const bool send_crc = o.checksums == "true" || (o.checksums == "auto" && ours);
    const int server_ranks =
        info.is_object() && info.contains("tp_size") && info["tp_size"].is_number_integer()
            ? std::max(1, info["tp_size"].get<int>())
            : 1;

    core::dist::UpdateGroupOptions go;
    go.master_address = o.master_address;
    go.master_port = o.master_port > 0 ? o.master_port : free_port(o.master_address);
    go.rank = 0;
    go.world_size = 1 + server_ranks;
    go.group_name = o.group_name;
    go.backend = backend;
    go.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));

    const json init_body = {{"master_address", go.master_address},
                            {"master_port", go.master_port},
                            {"rank_offset", 1},
                            {"world_size", go.world_size},
                            {"group_name", go.group_name},
                            {"backend", backend}};
    auto init = std::async(std::launch::async,
                           [&] { return call("POST", "/init_weights_update_group", init_body); });
    std::unique_ptr<core::dist::UpdateGroup> group;
    std::string group_error;
    try {
        group = std::make_unique<core::dist::UpdateGroup>(go);
    } catch (const std::exception &e) {
        group_error = e.what();
    }
    json init_reply;
    try {
        init_reply = init.get();
        require_success(init_reply, "init_weights_update_group");
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, std::string("sync: the server did not join the weight update "
                                               "group: ") +
                                       e.what());
    }
    if (!group)
        throw Error(ErrorKind::Io,
                    "sync: the trainer could not form the weight update group: " + group_error);
    // The group is destroyed on the server whatever happens next.
    struct Destroy {
        const InferenceClient &c;
        const std::string &name;
        bool done = false;
        ~Destroy() {
            if (done) return;
            try {
                c.call("POST", "/destroy_weights_update_group", json{{"group_name", name}});
            } catch (const std::exception &) {
            }
        }
    } destroy{*this, o.group_name};

    // Tensors in the wire dtype, on the group's device, in checkpoint order.
    std::vector<std::string> names;
    std::vector<at::Tensor> tensors;
    {
        at::NoGradGuard no_grad;
        for (const auto &[name, p] : model.named_weights()) {
            at::Tensor t = p.detach().to(wire_dtype(o.dtype, p.scalar_type()));
            t = (backend == "gloo" ? t.to(at::kCPU) : t).contiguous();
            names.push_back(name);
            tensors.push_back(std::move(t));
        }
    }
    SyncOutcome out;
    size_t first = 0;
    while (first < tensors.size()) {
        size_t end = first;
        int64_t bytes = 0;
        while (
            end < tensors.size() &&
            (end == first || bytes + static_cast<int64_t>(tensors[end].nbytes()) <= o.bucket_bytes))
            bytes += static_cast<int64_t>(tensors[end++].nbytes());
        const bool last = end == tensors.size();
        json body = {{"names", json::array()},  {"dtypes", json::array()},
                     {"shapes", json::array()}, {"group_name", o.group_name},
                     {"flush_cache", last},     {"weight_version", std::to_string(version)}};
        if (o.flattened) body["load_format"] = "flattened_bucket";
        std::vector<uint32_t> crcs;
        for (size_t i = first; i < end; ++i) {
            body["names"].push_back(names[i]);
            body["dtypes"].push_back(torch_dtype_name(tensors[i].scalar_type()));
            body["shapes"].push_back(tensors[i].sizes().vec());
            if (send_crc) crcs.push_back(tensor_crc32c(tensors[i]));
        }
        if (send_crc) body["checksums"] = crcs;
        auto reply = std::async(std::launch::async, [&] {
            return call("POST", "/update_weights_from_distributed", body);
        });
        std::vector<at::Tensor> wire;
        if (o.flattened) {
            std::vector<at::Tensor> bytes_views;
            for (size_t i = first; i < end; ++i)
                bytes_views.push_back(tensors[i].view({-1}).view(at::kByte));
            wire.push_back(at::cat(bytes_views));
        } else {
            wire.assign(tensors.begin() + static_cast<long>(first),
                        tensors.begin() + static_cast<long>(end));
        }
        std::string send_error;
        try {
            group->broadcast(wire);
        } catch (const std::exception &e) {
            send_error = e.what();
        }
        json r;
        try {
            r = reply.get();
        } catch (const std::exception &e) {
            throw Error(ErrorKind::Io,
                        std::string("sync: update_weights_from_distributed: ") + e.what() +
                            (send_error.empty() ? "" : "; broadcast: " + send_error));
        }
        if (!send_error.empty()) throw Error(ErrorKind::Io, "sync: " + send_error);
        require_success(r, "update_weights_from_distributed");
        out.bytes += static_cast<uint64_t>(bytes);
        out.tensors += static_cast<int64_t>(end - first);
        first = end;
    }
    destroy.done = true;
    const json d =
        call("POST", "/destroy_weights_update_group", json{{"group_name", o.group_name}});
    require_success(d, "destroy_weights_update_group");
    return out;
}

// vLLM's NCCL weight transfer engine (vLLM 0.33.0) as its trainer does it:
// rank 0 hosts the StatelessProcessGroup's store and publishes the NCCL id
// while the server joins (/init_weight_transfer_engine; with rendezvous
// "unique_id" the id goes in its body instead), then one update:
// /start_weight_update, /update_weights announcing names, dtypes and shapes
// while the tensors are broadcast (one by one, or packed into uint8 buffers of
// bucket_bytes when `flattened`), /finish_weight_update with the version.
SyncOutcome InferenceClient::sync_vllm_nccl(const core::Policy &policy, int64_t version,
                                            const SyncOptions &o) const {
    const core::CausalLM &model = policy.model();
    if (o.backend == "gloo")
        bad_option("sync: vLLM's weight transfer engine is NCCL only; backend 'gloo' is "
                   "SGLang's (use protocol 'sglang', or mode 'disk')");
    if (!model.device().is_cuda())
        bad_option("sync: vLLM's NCCL weight transfer needs the trainer's model on CUDA; it is on "
                   "the CPU (use mode 'disk')");
    std::string why;
    if (!vllm::nccl_available(&why)) bad_option("sync: " + why);
    int workers = 1;
    try {
        const json w = call("GET", "/get_world_size");
        if (w.is_object() && w.contains("world_size") && w["world_size"].is_number_integer())
            workers = std::max(1, w["world_size"].get<int>());
    } catch (const std::exception &) {
    }
    const int world = 1 + workers;
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
    std::unique_ptr<vllm::StatelessGroup> group;
    std::unique_ptr<vllm::NcclComm> comm;
    std::string trainer_error;
    if (o.rendezvous == "unique_id") {
        // No store: the id travels in the request and both sides enter
        // ncclCommInitRank together. NCCL's init has no timeout and cannot be
        // called off, so it runs on a thread of its own that owns what it
        // uses: when the server refuses to join, the sync fails at once and
        // that thread is left waiting for peers that never come.
        const vllm::UniqueId id = vllm::NcclComm::new_unique_id();
        auto made = std::make_shared<std::promise<std::unique_ptr<vllm::NcclComm>>>();
        auto comm_ready = made->get_future();
        std::thread([made, id, world, device = model.device()] {
            try {
                made->set_value(std::make_unique<vllm::NcclComm>(id, 0, world, device));
            } catch (...) {
                made->set_exception(std::current_exception());
            }
        }).detach();
        try {
            call("POST", "/init_weight_transfer_engine",
                 json{{"init_info", vllm_init_info(o, workers, 0, &id)}});
        } catch (const std::exception &e) {
            throw Error(ErrorKind::Io, std::string("sync: the server did not join vLLM's weight "
                                                   "transfer: ") +
                                           e.what());
        }
        if (comm_ready.wait_for(timeout) != std::future_status::ready)
            throw Error(ErrorKind::Io, "sync: the server joined vLLM's weight transfer, but "
                                       "ncclCommInitRank did not finish within the client's "
                                       "timeout");
        try {
            comm = comm_ready.get();
        } catch (const std::exception &e) {
            trainer_error = e.what();
        }
    } else {
        const int port = o.master_port > 0 ? o.master_port : free_port(o.master_address);
        const json init_info = vllm_init_info(o, workers, port, nullptr);
        auto init = std::async(std::launch::async, [&] {
            return call("POST", "/init_weight_transfer_engine", json{{"init_info", init_info}});
        });
        try {
            group =
                std::make_unique<vllm::StatelessGroup>(o.master_address, port, 0, world, timeout);
            const vllm::UniqueId id = vllm::NcclComm::new_unique_id();
            group->broadcast_unique_id(id);
            comm = std::make_unique<vllm::NcclComm>(id, 0, world, model.device());
        } catch (const std::exception &e) {
            trainer_error = e.what();
        }
        try {
            init.get();
        } catch (const std::exception &e) {
            throw Error(ErrorKind::Io, std::string("sync: the server did not join vLLM's weight "
                                                   "transfer: ") +
                                           e.what());
        }
    }
    if (!comm) throw Error(ErrorKind::Io, "sync: " + trainer_error);
    struct Shutdown {
        const InferenceClient &c;
        ~Shutdown() {
            try {
                c.call("POST", "/shutdown_weight_transfer_engine", json::object());
            } catch (const std::exception &) {
            }
        }
    } shutdown{*this};

    std::vector<at::Tensor> tensors;
    json info = {
        {"names", json::array()}, {"dtype_names", json::array()}, {"shapes", json::array()}};
    std::vector<int64_t> sizes;
    SyncOutcome out;
    {
        at::NoGradGuard no_grad;
        for (const auto &[name, p] : model.named_weights()) {
            at::Tensor t = p.detach().to(wire_dtype(o.dtype, p.scalar_type())).contiguous();
            info["names"].push_back(name);
            info["dtype_names"].push_back(torch_dtype_name(t.scalar_type()));
            info["shapes"].push_back(t.sizes().vec());
            sizes.push_back(static_cast<int64_t>(t.nbytes()));
            out.bytes += static_cast<uint64_t>(t.nbytes());
            tensors.push_back(std::move(t));
        }
    }
    out.tensors = static_cast<int64_t>(tensors.size());
    call("POST", "/start_weight_update", json::object());
    auto reply = std::async(std::launch::async, [&] {
        return call("POST", "/update_weights", json{{"update_info", info}});
    });
    std::string send_error;
    try {
        if (o.flattened) {
            size_t first = 0;
            for (size_t end : vllm::packed_chunk_ends(sizes, o.bucket_bytes)) {
                std::vector<at::Tensor> bytes;
                for (size_t i = first; i < end; ++i)
                    bytes.push_back(tensors[i].view({-1}).view(at::kByte));
                comm->broadcast({at::cat(bytes)});
                first = end;
            }
        } else {
            comm->broadcast(tensors);
        }
    } catch (const std::exception &e) {
        send_error = e.what();
    }
    try {
        reply.get();
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, std::string("sync: /update_weights: ") + e.what() +
                                       (send_error.empty() ? "" : "; broadcast: " + send_error));
    }
    if (!send_error.empty()) throw Error(ErrorKind::Io, "sync: " + send_error);
    call("POST", "/finish_weight_update", json{{"weight_version", std::to_string(version)}});
    return out;
}

} // namespace rl::serve
