#include "rl/core/scheduler.hpp"

#include "decode_step.hpp"
#include "routing.hpp"

#include "rl/core/device.hpp"
#include "rl/core/error.hpp"
#include "rl/core/kv_cache.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/names.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

namespace rl::core {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

int64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * static_cast<int64_t>(page) : 0;
}

std::string mib(int64_t b) {
    return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB";
}

constexpr Named<RequestEnd> kRequestEnds[] = {{RequestEnd::Stop, "stop"},
                                              {RequestEnd::Length, "length"},
                                              {RequestEnd::Cancelled, "cancelled"},
                                              {RequestEnd::Timeout, "timeout"},
                                              {RequestEnd::Error, "error"}};

} // namespace

const char *request_end_name(RequestEnd e) {
    return name_in(kRequestEnds, e, "error");
}

struct Scheduler::Impl {
    // A request between submit() and its end.
    struct Request {
        uint64_t id = 0;
        ServeRequest req;
        std::vector<int64_t> stop_ids;
        // Its tokens, logprobs, text and (return_routed_experts) the routing
        // of every token read so far: the decoding state every generator of
        // core/engine keeps (decode_step.hpp).
        detail::Sequence seq;
        bool stale = true; // the cache slot does not hold prompt + tokens[..-1]
        int64_t first_version = -1, last_version = -1;
        int64_t routed_layers = 0, routed_k = 0;
        // The LoRA adapter it samples with (params.adapter), held so that an
        // adapter unloaded meanwhile still serves the requests that named it.
        std::shared_ptr<const LoraAdapter> adapter;
    };
    using Finished = std::pair<std::unique_ptr<Request>, RequestResult>;

    std::shared_ptr<Policy> policy;
    SchedulerConfig config;
    int64_t max_context = 0;
    int64_t slots = 0;

    mutable std::mutex mu; // everything below but the cache and the running requests' state
    std::condition_variable cv;
    std::deque<std::unique_ptr<Request>> queue;
    std::vector<std::unique_ptr<Request>> running; // by slot; null: free
    std::unordered_set<uint64_t> cancels;
    uint64_t next_id = 1;
    bool stop = false, paused = false, memory_released = false;
    int exclusive_waiting = 0;
    int64_t version = 0;
    int64_t tokens_generated = 0;
    std::atomic<int64_t> cache_bytes{0};
    // QeRL noise (config.noise) of `version`: the norm weights every forward
    // uses (empty: the clean ones) and their sigma. Rebuilt under step_mu.
    NormWeights noisy_norms;
    double noise_sigma = 0;

    std::mutex step_mu; // held while a step runs; exclusive() and memory calls take it
    KVCache cache;
    std::thread thread;

