// The weight-update routes of `rlhost serve`: SGLang's (protocols.md D.2,
// D.3), prime-rl's /update_weights {weight_dir} (E.4) and vLLM's NCCL weight
// transfer engine (vLLM 0.33.0, docs/serving.md) with the read-only routes a
// vLLM trainer calls (/get_world_size, /weight_info), over WeightUpdater.
#include "weight_routes.hpp"

#include "server.hpp"
#include "weight_update.hpp"
#include "rl/core/json.hpp"
#include "rl/core/text.hpp"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cctype>
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

// vLLM's replies: {"message"} with 200; errors as the OpenAI-style error body.
template <typename F>
void vllm_call(Responder &r, F &&fn) {
    try {
        reply_json(r, 200, fn());
    } catch (const BadField &e) {
        send_error(r, 400, e.what(), e.field);
    } catch (const UpdateRefused &e) {
        send_error(r, e.status, e.what());
    } catch (const std::exception &e) {
        send_error(r, 500, e.what());
    }
}

int64_t info_int(const json &o, const std::string &where, const std::string &k, int64_t fallback,
                 bool required) {
    if (!o.contains(k) || o[k].is_null()) {
        if (required) throw BadField(where, where + "." + k + " is required (an integer)");
        return fallback;
    }
    if (!o[k].is_number_integer()) throw BadField(where, where + "." + k + " must be an integer");
    return o[k].get<int64_t>();
}

// init_info of /init_weight_transfer_engine for vLLM's NCCL engine:
// master_address + master_port (the StatelessProcessGroup's store) or
// nccl_unique_id_b64 (the id itself), rank_offset, world_size and the packing.
VllmInitInfo vllm_init_info(const json &body) {
    if (!body.contains("init_info") || !body["init_info"].is_object())
        throw BadField("init_info", "'init_info' is required (an object)");
    const json &o = body["init_info"];
    static const std::set<std::string> known = {"master_address",
                                                "master_port",
                                                "rank_offset",
                                                "world_size",
                                                "nccl_unique_id_b64",
                                                "packed",
                                                "packed_buffer_size_bytes",
                                                "packed_num_buffers"};
    for (const auto &[k, v] : o.items())
        if (!known.count(k))
            throw BadField("init_info", "init_info." + k +
                                            " is not a field of vLLM's NCCL engine (vLLM 0.33.0: "
                                            "master_address, master_port, rank_offset, "
                                            "world_size, nccl_unique_id_b64, packed, "
                                            "packed_buffer_size_bytes, packed_num_buffers)");
    VllmInitInfo info;
    const bool has_id = o.contains("nccl_unique_id_b64") && !o["nccl_unique_id_b64"].is_null() &&
                        o["nccl_unique_id_b64"] != "";
    const bool has_addr = o.contains("master_address") && !o["master_address"].is_null();
    const bool has_port = o.contains("master_port") && !o["master_port"].is_null();
    if (has_id && (has_addr || has_port))
        throw BadField("init_info", "init_info: give nccl_unique_id_b64 or master_address and "
                                    "master_port, not both");
    if (has_id) {
        if (!o["nccl_unique_id_b64"].is_string())
            throw BadField("init_info", "init_info.nccl_unique_id_b64 must be a string");
        const auto bytes = core::base64_decode(o["nccl_unique_id_b64"].get<std::string>());
        if (!bytes || bytes->size() != std::tuple_size<vllm::UniqueId>::value)
            throw BadField("init_info", "init_info.nccl_unique_id_b64 must be standard base64 of "
                                        "the 128 bytes of an ncclUniqueId");
        vllm::UniqueId id;
        std::memcpy(id.data(), bytes->data(), id.size());
        info.unique_id = id;
    } else {
        if (!has_addr || !has_port)
            throw BadField("init_info", "init_info needs master_address and master_port (or "
                                        "nccl_unique_id_b64)");
        if (!o["master_address"].is_string())
            throw BadField("init_info", "init_info.master_address must be a string");
        info.master_address = o["master_address"];
        info.master_port = static_cast<int>(info_int(o, "init_info", "master_port", 0, true));
    }
    info.rank_offset = static_cast<int>(info_int(o, "init_info", "rank_offset", 0, true));
    info.world_size = static_cast<int>(info_int(o, "init_info", "world_size", 0, true));
    if (o.contains("packed") && !o["packed"].is_null()) {
        if (!o["packed"].is_boolean())
            throw BadField("init_info", "init_info.packed must be true or false");
        info.packed = o["packed"];
    }
    info.packed_buffer_size_bytes =
        info_int(o, "init_info", "packed_buffer_size_bytes", info.packed_buffer_size_bytes, false);
    info.packed_num_buffers =
        info_int(o, "init_info", "packed_num_buffers", info.packed_num_buffers, false);
    return info;
}

