// The embedder API of abi/rl/train.h: models, tokenizers, the trainer, the
// co-located engine and the rollout buffer, as a C boundary over core/.
// No exception crosses it; failures set the thread-local last error.
#include "capi_common.hpp"
#include "loss_call.hpp"
#include "rl/host/runtime.hpp"

#include "rl/core/buffer.hpp"
#include "rl/core/chat_template.hpp"
#include "rl/core/checkpoint.hpp"
#include "rl/core/device.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

using rl::host::CallSink;
using rl::host::HostError;
using rl::host::Instance;
using rl::host::OwnedTensor;

struct rl_model {
    std::shared_ptr<rl::core::Policy> policy;
};
struct rl_trainer {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::core::Trainer> impl;
};
struct rl_engine {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::core::Engine> impl;
};
struct rl_buffer {
    std::unique_ptr<rl::core::RolloutBuffer> impl;
};

namespace {

using namespace rl::host::capi;
using nlohmann::json;
namespace core = rl::core;
namespace fs = std::filesystem;

rl_status_t status_of(core::ErrorKind k) {
    switch (k) {
        case core::ErrorKind::InvalidArgument:
            return RL_ERR_INVALID_ARG;
        case core::ErrorKind::NotFound:
            return RL_ERR_NOT_FOUND;
        case core::ErrorKind::BadState:
            return RL_ERR_BAD_STATE;
        case core::ErrorKind::Io:
            return RL_ERR_IO;
        case core::ErrorKind::Numeric:
            return RL_ERR_NUMERIC;
    }
    return RL_ERR_INTERNAL;
}

// boundary() plus the error types of core/ and libtorch.
template <class F>
rl_status_t train_boundary(F &&f) noexcept {
    return boundary([&]() -> rl_status_t {
        try {
            return f();
        } catch (const core::TrainError &e) {
            throw HostError{status_of(e.kind()), e.what()};
        } catch (const core::Error &e) {
            throw HostError{RL_ERR_INVALID_ARG, e.what()};
        } catch (const c10::Error &e) {
            throw HostError{RL_ERR_INTERNAL,
                            std::string("libtorch: ") + e.what_without_backtrace()};
        } catch (const std::invalid_argument &e) {
            throw HostError{RL_ERR_INVALID_ARG, e.what()};
        }
    });
}

std::string fn_msg(const char *fn, const std::string &msg) {
    return std::string(fn) + ": " + msg;
}

// ---- tensors ----------------------------------------------------------------

at::ScalarType scalar_type_of(rl_dtype_t d, const std::string &what) {
    if (d.lanes == 1) {
        switch (d.code) {
            case RL_DTYPE_FLOAT:
                if (d.bits == 32) return at::kFloat;
                if (d.bits == 64) return at::kDouble;
                if (d.bits == 16) return at::kHalf;
                break;
            case RL_DTYPE_BFLOAT:
                if (d.bits == 16) return at::kBFloat16;
                break;
            case RL_DTYPE_INT:
                if (d.bits == 64) return at::kLong;
                if (d.bits == 32) return at::kInt;
                if (d.bits == 16) return at::kShort;
                if (d.bits == 8) return at::kChar;
                break;
            case RL_DTYPE_UINT:
                if (d.bits == 8) return at::kByte;
                break;
            case RL_DTYPE_BOOL:
                if (d.bits == 8) return at::kBool;
                break;
            default:
                break;
        }
    }
    throw HostError{RL_ERR_UNSUPPORTED,
                    what + ": dtype " + rl::host::dtype_string(d) + " is not supported"};
}

rl_dtype_t dtype_of(at::ScalarType t) {
    switch (t) {
        case at::kFloat:
            return {RL_DTYPE_FLOAT, 32, 1};
        case at::kDouble:
            return {RL_DTYPE_FLOAT, 64, 1};
        case at::kHalf:
            return {RL_DTYPE_FLOAT, 16, 1};
        case at::kBFloat16:
            return {RL_DTYPE_BFLOAT, 16, 1};
        case at::kLong:
            return {RL_DTYPE_INT, 64, 1};
        case at::kInt:
            return {RL_DTYPE_INT, 32, 1};
        case at::kShort:
            return {RL_DTYPE_INT, 16, 1};
        case at::kChar:
            return {RL_DTYPE_INT, 8, 1};
        case at::kByte:
            return {RL_DTYPE_UINT, 8, 1};
        case at::kBool:
            return {RL_DTYPE_BOOL, 8, 1};
        default:
            throw HostError{RL_ERR_INTERNAL, std::string("no ABI dtype for ") + c10::toString(t)};
    }
}

at::Tensor tensor_from_owned(const OwnedTensor &o, const std::string &what) {
    at::Tensor t = at::empty(o.shape, at::TensorOptions().dtype(scalar_type_of(o.dtype, what)));
    if (!o.bytes.empty()) std::memcpy(t.data_ptr(), o.bytes.data(), o.bytes.size());
    return t;
}

// A copy of a borrowed view; errors name `what`.
at::Tensor tensor_from_view(const rl_tensor_view_t &v, const std::string &what) {
    OwnedTensor o;
    try {
        o = OwnedTensor::copy_of(v);
    } catch (const HostError &e) {
        throw HostError{e.status, what + ": " + e.message};
    }
    return tensor_from_owned(o, what);
}

OwnedTensor owned_from_tensor(const at::Tensor &t) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    OwnedTensor o;
    o.dtype = dtype_of(c.scalar_type());
    o.shape.assign(c.sizes().begin(), c.sizes().end());
    o.bytes.resize(static_cast<size_t>(c.numel()) * c.element_size());
    if (!o.bytes.empty()) std::memcpy(o.bytes.data(), c.data_ptr(), o.bytes.size());
    return o;
}