    Impl(std::shared_ptr<Policy> p, SchedulerConfig c) : policy(std::move(p)), config(c) {
        require(policy != nullptr, ErrorKind::InvalidArgument, "scheduler: policy is null");
        require(config.max_running >= 1, ErrorKind::InvalidArgument,
                "scheduler: max_running must be >= 1, got " + std::to_string(config.max_running));
        require(config.max_queued >= 0, ErrorKind::InvalidArgument,
                "scheduler: max_queued must be >= 0, got " + std::to_string(config.max_queued));
        require(config.kv_cache_fraction > 0 && config.kv_cache_fraction <= 1,
                ErrorKind::InvalidArgument,
                "scheduler: kv_cache_fraction must be in (0, 1], got " +
                    std::to_string(config.kv_cache_fraction));
        const CausalLM &model = policy->model();
        const ModelConfig &mc = model.config();
        const int64_t model_max = mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 0;
        if (config.max_context > 0) {
            require(model_max == 0 || config.max_context <= model_max, ErrorKind::InvalidArgument,
                    "scheduler: max_context " + std::to_string(config.max_context) +
                        " exceeds the model's max_position_embeddings " +
                        std::to_string(model_max));
            max_context = config.max_context;
        } else {
            max_context = model_max > 0 ? std::min<int64_t>(model_max, 4096) : 4096;
        }
        // Slots: max_running, fewer when the KV budget cannot hold that many
        // sequences of max_context tokens.
        const int64_t per_slot = KVCache::bytes_for(mc, 1, max_context, model.dtype());
        const at::Device device = model.device();
        const double total = device.is_cuda()
                                 ? static_cast<double>(device_memory(device).total_bytes)
                                 : static_cast<double>(physical_memory_bytes());
        slots = config.max_running;
        if (total > 0) {
            const auto budget = static_cast<int64_t>(config.kv_cache_fraction * total);
            require(per_slot <= budget, ErrorKind::InvalidArgument,
                    "scheduler: one sequence of max_context = " + std::to_string(max_context) +
                        " tokens needs " + mib(per_slot) + " of KV cache, more than the budget " +
                        mib(budget) + " (kv_cache_fraction " +
                        std::to_string(config.kv_cache_fraction) +
                        " of the device's memory); lower max_context or raise kv_cache_fraction");
            slots = std::min(slots, budget / per_slot);
        }
        running.resize(static_cast<size_t>(slots));
        cache = model.make_cache(slots, std::min<int64_t>(max_context, 256));
        cache_bytes = cache.bytes();
        if (config.noise.enabled) {
            require(config.noise.sigma_start > 0, ErrorKind::InvalidArgument,
                    "scheduler: noise_scheduler.sigma_start must be > 0, got " +
                        std::to_string(config.noise.sigma_start));
            require(config.noise.sigma_end > 0, ErrorKind::InvalidArgument,
                    "scheduler: noise_scheduler.sigma_end must be > 0, got " +
                        std::to_string(config.noise.sigma_end));
            require(config.noise.num_stages >= 2, ErrorKind::InvalidArgument,
                    "scheduler: noise_scheduler.num_stages must be >= 2 (the first stage is "
                    "noise-free), got " +
                        std::to_string(config.noise.num_stages));
            require(config.total_steps > 0, ErrorKind::InvalidArgument,
                    "scheduler: noise_scheduler.enabled needs total_steps > 0 (the run's length)");
        }
        version = policy->version();
        refresh_noise();
        thread = std::thread([this] { loop(); });
    }

    // The QeRL noise of the version just adopted, from the model's current
    // (clean) weights: the engine's (qerl_noisy_norms), so a served version
    // samples with the noise a co-located engine draws for it.
    void refresh_noise() {
        noise_sigma = config.noise.sigma(std::max<int64_t>(0, version - config.first_step),
                                         config.total_steps);
        noisy_norms =
            qerl_noisy_norms(policy->model(), noise_sigma, config.seed.value_or(0), version);
    }

    ~Impl() {
        {
            std::lock_guard<std::mutex> lk(mu);
            stop = true;
        }
        cv.notify_all();
        if (thread.joinable()) thread.join();
    }

    static RequestResult result_of(Request &r, RequestEnd end, std::string text,
                                   std::string error = {}) {
        // Tokens never read (the last sampled one) route themselves: -1.
        detail::pad_unread_routing(r.seq);
        RequestResult res;
        res.end = end;
        res.tokens = std::move(r.seq.tokens);
        res.logprobs = std::move(r.seq.logprobs);
        res.text = std::move(text);
        res.error = std::move(error);
        res.prompt_tokens = static_cast<int64_t>(r.req.prompt.size());
        res.first_version = r.first_version;
        res.last_version = r.last_version;
        if (r.req.params.return_routed_experts) {
            res.routed_layers = r.routed_layers;
            res.routed_k = r.routed_k;
            res.routed_experts.assign(r.seq.routed.begin(), r.seq.routed.end());
            res.routed_expert_weights = std::move(r.seq.routed_weights);
        }
        return res;
    }

    static void deliver(std::vector<Finished> &done) {
        for (auto &[r, res] : done)
            if (r->req.on_done) r->req.on_done(std::move(res));
        done.clear();
    }

    int64_t running_count() const {
        int64_t n = 0;
        for (const auto &r : running) n += r != nullptr;
        return n;
    }

