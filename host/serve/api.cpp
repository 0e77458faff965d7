#include "api.hpp"

#include "rl/core/error.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

namespace rl::serve {

void send_json(Responder &r, const json &j, int status) {
    r.send(status, "application/json", dump(j));
}

Handler guarded(std::function<void(const Request &, Responder &)> fn) {
    return [fn = std::move(fn)](const Request &req, Responder &r) {
        auto answer = [&r](int status, const std::string &msg, const std::string &param,
                           const Headers &headers) {
            if (!r.responded()) send_error(r, status, msg, param, "", headers);
        };
        try {
            fn(req, r);
        } catch (const ApiError &e) {
            answer(e.status, e.what(), e.param, e.headers);
        } catch (const core::SchedulerFull &e) {
            answer(503, e.what(), "", {{"Retry-After", "1"}});
        } catch (const core::Error &e) {
            const int status = e.kind() == core::ErrorKind::NotFound          ? 404
                               : e.kind() == core::ErrorKind::BadState        ? 409
                               : e.kind() == core::ErrorKind::InvalidArgument ? 400
                                                                              : 500;
            answer(status, e.what(), "", {});
        } catch (const c10::Error &e) {
            answer(500, std::string("libtorch: ") + e.what_without_backtrace(), "", {});
        } catch (const std::bad_alloc &) {
            answer(500, "out of memory", "", {});
        } catch (const std::exception &e) {
            answer(500, std::string("internal error: ") + e.what(), "", {});
        }
    };
}

// ---- SampleGroup ---------------------------------------------------------------------------

struct SampleGroup::State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<SampleOutput> out;
    std::vector<bool> ended;
    size_t num_ended = 0;
    /// What arrived, in order: (sample, event index), or (sample, -1) for its end.
    std::deque<std::pair<size_t, int64_t>> arrivals;
};

SampleGroup::SampleGroup(Server &server, std::string rid)
    : server_(server), rid_(std::move(rid)), state_(std::make_shared<State>()) {}

SampleGroup::~SampleGroup() {
    cancel_all();
    for (uint64_t t : tickets_) server_.forget(t);
}

size_t SampleGroup::size() const {
    return state_->out.size();
}

const std::vector<SampleOutput> &SampleGroup::outputs() const {
    return state_->out;
}

void SampleGroup::cancel_all() {
    std::vector<size_t> open;
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        for (size_t i = 0; i < ids_.size(); ++i)
            if (!state_->ended[i]) open.push_back(i);
    }
    for (size_t i : open) server_.scheduler().cancel(ids_[i]);
}

void SampleGroup::submit(std::vector<SampleSpec> specs) {
    const size_t n = specs.size();
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->out.assign(n, SampleOutput{});
        state_->ended.assign(n, false);
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(server_.config().request_timeout_s));
    std::vector<std::string> rids;
    for (const auto &s : specs) rids.push_back(s.rid.empty() ? rid_ : s.rid);
    for (size_t i = 0; i < n; ++i) {
        core::ServeRequest req;
        req.prompt = std::move(specs[i].prompt);
        req.params = specs[i].params;
        req.sample_index = specs[i].sample_index;
        req.top_logprobs = specs[i].top_logprobs;
        req.deadline = deadline;
        std::shared_ptr<State> st = state_;
        req.on_token = [st, i](const core::TokenEvent &e) {
            std::lock_guard<std::mutex> lock(st->mu);
            auto &events = st->out[i].events;
            events.push_back(e);
            st->arrivals.emplace_back(i, static_cast<int64_t>(events.size()) - 1);
            st->cv.notify_all();
        };
        req.on_done = [st, i](core::RequestResult r) {
            std::lock_guard<std::mutex> lock(st->mu);
            st->out[i].result = std::move(r);
            if (!st->ended[i]) {
                st->ended[i] = true;
                ++st->num_ended;
            }
            st->arrivals.emplace_back(i, -1);
            st->cv.notify_all();
        };
        try {
            ids_.push_back(server_.scheduler().submit(std::move(req)));
        } catch (const core::SchedulerFull &e) {
            cancel_all();
            throw ApiError(503, std::string(e.what()) + "; retry later", "",
                           {{"Retry-After", "1"}});
        } catch (const core::Error &e) {
            cancel_all();
            throw ApiError(400, e.what());
        }
    }
    // Registered by request id (a batch may name one per prompt).
    std::map<std::string, std::vector<uint64_t>> by_rid;
    for (size_t i = 0; i < n; ++i) by_rid[rids[i]].push_back(ids_[i]);
    for (const auto &[rid, ids] : by_rid) tickets_.push_back(server_.track(rid, ids));
}

bool SampleGroup::wait_ended(double seconds) {
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, std::chrono::duration<double>(seconds),
                               [&] { return state_->num_ended == state_->out.size(); });
}

bool SampleGroup::wait(Responder &r) {
    for (;;) {
        if (wait_ended(0.05)) return true;
        if (r.client_gone()) {
            cancel_all();
            // The scheduler ends a cancelled request before its next token.
            wait_ended(60);
            return false;
        }
    }
}

