// SGLang's native routes (POST /generate; health, model and server info;
// cache, pause / continue, memory, abort, get_weights_by_name, LoRA adapters) and vLLM's
// equivalents (/pause, /resume, /is_paused, /sleep, /wake_up, /is_sleeping)
// where they are the same operation. Shapes follow protocols.md part D.
#include "api.hpp"
#include "routed_experts_wire.hpp"

#include "rl/core/error.hpp"
#include "rl/core/model.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <limits>

namespace rl::serve {

namespace {

using Clock = std::chrono::steady_clock;

// ---- /generate -----------------------------------------------------------------------------

/// One prompt of a /generate request with its own settings.
struct Item {
    std::vector<int64_t> prompt;
    core::SamplingParams params; ///< n = 1, seed set
    int64_t n = 1;
    bool return_logprob = false;
    int64_t top_logprobs_num = 0;
    int64_t logprob_start_len = -1;
    bool text_in_logprobs = false;
    bool no_stop_trim = false;
    bool routed_experts = false; ///< return_routed_experts (R3)
    bool expert_logits = false;  ///< return_expert_logits (their weights)
    std::string rid;
    std::vector<float> input_logprobs; ///< prompt positions logprob_start_len.. (0: none)
};

// A per-item field: a value, or a list with one value per prompt.
const json *per_item(const json &body, const char *key, size_t item, size_t items) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    if (!it->is_array()) return &*it;
    if (it->size() != items)
        refuse(key, std::string(key) + " has " + std::to_string(it->size()) +
                        " entries for a batch of " + std::to_string(items) + " prompts");
    return &(*it)[item];
}

void read_sampling(Server &server, const json *sp, Item &item) {
    item.params.max_tokens = 128;
    bool ignore_eos = false;
    std::vector<int64_t> extra;
    std::optional<uint64_t> seed;
    if (sp) {
        if (!sp->is_object()) refuse("sampling_params", "sampling_params must be an object");
        Fields f(*sp, "sampling_params.");
        f.only({"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "n",
                "sampling_seed", "seed", "ignore_eos", "no_stop_trim", "min_new_tokens",
                "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p",
                "skip_special_tokens", "spaces_between_special_tokens", "custom_params"});
        const int64_t vocab = vocab_size(server);
        if (auto v = f.integer("max_new_tokens", 0, std::numeric_limits<int64_t>::max()))
            item.params.max_tokens = *v;
        if (auto v = f.number("temperature", 0, 1e4)) item.params.temperature = *v;
        if (auto v = f.number("top_p", 0, 1)) {
            if (*v <= 0) refuse(f.name("top_p"), f.name("top_p") + " must be above 0");
            item.params.top_p = *v;
        }
        if (auto v = f.integer("top_k", -1, vocab)) item.params.top_k = *v < 0 ? 0 : *v;
        if (auto v = f.strings("stop", 16)) item.params.stop = *v;
        if (auto v = f.integers("stop_token_ids", 0, vocab - 1)) extra = *v;
        if (auto v = f.integer("n", 1, 128)) item.n = *v;
        for (const char *key : {"sampling_seed", "seed"})
            if (auto v = f.integer(key, std::numeric_limits<int64_t>::min(),
                                   std::numeric_limits<int64_t>::max()))
                seed = static_cast<uint64_t>(*v);
        ignore_eos = f.boolean("ignore_eos").value_or(false);
        item.no_stop_trim = f.boolean("no_stop_trim").value_or(false);
        f.neutral("min_new_tokens", 0);
        f.neutral("frequency_penalty", 0);
        f.neutral("presence_penalty", 0);
        f.neutral("repetition_penalty", 1);
        f.neutral("min_p", 0);
        // The completion text keeps special tokens other than the stop token
        // (which it never holds): refuse asking for anything else.
        if (f.boolean("skip_special_tokens").value_or(false))
            refuse(f.name("skip_special_tokens"),
                   f.name("skip_special_tokens") +
                       " = true is not supported (the text keeps special tokens; read output_ids)");
        f.boolean("spaces_between_special_tokens");
        if (const json *cp = f.get("custom_params"); cp && !(cp->is_object() && cp->empty()))
            refuse(f.name("custom_params"), f.name("custom_params") + " is not supported");
    }
    item.params.n = 1;
    item.params.seed = seed ? *seed : server.policy().next_sampling_seed();
    item.params.stop_token_ids = stop_ids(server, ignore_eos, extra);
}

// log p(prompt[t] | prompt[<t]) for t = from .. size-1 at temperature
// `temperature` (the trainer's scoring), under the scheduler's lock on the
// weights. Entry t = 0 has no context and is NaN (null on the wire).
std::vector<float> prompt_logprobs(Server &server, const std::vector<int64_t> &prompt, int64_t from,
                                   double temperature, const std::string &adapter) {
    std::vector<float> out;
    // The adapter (NotFound if it was unloaded since the request was read).
    std::shared_ptr<const core::LoraAdapter> lora =
        adapter.empty() ? nullptr : server.policy().adapter(adapter);
    server.scheduler().exclusive([&] {
        c10::InferenceMode guard;
        core::AdapterScope scope(lora, /*training=*/false);
        core::CausalLM &model = server.policy().model();
        core::PackedBatch batch = core::PackedBatch::from_sequences({prompt});
        batch.input_ids = batch.input_ids.to(model.device());
        batch.cu_seqlens = batch.cu_seqlens.to(model.device());
        if (batch.position_ids.defined())
            batch.position_ids = batch.position_ids.to(model.device());
        std::vector<int64_t> next(prompt.begin() + 1, prompt.end());
        next.push_back(-100);
        at::Tensor labels = at::tensor(next, at::kLong).to(model.device());
        core::LogprobOptions o;
        o.temperature = temperature > 0 ? temperature : 1.0;
        const at::Tensor lp =
            model.token_logprobs(batch, labels, o).logprobs.to(at::kCPU).contiguous();
        const float *p = lp.data_ptr<float>();
        for (int64_t t = from; t < static_cast<int64_t>(prompt.size()); ++t)
            out.push_back(t == 0 ? std::numeric_limits<float>::quiet_NaN() : p[t - 1]);
    });
    return out;
}

json logprob_triple(const Server &server, const Item &item, double lp, int64_t id) {
    json t = json::array();
    t.push_back(std::isnan(lp) ? json(nullptr) : json(lp));
    t.push_back(id);
    t.push_back(item.text_in_logprobs ? json(token_text(server, id)) : json(nullptr));
    return t;
}

json finish_reason_of(const Server &server, const SampleSpec &spec, const core::RequestResult &r,
                      double timeout_s) {
    switch (r.end) {
        case core::RequestEnd::Stop:
            return {{"type", "stop"}, {"matched", matched_stop(server, spec, r)}};
        case core::RequestEnd::Length:
            return {{"type", "length"}, {"length", r.tokens.size()}};
        case core::RequestEnd::Timeout:
            return {{"type", "abort"},
                    {"message", "the request timed out after " + json(timeout_s).dump() + " s"}};
        case core::RequestEnd::Cancelled:
            return {{"type", "abort"}, {"message", "the request was aborted"}};
        case core::RequestEnd::Error:
            return {{"type", "abort"}, {"message", r.error}};
    }
    return nullptr;
}

/// One output object of /generate for sample `k` (of `item`), complete or partial.
json generate_output(Server &server, const Item &item, const SampleSpec &spec,
                     const SampleOutput &o, bool finished, const std::string &id,
                     Clock::time_point start) {
    std::string text = o.result.text;
    if (!finished) {
        text.clear();
        for (const auto &e : o.events) text += e.text;
    } else if (item.no_stop_trim) {
        const json m = matched_stop(server, spec, o.result);
        if (m.is_string()) text += m.get<std::string>();
    }
    const std::vector<int64_t> &ids = o.result.tokens;
    json meta = {{"id", id},
                 {"finish_reason", finished ? finish_reason_of(server, spec, o.result,
                                                               server.config().request_timeout_s)
                                            : json(nullptr)},
                 {"prompt_tokens", spec.prompt.size()},
                 {"completion_tokens", ids.size()},
                 {"cached_tokens", 0},
                 {"weight_version", server.weight_version()},
                 {"e2e_latency", std::chrono::duration<double>(Clock::now() - start).count()}};
    if (item.return_logprob) {
        json out = json::array(), top = json::array();
        for (size_t i = 0; i < ids.size(); ++i) {
            out.push_back(logprob_triple(server, item, o.result.logprobs[i], ids[i]));
            if (item.top_logprobs_num > 0) {
                json alts = json::array();
                if (i < o.events.size())
                    for (const auto &[alt, lp] : o.events[i].top)
                        alts.push_back(logprob_triple(server, item, lp, alt));
                top.push_back(std::move(alts));
            }
        }
        meta["output_token_logprobs"] = std::move(out);
        if (item.top_logprobs_num > 0) meta["output_top_logprobs"] = std::move(top);
        if (item.logprob_start_len >= 0) {
            json in = json::array();
            for (size_t i = 0; i < item.input_logprobs.size(); ++i) {
                const size_t pos = static_cast<size_t>(item.logprob_start_len) + i;
                in.push_back(
                    logprob_triple(server, item, item.input_logprobs[i], spec.prompt[pos]));
            }
            meta["input_token_logprobs"] = std::move(in);
        }
    }
    if (item.routed_experts && finished && o.result.routed_layers > 0)
        put_routed_experts(meta, o.result.routed_experts,
                           static_cast<int64_t>(spec.prompt.size() + ids.size()),
                           o.result.routed_layers, o.result.routed_k);
    if (item.expert_logits && finished && o.result.routed_layers > 0)
        put_expert_logits(meta, o.result.routed_expert_weights,
                          static_cast<int64_t>(spec.prompt.size() + ids.size()),
                          o.result.routed_layers, o.result.routed_k);
    return {{"text", text}, {"output_ids", ids}, {"meta_info", std::move(meta)}};
}

void generate(Server &server, const Request &req, Responder &r) {
    const auto start = Clock::now();
    const json body = json_body(req);
    Fields f(body);
    f.only({"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
            "top_logprobs_num", "return_text_in_logprobs", "stream", "rid", "model", "lora_path",
            "return_routed_experts", "return_expert_logits", "return_hidden_states"});
    if (f.has("text") == f.has("input_ids"))
        refuse(f.has("text") ? "input_ids" : "text", "give exactly one of text and input_ids");
    f.string("model"); // one model is served; the name is not checked here
    f.must_be_false("return_hidden_states", "hidden states are not returned");
    const bool stream = f.boolean("stream").value_or(false);

    // Prompts.
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> prompt_names;
    bool batch = false;
    if (const json *t = f.get("text")) {
        if (t->is_string()) {
            prompts.push_back(encode_text(server, t->get<std::string>(), "text"));
            prompt_names.push_back("text");
        } else if (t->is_array() && !t->empty()) {
            batch = true;
            for (size_t i = 0; i < t->size(); ++i) {
                const std::string name = "text[" + std::to_string(i) + "]";
                if (!(*t)[i].is_string()) refuse("text", name + " must be a string");
                prompts.push_back(encode_text(server, (*t)[i].get<std::string>(), name));
                prompt_names.push_back(name);
            }
        } else {
            refuse("text", "text must be a string or a non-empty list of strings");
        }
    } else {
        const json &ids = *f.get("input_ids");
        const bool nested = ids.is_array() && !ids.empty() && ids[0].is_array();
        if (!ids.is_array() || ids.empty())
            refuse("input_ids", "input_ids must be a non-empty list of token ids (or of lists)");
        batch = nested;
        for (size_t i = 0; i < (nested ? ids.size() : 1); ++i) {
            const std::string name = nested ? "input_ids[" + std::to_string(i) + "]" : "input_ids";
            Fields one(json{{name, nested ? ids[i] : ids}});
            prompts.push_back(*one.integers(name.c_str(), std::numeric_limits<int64_t>::min(),
                                            std::numeric_limits<int64_t>::max()));
            prompt_names.push_back(name);
        }
    }
    for (size_t i = 0; i < prompts.size(); ++i)
        check_token_ids(server, prompts[i], prompt_names[i]);

    // Per-prompt settings.
    const size_t count = prompts.size();
    std::vector<Item> items(count);
    const std::string rid0 = server.new_request_id("");
    for (size_t i = 0; i < count; ++i) {
        Item &it = items[i];
        it.prompt = prompts[i];
        read_sampling(server, per_item(body, "sampling_params", i, count), it);
        auto field = [&](const char *key) {
            const json *v = per_item(body, key, i, count);
            return Fields(v ? json{{key, *v}} : json::object());
        };
        it.return_logprob = field("return_logprob").boolean("return_logprob").value_or(false);
        it.top_logprobs_num =
            field("top_logprobs_num").integer("top_logprobs_num", 0, 20).value_or(0);
        it.logprob_start_len =
            field("logprob_start_len")
                .integer("logprob_start_len", -1, std::numeric_limits<int64_t>::max())
                .value_or(-1);
        it.text_in_logprobs =
            field("return_text_in_logprobs").boolean("return_text_in_logprobs").value_or(false);
        it.params.adapter = adapter_named(server, per_item(body, "lora_path", i, count),
                                          body.value("lora_path", json()).is_array()
                                              ? "lora_path[" + std::to_string(i) + "]"
                                              : std::string("lora_path"));
        it.routed_experts =
            field("return_routed_experts").boolean("return_routed_experts").value_or(false);
        if (it.routed_experts) {
            if (!server.policy().model().config().has_moe())
                refuse("return_routed_experts",
                       "return_routed_experts: the model has no sparse mixture-of-experts "
                       "layer to record routings of");
            if (it.params.max_tokens == 0)
                refuse("return_routed_experts",
                       "return_routed_experts needs sampling (max_new_tokens > 0); scoring a "
                       "prompt records no routing");
            it.params.return_routed_experts = true;
        }
        // xorl-sglang's return_expert_logits: the routed experts' weights too.
        it.expert_logits =
            field("return_expert_logits").boolean("return_expert_logits").value_or(false);
        if (it.expert_logits) {
            if (!it.routed_experts)
                refuse("return_expert_logits",
                       "return_expert_logits returns the weights of the routed experts: it "
                       "needs return_routed_experts");
            it.params.return_expert_logits = true;
        }
        if (auto v = field("rid").string("rid"))
            it.rid = *v;
        else
            it.rid = batch ? rid0 + "-" + std::to_string(i) : rid0;
        if (it.logprob_start_len >= static_cast<int64_t>(it.prompt.size()))
            refuse("logprob_start_len",
                   "logprob_start_len = " + std::to_string(it.logprob_start_len) +
                       " is not below the prompt's " + std::to_string(it.prompt.size()) +
                       " tokens");
        if (it.logprob_start_len >= 0 && !it.return_logprob)
            refuse("logprob_start_len", "logprob_start_len needs return_logprob: true");
        if (it.logprob_start_len >= 0 && it.top_logprobs_num > 0)
            refuse("top_logprobs_num", "top alternatives of prompt tokens (input_top_logprobs) "
                                       "are not supported; use top_logprobs_num 0 with "
                                       "logprob_start_len");
        if (it.params.max_tokens == 0 && it.logprob_start_len < 0)
            refuse("sampling_params.max_new_tokens",
                   "max_new_tokens = 0 only scores the prompt: it needs return_logprob: true and "
                   "logprob_start_len >= 0");
        if (it.params.max_tokens == 0 && stream)
            refuse("stream", "scoring a prompt (max_new_tokens = 0) is not streamed");
        check_lengths(server, it.prompt.size(), it.params.max_tokens, prompt_names[i],
                      "sampling_params.max_new_tokens");
    }

    // Prompt scoring first (it holds the weights briefly), then sampling.
    for (auto &it : items)
        if (it.logprob_start_len >= 0)
            it.input_logprobs = prompt_logprobs(server, it.prompt, it.logprob_start_len,
                                                it.params.temperature, it.params.adapter);
    std::vector<SampleSpec> specs;
    std::vector<size_t> item_of; // spec -> item
    std::vector<std::string> ids_of;
    for (size_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < items[i].n; ++j) {
            SampleSpec s;
            s.prompt = items[i].prompt;
            s.params = items[i].params;
            s.sample_index = j;
            s.top_logprobs = items[i].return_logprob ? items[i].top_logprobs_num : 0;
            s.rid = items[i].rid;
            specs.push_back(std::move(s));
            item_of.push_back(i);
            ids_of.push_back(items[i].n > 1 ? items[i].rid + "-" + std::to_string(j)
                                            : items[i].rid);
        }
    const bool single = !batch && specs.size() == 1;

    // Specs with max_new_tokens = 0 are scored only: they never reach the scheduler.
    std::vector<size_t> run; // spec indices that sample
    std::vector<SampleSpec> to_run;
    for (size_t k = 0; k < specs.size(); ++k)
        if (specs[k].params.max_tokens > 0) {
            run.push_back(k);
            to_run.push_back(specs[k]);
        }
    SampleGroup group(server, rid0);
    if (!to_run.empty()) group.submit(std::move(to_run));

    if (stream) {
        if (!r.start_stream()) return;
        std::vector<SampleOutput> partial(run.size());
        auto chunk = [&](size_t g, bool finished, const SampleOutput &o) {
            const size_t k = run[g];
            json j =
                generate_output(server, items[item_of[k]], specs[k], o, finished, ids_of[k], start);
            if (!single) j["index"] = k;
            return r.event(dump(j));
        };
        const bool completed = group.stream(
            r,
            [&](size_t g, const core::TokenEvent &e) {
                SampleOutput &p = partial[g];
                p.add_token(e);
                return chunk(g, false, p);
            },
            [&](size_t g, const SampleOutput &o) { return chunk(g, true, o); });
        if (!completed) return;
        r.event("[DONE]");
        r.end_stream();
        return;
    }
    if (!run.empty() && !group.wait(r)) return;
    json outputs = json::array();
    size_t g = 0;
    for (size_t k = 0; k < specs.size(); ++k) {
        SampleOutput scored; // a prompt that was only scored: no tokens, "length" 0
        const bool sampled = g < run.size() && run[g] == k;
        const SampleOutput &o = sampled ? group.outputs()[g++] : scored;
        if (!sampled) scored.result.end = core::RequestEnd::Length;
        if (o.result.end == core::RequestEnd::Error)
            throw ApiError(500, "sample " + std::to_string(k) + " failed: " + o.result.error);
        outputs.push_back(
            generate_output(server, items[item_of[k]], specs[k], o, true, ids_of[k], start));
    }
    send_json(r, single ? outputs[0] : outputs);
}

// ---- control ----------------------------------------------------------------------------------

json stats_json(Server &server) {
    const core::Scheduler::Stats s = server.scheduler().stats();
    return {{"running", s.running},
            {"queued", s.queued},
            {"slots", s.slots},
            {"version", s.version},
            {"noise_sigma", s.noise_sigma},
            {"tokens_generated", s.tokens_generated},
            {"cache_bytes", s.cache_bytes},
            {"paused", s.paused},
            {"memory_released", s.memory_released}};
}

json model_info(Server &server) {
    const auto &mc = server.policy().model().config();
    return {{"model_path", server.config().model_path},
            {"tokenizer_path", server.config().model_path},
            {"served_model_name", server.model_name()},
            {"is_generation", true},
            {"model_type", mc.model_type},
            {"vocab_size", mc.vocab_size},
            {"context_length", server.scheduler().max_context()},
            {"weight_version", server.weight_version()},
            {"preferred_sampling_params", nullptr},
            {"has_image_understanding", false},
            {"has_audio_understanding", false}};
}

json server_info(Server &server) {
    const ServerConfig &c = server.config();
    const core::CausalLM &m = server.policy().model();
    return {{"model_path", c.model_path},
            {"served_model_name", server.model_name()},
            {"host", c.host},
            {"port", server.port()},
            {"api_key_required", !c.api_key.empty()},
            {"max_running_requests", c.scheduler.max_running},
            {"max_queued_requests", c.scheduler.max_queued},
            {"context_length", server.scheduler().max_context()},
            {"max_tokens_limit", c.max_tokens_limit},
            {"max_body_bytes", c.max_body_bytes},
            {"max_connections", c.max_connections},
            {"request_timeout_s", c.request_timeout_s},
            {"kv_cache_fraction", c.scheduler.kv_cache_fraction},
            // QeRL noise (docs/moe.md): what rl.rollout_engine checks a run's
            // engine.noise_scheduler against.
            {"noise_scheduler",
             {{"enabled", c.scheduler.noise.enabled},
              {"sigma_start", c.scheduler.noise.sigma_start},
              {"sigma_end", c.scheduler.noise.sigma_end},
              {"num_stages", c.scheduler.noise.num_stages},
              {"total_steps", c.scheduler.total_steps},
              {"first_step", c.scheduler.first_step},
              {"seed", c.scheduler.seed.value_or(0)}}},
            {"device", m.device().str()},
            {"dtype", std::string(c10::toString(m.dtype()))},
            {"tp_size", 1},
            {"dp_size", 1},
            {"enable_lora", true}, // adapters load with /load_lora_adapter
            {"version", RL_VERSION_STRING},
            {"rl_version", RL_VERSION_STRING}, // tells our sync client this is rlhost serve
            {"weight_version", server.weight_version()},
            {"scheduler", stats_json(server)}};
}

// pause with SGLang's / vLLM's mode: "abort" cancels what runs; the others keep it.
void pause(Server &server, const std::string &mode, const std::string &param) {
    if (mode != "abort" && mode != "retract" && mode != "in_place" && mode != "keep")
        refuse(param, param + " '" + mode + "' is not one of abort, retract, in_place, keep");
    server.scheduler().pause();
    if (mode == "abort") server.abort_all();
}

// SGLang's `tags`: the KV cache is what this server releases; weights stay.
void check_tags(const json &body) {
    Fields f(body);
    f.only({"tags"});
    if (const json *t = f.get("tags")) {
        if (!t->is_array()) refuse("tags", "tags must be a list of strings");
        for (const auto &tag : *t) {
            if (!tag.is_string()) refuse("tags", "tags must be a list of strings");
            const std::string s = tag.get<std::string>();
            if (s == "weights")
                refuse("tags", "releasing the weights is not supported; the KV cache "
                               "(tag kv_cache) is what this server releases");
            if (s != "kv_cache" && s != "cuda_graph")
                refuse("tags", "unknown tag '" + s + "' (kv_cache)");
        }
    }
}

} // namespace