    // Under mu: cancellations, timeouts, shutdown; then admits queued
    // requests into free slots. Fills `done`.
    void housekeeping(std::vector<Finished> &done) {
        const auto now = Clock::now();
        auto ends = [&](Request &r) -> std::optional<RequestEnd> {
            if (stop || cancels.count(r.id)) return RequestEnd::Cancelled;
            if (now >= r.req.deadline) return RequestEnd::Timeout;
            return std::nullopt;
        };
        for (auto it = queue.begin(); it != queue.end();) {
            if (auto e = ends(**it)) {
                cancels.erase((*it)->id);
                std::string text = (*it)->seq.text->cut();
                RequestResult res = result_of(**it, *e, std::move(text));
                done.emplace_back(std::move(*it), std::move(res));
                it = queue.erase(it);
            } else {
                ++it;
            }
        }
        for (size_t s = 0; s < running.size(); ++s) {
            auto &r = running[s];
            if (!r) continue;
            if (auto e = ends(*r)) {
                cancels.erase(r->id);
                std::string text = r->seq.text->finish();
                RequestResult res = result_of(*r, *e, std::move(text));
                done.emplace_back(std::move(r), std::move(res));
                r.reset();
            }
        }
        // Ids cancelled after they ended (or never known) are dropped.
        if (!cancels.empty() && queue.empty() && running_count() == 0) cancels.clear();
        if (stop) return;
        for (size_t s = 0; s < running.size() && !queue.empty(); ++s) {
            if (running[s]) continue;
            running[s] = std::move(queue.front());
            running[s]->stale = true;
            queue.pop_front();
        }
    }

    Clock::time_point next_deadline() const {
        auto t = Clock::time_point::max();
        for (const auto &r : queue) t = std::min(t, r->req.deadline);
        for (const auto &r : running)
            if (r) t = std::min(t, r->req.deadline);
        return t;
    }

    void loop() {
        std::vector<Finished> done;
        for (;;) {
            bool step = false;
            {
                std::unique_lock<std::mutex> lk(mu);
                for (;;) {
                    housekeeping(done);
                    if (stop) break;
                    step = !paused && !memory_released && exclusive_waiting == 0 &&
                           running_count() > 0;
                    if (step || !done.empty()) break;
                    const auto deadline = next_deadline();
                    if (deadline == Clock::time_point::max())
                        cv.wait(lk);
                    else
                        cv.wait_until(lk, deadline);
                }
            }
            deliver(done);
            {
                std::lock_guard<std::mutex> lk(mu);
                if (stop) {
                    housekeeping(done);
                    break;
                }
            }
            if (step) {
                std::lock_guard<std::mutex> sl(step_mu);
                run_step(done);
                deliver(done);
            }
        }
        deliver(done);
    }