bool SampleGroup::stream(Responder &r,
                         const std::function<bool(size_t, const core::TokenEvent &)> &on_token,
                         const std::function<bool(size_t, const SampleOutput &)> &on_end) {
    auto give_up = [&] {
        cancel_all();
        wait_ended(60);
        return false;
    };
    for (;;) {
        std::pair<size_t, int64_t> next;
        core::TokenEvent event;
        SampleOutput ended;
        {
            std::unique_lock<std::mutex> lock(state_->mu);
            if (state_->arrivals.empty() && state_->num_ended == state_->out.size()) return true;
            if (!state_->cv.wait_for(lock, std::chrono::milliseconds(50),
                                     [&] { return !state_->arrivals.empty(); })) {
                lock.unlock();
                if (r.client_gone()) return give_up();
                continue;
            }
            next = state_->arrivals.front();
            state_->arrivals.pop_front();
            if (next.second >= 0)
                event = state_->out[next.first].events[static_cast<size_t>(next.second)];
            else
                ended = state_->out[next.first];
        }
        const bool ok = next.second >= 0 ? on_token(next.first, event) : on_end(next.first, ended);
        if (!ok || r.client_gone()) return give_up();
    }
}

// ---- shared pieces -------------------------------------------------------------------------

int64_t vocab_size(const Server &server) {
    return server.policy().model().config().vocab_size;
}

void check_token_ids(const Server &server, const std::vector<int64_t> &ids,
                     const std::string &param) {
    const int64_t v = vocab_size(server);
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= v)
            refuse(param, param + ": token " + std::to_string(i) + " = " + std::to_string(ids[i]) +
                              " is outside the vocabulary [0, " + std::to_string(v) + ")");
}

std::vector<int64_t> encode_text(const Server &server, const std::string &text,
                                 const std::string &param) {
    const auto &tok = server.policy().tokenizer();
    if (!tok)
        refuse(param, param + ": the model has no tokenizer (tokenizer.json); send token ids");
    const std::vector<int32_t> ids = tok->encode(text);
    return std::vector<int64_t>(ids.begin(), ids.end());
}

void check_lengths(Server &server, size_t prompt_tokens, int64_t max_tokens,
                   const std::string &prompt_param, const std::string &max_tokens_param) {
    const int64_t limit = server.config().max_tokens_limit;
    if (max_tokens > limit)
        refuse(max_tokens_param, max_tokens_param + " = " + std::to_string(max_tokens) +
                                     " is above this server's limit of " + std::to_string(limit) +
                                     " (max_tokens_limit)");
    if (prompt_tokens == 0) refuse(prompt_param, prompt_param + " is empty");
    const int64_t context = server.scheduler().max_context();
    const auto p = static_cast<int64_t>(prompt_tokens);
    if (p >= context)
        refuse(prompt_param, prompt_param + " has " + std::to_string(p) +
                                 " tokens; the context holds " + std::to_string(context) +
                                 " (prompt and completion)");
    if (p + max_tokens > context)
        refuse(max_tokens_param, "the prompt's " + std::to_string(p) + " tokens plus " +
                                     max_tokens_param + " = " + std::to_string(max_tokens) +
                                     " exceed the context of " + std::to_string(context) +
                                     " tokens; at most " + std::to_string(context - p) +
                                     " can be generated");
}

std::string token_text(const Server &server, int64_t id) {
    const auto &tok = server.policy().tokenizer();
    if (!tok || id < 0 || id >= tok->vocab_size()) return {};
    return tok->decode({static_cast<int32_t>(id)});
}

json matched_stop(const Server &server, const SampleSpec &spec, const core::RequestResult &r) {
    if (r.end != core::RequestEnd::Stop || r.tokens.empty()) return nullptr;
    const int64_t last = r.tokens.back();
    const auto &ids = spec.params.stop_token_ids;
    if (ids && std::find(ids->begin(), ids->end(), last) != ids->end()) return last;
    const auto &tok = server.policy().tokenizer();
    if (!tok || spec.params.stop.empty()) return nullptr;
    std::vector<int32_t> all(r.tokens.begin(), r.tokens.end());
    const std::string full = tok->decode(all);
    if (full.compare(0, r.text.size(), r.text) != 0) return nullptr;
    const std::string rest = full.substr(r.text.size());
    for (const auto &s : spec.params.stop)
        if (rest.compare(0, s.size(), s) == 0) return s;
    return nullptr;
}

std::vector<int64_t> stop_ids(const Server &server, bool ignore_eos,
                              const std::vector<int64_t> &extra) {
    std::vector<int64_t> out;
    if (!ignore_eos) out = server.policy().eos_token_ids();
    for (int64_t id : extra)
        if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    return out;
}

std::string adapter_named(const Server &server, const json *value, const std::string &param) {
    if (value == nullptr || value->is_null()) return {};
    if (!value->is_string())
        refuse(param, param + " must be the name of a loaded LoRA adapter (a string) or null");
    const std::string name = value->get<std::string>();
    if (server.policy().find_adapter(name)) return name;
    std::string known;
    for (const auto &n : server.policy().adapter_names())
        known += (known.empty() ? "'" : ", '") + n + "'";
    refuse(param, param + " '" + name + "' is not a loaded LoRA adapter; loaded: " +
                      (known.empty() ? std::string("none") : known) +
                      " (load one with POST /load_lora_adapter)");
}

} // namespace rl::serve