template <class T>
OwnedTensor owned_from_vector(const std::vector<T> &v, rl_dtype_t dtype) {
    OwnedTensor o;
    o.dtype = dtype;
    o.shape = {static_cast<int64_t>(v.size())};
    o.bytes.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
    return o;
}

// A 1-D integer view as int64 values.
std::vector<int64_t> int_vector(const rl_tensor_view_t &v, const std::string &what) {
    at::Tensor t = tensor_from_view(v, what);
    if (t.dim() != 1) throw HostError{RL_ERR_INVALID_ARG, what + " must be 1-D"};
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        throw HostError{RL_ERR_INVALID_ARG, what + " must be an integer tensor (int64), got " +
                                                c10::toString(t.scalar_type())};
    t = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// ---- loss plugins as trainer callbacks ------------------------------------------

core::LossFunction loss_function(Instance &inst) {
    const rl::host::LossSignatureLists sig = rl::host::loss_signature(inst);
    core::LossFunction f;
    f.name = inst.who();
    f.signature = {sig.required, sig.optional, sig.differentiable};
    f.compute = [&inst](const core::LossCall &call) {
        std::vector<OwnedTensor> store;
        store.reserve(call.tensors.size());
        for (const auto &kv : call.tensors) store.push_back(owned_from_tensor(kv.second));
        std::vector<rl_tensor_arg_t> args;
        for (size_t i = 0; i < store.size(); ++i)
            args.push_back({call.tensors[i].first.c_str(), store[i].view()});
        const OwnedTensor cu = owned_from_tensor(call.cu_seqlens);
        rl_loss_inputs_t in{};
        in.struct_size = sizeof(in);
        in.tensors = rl_tensor_list_t{args.empty() ? nullptr : args.data(), args.size()};
        in.cu_seqlens = cu.view();
        in.global_tokens = call.global_tokens;
        in.global_seqs = call.global_seqs;
        CallSink sink = rl::host::compute_loss(inst, in, call.want_grads);
        core::LossResult r;
        r.loss = sink.scalars.at("loss");
        for (const auto &kv : sink.tensors) {
            if (kv.first.rfind("grad.", 0) == 0)
                r.grads[kv.first.substr(5)] = tensor_from_owned(kv.second, inst.who());
            else
                r.tensors[kv.first] = tensor_from_owned(kv.second, inst.who());
        }
        r.metrics.insert(sink.metrics.begin(), sink.metrics.end());
        return r;
    };
    return f;
}

// ---- batches and results ----------------------------------------------------------

core::TrainBatch batch_from(const rl_batch_t *b, const char *fn) {
    require(b != nullptr, fn_msg(fn, "batch is NULL"));
    require(b->struct_size >= sizeof(rl_batch_t),
            fn_msg(fn, "batch->struct_size is too small (set it to sizeof(rl_batch_t))"));
    core::TrainBatch tb;
    tb.input_ids = tensor_from_view(b->input_ids, fn_msg(fn, "batch input_ids"));
    tb.cu_seqlens = int_vector(b->cu_seqlens, fn_msg(fn, "batch cu_seqlens"));
    require(
        b->tensors.count == 0 || b->tensors.items != nullptr,
        fn_msg(fn, "batch tensors.items is NULL but count is " + std::to_string(b->tensors.count)));
    for (uint64_t i = 0; i < b->tensors.count; ++i) {
        const rl_tensor_arg_t &a = b->tensors.items[i];
        require(a.name != nullptr && *a.name,
                fn_msg(fn, "batch tensor " + std::to_string(i) + " has no name"));
        const std::string name = a.name;
        const std::string what = fn_msg(fn, "batch tensor '" + name + "'");
        if (name == "global_tokens" || name == "global_seqs") {
            at::Tensor t = tensor_from_view(a.view, what);
            require(t.numel() == 1, what + " must hold one number (the count over the whole "
                                           "optimizer step)");
            (name == "global_tokens" ? tb.global_tokens : tb.global_seqs) =
                t.to(at::kDouble).item<double>();
            continue;
        }
        require(!tb.tensors.count(name), fn_msg(fn, "batch tensor '" + name + "' given twice"));
        tb.tensors[name] = tensor_from_view(a.view, what);
    }
    return tb;
}

CallSink step_sink(const core::StepResult &r, bool with_loss) {
    CallSink sink;
    if (with_loss) {
        sink.scalars["loss"] = r.loss;
        sink.scalars["loss_tokens"] = static_cast<double>(r.loss_tokens);
    }
    sink.scalars["tokens"] = static_cast<double>(r.tokens);
    sink.scalars["seqs"] = static_cast<double>(r.seqs);
    sink.scalars["bins"] = static_cast<double>(r.bins);
    sink.scalars["micro_batches"] = static_cast<double>(r.micro_batches);
    sink.metrics.insert(r.metrics.begin(), r.metrics.end());
    for (const auto &kv : r.tensors) sink.tensors[kv.first] = owned_from_tensor(kv.second);
    return sink;
}

json parse_json(const char *text, const std::string &what) {
    if (text == nullptr) return json();
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) throw HostError{RL_ERR_INVALID_ARG, what + ": not valid JSON"};
    return j;
}

