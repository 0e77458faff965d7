// The training server's sampling routes: sampling sessions and asample.
#include "training_server_impl.hpp"

namespace rl::serve {

// ---- sampling
// ------------------------------------------------------------------------------------

void TrainingServer::Impl::create_sampling_session(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    const auto model_path = f.string("model_path");
    const auto base_model = f.string("base_model");
    std::string session_id;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto s = f.string("session_id"))
            session_id = session_locked(*s, "session_id")->id;
        else
            session_id = xorl_session_locked()->id;
    }
    std::shared_ptr<core::Policy> policy;
    std::string path;
    if (model_path) {
        const CheckpointRef ref = parse_checkpoint_path(
            *model_path, f.string("model_id").value_or(""), "sampler_weights", "model_path");
        fs::path dir = checkpoint_path(ref);
        if (ref.kind == "weights") { // a training checkpoint: its newest step's model or adapter
            fs::path best;
            int64_t best_step = -1;
            std::error_code ec;
            for (const auto &e : fs::directory_iterator(dir, ec)) {
                const std::string n = e.path().filename().string();
                for (const char *sub : {"model", "adapter"}) {
                    if (n.rfind("step_", 0) != 0 || !fs::is_directory(e.path() / sub)) continue;
                    const int64_t st = std::atoll(n.c_str() + 5);
                    if (st > best_step) {
                        best_step = st;
                        best = e.path() / sub;
                    }
                }
            }
            dir = best;
        }
        path = *model_path;
        if (!dir.empty() && fs::exists(dir / "adapter_config.json")) {
            // xorl's flow: the adapter is loaded on every registered inference
            // endpoint under the checkpoint's name, which xorl-client's
            // SamplingClient sends as /generate's lora_path.
            std::string lora_name;
            if (!endpoints->empty()) {
                lora_name = ref.name;
                const std::string failed =
                    endpoints->load_adapter(lora_name, fs::absolute(dir).string());
                if (!failed.empty())
                    throw ApiError(
                        500,
                        "model_path '" + *model_path + "': the LoRA adapter '" + lora_name +
                            "' could not be loaded on the inference endpoints: " + failed,
                        "model_path");
            }
            // A LoRA checkpoint: its adapter over the shared base.
            auto s = make_sampler(session_id, base, path, [this, dir](const std::string &id) {
                auto a = core::load_adapter(base->model(), dir.string(), id);
                base->add_adapter(a);
                return a;
            });
            if (lora_name.empty()) lora_name = s->id;
            send_json(r, {{"type", "create_sampling_session"},
                          {"sampling_session_id", s->id},
                          {"success", true},
                          {"model_path", path},
                          {"lora_name", lora_name},
                          {"message", "LoRA adapter '" + lora_name + "' loaded"}});
            return;
        }
        if (dir.empty() || !fs::exists(dir / "config.json"))
            throw ApiError(404, "model_path '" + *model_path + "': no such sampler checkpoint",
                           "model_path");
        core::LoadOptions lo;
        lo.dtype = base->model().dtype();
        lo.device = base->model().device();
        policy = core::Policy::load(dir.string(), lo);
    } else {
        if (base_model && !is_base_model(*base_model))
            throw ApiError(400,
                           "base_model '" + *base_model +
                               "' is not served here; this server has '" + base_name + "'",
                           "base_model");
        policy = base; // read-only: sessions train copies or adapters
    }
    auto s = make_sampler(session_id, policy, path);
    send_json(r, {{"type", "create_sampling_session"},
                  {"sampling_session_id", s->id},
                  {"success", true},
                  {"model_path", path.empty() ? json(nullptr) : json(path)},
                  {"lora_name", nullptr}});
}

tinker::SampleOutput
TrainingServer::Impl::run_sample(Sampler &s, const std::vector<int64_t> &prompt,
                                 int64_t num_samples, const core::SamplingParams &params,
                                 bool prompt_logprobs, std::optional<int64_t> last_n) {
    tinker::SampleOutput out;
    if (params.max_tokens > 0) {
        core::SamplingParams p = params;
        p.n = num_samples;
        if (s.adapter) p.adapter = s.adapter->name();
        s.engine->sync_weights();
        const core::Generation g = s.engine->generate({prompt}, p);
        for (int64_t i = 0; i < g.samples(); ++i) {
            tinker::SampledSequence seq;
            const int64_t a = g.cu_seqlens[i], b = g.cu_seqlens[i + 1];
            seq.tokens.assign(g.token_ids.begin() + a, g.token_ids.begin() + b);
            seq.logprobs.assign(g.logprobs.begin() + a, g.logprobs.begin() + b);
            seq.stopped_by_length = g.finish_reasons[i] == core::FinishReason::Length;
            out.sequences.push_back(std::move(seq));
        }
    } else {
        for (int64_t i = 0; i < num_samples; ++i) out.sequences.push_back({{}, {}, true});
    }
    if (prompt_logprobs) {
        std::vector<double> lp(prompt.size(), std::numeric_limits<double>::quiet_NaN());
        if (prompt.size() > 1) {
            c10::InferenceMode guard;
            core::AdapterScope scope(s.adapter); // null: the base model
            core::PackedBatch batch = core::PackedBatch::from_sequences({prompt});
            std::vector<int64_t> next(prompt.begin() + 1, prompt.end());
            next.push_back(-100);
            core::LogprobOptions lo;
            const at::Tensor t = s.policy->model()
                                     .token_logprobs(batch, at::tensor(next, at::kLong), lo)
                                     .logprobs.to(at::kCPU)
                                     .to(at::kDouble)
                                     .contiguous();
            for (size_t i = 1; i < prompt.size(); ++i) lp[i] = t.data_ptr<double>()[i - 1];
        }
        if (last_n)
            for (size_t i = 0; i + static_cast<size_t>(*last_n) < prompt.size(); ++i)
                lp[i] = std::numeric_limits<double>::quiet_NaN();
        out.prompt_logprobs = std::move(lp);
    }
    return out;
}