    // One forward over every running request (prefill of the new and stale
    // ones, one token for the others), then one sampled token each.
    void run_step(std::vector<Finished> &done) {
        std::vector<int64_t> slot_ids, counts, packed;
        std::vector<Request *> reqs;
        int64_t step_version = 0;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (paused || memory_released || exclusive_waiting > 0 || stop) return;
            const int64_t current = policy->version();
            if (current != version) { // weights changed outside exclusive(): never mix
                version = current;
                refresh_noise();
                for (auto &r : running)
                    if (r) r->stale = true;
            }
            step_version = version;
            for (size_t s = 0; s < running.size(); ++s)
                if (running[s]) {
                    slot_ids.push_back(static_cast<int64_t>(s));
                    reqs.push_back(running[s].get());
                }
        }
        if (reqs.empty()) return;
        // Requests of one adapter (or of the base model) side by side: each
        // group is one forward under its adapter.
        {
            std::vector<size_t> order(reqs.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
                return std::less<const LoraAdapter *>()(reqs[a]->adapter.get(),
                                                        reqs[b]->adapter.get());
            });
            std::vector<int64_t> sorted_slots;
            std::vector<Request *> sorted_reqs;
            for (size_t i : order) {
                sorted_slots.push_back(slot_ids[i]);
                sorted_reqs.push_back(reqs[i]);
            }
            slot_ids = std::move(sorted_slots);
            reqs = std::move(sorted_reqs);
        }
        int64_t needed = 0;
        std::vector<uint8_t> refilled(reqs.size(), 0); // prefilled from the prompt this step
        bool record = false;                           // some request records its routing (R3)
        for (size_t i = 0; i < reqs.size(); ++i) {
            Request &r = *reqs[i];
            record = record || r.req.params.return_routed_experts;
            refilled[i] = r.stale ? 1 : 0;
            if (r.stale) {
                cache.clear(slot_ids[i]);
                packed.insert(packed.end(), r.req.prompt.begin(), r.req.prompt.end());
                packed.insert(packed.end(), r.seq.tokens.begin(), r.seq.tokens.end());
                counts.push_back(static_cast<int64_t>(r.req.prompt.size() + r.seq.tokens.size()));
                r.stale = false;
            } else {
                packed.push_back(r.seq.tokens.back());
                counts.push_back(1);
            }
            needed = std::max(needed, cache.length(slot_ids[i]) + counts.back());
        }
        at::Tensor logits;
        try {
            c10::InferenceMode inference;
            if (needed > cache.capacity())
                cache.reserve(std::min(max_context, std::max(needed, 2 * cache.capacity())));
            at::Tensor tokens = at::empty({static_cast<int64_t>(packed.size())}, at::kLong);
            std::copy(packed.begin(), packed.end(), tokens.data_ptr<int64_t>());
            logits = forward(reqs, slot_ids, tokens, counts, refilled, record);
            cache_bytes = cache.bytes();
            sample(reqs, slot_ids, logits, step_version, done);
        } catch (const std::exception &e) {
            // The step failed (memory, a broken model): end what ran in it,
            // keep serving the rest.
            std::lock_guard<std::mutex> lk(mu);
            for (size_t i = 0; i < reqs.size(); ++i) {
                auto &slot = running[static_cast<size_t>(slot_ids[i])];
                if (slot.get() != reqs[i]) continue;
                cache.clear(slot_ids[i]);
                std::string text = slot->seq.text->finish();
                RequestResult res = result_of(*slot, RequestEnd::Error, std::move(text),
                                              std::string("generation step failed: ") + e.what());
                done.emplace_back(std::move(slot), std::move(res));
                slot.reset();
            }
        }
    }

    // The step's forward: one extend per run of requests sharing an adapter
    // (reqs are grouped by run_step), their last-token logits concatenated in
    // request order; with `record`, the routing of every token read.
    at::Tensor forward(const std::vector<Request *> &reqs, const std::vector<int64_t> &slot_ids,
                       const at::Tensor &tokens, const std::vector<int64_t> &counts,
                       const std::vector<uint8_t> &refilled, bool record) {
        NormWeightsScope noise_scope(&noisy_norms); // QeRL noise (empty: the clean norms)
        std::vector<at::Tensor> logits;
        std::vector<std::vector<at::Tensor>> routing; // per group, per sparse layer
        int64_t token_at = 0;
        for (size_t a = 0; a < reqs.size();) {
            size_t b = a;
            int64_t group_tokens = 0;
            while (b < reqs.size() && reqs[b]->adapter == reqs[a]->adapter)
                group_tokens += counts[b++];
            const std::vector<int64_t> slots(slot_ids.begin() + static_cast<std::ptrdiff_t>(a),
                                             slot_ids.begin() + static_cast<std::ptrdiff_t>(b));
            const std::vector<int64_t> group_counts(counts.begin() + static_cast<std::ptrdiff_t>(a),
                                                    counts.begin() +
                                                        static_cast<std::ptrdiff_t>(b));
            AdapterScope scope(reqs[a]->adapter, /*training=*/false);
            std::optional<RouterLogitsRecorder> recorder;
            if (record) recorder.emplace();
            logits.push_back(policy->model().extend(
                cache, slots, tokens.narrow(0, token_at, group_tokens), group_counts));
            if (record) routing.push_back(recorder->logits());
            token_at += group_tokens;
            a = b;
        }
        if (record) {
            std::vector<at::Tensor> layers = routing.front();
            for (size_t l = 0; l < layers.size() && routing.size() > 1; ++l) {
                std::vector<at::Tensor> parts;
                for (const auto &g : routing) parts.push_back(g[l]);
                layers[l] = at::cat(parts, 0);
            }
            // Routing replay (R3): each recording request's rows (the routing
            // of the tokens it read), appended, or replacing what it had when
            // it was prefilled again from its prompt.
            std::vector<detail::Sequence *> seqs;
            bool weights = false;
            for (Request *r : reqs) {
                seqs.push_back(&r->seq);
                weights = weights || r->seq.record_weights;
            }
            detail::ForwardRouting(layers, policy->model().config(), weights)
                .append_in_order(seqs, &counts, &refilled);
        }
        return logits.size() == 1 ? logits.front() : at::cat(logits, 0);
    }

    void sample(const std::vector<Request *> &reqs, const std::vector<int64_t> &slot_ids,
                const at::Tensor &logits, int64_t step_version, std::vector<Finished> &done) {
        std::vector<detail::Sequence *> seqs;
        for (Request *r : reqs) seqs.push_back(&r->seq);
        std::vector<detail::Draw> drawn = detail::draw_next(logits, seqs);
        std::unordered_set<uint64_t> cancelled;
        {
            std::lock_guard<std::mutex> lk(mu);
            cancelled = cancels;
        }
        int64_t produced = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
            Request &r = *reqs[i];
            if (cancelled.count(r.id)) continue; // ends before this token (housekeeping)
            if (r.first_version < 0) r.first_version = step_version;
            r.last_version = step_version;
            ++produced;
            std::optional<detail::End> end = detail::accept(r.seq, drawn[i]);
            TokenEvent ev;
            ev.token = drawn[i].token;
            ev.logprob = drawn[i].logprob;
            ev.top = std::move(drawn[i].top);
            if (end) {
                const size_t from = std::min(r.seq.text->emitted(), end->text.size());
                ev.text = end->text.substr(from);
            } else {
                ev.text = r.seq.text->take_settled();
            }
            if (r.req.on_token) r.req.on_token(ev);
            if (end) {
                std::lock_guard<std::mutex> lk(mu);
                auto &slot = running[static_cast<size_t>(slot_ids[i])];
                cache.clear(slot_ids[i]);
                const RequestEnd how =
                    end->reason == FinishReason::Stop ? RequestEnd::Stop : RequestEnd::Length;
                RequestResult res = result_of(*slot, how, std::move(end->text));
                done.emplace_back(std::move(slot), std::move(res));
                slot.reset();
            }
        }
        std::lock_guard<std::mutex> lk(mu);
        tokens_generated += produced;
    }
};

