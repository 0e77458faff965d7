// abi/rl/disagg.h: the worker's and the trainer's ends of the three-role
// protocol.
#include "protocol.hpp"

#include <chrono>

using namespace rl::host::disagg;

namespace {

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// A result's tensor `name` (copied), for the chunk of a worker.
OwnedTensor tensor_of(const rl_result_t *r, const char *name, const char *fn) {
    rl_tensor_view_t v{};
    if (rl_result_tensor(r, name, &v) != RL_OK)
        throw HostError{RL_ERR_INTERNAL, std::string(fn) + ": the batch has no '" + name + "'"};
    return OwnedTensor::copy_of(v);
}

double scalar_of(const rl_result_t *r, const char *name, double def) {
    double v = def;
    return rl_result_scalar(r, name, &v) == RL_OK ? v : def;
}

void check(rl_status_t st, const std::string &what) {
    if (st != RL_OK) throw HostError{st, what + ": " + rl_last_error()};
}

struct ResultPtr {
    rl_result_t *r = nullptr;
    ~ResultPtr() { rl_result_destroy(r); }
};

} // namespace

struct rl_disagg_worker {
    Settings s;
    int64_t index = 0;
    std::string run, tag;
    Transport credits, out;
    int64_t seq = 0, allowed = 0, min_version = 0, trainer_version = 0;
    std::optional<std::string> trainer_run;
    bool done = false, credited = false;
};

struct rl_disagg_trainer {
    Settings s;
    std::string run;
    Transport inbox, acks;
    std::map<int64_t, Msg> waiting; // batches for later steps
    int64_t duplicates = 0;         // batches for past steps, skipped
    int64_t waited_version = -1;    // the step next() waits for, since `since`
    double since = 0;
    // Until the orchestrator is heard from, next() says hello again every 2 s: a
    // starting orchestrator clears its folders, and a hello written just before
    // that is gone (the workers repeat theirs the same way).
    bool heard = false;
    double hello_at = 0;
};

RL_API uint32_t rl_disagg_protocol_version(void) {
    return RL_DISAGG_PROTOCOL_VERSION;
}

// ---- worker end ---------------------------------------------------------------------

RL_API rl_status_t rl_disagg_worker_create(rl_runtime_t *runtime, const char *config_json,
                                           int64_t worker, rl_disagg_worker_t **out_worker) {
    return boundary([&] {
        const char *fn = "rl_disagg_worker_create";
        require(runtime && out_worker, std::string(fn) + ": runtime and out_worker are required");
        auto w = std::make_unique<rl_disagg_worker>();
        w->s = Settings::parse(config_json, fn);
        require(worker >= 0 && worker < w->s.workers,
                fmt("%s: worker %lld, but there are %lld (config key 'workers')", fn,
                    static_cast<long long>(worker), static_cast<long long>(w->s.workers)));
        w->index = worker;
        w->run = fmt("%lld-%lld", static_cast<long long>(worker), static_cast<long long>(now_ms()));
        w->tag = fmt("[rollout %lld/%lld]", static_cast<long long>(worker),
                     static_cast<long long>(w->s.workers));
        if (w->s.transport == "filesystem") clear(w->s.dir, {"credits_" + std::to_string(worker)});
        w->credits = to_worker(runtime, w->s, worker, true);
        w->out = to_orchestrator(runtime, w->s, "w" + std::to_string(worker), false);
        *out_worker = w.release();
        return RL_OK;
    });
}

RL_API void rl_disagg_worker_destroy(rl_disagg_worker_t *worker) {
    delete worker;
}

namespace {

// A hello: an orchestrator starting at the same time clears its shared
// folders, so a send can fail; it is tried again for 5 s.
void send_hello(rl_instance_t *t, const Msg &m, const std::string &what) {
    for (int attempt = 1;; ++attempt) {
        try {
            send(t, m, what);
            return;
        } catch (const HostError &) {
            if (attempt == 50) throw;
        }
        sleep_s(0.1);
    }
}

void worker_hello(rl_disagg_worker_t *w) {
    Msg m;
    m.header = {{"kind", "rl.hello"}, {"worker", w->index}, {"worker_run", w->run}};
    send_hello(w->out.get(), m, w->tag + " hello");
}

} // namespace

RL_API rl_status_t rl_disagg_worker_hello(rl_disagg_worker_t *worker) {
    return boundary([&] {
        require(worker != nullptr, "rl_disagg_worker_hello: worker is NULL");
        worker_hello(worker);
        return RL_OK;
    });
}

