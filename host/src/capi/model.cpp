// abi/rl/train.h: models, the tokenizer and the platform query.
#include "train_common.hpp"

#include "rl/core/chat_template.hpp"
#include "rl/core/checkpoint.hpp"
#include "rl/core/device.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/tiny.hpp"

#include <unistd.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace {

// The conversation rendered by `name`: "model" (the model's own Jinja
// template, which gets the messages as they are: tool_calls,
// reasoning_content, list contents, ...) or a built-in format (string
// contents only).
std::string render_chat(rl_model &model, const char *messages_json, const std::string &name,
                        const core::ChatTemplateOptions &o, const char *fn) {
    const json j = parse_json(messages_json, fn_msg(fn, "messages"));
    require(j.is_array(), fn_msg(fn, "messages must be a JSON array of {role, content}"));
    const bool own = name == "model";
    std::vector<core::ChatMessage> msgs;
    for (size_t i = 0; i < j.size(); ++i) {
        const json &m = j[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        require(m.is_object() && m.contains("role") && m["role"].is_string() &&
                    m.contains("content") &&
                    (m["content"].is_string() ||
                     (own && (m["content"].is_null() || m["content"].is_array()))),
                fn_msg(fn, at + (own ? " must be an object with a string 'role' and a "
                                       "'content' (string, array or null)"
                                     : " must be an object with string 'role' and 'content'")));
        if (!own) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    if (own) return tokenizer_of(&model, fn).apply_chat_template_json(j.dump(), o);
    return core::apply_chat_template(core::parse_chat_format(name), msgs, o);
}

} // namespace

extern "C" {

// ---- models ---------------------------------------------------------------------

RL_API rl_status_t rl_model_init_preset(const char *preset, const char *dir, uint64_t seed) {
    return train_boundary([&] {
        require(preset && dir && *dir, "rl_model_init_preset: preset and dir are required");
        const std::string name = preset;
        require(name == "tiny" || name == "tiny-moe" || name == "tiny-reward",
                "rl_model_init_preset: unknown preset '" + name +
                    "'; valid: tiny, tiny-moe, tiny-reward");
        core::write_tiny_model(dir, seed, core::tiny_preset_spec(name));
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
                } else if (key == "value_head") {
                    require(kv.value().is_boolean(),
                            "rl_model_load: value_head must be true or false, got " +
                                kv.value().dump());
                } else if (key == "value_head_seed") {
                    require(kv.value().is_number_unsigned(),
                            "rl_model_load: value_head_seed must be an integer >= 0, got " +
                                kv.value().dump());
                } else if (key == "device" || key == "dtype") {
                    require(kv.value().is_string(), "rl_model_load: " + key +
                                                        " must be a string, got " +
                                                        kv.value().dump());
                } else {
                    throw HostError{RL_ERR_INVALID_ARG, "rl_model_load: unknown option '" + key +
                                                            "'; valid: threads, device, dtype, "
                                                            "value_head, value_head_seed"};
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
        if (opts.is_object()) {
            lo.value_head = opts.value("value_head", false);
            lo.value_head_seed = opts.value("value_head_seed", uint64_t{0});
        }
        auto m = std::make_unique<rl_model>();
        m->policy = core::Policy::load(path, lo);
        *out_model = m.release();
        return RL_OK;
    });
}

RL_API rl_status_t rl_tokenizer_load(const char *dir, rl_model_t **out_tokenizer) {
    return train_boundary([&] {
        require(dir && *dir && out_tokenizer,
                "rl_tokenizer_load: dir and out_tokenizer are required");
        const fs::path file = fs::path(dir) / "tokenizer.json";
        std::error_code ec;
        require(fs::exists(file, ec),
                "rl_tokenizer_load: '" + std::string(dir) + "' has no tokenizer.json");
        auto m = std::make_unique<rl_model>();
        m->tokenizer = core::Tokenizer::from_folder(dir);
        *out_tokenizer = m.release();
        return RL_OK;
    });
}

RL_API void rl_model_destroy(rl_model_t *model) {
    delete model;
}

RL_API rl_status_t rl_model_info(rl_model_t *model, rl_result_t **out_result) {
    return train_boundary([&] {
        require(model && out_result, "rl_model_info: model and out_result are required");
        if (!model->policy) { // a tokenizer alone (rl_tokenizer_load)
            const core::Tokenizer &tok = *model->tokenizer;
            std::vector<int64_t> eos;
            if (tok.eos_token_id()) eos.push_back(*tok.eos_token_id());
            CallSink sink;
            sink.texts["info"] = json{
                {"has_model", false},
                {"has_tokenizer", true},
                {"vocab_size", tok.vocab_size()},
                {"eos_token_ids",
                 eos}}.dump();
            *out_result = new_result(std::move(sink));
            return RL_OK;
        }
        const core::CausalLM &m = model->policy->model();
        const core::ModelConfig &c = m.config();
        json j = {{"architecture", c.class_name()},
                  {"task", c.is_classifier() ? "sequence_classification" : "causal_lm"},
                  {"num_labels", c.num_labels},
                  {"vocab_size", c.vocab_size},
                  {"num_parameters", m.num_parameters()},
                  {"hidden_size", c.hidden_size},
                  {"num_layers", c.num_hidden_layers},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"eos_token_ids", model->policy->eos_token_ids()},
                  {"has_tokenizer", model->policy->tokenizer() != nullptr},
                  {"has_model", true},
                  {"value_head", model->policy->value_head() != nullptr},
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
            const core::Policy &policy = policy_of(model, "rl_model_save");
            core::save_pretrained(policy.model(), tmp.string());
            if (policy.value_head())
                policy.value_head()->save((tmp / core::kValueHeadFile).string());
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
        require((flags & ~static_cast<uint32_t>(RL_ENCODE_ADD_SPECIAL | RL_ENCODE_PLAIN_TEXT)) == 0,
                "rl_tokenizer_encode: unknown flags " + std::to_string(flags));
        const core::Tokenizer &tok = tokenizer_of(model, "rl_tokenizer_encode");
        core::EncodeOptions o;
        o.add_special_tokens = (flags & RL_ENCODE_ADD_SPECIAL) != 0;
        o.parse_special = (flags & RL_ENCODE_PLAIN_TEXT) == 0;
        const auto ids = tok.encode(std::string_view(text.data ? text.data : "", text.length), o);
        CallSink sink;
        sink.tensors["ids"] = owned_from_vector(std::vector<int64_t>(ids.begin(), ids.end()),
                                                rl_dtype_t{RL_DTYPE_INT, 64, 1});
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"

namespace {

rl_status_t decode_ids(rl_model_t *model, const int64_t *ids, uint64_t n, uint32_t flags,
                       rl_result_t **out_result, const char *fn) {
    return train_boundary([&] {
        require(model && out_result, fn_msg(fn, "model and out_result are required"));
        require(n == 0 || ids != nullptr, fn_msg(fn, "ids is NULL but n is " + std::to_string(n)));
        require((flags & ~static_cast<uint32_t>(RL_DECODE_SKIP_SPECIAL)) == 0,
                fn_msg(fn, "unknown flags " + std::to_string(flags)));
        const core::Tokenizer &tok = tokenizer_of(model, fn);
        std::vector<int32_t> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) {
            require(ids[i] >= 0 && ids[i] < tok.vocab_size(),
                    fn_msg(fn, "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                   " is outside the vocabulary [0, " +
                                   std::to_string(tok.vocab_size()) + ")"));
            v.push_back(static_cast<int32_t>(ids[i]));
        }
        CallSink sink;
        sink.texts["text"] = tok.decode(v, (flags & RL_DECODE_SKIP_SPECIAL) != 0);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

// messages_json as chat messages; errors name fn.
std::vector<core::ChatMessage> chat_messages(const char *messages_json, const char *fn) {
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
    return msgs;
}

// The conversation rendered by `template_name` (NULL or "model": the model's
// own template; else a built-in format).
std::function<std::string(const std::vector<core::ChatMessage> &)>
chat_renderer(const rl_model_t *model, const char *template_name, bool add_generation_prompt,
              const char *fn) {
    core::ChatTemplateOptions o;
    o.add_generation_prompt = add_generation_prompt;
    if (template_name && std::string(template_name) != "model") {
        const core::ChatFormat f = core::parse_chat_format(template_name);
        return [f, o](const std::vector<core::ChatMessage> &m) {
            return core::apply_chat_template(f, m, o);
        };
    }
    const core::Tokenizer *tok = &tokenizer_of(model, fn);
    return [tok, o](const std::vector<core::ChatMessage> &m) {
        return tok->apply_chat_template(m, o);
    };
}

} // namespace

extern "C" {

RL_API rl_status_t rl_tokenizer_decode(rl_model_t *model, const int64_t *ids, uint64_t n,
                                       rl_result_t **out_result) {
    return decode_ids(model, ids, n, 0, out_result, "rl_tokenizer_decode");
}

RL_API rl_status_t rl_tokenizer_decode_v2(rl_model_t *model, const int64_t *ids, uint64_t n,
                                          uint32_t flags, rl_result_t **out_result) {
    return decode_ids(model, ids, n, flags, out_result, "rl_tokenizer_decode_v2");
}

RL_API rl_status_t rl_tokenizer_encode_chat(rl_model_t *model, const char *messages_json,
                                            const char *template_name,
                                            uint32_t add_generation_prompt, uint32_t flags,
                                            rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_tokenizer_encode_chat";
        require(model && messages_json && out_result,
                fn_msg(fn, "model, messages_json and out_result are required"));
        require((flags & ~static_cast<uint32_t>(RL_ENCODE_PLAIN_TEXT)) == 0,
                fn_msg(fn, "unknown flags " + std::to_string(flags) +
                               " (valid: RL_ENCODE_PLAIN_TEXT)"));
        const std::vector<core::ChatMessage> msgs = chat_messages(messages_json, fn);
        const core::Tokenizer &tok = tokenizer_of(model, fn);
        const auto render = chat_renderer(model, template_name, add_generation_prompt != 0, fn);
        std::string prompt;
        std::vector<int32_t> ids;
        if (flags & RL_ENCODE_PLAIN_TEXT) {
            ids = encode_chat_plain(tok, msgs, render, &prompt, fn);
        } else {
            prompt = render(msgs);
            ids = tok.encode(prompt);
        }
        CallSink sink;
        sink.tensors["ids"] = owned_from_vector(std::vector<int64_t>(ids.begin(), ids.end()),
                                                rl_dtype_t{RL_DTYPE_INT, 64, 1});
        sink.texts["prompt"] = prompt;
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
        core::ChatTemplateOptions o;
        o.add_generation_prompt = add_generation_prompt != 0;
        CallSink sink;
        sink.texts["prompt"] =
            render_chat(*model, messages_json, template_name ? template_name : "model", o, fn);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_tokenizer_render_chat(rl_model_t *model, const char *messages_json,
                                            const char *options_json, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_tokenizer_render_chat";
        require(model && messages_json && out_result,
                fn_msg(fn, "model, messages_json and out_result are required"));
        const json opts = options_arg(options_json, fn);
        std::string name = "model";
        core::ChatTemplateOptions o;
        for (const auto &kv : opts.items()) {
            const json &v = kv.value();
            if (kv.key() == "template" && (v.is_string() || v.is_null())) {
                if (v.is_string()) name = v.get<std::string>();
            } else if (kv.key() == "add_generation_prompt" && v.is_boolean()) {
                o.add_generation_prompt = v.get<bool>();
            } else if (kv.key() == "tools" && (v.is_array() || v.is_null())) {
                // Keys in the order given, as transformers renders them.
                if (v.is_array())
                    o.tools_json = nlohmann::ordered_json::parse(options_json)["tools"].dump(
                        -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
            } else if (kv.key() == "chat_template_kwargs" && (v.is_object() || v.is_null())) {
                if (v.is_object()) o.variables_json = v.dump();
            } else {
                bad_option(fn, kv.key(),
                           "template (a string), add_generation_prompt (a boolean), tools (an "
                           "array), chat_template_kwargs (an object)");
            }
        }
        require(name == "model" || (o.tools_json.empty() && o.variables_json.empty()),
                fn_msg(fn, "tools and chat_template_kwargs need the model's own template "
                           "(template \"model\"); the built-in '" +
                               name + "' format has neither"));
        CallSink sink;
        sink.texts["prompt"] = render_chat(*model, messages_json, name, o, fn);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