// ---- the rollout buffer -----------------------------------------------------------

core::BufferConfig buffer_config(const json &j) {
    core::BufferConfig c;
    if (j.is_null()) return c;
    require(j.is_object(), "rl_buffer_create: config must be a JSON object");
    auto opt_number = [](const json &v, const std::string &k) -> std::optional<double> {
        if (v.is_null()) return std::nullopt;
        require(v.is_number(), "rl_buffer_create: " + k + " must be a number or null");
        return v.get<double>();
    };
    auto count = [](const json &v, const std::string &k) -> int64_t {
        require(v.is_number_integer() && v.get<int64_t>() >= 0,
                "rl_buffer_create: " + k + " must be an integer >= 0, got " + v.dump());
        return v.get<int64_t>();
    };
    for (const auto &kv : j.items()) {
        const std::string &k = kv.key();
        const json &v = kv.value();
        if (k == "group_size") {
            c.group_size = static_cast<size_t>(count(v, k));
        } else if (k == "easy_threshold") {
            c.easy_threshold = opt_number(v, k);
        } else if (k == "hard_threshold") {
            c.hard_threshold = opt_number(v, k);
        } else if (k == "drop_zero_variance") {
            require(v.is_boolean(), "rl_buffer_create: drop_zero_variance must be true or false");
            c.drop_zero_variance = v.get<bool>();
        } else if (k == "reward_tolerance") {
            require(v.is_number(), "rl_buffer_create: reward_tolerance must be a number");
            c.reward_tolerance = v.get<double>();
        } else if (k == "min_group_size") {
            c.min_group_size = static_cast<size_t>(count(v, k));
        } else if (k == "max_off_policy_steps") {
            c.max_off_policy_steps =
                v.is_null() ? std::nullopt : std::optional<int64_t>(count(v, k));
        } else if (k == "drop_log_capacity") {
            c.drop_log_capacity = static_cast<size_t>(count(v, k));
        } else {
            throw HostError{RL_ERR_INVALID_ARG,
                            "rl_buffer_create: unknown key '" + k +
                                "'; valid: group_size, easy_threshold, hard_threshold, "
                                "drop_zero_variance, reward_tolerance, min_group_size, "
                                "max_off_policy_steps, drop_log_capacity"};
        }
    }
    return c;
}