Scheduler::Scheduler(std::shared_ptr<Policy> policy, SchedulerConfig config)
    : impl_(std::make_unique<Impl>(std::move(policy), config)) {}

Scheduler::~Scheduler() = default;

int64_t Scheduler::max_context() const {
    return impl_->max_context;
}

uint64_t Scheduler::submit(ServeRequest request) {
    Impl &s = *impl_;
    const SamplingParams &p = request.params;
    p.validate();
    if (p.n != 1)
        invalid("sampling params: n must be 1 per scheduler request (got " + std::to_string(p.n) +
                "); submit one request per sample with sample_index 0..n-1");
    if (request.sample_index < 0)
        invalid("sample_index must be >= 0, got " + std::to_string(request.sample_index));
    if (request.top_logprobs < 0 || request.top_logprobs > 20)
        invalid("top_logprobs must be in 0..20, got " + std::to_string(request.top_logprobs));
    const ModelConfig &mc = s.policy->model().config();
    const auto &prompt = request.prompt;
    if (prompt.empty()) invalid("prompt is empty");
    for (size_t t = 0; t < prompt.size(); ++t)
        if (prompt[t] < 0 || prompt[t] >= mc.vocab_size)
            invalid("prompt token " + std::to_string(t) + " = " + std::to_string(prompt[t]) +
                    " is outside the vocabulary [0, " + std::to_string(mc.vocab_size) + ")");
    const auto total = static_cast<int64_t>(prompt.size()) + p.max_tokens;
    if (total > s.max_context)
        invalid("max_tokens: the prompt has " + std::to_string(prompt.size()) +
                " tokens and max_tokens is " + std::to_string(p.max_tokens) + " (" +
                std::to_string(total) + " in all); the server's context is " +
                std::to_string(s.max_context) + " tokens");
    auto r = std::make_unique<Impl::Request>();
    if (p.return_routed_experts) {
        if (!mc.has_moe())
            invalid("sampling params: return_routed_experts: the model has no sparse MoE layer");
        r->routed_layers = detail::sparse_layers(mc);
        r->routed_k = mc.num_experts_per_tok;
    }
    // The adapter by name (NotFound naming the adapters there are).
    if (!p.adapter.empty()) r->adapter = s.policy->adapter(p.adapter);
    r->stop_ids = p.stop_token_ids.value_or(s.policy->eos_token_ids());
    for (size_t i = 0; i < r->stop_ids.size(); ++i)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= mc.vocab_size)
            invalid("stop_token_ids[" + std::to_string(i) +
                    "] = " + std::to_string(r->stop_ids[i]) + " is outside the vocabulary");
    if (!p.stop.empty()) s.policy->require_tokenizer("stop strings");
    detail::Sequence &seq = r->seq;
    seq.seed = p.seed ? *p.seed : s.policy->next_sampling_seed();
    seq.text.emplace(s.policy->tokenizer(), p.stop);
    r->req = std::move(request);
    // The sample's uniforms are generate's for prompt 0, sample sample_index.
    seq.params = &r->req.params;
    seq.stop_ids = &r->stop_ids;
    seq.prompt = 0;
    seq.sample = r->req.sample_index;
    seq.prompt_len = static_cast<int64_t>(r->req.prompt.size());
    seq.context_limit = s.max_context;
    seq.top_logprobs = r->req.top_logprobs;
    if (r->req.params.return_routed_experts) {
        seq.routed_width = r->routed_layers * r->routed_k;
        seq.record_weights = r->req.params.return_expert_logits;
    }
    uint64_t id = 0;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (s.stop) throw Error(ErrorKind::BadState, "the scheduler is shutting down");
        const auto waiting = static_cast<int64_t>(s.queue.size()) + s.running_count();
        if (waiting >= s.slots + s.config.max_queued)
            throw SchedulerFull("the server is at capacity: " + std::to_string(s.slots) +
                                " requests running and " + std::to_string(s.queue.size()) +
                                " queued (max_queued); retry later");
        id = s.next_id++;
        r->id = id;
        s.queue.push_back(std::move(r));
    }
    s.cv.notify_all();
    return id;
}

