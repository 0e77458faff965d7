// The weight-update routes of `rlhost serve`: SGLang's (protocols.md D.2,
// D.3) and prime-rl's /update_weights {weight_dir} (E.4), over WeightUpdater.
#include "weight_routes.hpp"

#include "server.hpp"
#include "weight_update.hpp"
#include "rl/core/json.hpp"
#include "rl/core/text.hpp"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <set>

namespace rl::serve {

using json = nlohmann::json;

namespace {

struct BadField : std::runtime_error {
    BadField(std::string field, const std::string &what)
        : std::runtime_error(what), field(std::move(field)) {}
    std::string field;
};

// The request body as a JSON object whose keys are all in `known`.
json body_of(const Request &req, const std::set<std::string> &known) {
    if (req.body.empty()) return json::object();
    json j;
    std::string error;
    if (!rl::core::try_parse_json(req.body, j, "the request body", &error))
        throw BadField("", error);
    if (!j.is_object()) throw BadField("", "the request body must be a JSON object");
    for (const auto &[k, v] : j.items())
        if (!known.count(k)) throw BadField(k, "unknown field '" + k + "'");
    return j;
}

std::string string_field(const json &j, const std::string &k, bool required,
                         const std::string &fallback = "") {
    if (!j.contains(k) || j[k].is_null()) {
        if (required) throw BadField(k, "'" + k + "' is required");
        return fallback;
    }
    if (!j[k].is_string()) throw BadField(k, "'" + k + "' must be a string");
    return j[k];
}

int64_t int_field(const json &j, const std::string &k) {
    if (!j.contains(k) || !j[k].is_number_integer())
        throw BadField(k, "'" + k + "' is required and must be an integer");
    return j[k];
}

std::optional<std::string> version_field(const json &j) {
    if (!j.contains("weight_version") || j["weight_version"].is_null()) return std::nullopt;
    if (j["weight_version"].is_string()) return j["weight_version"].get<std::string>();
    if (j["weight_version"].is_number_integer()) return j["weight_version"].dump();
    throw BadField("weight_version", "'weight_version' must be a string");
}

std::optional<std::vector<uint32_t>> crc_list(const json &j) {
    if (!j.contains("checksums") || j["checksums"].is_null()) return std::nullopt;
    const json &c = j["checksums"];
    if (!c.is_array()) throw BadField("checksums", "'checksums' must be a list of CRC-32C values");
    std::vector<uint32_t> out;
    for (const auto &v : c) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xffffffffu)
            throw BadField("checksums", "'checksums' entries must be 32-bit unsigned integers");
        out.push_back(v.get<uint32_t>());
    }
    return out;
}

void check_load_format(const json &j, std::initializer_list<const char *> allowed) {
    if (!j.contains("load_format") || j["load_format"].is_null()) return;
    if (j["load_format"].is_string())
        for (const char *a : allowed)
            if (j["load_format"] == a) return;
    std::string list;
    for (const char *a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
    throw BadField("load_format", "load_format " + j["load_format"].dump() +
                                      " is not supported (null" +
                                      (list.empty() ? std::string() : ", " + list) + ")");
}

std::vector<uint8_t> base64_decode(const std::string &s, const std::string &field) {
    auto bytes = core::base64_decode(s);
    if (!bytes) throw BadField(field, field + " is not valid base64");
    return std::move(*bytes);
}

void reply_json(Responder &r, int status, const json &j) {
    r.send(status, "application/json", j.dump());
}

// SGLang's reply shape: {"success", "message"} with 200 or 400.
template <typename F>
void sglang_call(Responder &r, F &&fn) {
    try {
        json j = fn();
        j["success"] = true;
        reply_json(r, 200, j);
    } catch (const BadField &e) {
        reply_json(r, 400, {{"success", false}, {"message", e.what()}, {"param", e.field}});
    } catch (const UpdateRefused &e) {
        reply_json(r, e.status, {{"success", false}, {"message", e.what()}});
    } catch (const std::exception &e) {
        reply_json(r, 500, {{"success", false}, {"message", e.what()}});
    }
}

json outcome_json(const UpdateOutcome &o, const std::string &what) {
    return {{"message", what + ": " + std::to_string(o.tensors) + " tensors (" +
                            std::to_string(o.bytes) + " bytes) in " + std::to_string(o.seconds) +
                            " s; weight_version " + o.weight_version},
            {"num_paused_requests", 0},
            {"weight_version", o.weight_version}};
}

} // namespace