// One update_info object of /update_weights for vLLM's NCCL engine: names,
// dtype_names and shapes (all empty: those of the previous update). `at`
// names it in errors ("update_info" or "update_info[i]").
std::vector<AnnouncedTensor> vllm_update_entry(const json &u, const std::string &at) {
    if (!u.is_object()) throw BadField("update_info", "'" + at + "' must be an object");
    for (const auto &[k, v] : u.items())
        if (k != "names" && k != "dtype_names" && k != "shapes")
            throw BadField("update_info",
                           at + "." + k +
                               " is not a field of vLLM's NCCL engine (vLLM 0.33.0: names, "
                               "dtype_names, shapes; packing moved to init_info)");
    std::vector<AnnouncedTensor> ts;
    for (const char *k : {"names", "dtype_names", "shapes"})
        if (u.contains(k) && !u[k].is_array())
            throw BadField("update_info", at + "." + k + " must be a list");
    const json empty = json::array();
    const json &names = u.contains("names") ? u["names"] : empty;
    const json &dtypes = u.contains("dtype_names") ? u["dtype_names"] : empty;
    const json &shapes = u.contains("shapes") ? u["shapes"] : empty;
    if (dtypes.size() != names.size() || shapes.size() != names.size())
        throw BadField("update_info", at + ": names, dtype_names and shapes differ in length (" +
                                          std::to_string(names.size()) + ", " +
                                          std::to_string(dtypes.size()) + ", " +
                                          std::to_string(shapes.size()) + ")");
    for (size_t i = 0; i < names.size(); ++i) {
        const std::string n = "[" + std::to_string(i) + "]";
        if (!names[i].is_string())
            throw BadField("update_info", at + ".names" + n + " must be a string");
        if (!dtypes[i].is_string())
            throw BadField("update_info", at + ".dtype_names" + n + " must be a string");
        if (!shapes[i].is_array())
            throw BadField("update_info", at + ".shapes" + n + " must be a list");
        AnnouncedTensor t;
        t.name = names[i];
        t.dtype = dtypes[i];
        for (const auto &d : shapes[i]) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0)
                throw BadField("update_info", at + ".shapes" + n + " must hold integers >= 0");
            t.shape.push_back(d);
        }
        ts.push_back(std::move(t));
    }
    return ts;
}