void Scheduler::cancel(uint64_t id) {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        if (id == 0 || id >= impl_->next_id) return;
        bool known = false;
        for (const auto &r : impl_->queue) known = known || r->id == id;
        for (const auto &r : impl_->running) known = known || (r && r->id == id);
        if (!known) return;
        impl_->cancels.insert(id);
    }
    impl_->cv.notify_all();
}

void Scheduler::pause() {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->paused = true;
    }
    std::lock_guard<std::mutex> wait_for_step(impl_->step_mu);
}

void Scheduler::resume() {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->paused = false;
    }
    impl_->cv.notify_all();
}

bool Scheduler::paused() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->paused;
}

void Scheduler::exclusive(const std::function<void()> &fn) {
    Impl &s = *impl_;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        ++s.exclusive_waiting;
    }
    struct Leave {
        Impl &s;
        ~Leave() {
            {
                std::lock_guard<std::mutex> lk(s.mu);
                --s.exclusive_waiting;
            }
            s.cv.notify_all();
        }
    } leave{s};
    std::lock_guard<std::mutex> sl(s.step_mu);
    fn();
    std::lock_guard<std::mutex> lk(s.mu);
    s.version = s.policy->version();
    s.refresh_noise();
    for (auto &r : s.running)
        if (r) r->stale = true;
    s.cache.clear_all();
}

void Scheduler::release_memory() {
    Impl &s = *impl_;
    std::lock_guard<std::mutex> sl(s.step_mu);
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.memory_released) return;
    s.cache.release();
    release_cached_memory(s.policy->model().device());
    s.cache_bytes = 0;
    s.memory_released = true;
    for (auto &r : s.running)
        if (r) r->stale = true;
}

void Scheduler::resume_memory() {
    Impl &s = *impl_;
    {
        std::lock_guard<std::mutex> sl(s.step_mu);
        std::lock_guard<std::mutex> lk(s.mu);
        if (!s.memory_released) return;
        s.cache.allocate();
        s.cache_bytes = s.cache.bytes();
        s.memory_released = false;
    }
    s.cv.notify_all();
}

Scheduler::Stats Scheduler::stats() const {
    const Impl &s = *impl_;
    std::lock_guard<std::mutex> lk(s.mu);
    Stats st;
    st.running = s.running_count();
    st.queued = static_cast<int64_t>(s.queue.size());
    st.slots = s.slots;
    st.version = s.version;
    st.noise_sigma = s.noise_sigma;
    st.tokens_generated = s.tokens_generated;
    st.cache_bytes = s.cache_bytes;
    st.paused = s.paused;
    st.memory_released = s.memory_released;
    return st;
}

} // namespace rl::core