void add_sglang_routes(Server &server) {
    Router &router = server.router();
    Server *s = &server;
    auto add = [&router](std::initializer_list<const char *> methods, const std::string &path,
                         std::function<void(const Request &, Responder &)> fn) {
        router.add(methods, path, guarded(std::move(fn)));
    };

    add({"POST", "PUT"}, "/generate",
        [s](const Request &req, Responder &r) { generate(*s, req, r); });
    add({"GET"}, "/health", [](const Request &, Responder &r) { r.send(200, "text/plain", ""); });
    add({"GET"}, "/health_generate", [s](const Request &, Responder &r) {
        const core::Scheduler::Stats st = s->scheduler().stats();
        if (st.paused || st.memory_released) {
            send_error(r, 503,
                       st.paused ? "generation is paused (POST /continue_generation)"
                                 : "the KV cache is released (POST /resume_memory_occupation)");
            return;
        }
        SampleSpec spec;
        const auto eos = s->policy().eos_token_ids();
        spec.prompt = {eos.empty() ? 0 : eos[0]};
        spec.params.temperature = 0;
        spec.params.max_tokens = 1;
        spec.params.seed = 0;
        spec.params.stop_token_ids = std::vector<int64_t>{};
        SampleGroup group(*s, s->new_request_id("health"));
        std::vector<SampleSpec> specs{spec};
        group.submit(std::move(specs));
        if (!group.wait(r)) return;
        const auto &res = group.outputs()[0].result;
        if (res.end == core::RequestEnd::Length || res.end == core::RequestEnd::Stop)
            r.send(200, "text/plain", "");
        else
            send_error(r, 503,
                       std::string("a one-token generation ended with '") +
                           core::request_end_name(res.end) + "'" +
                           (res.error.empty() ? "" : ": " + res.error));
    });
    for (const char *path : {"/get_model_info", "/model_info"})
        add({"GET"}, path, [s](const Request &, Responder &r) { send_json(r, model_info(*s)); });
    for (const char *path : {"/get_server_info", "/server_info"})
        add({"GET"}, path, [s](const Request &, Responder &r) { send_json(r, server_info(*s)); });
    add({"POST", "GET"}, "/flush_cache", [s](const Request &, Responder &r) {
        const core::Scheduler::Stats st = s->scheduler().stats();
        if (st.running + st.queued > 0)
            throw ApiError(400, "cannot flush the cache: " + std::to_string(st.running) +
                                    " requests are running and " + std::to_string(st.queued) +
                                    " waiting");
        // No prefix cache outlives a request here; what flushing means is
        // adopting the policy's current weights before the next request.
        s->scheduler().exclusive([] {});
        r.send(200, "text/plain", "Cache flushed.\n");
    });
    add({"POST"}, "/pause_generation", [s](const Request &req, Responder &r) {
        const json body = json_body(req, true);
        Fields f(body);
        f.only({"mode"});
        pause(*s, f.string("mode").value_or("abort"), "mode");
        send_json(r, {{"message", "Generation paused successfully."}, {"status", "ok"}});
    });
    add({"POST"}, "/continue_generation", [s](const Request &req, Responder &r) {
        const json body = json_body(req, true);
        Fields f(body);
        f.only({"torch_empty_cache"});
        f.boolean("torch_empty_cache");
        s->scheduler().resume();
        send_json(r, {{"message", "Generation continued successfully."}, {"status", "ok"}});
    });
    add({"POST", "GET"}, "/release_memory_occupation", [s](const Request &req, Responder &r) {
        check_tags(json_body(req, true));
        s->scheduler().release_memory();
        send_json(r, nullptr);
    });
    add({"POST", "GET"}, "/resume_memory_occupation", [s](const Request &req, Responder &r) {
        check_tags(json_body(req, true));
        s->scheduler().resume_memory();
        send_json(r, nullptr);
    });
    add({"POST"}, "/abort_request", [s](const Request &req, Responder &r) {
        const json body = json_body(req);
        Fields f(body);
        f.only({"rid", "abort_all", "finished_reason", "abort_message"});
        const bool all = f.boolean("abort_all").value_or(false);
        const auto rid = f.string("rid");
        f.string("finished_reason");
        f.string("abort_message");
        if (!all && !rid) refuse("rid", "give rid or abort_all: true");
        const int hit = all ? s->abort_all() : s->abort(*rid);
        send_json(r, {{"success", true}, {"aborted", hit}});
    });
    // LoRA adapters (SGLang's shapes: {success, error_message, loaded_adapters};
    // a load or unload that fails is a 400 of that shape, as SGLang answers).
    auto loaded = [s] {
        json m = json::object();
        for (const auto &[name, path] : s->adapters()) m[name] = path;
        return m;
    };
    add({"POST"}, "/load_lora_adapter", [s, loaded](const Request &req, Responder &r) {
        const json body = json_body(req);
        Fields f(body);
        f.only({"lora_name", "lora_path", "pinned"});
        const auto name = f.string("lora_name");
        if (!name || name->empty())
            refuse("lora_name", "lora_name (the name requests select the adapter by) is required");
        const auto path = f.string("lora_path");
        if (!path || path->empty())
            refuse("lora_path", "lora_path (the adapter's PEFT folder) is required");
        f.boolean("pinned"); // adapters stay loaded until unloaded: all are pinned
        std::string error;
        try {
            s->load_adapter(*name, *path);
        } catch (const core::Error &e) {
            error = std::string("cannot load the LoRA adapter '") + *name + "' from lora_path '" +
                    *path + "': " + e.what();
        }
        send_json(r,
                  {{"success", error.empty()},
                   {"error_message", error.empty() ? json(nullptr) : json(error)},
                   {"loaded_adapters", loaded()}},
                  error.empty() ? 200 : 400);
    });
    add({"POST"}, "/unload_lora_adapter", [s, loaded](const Request &req, Responder &r) {
        const json body = json_body(req);
        Fields f(body);
        f.only({"lora_name"});
        const auto name = f.string("lora_name");
        if (!name || name->empty()) refuse("lora_name", "lora_name is required");
        std::string error;
        try {
            s->unload_adapter(*name);
        } catch (const core::Error &e) {
            error = std::string("lora_name: ") + e.what();
        }
        send_json(r,
                  {{"success", error.empty()},
                   {"error_message", error.empty() ? json(nullptr) : json(error)},
                   {"loaded_adapters", loaded()}},
                  error.empty() ? 200 : 400);
    });
    add({"GET", "POST"}, "/get_weights_by_name", [s](const Request &req, Responder &r) {
        json body = json_body(req, true);
        if (auto q = req.query_param("name")) body["name"] = *q;
        if (auto q = req.query_param("truncate_size")) {
            try {
                body["truncate_size"] = std::stoll(*q);
            } catch (const std::exception &) {
                refuse("truncate_size", "truncate_size must be an integer");
            }
        }
        Fields f(body);
        f.only({"name", "truncate_size"});
        const auto name = f.string("name");
        if (!name) refuse("name", "name (a parameter's Hugging Face name) is required");
        const int64_t truncate =
            f.integer("truncate_size", 1, std::numeric_limits<int64_t>::max()).value_or(100);
        json values;
        s->scheduler().exclusive([&] {
            for (const auto &[n, t] : s->policy().model().named_weights()) {
                if (n != *name) continue;
                c10::InferenceMode guard;
                at::Tensor v = t.detach();
                if (v.dim() > 0) v = v.narrow(0, 0, std::min<int64_t>(truncate, v.size(0)));
                v = v.to(at::kCPU, at::kDouble).contiguous();
                // Nested lists in the parameter's shape, as tolist() writes them.
                const double *p = v.data_ptr<double>();
                std::function<json(int64_t, int64_t &)> build = [&](int64_t d, int64_t &at) {
                    if (d == v.dim()) return json(p[at++]);
                    json a = json::array();
                    for (int64_t i = 0; i < v.size(d); ++i) a.push_back(build(d + 1, at));
                    return a;
                };
                int64_t at = 0;
                values = build(0, at);
                return;
            }
        });
        if (values.is_null()) throw ApiError(404, "no parameter named '" + *name + "'", "name");
        send_json(r, values);
    });

    // vLLM's names for the same operations.
    add({"POST"}, "/pause", [s](const Request &req, Responder &r) {
        const std::string mode = req.query_param("mode").value_or("abort");
        if (mode == "wait") refuse("mode", "mode 'wait' is not supported (abort or keep)");
        pause(*s, mode, "mode");
        send_json(r, {{"status", "paused"}});
    });
    add({"POST"}, "/resume", [s](const Request &, Responder &r) {
        s->scheduler().resume();
        send_json(r, {{"status", "resumed"}});
    });
    add({"GET"}, "/is_paused", [s](const Request &, Responder &r) {
        send_json(r, {{"is_paused", s->scheduler().paused()}});
    });
    add({"POST"}, "/sleep", [s](const Request &req, Responder &r) {
        const std::string level = req.query_param("level").value_or("1");
        if (level != "1")
            refuse("level", "sleep level " + level + " is not supported (1: release the KV cache)");
        s->scheduler().release_memory();
        r.send(200, "text/plain", "");
    });
    add({"POST"}, "/wake_up", [s](const Request &req, Responder &r) {
        for (const auto &tag : req.query_params("tags"))
            if (tag != "kv_cache" && tag != "weights")
                refuse("tags", "unknown tag '" + tag + "' (kv_cache, weights)");
        s->scheduler().resume_memory();
        r.send(200, "text/plain", "");
    });
    add({"GET"}, "/is_sleeping", [s](const Request &, Responder &r) {
        send_json(r, {{"is_sleeping", s->scheduler().stats().memory_released}});
    });
}

} // namespace rl::serve