RL_API rl_status_t rl_disagg_worker_credit(rl_disagg_worker_t *w, rl_result_t **out_result) {
    return boundary([&] {
        require(w && out_result, "rl_disagg_worker_credit: worker and out_result are required");
        bool restarted = false;
        int64_t restart_version = 0; // the version the trainer restarted at
        const double waited_since = clock_s();
        while (w->allowed <= w->seq && !w->done) {
            // Before the first credit, in slices of 2 s with the hello again.
            const auto m = recv(w->credits.get(), w->credited ? w->s.timeout_ms() : 2000, w->tag);
            if (!m) {
                if (w->credited || clock_s() - waited_since > w->s.timeout)
                    throw HostError{RL_ERR_TIMEOUT, w->tag +
                                                        " no credit from the orchestrator within " +
                                                        w->s.timeout_text() + "; is it running?"};
                worker_hello(w);
                continue;
            }
            const json &h = m->header;
            if (h.value("worker_run", std::string()) != w->run)
                continue; // credits for an earlier process are void
            w->credited = true;
            const std::string trun = h.value("trainer_run", std::string());
            w->trainer_version = h.value("trainer_version", int64_t{0});
            if (w->trainer_run && *w->trainer_run != trun)
                restarted = true, restart_version = w->trainer_version;
            w->trainer_run = trun;
            w->done = h.value("done", false);
            w->allowed = std::max(w->allowed, h.value("seq", int64_t{0}));
            w->min_version = h.value("min_version", int64_t{0});
        }
        rl::host::CallSink s;
        s.scalars["seq"] = static_cast<double>(w->seq + 1);
        s.scalars["min_version"] = static_cast<double>(w->min_version);
        s.scalars["done"] = w->done ? 1 : 0;
        s.scalars["trainer_restarted"] = restarted ? 1 : 0;
        s.scalars["trainer_version"] =
            static_cast<double>(restarted ? restart_version : w->trainer_version);
        s.texts["worker_run"] = w->run;
        *out_result = new_result(std::move(s));
        return RL_OK;
    });
}

RL_API rl_status_t rl_disagg_worker_send(rl_disagg_worker_t *w, const rl_rollouts_t *rollouts,
                                         int64_t policy_version) {
    return boundary([&] {
        const char *fn = "rl_disagg_worker_send";
        require(w && rollouts, std::string(fn) + ": worker and rollouts are required");
        require(w->allowed > w->seq && !w->done,
                std::string(fn) + ": no credit for another chunk (call rl_disagg_worker_credit)");
        ResultPtr info, binfo;
        check(rl_rollouts_info(rollouts, &info.r), fn);
        rl_train_batch_t *batch = nullptr;
        check(rl_rollouts_to_batch(rollouts, &batch), fn);
        std::unique_ptr<rl_train_batch_t, void (*)(rl_train_batch_t *)> owned(
            batch, rl_train_batch_destroy);
        check(rl_train_batch_info(batch, &binfo.r), fn);
        Msg m;
        m.header = {{"kind", "rl.rollouts"},
                    {"worker", w->index},
                    {"worker_run", w->run},
                    {"seq", w->seq + 1},
                    {"policy_version", policy_version},
                    {"reward", scalar_of(info.r, "reward_mean", 0)},
                    {"flagged", scalar_of(info.r, "flagged", 0)},
                    {"masked", scalar_of(info.r, "masked", 0)}};
        double temperature = 0;
        if (rl_result_scalar(binfo.r, "sampling_temperature", &temperature) == RL_OK)
            m.header["sampling_temperature"] = temperature;
        for (const char *name :
             {"input_ids", "cu_seqlens", "loss_mask", "rewards", "group_ids", "policy_versions"})
            m.tensors[name] = tensor_of(binfo.r, name, fn);
        // The sampling logprobs: the behaviour policy's, the loss's old_logprobs.
        m.tensors["rollout_logprobs"] = tensor_of(binfo.r, "old_logprobs", fn);
        // Routing replay (R3): the experts (and weights) each token was routed
        // to, [tokens, L_moe, K], when the rollouts recorded them.
        for (const char *name : {"routed_experts", "routed_expert_weights"}) {
            rl_tensor_view_t v{};
            if (rl_result_tensor(binfo.r, name, &v) == RL_OK)
                m.tensors[name] = OwnedTensor::copy_of(v);
        }
        send(w->out.get(), m, w->tag + " sending a chunk");
        ++w->seq;
        return RL_OK;
    });
}

// ---- trainer end --------------------------------------------------------------------