// update_info of /update_weights: one object, or vLLM 0.33's list indexed by
// global worker rank (data_parallel_index * TP * PP + rank; the worker takes
// its own entry). This server is one worker, rank 0, so it takes entry 0. The
// entries of other ranks are taken only when they announce what entry 0 does:
// every rank of vLLM's dense NCCL engine receives the same full (checkpoint
// format) tensors from the same broadcasts, and entries that differ describe
// per-rank shards for tensor-parallel ranks this server does not have.
std::vector<AnnouncedTensor> vllm_update_info(const json &given) {
    if (!given.is_array()) return vllm_update_entry(given, "update_info");
    if (given.empty())
        throw BadField("update_info",
                       "update_info is an empty list; a list holds one entry per worker, indexed "
                       "by global worker rank, and this server is worker 0 (give one object)");
    std::vector<AnnouncedTensor> mine = vllm_update_entry(given[0], "update_info[0]");
    for (size_t r = 1; r < given.size(); ++r) {
        const std::string at = "update_info[" + std::to_string(r) + "]";
        const std::vector<AnnouncedTensor> other = vllm_update_entry(given[r], at);
        std::string differs;
        if (other.size() != mine.size())
            differs = "announces " + std::to_string(other.size()) + " tensors, update_info[0] " +
                      std::to_string(mine.size());
        for (size_t i = 0; differs.empty() && i < mine.size(); ++i) {
            const std::string n = "[" + std::to_string(i) + "]";
            if (other[i].name != mine[i].name)
                differs = "names" + n + " is '" + other[i].name + "', update_info[0]'s '" +
                          mine[i].name + "'";
            else if (other[i].dtype != mine[i].dtype)
                differs = "dtype_names" + n + " is '" + other[i].dtype + "', update_info[0]'s '" +
                          mine[i].dtype + "'";
            else if (other[i].shape != mine[i].shape)
                differs = "shapes" + n + " is " + json(other[i].shape).dump() +
                          ", update_info[0]'s " + json(mine[i].shape).dump();
        }
        if (!differs.empty())
            throw BadField("update_info",
                           at + " differs from update_info[0] (" + differs +
                               "): a list holds one entry per worker, indexed by global worker "
                               "rank (vLLM 0.33.0: data_parallel_index * TP * PP + rank), and "
                               "this server is one worker (rank 0, /get_world_size 1); "
                               "per-rank shards of tensor-parallel ranks it does not have "
                               "cannot be received, and every rank of one NCCL broadcast "
                               "receives the same tensors (send full tensors, one entry)");
    }
    return mine;
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
    // {"update_info": ...} receives over its NCCL transfer engine.
    router.add("POST", "/update_weights", [srv, &updater](const Request &req, Responder &r) {
        vllm_call(r, [&] {
            const json j = body_of(req, {"weight_dir", "update_info"});
            if (j.contains("update_info")) {
                if (j.contains("weight_dir"))
                    throw BadField("weight_dir", "give either 'weight_dir' (prime-rl) or "
                                                 "'update_info' (vLLM's NCCL engine), not both");
                auto o = updater.vllm_receive(vllm_update_info(j["update_info"]));
                if (o) srv->set_weight_version(o->weight_version);
                return json{{"message", "Weights updated"}};
            }
            const UpdateOutcome o =
                updater.from_disk(string_field(j, "weight_dir", true), std::nullopt, std::nullopt);
            srv->set_weight_version(o.weight_version);
            return json{{"status", "ok"}};
        });
    });

    // vLLM's NCCL weight transfer engine (vLLM 0.33.0's routes and bodies).
    router.add("POST", "/init_weight_transfer_engine",
               [&updater](const Request &req, Responder &r) {
                   vllm_call(r, [&] {
                       const json j = body_of(req, {"init_info"});
                       updater.vllm_init(vllm_init_info(j));
                       return json{{"message", "Weight transfer initialized"}};
                   });
               });
    router.add("POST", "/start_weight_update", [&updater](const Request &req, Responder &r) {
        vllm_call(r, [&] {
            // Older releases sent is_checkpoint_format (always true here).
            const json j = body_of(req, {"is_checkpoint_format"});
            if (j.contains("is_checkpoint_format") && j["is_checkpoint_format"] != true)
                throw BadField("is_checkpoint_format",
                               "is_checkpoint_format: only checkpoint-format weights (true) are "
                               "received");
            updater.vllm_start();
            return json{{"message", "Weight update started"}};
        });
    });
    router.add("POST", "/finish_weight_update", [srv, &updater](const Request &req, Responder &r) {
        vllm_call(r, [&] {
            const json j = body_of(req, {"weight_version"});
            const UpdateOutcome o = updater.vllm_finish(version_field(j));
            srv->set_weight_version(o.weight_version);
            return json{{"message", "Weight update finished"}};
        });
    });
    router.add("POST", "/shutdown_weight_transfer_engine",
               [&updater](const Request &req, Responder &r) {
                   vllm_call(r, [&] {
                       (void)body_of(req, {});
                       updater.vllm_shutdown();
                       return json{{"message", "Weight transfer shut down"}};
                   });
               });
    // vLLM 0.33's read-only routes of its RL API (vllm/entrypoints/rl/online/
    // api_router.py) a trainer calls: the workers to count in the NCCL group
    // (TP * PP, times DP with include_dp) and the weights' version.
    router.add("GET", "/get_world_size", [](const Request &req, Responder &r) {
        vllm_call(r, [&] {
            if (auto q = req.query_param("include_dp")) {
                std::string v = *q;
                for (char &c : v)
                    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                static const std::set<std::string> truth = {"true",  "1", "yes", "on",  "t", "y",
                                                            "false", "0", "no",  "off", "f", "n"};
                if (!truth.count(v))
                    throw BadField("include_dp",
                                   "include_dp must be a boolean (true or false), got '" + *q +
                                       "'");
            }
            // One worker either way: no tensor, pipeline or data parallelism.
            return json{{"world_size", 1}};
        });
    });
    router.add("GET", "/weight_info", [srv](const Request &, Responder &r) {
        vllm_call(r, [&] { return json{{"weight_version", srv->weight_version()}}; });
    });
    router.add("POST", "/weight_checker", [](const Request &, Responder &r) {
        send_error(r, 400,
                   "/weight_checker is not served: vLLM's checksums are SHA-256 digests of its "
                   "own in-memory parameters (fused qkv_proj, gate_up_proj; keys per rank, "
                   "dp0:pp0:pcp0:tp0:...), "
                   "which this server does not hold; /update_weights_from_disk, "
                   "/update_weights_from_distributed and /update_weights_from_tensor take "
                   "CRC-32C per tensor instead",
                   "action");
    });
    router.add("POST", "/init_broadcaster", [](const Request &, Responder &r) {
        send_error(r, 400,
                   "/init_broadcaster belongs to prime-rl's NCCL broadcast, which this server "
                   "does not speak; use vLLM's /init_weight_transfer_engine, "
                   "/update_weights {weight_dir}, or SGLang's /init_weights_update_group");
    });
}

} // namespace rl::serve