void add_weight_routes(Server &server, WeightUpdater &updater) {
    Router &router = server.router();
    Server *srv = &server;
    router.add(
        "POST", "/update_weights_from_disk", [srv, &updater](const Request &req, Responder &r) {
            sglang_call(r, [&] {
                const json j = body_of(
                    req, {"model_path", "load_format", "abort_all_requests", "weight_version",
                          "flush_cache", "is_async", "torch_empty_cache", "keep_pause",
                          "recapture_cuda_graph", "token_step", "manifest", "checksums"});
                check_load_format(j, {"auto", "safetensors"});
                std::optional<std::map<std::string, uint32_t>> crcs;
                if (j.contains("checksums") && !j["checksums"].is_null()) {
                    if (!j["checksums"].is_object())
                        throw BadField("checksums", "'checksums' must map tensor names to CRC-32C");
                    crcs.emplace();
                    for (const auto &[name, v] : j["checksums"].items()) {
                        if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xffffffffu)
                            throw BadField("checksums", "checksums['" + name +
                                                            "'] must be a 32-bit unsigned integer");
                        (*crcs)[name] = v.get<uint32_t>();
                    }
                }
                const UpdateOutcome o =
                    updater.from_disk(string_field(j, "model_path", true), crcs, version_field(j));
                srv->set_weight_version(o.weight_version);
                return outcome_json(o, "Succeeded to update model weights");
            });
        });

    router.add(
        "POST", "/init_weights_update_group", [srv, &updater](const Request &req, Responder &r) {
            sglang_call(r, [&] {
                const json j = body_of(req, {"master_address", "master_port", "rank_offset",
                                             "world_size", "group_name", "backend"});
                core::dist::UpdateGroupOptions o;
                o.master_address = string_field(j, "master_address", true);
                o.master_port = static_cast<int>(int_field(j, "master_port"));
                o.rank = static_cast<int>(int_field(j, "rank_offset"));
                o.world_size = static_cast<int>(int_field(j, "world_size"));
                o.group_name = string_field(j, "group_name", false, "weight_update_group");
                o.backend = string_field(j, "backend", false, "nccl");
                updater.init_group(o);
                return json{{"message", "Succeeded to initialize the weight update group '" +
                                            o.group_name + "' as rank " + std::to_string(o.rank)}};
            });
        });

    router.add(
        "POST", "/destroy_weights_update_group", [srv, &updater](const Request &req, Responder &r) {
            sglang_call(r, [&] {
                const json j = body_of(req, {"group_name"});
                const std::string name =
                    string_field(j, "group_name", false, "weight_update_group");
                updater.destroy_group(name);
                return json{{"message", "Succeeded to destroy weight update group '" + name + "'"}};
            });
        });

    router.add(
        "POST", "/update_weights_from_distributed",
        [srv, &updater](const Request &req, Responder &r) {
            sglang_call(r, [&] {
                const json j = body_of(req, {"names", "dtypes", "shapes", "group_name",
                                             "flush_cache", "abort_all_requests", "weight_version",
                                             "load_format", "torch_empty_cache", "checksums"});
                check_load_format(j, {"flattened_bucket"});
                for (const char *k : {"names", "dtypes", "shapes"})
                    if (!j.contains(k) || !j[k].is_array())
                        throw BadField(k, std::string("'") + k + "' is required (a list)");
                const size_t n = j["names"].size();
                if (j["dtypes"].size() != n || j["shapes"].size() != n)
                    throw BadField("shapes", "names, dtypes and shapes differ in length (" +
                                                 std::to_string(n) + ", " +
                                                 std::to_string(j["dtypes"].size()) + ", " +
                                                 std::to_string(j["shapes"].size()) + ")");
                std::vector<AnnouncedTensor> ts(n);
                for (size_t i = 0; i < n; ++i) {
                    const std::string at = "[" + std::to_string(i) + "]";
                    if (!j["names"][i].is_string())
                        throw BadField("names", "names" + at + " must be a string");
                    if (!j["dtypes"][i].is_string())
                        throw BadField("dtypes", "dtypes" + at + " must be a string");
                    ts[i].name = j["names"][i];
                    ts[i].dtype = j["dtypes"][i];
                    const json &s = j["shapes"][i];
                    if (!s.is_array()) throw BadField("shapes", "shapes" + at + " must be a list");
                    for (const auto &d : s) {
                        if (!d.is_number_integer() || d.get<int64_t>() < 0)
                            throw BadField("shapes", "shapes" + at + " must hold integers >= 0");
                        ts[i].shape.push_back(d);
                    }
                }
                const bool flat =
                    j.contains("load_format") && j["load_format"] == "flattened_bucket";
                const UpdateOutcome o = updater.from_distributed(
                    ts, string_field(j, "group_name", false, "weight_update_group"), flat,
                    crc_list(j), version_field(j));
                srv->set_weight_version(o.weight_version);
                return outcome_json(o, "Succeeded to update parameter online");
            });
        });

    router.add(
        "POST", "/update_weights_from_tensor", [srv, &updater](const Request &req, Responder &r) {
            sglang_call(r, [&] {
                const json j =
                    body_of(req, {"serialized_named_tensors", "named_tensors", "load_format",
                                  "flush_cache", "abort_all_requests", "weight_version",
                                  "disable_draft_model", "torch_empty_cache", "checksums"});
                if (j.contains("serialized_named_tensors"))
                    throw BadField("serialized_named_tensors",
                                   "serialized_named_tensors holds Python pickles of torch tensors "
                                   "(CUDA IPC handles), which only a co-located Python process can "
                                   "read; send 'named_tensors': [{name, dtype, shape, data "
                                   "(base64 of the raw little-endian bytes)}] instead");
                check_load_format(j, {"direct"});
                if (!j.contains("named_tensors") || !j["named_tensors"].is_array())
                    throw BadField("named_tensors", "'named_tensors' is required (a list)");
                std::vector<std::pair<std::string, at::Tensor>> tensors;
                for (size_t i = 0; i < j["named_tensors"].size(); ++i) {
                    const json &t = j["named_tensors"][i];
                    const std::string at = "named_tensors[" + std::to_string(i) + "]";
                    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
                        !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
                        !t["shape"].is_array() || !t.contains("data") || !t["data"].is_string())
                        throw BadField("named_tensors", at + " must be {name, dtype, shape, data}");
                    const at::ScalarType type = scalar_type_of(t["dtype"], at + ".dtype");
                    std::vector<int64_t> shape;
                    for (const auto &d : t["shape"]) {
                        if (!d.is_number_integer() || d.get<int64_t>() < 0)
                            throw BadField("named_tensors", at + ".shape must hold integers >= 0");
                        shape.push_back(d);
                    }
                    std::vector<uint8_t> bytes = base64_decode(t["data"], at + ".data");
                    const int64_t want = c10::multiply_integers(shape) *
                                         static_cast<int64_t>(c10::elementSize(type));
                    if (static_cast<int64_t>(bytes.size()) != want)
                        throw BadField("named_tensors",
                                       at + ".data has " + std::to_string(bytes.size()) +
                                           " bytes; shape and dtype need " + std::to_string(want));
                    at::Tensor x = at::empty(shape, at::TensorOptions().dtype(type));
                    if (want > 0) std::memcpy(x.data_ptr(), bytes.data(), bytes.size());
                    tensors.emplace_back(t["name"].get<std::string>(), x);
                }
                const UpdateOutcome o =
                    updater.from_tensors(tensors, crc_list(j), version_field(j));
                srv->set_weight_version(o.weight_version);
                return outcome_json(o, "Succeeded to update model weights");
            });
        });

    router.add("POST", "/update_weight_version", [srv, &updater](const Request &req, Responder &r) {
        sglang_call(r, [&] {
            const json j = body_of(req, {"new_version", "abort_all_requests"});
            const std::string v = string_field(j, "new_version", true);
            srv->set_weight_version(v);
            return json{{"message", "weight_version set"}, {"new_version", v}};
        });
    });

    // prime-rl's vLLM server: {"weight_dir": ...} loads a folder; vLLM's
    // {"update_info": ...} belongs to its NCCL transfer engine (not spoken here).
    router.add("POST", "/update_weights", [srv, &updater](const Request &req, Responder &r) {
        try {
            const json j = body_of(req, {"weight_dir", "update_info"});
            if (j.contains("update_info"))
                throw BadField("update_info",
                               "update_info belongs to vLLM's NCCL weight transfer engine "
                               "(StatelessProcessGroup with a pickled NCCL id), which this server "
                               "does not speak; use {\"weight_dir\": ...} or SGLang's "
                               "/init_weights_update_group + /update_weights_from_distributed");
            const UpdateOutcome o =
                updater.from_disk(string_field(j, "weight_dir", true), std::nullopt, std::nullopt);
            srv->set_weight_version(o.weight_version);
            reply_json(r, 200, {{"status", "ok"}});
        } catch (const BadField &e) {
            send_error(r, 400, e.what(), e.field);
        } catch (const UpdateRefused &e) {
            send_error(r, e.status, e.what());
        } catch (const std::exception &e) {
            send_error(r, 500, e.what());
        }
    });
    for (const char *path : {"/init_weight_transfer_engine", "/start_weight_update",
                             "/finish_weight_update", "/init_broadcaster"})
        router.add("POST", path, [path](const Request &, Responder &r) {
            send_error(r, 400,
                       std::string(path) +
                           " belongs to vLLM's NCCL weight transfer (a StatelessProcessGroup with "
                           "a pickled NCCL id), which this server does not speak; use "
                           "/update_weights_from_disk, /update_weights {weight_dir}, or SGLang's "
                           "/init_weights_update_group + /update_weights_from_distributed");
        });
}

} // namespace rl::serve