CallSink batch_sink(std::vector<core::Group> groups) {
    CallSink sink;
    std::vector<const core::Rollout *> rs;
    for (const auto &g : groups)
        for (const auto &r : g.rollouts) rs.push_back(&r);
    sink.scalars["groups"] = static_cast<double>(groups.size());
    sink.scalars["rollouts"] = static_cast<double>(rs.size());
    if (rs.empty()) {
        sink.scalars["tokens"] = 0;
        return sink;
    }
    std::vector<int64_t> ids, cu{0}, group_ids, versions;
    std::vector<float> mask, logprobs;
    std::vector<double> rewards;
    std::map<std::string, std::vector<float>> extras;
    const bool with_logprobs = !rs.front()->logprobs.empty();
    json tasks = json::array(), completions = json::array();
    for (size_t i = 0; i < rs.size(); ++i) {
        const core::Rollout &r = *rs[i];
        const size_t n = r.token_ids.size();
        ids.insert(ids.end(), r.token_ids.begin(), r.token_ids.end());
        cu.push_back(static_cast<int64_t>(ids.size()));
        group_ids.push_back(r.group_id);
        versions.push_back(r.policy_version);
        rewards.push_back(r.reward);
        if (r.loss_mask.empty())
            mask.insert(mask.end(), n, 1.0f);
        else
            for (uint8_t m : r.loss_mask) mask.push_back(m ? 1.0f : 0.0f);
        if (with_logprobs != !r.logprobs.empty())
            throw HostError{RL_ERR_BAD_STATE,
                            "rl_buffer_pop_batch: some rollouts carry logprobs and others do not "
                            "(group " +
                                std::to_string(r.group_id) + ")"};
        logprobs.insert(logprobs.end(), r.logprobs.begin(), r.logprobs.end());
        if (i == 0)
            for (const auto &kv : r.extras) extras[kv.first];
        for (auto &kv : extras) {
            auto it = r.extras.find(kv.first);
            if (it == r.extras.end() || r.extras.size() != extras.size())
                throw HostError{RL_ERR_BAD_STATE,
                                "rl_buffer_pop_batch: rollouts of the batch carry different "
                                "extra tensors (group " +
                                    std::to_string(r.group_id) + ")"};
            kv.second.insert(kv.second.end(), it->second.begin(), it->second.end());
        }
        tasks.push_back(r.task);
        completions.push_back(r.completion);
    }
    const rl_dtype_t f32{RL_DTYPE_FLOAT, 32, 1}, f64{RL_DTYPE_FLOAT, 64, 1},
        i64{RL_DTYPE_INT, 64, 1};
    sink.scalars["tokens"] = static_cast<double>(ids.size());
    sink.tensors["input_ids"] = owned_from_vector(ids, i64);
    sink.tensors["cu_seqlens"] = owned_from_vector(cu, i64);
    sink.tensors["loss_mask"] = owned_from_vector(mask, f32);
    if (with_logprobs) sink.tensors["rollout_logprobs"] = owned_from_vector(logprobs, f32);
    for (const auto &kv : extras) sink.tensors[kv.first] = owned_from_vector(kv.second, f32);
    sink.tensors["rewards"] = owned_from_vector(rewards, f64);
    sink.tensors["group_ids"] = owned_from_vector(group_ids, i64);
    sink.tensors["policy_versions"] = owned_from_vector(versions, i64);
    sink.texts["tasks"] = tasks.dump();
    sink.texts["completions"] = completions.dump();
    return sink;
}

} // namespace