RL_API rl_status_t rl_disagg_trainer_create(rl_runtime_t *runtime, const char *config_json,
                                            rl_disagg_trainer_t **out_trainer) {
    return boundary([&] {
        const char *fn = "rl_disagg_trainer_create";
        require(runtime && out_trainer, std::string(fn) + ": runtime and out_trainer are required");
        auto t = std::make_unique<rl_disagg_trainer>();
        t->s = Settings::parse(config_json, fn);
        t->run = std::to_string(now_ms());
        if (t->s.transport == "filesystem") clear(t->s.dir, {"batches"});
        t->inbox = to_trainer(runtime, t->s, true);
        t->acks = to_orchestrator(runtime, t->s, "trainer", false);
        *out_trainer = t.release();
        return RL_OK;
    });
}

RL_API void rl_disagg_trainer_destroy(rl_disagg_trainer_t *trainer) {
    delete trainer;
}

namespace {

void ack(rl_disagg_trainer_t *t, int64_t version, int64_t checkpoint, bool hello) {
    Msg m;
    m.header = {{"kind", "rl.trainer"}, {"trainer_run", t->run},
                {"version", version},   {"checkpoint", checkpoint},
                {"hello", hello},       {"done", !hello && version >= t->s.steps}};
    const std::string what = "trainer: acknowledging version " + std::to_string(version);
    if (hello)
        send_hello(t->acks.get(), m, what);
    else
        send(t->acks.get(), m, what);
}

} // namespace

RL_API rl_status_t rl_disagg_trainer_hello(rl_disagg_trainer_t *trainer, int64_t version) {
    return boundary([&] {
        require(trainer != nullptr, "rl_disagg_trainer_hello: trainer is NULL");
        ack(trainer, version, version, true);
        trainer->hello_at = clock_s();
        return RL_OK;
    });
}

RL_API rl_status_t rl_disagg_trainer_ack(rl_disagg_trainer_t *trainer, int64_t version) {
    return boundary([&] {
        require(trainer != nullptr, "rl_disagg_trainer_ack: trainer is NULL");
        ack(trainer, version, trainer->s.checkpoint_floor(version), false);
        return RL_OK;
    });
}

RL_API rl_status_t rl_disagg_trainer_next(rl_disagg_trainer_t *t, int64_t version,
                                          rl_result_t **out_result) {
    return boundary([&] {
        require(t && out_result, "rl_disagg_trainer_next: trainer and out_result are required");
        if (t->waited_version != version) t->waited_version = version, t->since = clock_s();
        std::optional<Msg> msg;
        if (auto it = t->waiting.find(version); it != t->waiting.end()) {
            msg = std::move(it->second);
            t->waiting.erase(it);
        }
        while (!msg) {
            auto m = recv(t->inbox.get(), 200, "trainer");
            if (!m) {
                if (clock_s() - t->since > t->s.timeout)
                    throw HostError{RL_ERR_TIMEOUT,
                                    fmt("trainer: no batch for step %lld from the orchestrator "
                                        "within %s; is it running?",
                                        static_cast<long long>(version),
                                        t->s.timeout_text().c_str())};
                if (!t->heard && t->hello_at > 0 && clock_s() - t->hello_at > 2) {
                    ack(t, version, version, true);
                    t->hello_at = clock_s();
                }
                continue;
            }
            t->heard = true;
            const std::string kind = m->header.value("kind", std::string());
            if (kind == "rl.weights_wanted") {
                msg = std::move(m); // the caller sends the weights in use to that worker
            } else if (kind == "rl.orchestrator_hello") {
                // The answer to this trainer's hello: heard, nothing to do. Without
                // "welcome", the orchestrator restarted: where this trainer is (its
                // batches follow).
                if (m->header.value("welcome", false)) continue;
                ack(t, version, t->s.checkpoint_floor(version), false);
                say(fmt("trainer: the orchestrator restarted; at version %lld",
                        static_cast<long long>(version)));
            } else if (kind == "rl.batch") {
                const int64_t s = m->header.value("step", int64_t{-1});
                if (s == version)
                    msg = std::move(m);
                else if (s < version)
                    ++t->duplicates;
                else
                    t->waiting[s] = std::move(*m);
            } else {
                throw HostError{RL_ERR_INVALID_ARG, "trainer: unexpected message kind '" + kind +
                                                        "' from the orchestrator"};
            }
        }
        msg->header["duplicate_batches"] = t->duplicates;
        msg->header.erase("protocol");
        rl::host::CallSink s;
        s.texts["header"] = msg->header.dump(-1, ' ', false, json::error_handler_t::replace);
        s.tensors = std::move(msg->tensors);
        *out_result = new_result(std::move(s));
        return RL_OK;
    });
}