void TrainingServer::Impl::asample(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    std::shared_ptr<Sampler> s;
    {
        auto sid = f.string("sampling_session_id");
        if (!sid)
            throw ApiError(400,
                           "sampling_session_id is required (create one with "
                           "/api/v1/create_sampling_session)",
                           "sampling_session_id");
        std::lock_guard<std::mutex> lock(mu);
        s = sampler_locked(*sid, "sampling_session_id");
    }
    const json *prompt_j = f.get("prompt");
    if (!prompt_j) throw ApiError(400, "prompt is required", "prompt");
    const std::vector<int64_t> prompt = tinker::model_input_from_json(*prompt_j, "prompt");
    if (prompt.empty()) throw ApiError(400, "prompt has no tokens", "prompt");
    check_tokens(prompt, "prompt");
    const int64_t num_samples = f.integer("num_samples", 1, 1024).value_or(1);
    const bool want_prompt_lp = f.boolean("prompt_logprobs").value_or(false);
    // Score only the last N prompt tokens (the earlier entries are null).
    const auto last_n = f.integer("prompt_logprobs_last_n", 1,
                                  std::max<int64_t>(1, static_cast<int64_t>(prompt.size()) - 1));
    // Top-k logprobs are not produced: only 0 is accepted (the range refuses others).
    for (const char *k : {"topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"})
        (void)f.integer(k, 0, 0);
    if (f.get("target_prompt_logprobs"))
        throw ApiError(400, "target_prompt_logprobs is not supported", "target_prompt_logprobs");
    core::SamplingParams p;
    p.max_tokens = 16;
    const int64_t context = base->model().config().max_position_embeddings;
    if (const json *sp = f.get("sampling_params")) {
        Fields q(*sp, "sampling_params.");
        if (auto v = q.integer("max_tokens", 0, cfg.max_sample_tokens)) p.max_tokens = *v;
        if (auto v = q.number("temperature", 0, 100)) p.temperature = *v;
        if (auto v = q.number("top_p", 0, 1)) {
            if (*v <= 0)
                throw ApiError(400, "sampling_params.top_p must be above 0",
                               "sampling_params.top_p");
            p.top_p = *v;
        }
        if (auto v = q.integer("top_k", -1, 1 << 30)) p.top_k = *v < 0 ? 0 : *v;
        if (const json *seed = q.get("seed")) {
            if (!seed->is_number_integer())
                throw ApiError(400, "sampling_params.seed must be an integer",
                               "sampling_params.seed");
            p.seed = static_cast<uint64_t>(seed->get<int64_t>());
        }
        if (const json *stop = q.get("stop")) {
            if (stop->is_string()) {
                p.stop = {stop->get<std::string>()};
            } else if (stop->is_array() && !stop->empty() && (*stop)[0].is_number_integer()) {
                auto ids = q.integers("stop", 0, vocab() - 1);
                std::vector<int64_t> stops = base->eos_token_ids();
                stops.insert(stops.end(), ids->begin(), ids->end());
                p.stop_token_ids = stops;
            } else if (stop->is_array()) {
                p.stop = *q.strings("stop", 64);
            } else {
                throw ApiError(400, "sampling_params.stop must be a string, strings or token ids",
                               "sampling_params.stop");
            }
        }
    }
    if (static_cast<int64_t>(prompt.size()) + p.max_tokens > context)
        throw ApiError(400,
                       "prompt (" + std::to_string(prompt.size()) +
                           " tokens) + sampling_params.max_tokens (" +
                           std::to_string(p.max_tokens) + ") exceeds the model's context of " +
                           std::to_string(context),
                       "sampling_params.max_tokens");
    try {
        p.validate();
    } catch (const core::Error &e) {
        throw ApiError(400, std::string("sampling_params: ") + e.what(), "sampling_params");
    }
    const std::string id = submit("sampler:" + s->id, "Sample", "", s->session_id, std::nullopt,
                                  [this, s, prompt, num_samples, p, want_prompt_lp, last_n]() {
                                      const tinker::SampleOutput out = run_sample(
                                          *s, prompt, num_samples, p, want_prompt_lp, last_n);
                                      return OpResult{tinker::to_json(out), tinker::to_proto(out)};
                                  });
    // One id per sample, fixed at submission (newer SDKs stamp them on the sequences).
    json seq_ids = json::array();
    for (int64_t i = 0; i < num_samples; ++i) seq_ids.push_back(id + "-" + std::to_string(i));
    send_json(r, {{"request_id", id}, {"model_id", nullptr}, {"sample_sequence_ids", seq_ids}});
}

} // namespace rl::serve