extern "C" {

// ---- models ---------------------------------------------------------------------

RL_API rl_status_t rl_model_init_preset(const char *preset, const char *dir, uint64_t seed) {
    return train_boundary([&] {
        require(preset && dir && *dir, "rl_model_init_preset: preset and dir are required");
        require(std::string(preset) == "tiny",
                "rl_model_init_preset: unknown preset '" + std::string(preset) + "'; valid: tiny");
        core::write_tiny_model(dir, seed);
        return RL_OK;
    });
}

RL_API const char *rl_platform_info(void) {
    static const std::string info = [] {
        try {
            return json{{"torch_version", core::torch_version()},
                        {"cuda_built", core::torch_has_cuda()},
                        {"cuda_devices", core::cuda_device_count()},
                        {"summary", core::torch_summary()}}
                .dump();
        } catch (const std::exception &e) {
            return json{{"torch_version", core::torch_version()}, {"error", e.what()}}.dump();
        }
    }();
    return info.c_str();
}

RL_API rl_status_t rl_model_load(const char *path, const char *options_json,
                                 rl_model_t **out_model) {
    return train_boundary([&] {
        require(path && out_model, "rl_model_load: path and out_model are required");
        const json opts = parse_json(options_json, "rl_model_load: options");
        if (!opts.is_null()) {
            require(opts.is_object(), "rl_model_load: options must be a JSON object");
            for (const auto &kv : opts.items()) {
                const std::string &key = kv.key();
                if (key == "threads") {
                    require(kv.value().is_number_integer() && kv.value().get<int64_t>() >= 0,
                            "rl_model_load: threads must be an integer >= 0 (0: all cores)");
                    core::set_num_threads(static_cast<int>(kv.value().get<int64_t>()));
                } else if (key == "device" || key == "dtype") {
                    require(kv.value().is_string(), "rl_model_load: " + key +
                                                        " must be a string, got " +
                                                        kv.value().dump());
                } else {
                    throw HostError{RL_ERR_INVALID_ARG, "rl_model_load: unknown option '" + key +
                                                            "'; valid: threads, device, dtype"};
                }
            }
        }
        core::LoadOptions lo;
        if (opts.is_object() && opts.contains("device"))
            lo.device =
                core::resolve_device(opts["device"].get<std::string>(), "rl_model_load: device");
        if (opts.is_object() && opts.contains("dtype")) {
            lo.dtype = core::parse_dtype(opts["dtype"].get<std::string>(), "rl_model_load: dtype");
            require(lo.dtype == at::kFloat || lo.dtype == at::kBFloat16,
                    "rl_model_load: dtype must be float32 or bfloat16, got '" +
                        opts["dtype"].get<std::string>() + "'");
        }
        auto m = std::make_unique<rl_model>();
        m->policy = core::Policy::load(path, lo);
        *out_model = m.release();
        return RL_OK;
    });
}

RL_API void rl_model_destroy(rl_model_t *model) {
    delete model;
}

RL_API rl_status_t rl_model_info(rl_model_t *model, rl_result_t **out_result) {
    return train_boundary([&] {
        require(model && out_result, "rl_model_info: model and out_result are required");
        const core::CausalLM &m = model->policy->model();
        const core::ModelConfig &c = m.config();
        json j = {{"architecture", core::architecture_name(c.architecture)},
                  {"vocab_size", c.vocab_size},
                  {"num_parameters", m.num_parameters()},
                  {"hidden_size", c.hidden_size},
                  {"num_layers", c.num_hidden_layers},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"eos_token_ids", model->policy->eos_token_ids()},
                  {"has_tokenizer", model->policy->tokenizer() != nullptr},
                  {"device", m.device().str()},
                  {"dtype", core::dtype_string(m.dtype())},
                  {"policy_version", model->policy->version()}};
        CallSink sink;
        sink.texts["info"] = j.dump();
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_model_save(rl_model_t *model, const char *dir) {
    return train_boundary([&] {
        require(model && dir && *dir, "rl_model_save: model and dir are required");
        const fs::path target = fs::path(dir).lexically_normal();
        std::error_code ec;
        if (fs::exists(target, ec)) {
            require(fs::is_directory(target, ec),
                    "rl_model_save: '" + target.string() + "' exists and is not a folder");
            const bool empty = fs::is_empty(target, ec);
            require(empty || fs::exists(target / "config.json", ec),
                    "rl_model_save: refusing to replace '" + target.string() +
                        "': it exists and is not a model folder (no config.json)");
        }
        fs::path parent = target.parent_path();
        if (!parent.empty()) fs::create_directories(parent, ec);
        const fs::path tmp = fs::path(target.string() + ".tmp-" + std::to_string(::getpid()));
        fs::remove_all(tmp, ec);
        try {
            core::save_pretrained(model->policy->model(), tmp.string());
            core::replace_folder(tmp.string(), target.string());
        } catch (...) {
            fs::remove_all(tmp, ec);
            throw;
        }
        return RL_OK;
    });
}

// ---- tokenizer ---------------------------------------------------------------------

RL_API rl_status_t rl_tokenizer_encode(rl_model_t *model, rl_string_view_t text, uint32_t flags,
                                       rl_result_t **out_result) {
    return train_boundary([&] {
        require(model && out_result, "rl_tokenizer_encode: model and out_result are required");
        require(text.length == 0 || text.data != nullptr,
                "rl_tokenizer_encode: text.data is NULL but text.length is " +
                    std::to_string(text.length));
        require((flags & ~static_cast<uint32_t>(RL_ENCODE_ADD_SPECIAL)) == 0,
                "rl_tokenizer_encode: unknown flags " + std::to_string(flags));
        const core::Tokenizer &tok = model->policy->require_tokenizer("rl_tokenizer_encode");
        core::EncodeOptions o;
        o.add_special_tokens = (flags & RL_ENCODE_ADD_SPECIAL) != 0;
        const auto ids = tok.encode(std::string_view(text.data ? text.data : "", text.length), o);
        CallSink sink;
        sink.tensors["ids"] = owned_from_vector(std::vector<int64_t>(ids.begin(), ids.end()),
                                                rl_dtype_t{RL_DTYPE_INT, 64, 1});
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_tokenizer_decode(rl_model_t *model, const int64_t *ids, uint64_t n,
                                       rl_result_t **out_result) {
    return train_boundary([&] {
        require(model && out_result, "rl_tokenizer_decode: model and out_result are required");
        require(n == 0 || ids != nullptr,
                "rl_tokenizer_decode: ids is NULL but n is " + std::to_string(n));
        const core::Tokenizer &tok = model->policy->require_tokenizer("rl_tokenizer_decode");
        std::vector<int32_t> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) {
            require(ids[i] >= 0 && ids[i] < tok.vocab_size(),
                    "rl_tokenizer_decode: ids[" + std::to_string(i) +
                        "] = " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                        std::to_string(tok.vocab_size()) + ")");
            v.push_back(static_cast<int32_t>(ids[i]));
        }
        CallSink sink;
        sink.texts["text"] = tok.decode(v);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_tokenizer_apply_chat_template(rl_model_t *model, const char *messages_json,
                                                    const char *template_name,
                                                    uint32_t add_generation_prompt,
                                                    rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_tokenizer_apply_chat_template";
        require(model && messages_json && out_result,
                fn_msg(fn, "model, messages_json and out_result are required"));
        const json j = parse_json(messages_json, fn_msg(fn, "messages"));
        require(j.is_array(), fn_msg(fn, "messages must be a JSON array of {role, content}"));
        std::vector<core::ChatMessage> msgs;
        for (size_t i = 0; i < j.size(); ++i) {
            const json &m = j[i];
            const std::string at = "messages[" + std::to_string(i) + "]";
            require(m.is_object() && m.contains("role") && m["role"].is_string() &&
                        m.contains("content") && m["content"].is_string(),
                    fn_msg(fn, at + " must be an object with string 'role' and 'content'"));
            msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
        }
        core::ChatTemplateOptions o;
        o.add_generation_prompt = add_generation_prompt != 0;
        CallSink sink;
        if (template_name) {
            sink.texts["prompt"] =
                core::apply_chat_template(core::parse_chat_format(template_name), msgs, o);
        } else {
            sink.texts["prompt"] =
                model->policy->require_tokenizer(fn).apply_chat_template(msgs, o);
        }
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

// ---- trainer -----------------------------------------------------------------------

RL_API rl_status_t rl_trainer_create(rl_model_t *model, const char *config_json,
                                     rl_trainer_t **out_trainer) {
    return train_boundary([&] {
        require(model && out_trainer, "rl_trainer_create: model and out_trainer are required");
        auto t = std::make_unique<rl_trainer>();
        t->policy = model->policy;
        t->impl = std::make_unique<core::Trainer>(
            model->policy, core::TrainerConfig::from_json(config_json ? config_json : ""));
        *out_trainer = t.release();
        return RL_OK;
    });
}

RL_API void rl_trainer_destroy(rl_trainer_t *trainer) {
    delete trainer;
}

RL_API rl_status_t rl_trainer_forward_backward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                               rl_instance_t *loss, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_trainer_forward_backward";
        require(trainer && out_result, fn_msg(fn, "trainer and out_result are required"));
        Instance &inst = checked(loss, RL_KIND_LOSS, fn);
        const core::TrainBatch tb = batch_from(batch, fn);
        const core::LossFunction lf = loss_function(inst);
        *out_result = new_result(step_sink(trainer->impl->forward_backward(tb, lf), true));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_forward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                      rl_instance_t *loss, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_trainer_forward";
        require(trainer && out_result, fn_msg(fn, "trainer and out_result are required"));
        const core::TrainBatch tb = batch_from(batch, fn);
        std::optional<core::LossFunction> lf;
        if (loss) lf = loss_function(checked(loss, RL_KIND_LOSS, fn));
        *out_result =
            new_result(step_sink(trainer->impl->forward(tb, lf ? &*lf : nullptr), lf.has_value()));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_optim_step(rl_trainer_t *trainer, const char *params_json,
                                         rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && out_result,
                "rl_trainer_optim_step: trainer and out_result are required");
        const core::OptimResult r = trainer->impl->optim_step(
            core::OptimOverrides::from_json(params_json ? params_json : ""));
        CallSink sink;
        sink.scalars["grad_norm"] = r.grad_norm;
        sink.scalars["learning_rate"] = r.learning_rate;
        sink.scalars["step"] = static_cast<double>(r.step);
        sink.scalars["policy_version"] = static_cast<double>(r.policy_version);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_save_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              const char *state_json, rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && dir && out_result,
                "rl_trainer_save_checkpoint: trainer, dir and out_result are required");
        CallSink sink;
        sink.texts["path"] = trainer->impl->save_checkpoint(dir, state_json ? state_json : "");
        sink.scalars["step"] = static_cast<double>(trainer->impl->step());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_load_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && dir && out_result,
                "rl_trainer_load_checkpoint: trainer, dir and out_result are required");
        const core::CheckpointInfo info = trainer->impl->load_checkpoint(dir);
        CallSink sink;
        sink.texts["state"] = info.state_json;
        sink.texts["path"] = info.path;
        sink.scalars["step"] = static_cast<double>(info.step);
        sink.scalars["policy_version"] = static_cast<double>(trainer->policy->version());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

// ---- engine -------------------------------------------------------------------------

RL_API rl_status_t rl_engine_create(rl_model_t *model, const char *config_json,
                                    rl_engine_t **out_engine) {
    return train_boundary([&] {
        require(model && out_engine, "rl_engine_create: model and out_engine are required");
        auto e = std::make_unique<rl_engine>();
        e->policy = model->policy;
        e->impl = std::make_unique<core::Engine>(
            model->policy, core::EngineConfig::from_json(config_json ? config_json : ""));
        *out_engine = e.release();
        return RL_OK;
    });
}

RL_API void rl_engine_destroy(rl_engine_t *engine) {
    delete engine;
}

RL_API rl_status_t rl_engine_generate(rl_engine_t *engine, const rl_tensor_view_t *prompt_ids,
                                      const rl_tensor_view_t *prompt_cu_seqlens,
                                      const char *params_json, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_engine_generate";
        require(engine && prompt_ids && prompt_cu_seqlens && out_result,
                fn_msg(fn, "engine, prompt_ids, prompt_cu_seqlens and out_result are required"));
        const auto ids = int_vector(*prompt_ids, fn_msg(fn, "prompt_ids"));
        const auto cu = int_vector(*prompt_cu_seqlens, fn_msg(fn, "prompt_cu_seqlens"));
        require(cu.size() >= 2, fn_msg(fn, "prompt_cu_seqlens must hold n_prompts + 1 >= 2 "
                                           "entries"));
        require(cu.front() == 0, fn_msg(fn, "prompt_cu_seqlens[0] must be 0"));
        require(cu.back() == static_cast<int64_t>(ids.size()),
                fn_msg(fn, "prompt_cu_seqlens ends at " + std::to_string(cu.back()) +
                               " but prompt_ids has " + std::to_string(ids.size()) + " tokens"));
        std::vector<std::vector<int64_t>> prompts;
        for (size_t i = 0; i + 1 < cu.size(); ++i) {
            require(cu[i + 1] > cu[i], fn_msg(fn, "prompt " + std::to_string(i) +
                                                      " is empty or prompt_cu_seqlens decreases"));
            prompts.emplace_back(ids.begin() + cu[i], ids.begin() + cu[i + 1]);
        }
        const core::Generation g = engine->impl->generate(
            prompts, core::SamplingParams::from_json(params_json ? params_json : ""));
        const rl_dtype_t i64{RL_DTYPE_INT, 64, 1}, f32{RL_DTYPE_FLOAT, 32, 1};
        CallSink sink;
        sink.tensors["token_ids"] = owned_from_vector(g.token_ids, i64);
        sink.tensors["logprobs"] = owned_from_vector(g.logprobs, f32);
        sink.tensors["cu_seqlens"] = owned_from_vector(g.cu_seqlens, i64);
        sink.tensors["prompt_index"] = owned_from_vector(g.prompt_index, i64);
        json completions = json::array(), reasons = json::array();
        for (size_t i = 0; i < g.completions.size(); ++i) {
            // Invalid UTF-8 never reaches here (the decoder emits U+FFFD), but
            // be strict: replace rather than throw.
            completions.push_back(g.completions[i]);
            reasons.push_back(core::finish_reason_name(g.finish_reasons[i]));
        }
        sink.texts["completions"] =
            completions.dump(-1, ' ', false, json::error_handler_t::replace);
        sink.texts["finish_reasons"] = reasons.dump();
        sink.scalars["policy_version"] = static_cast<double>(g.policy_version);
        sink.scalars["samples"] = static_cast<double>(g.samples());
        sink.scalars["tokens"] = static_cast<double>(g.token_ids.size());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_engine_sync_weights(rl_engine_t *engine, rl_result_t **out_result) {
    return train_boundary([&] {
        require(engine && out_result, "rl_engine_sync_weights: engine and out_result are required");
        CallSink sink;
        sink.scalars["policy_version"] = static_cast<double>(engine->impl->sync_weights());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_engine_sleep(rl_engine_t *engine) {
    return train_boundary([&] {
        require(engine != nullptr, "rl_engine_sleep: engine is NULL");
        engine->impl->sleep();
        return RL_OK;
    });
}

RL_API rl_status_t rl_engine_wake_up(rl_engine_t *engine) {
    return train_boundary([&] {
        require(engine != nullptr, "rl_engine_wake_up: engine is NULL");
        engine->impl->wake_up();
        return RL_OK;
    });
}

// ---- rollout buffer --------------------------------------------------------------------

RL_API rl_status_t rl_buffer_create(const char *config_json, rl_buffer_t **out_buffer) {
    return train_boundary([&] {
        require(out_buffer != nullptr, "rl_buffer_create: out_buffer is NULL");
        auto b = std::make_unique<rl_buffer>();
        b->impl = std::make_unique<core::RolloutBuffer>(
            buffer_config(parse_json(config_json, "rl_buffer_create: config")));
        *out_buffer = b.release();
        return RL_OK;
    });
}

RL_API void rl_buffer_destroy(rl_buffer_t *buffer) {
    delete buffer;
}

RL_API rl_status_t rl_buffer_set_policy_version(rl_buffer_t *buffer, int64_t version) {
    return train_boundary([&] {
        require(buffer != nullptr, "rl_buffer_set_policy_version: buffer is NULL");
        buffer->impl->set_policy_version(version);
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_push(rl_buffer_t *buffer, const char *rollout_json,
                                  const rl_tensor_list_t *tensors) {
    return train_boundary([&] {
        const char *fn = "rl_buffer_push";
        require(buffer && rollout_json && tensors,
                fn_msg(fn, "buffer, rollout_json and tensors are required"));
        const json j = parse_json(rollout_json, fn_msg(fn, "rollout"));
        require(j.is_object(), fn_msg(fn, "rollout must be a JSON object"));
        core::Rollout r;
        for (const auto &kv : j.items()) {
            const std::string &k = kv.key();
            const json &v = kv.value();
            if (k == "group_id" || k == "policy_version") {
                require(v.is_number_integer(), fn_msg(fn, k + " must be an integer"));
                (k == "group_id" ? r.group_id : r.policy_version) = v.get<int64_t>();
            } else if (k == "reward") {
                require(v.is_number(), fn_msg(fn, "reward must be a number"));
                r.reward = v.get<double>();
            } else if (k == "task" || k == "completion") {
                require(v.is_string(), fn_msg(fn, k + " must be a string"));
                (k == "task" ? r.task : r.completion) = v.get<std::string>();
            } else {
                throw HostError{RL_ERR_INVALID_ARG,
                                fn_msg(fn, "unknown rollout key '" + k +
                                               "'; valid: group_id, policy_version, reward, "
                                               "task, completion")};
            }
        }
        require(j.contains("group_id") && j.contains("reward"),
                fn_msg(fn, "rollout needs 'group_id' and 'reward'"));
        require(tensors->count == 0 || tensors->items != nullptr,
                fn_msg(fn, "tensors.items is NULL"));
        std::set<std::string> seen;
        for (uint64_t i = 0; i < tensors->count; ++i) {
            const rl_tensor_arg_t &a = tensors->items[i];
            require(a.name && *a.name, fn_msg(fn, "tensor " + std::to_string(i) + " has no name"));
            const std::string name = a.name;
            require(seen.insert(name).second, fn_msg(fn, "tensor '" + name + "' given twice"));
            const std::string what = fn_msg(fn, "tensor '" + name + "'");
            if (name == "token_ids") {
                r.token_ids = int_vector(a.view, what);
                continue;
            }
            at::Tensor t = tensor_from_view(a.view, what);
            require(t.dim() == 1, what + " must be 1-D (one value per token)");
            if (name == "loss_mask") {
                at::Tensor m = t.to(at::kDouble).contiguous();
                const double *p = m.data_ptr<double>();
                for (int64_t k = 0; k < m.numel(); ++k) {
                    require(p[k] == 0 || p[k] == 1, what + " must hold 0 or 1, got " +
                                                        std::to_string(p[k]) + " at token " +
                                                        std::to_string(k));
                    r.loss_mask.push_back(p[k] != 0);
                }
                continue;
            }
            at::Tensor f = t.to(at::kFloat).contiguous();
            std::vector<float> v(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
            if (name == "logprobs")
                r.logprobs = std::move(v);
            else
                r.extras[name] = std::move(v);
        }
        require(!r.token_ids.empty(), fn_msg(fn, "tensor 'token_ids' is required and non-empty"));
        buffer->impl->push(std::move(r));
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_close_group(rl_buffer_t *buffer, int64_t group_id,
                                         uint32_t *out_found) {
    return train_boundary([&] {
        require(buffer != nullptr, "rl_buffer_close_group: buffer is NULL");
        const bool found = buffer->impl->close_group(group_id);
        if (out_found) *out_found = found ? 1u : 0u;
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_pop_batch(rl_buffer_t *buffer, uint64_t min_rollouts,
                                       uint64_t timeout_ms, rl_result_t **out_result) {
    return train_boundary([&] {
        require(buffer && out_result, "rl_buffer_pop_batch: buffer and out_result are required");
        require(min_rollouts >= 1, "rl_buffer_pop_batch: min_rollouts must be >= 1");
        std::vector<core::Group> groups =
            timeout_ms == 0
                ? buffer->impl->pop_batch(min_rollouts)
                : buffer->impl->wait_batch(min_rollouts, std::chrono::milliseconds(timeout_ms));
        *out_result = new_result(batch_sink(std::move(groups)));
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_stats(rl_buffer_t *buffer, uint32_t take, rl_result_t **out_result) {
    return train_boundary([&] {
        require(buffer && out_result, "rl_buffer_stats: buffer and out_result are required");
        core::RolloutBuffer &b = *buffer->impl;
        const core::BufferStats s = take ? b.take_stats() : b.stats();
        CallSink sink;
        sink.scalars["pushed_rollouts"] = static_cast<double>(s.pushed_rollouts);
        sink.scalars["completed_groups"] = static_cast<double>(s.completed_groups);
        sink.scalars["passed_groups"] = static_cast<double>(s.ready_groups);
        sink.scalars["popped_groups"] = static_cast<double>(s.popped_groups);
        sink.scalars["popped_rollouts"] = static_cast<double>(s.popped_rollouts);
        sink.scalars["dropped_groups"] = static_cast<double>(s.dropped_groups());
        sink.scalars["dropped_rollouts"] = static_cast<double>(s.dropped_rollouts());
        for (const auto &kv : s.dropped) {
            sink.scalars["dropped." + kv.first + ".groups"] = static_cast<double>(kv.second.groups);
            sink.scalars["dropped." + kv.first + ".rollouts"] =
                static_cast<double>(kv.second.rollouts);
        }
        sink.scalars["ready_groups"] = static_cast<double>(b.ready_groups());
        sink.scalars["ready_rollouts"] = static_cast<double>(b.ready_rollouts());
        sink.scalars["pending_groups"] = static_cast<double>(b.pending_groups());
        sink.scalars["pending_rollouts"] = static_cast<double>(b.pending_rollouts());
        sink.scalars["policy_version"] = static_cast<double>(b.policy_version());
        if (take) {
            json log = json::array();
            for (const auto &d : b.take_drop_log())
                log.push_back({{"group_id", d.group_id},
                               {"reason", core::drop_reason_name(d.reason)},
                               {"rollouts", d.rollouts},
                               {"mean_reward", d.mean_reward},
                               {"policy_version", d.policy_version},
                               {"current_version", d.current_version}});
            sink.texts["drop_log"] = log.dump();
        }
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
