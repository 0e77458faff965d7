// abi/rl/disagg.h: the orchestrator of the three-role protocol, the whole loop
// in one call. It owns the buffer, the advantages, the batches (each numbered
// with the trainer step it is for and kept until the trainer's checkpoint
// covers it), the workers' credits, and its state: saved in state_dir after
// every change (state.json names the buffer file of its generation: the commit
// point; each kept batch is a message in its own folder), taken back with
// "resume".
#include "protocol.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace rl::host::disagg;

namespace {

constexpr const char *kStateFormat = "rl.orchestrator_state/1";
constexpr const char *kTag = "[orchestrator]";

struct WorkerState {
    std::string run;
    int64_t seq = 0, granted = 0; // last chunk taken, last credit granted
};

struct TrainerState {
    std::optional<std::string> run;
    int64_t version = -1, checkpoint = 0;
    bool done = false;
};

const char *const kStats[] = {
    "chunks",           "duplicates", "lost_chunks",          "worker_restarts",
    "trainer_restarts", "resent",     "orchestrator_restarts"};

void check(rl_status_t st, const std::string &what) {
    if (st != RL_OK) throw HostError{st, std::string(kTag) + " " + what + ": " + rl_last_error()};
}

long long ll(int64_t v) {
    return static_cast<long long>(v);
}

class Orchestrator {
public:
    Orchestrator(rl_runtime_t *rt, Settings s, rl_buffer_t *buffer, rl_instance_t *advantage)
        : rt_(rt), s_(std::move(s)), buffer_(buffer), advantage_(advantage) {}

    rl_result_t *run();

private:
    rl_runtime_t *rt_;
    Settings s_;
    rl_buffer_t *buffer_;
    rl_instance_t *advantage_;
    std::vector<Transport> inboxes_;
    Transport batches_;
    std::map<int64_t, Transport> credit_out_;

    TrainerState trainer_;
    std::map<int64_t, WorkerState> w_;
    std::map<std::string, int64_t> stats_;
    std::map<int64_t, Msg> sent_; // step -> batch, kept until the trainer's checkpoint covers it
    std::optional<int64_t> next_step_;
    int64_t gid_ = 0;
    json gid_map_ = json::object(); // "<worker_run>:<group>" -> the orchestrator's group id
    int64_t generation_ = 0;
    bool resync_ = false;           // after a restart: the trainer's next ack says what it lacks
    std::vector<int64_t> obsolete_; // kept batches the checkpoint covers, removed after a save
    double last_heard_ = 0;

    std::string buffer_file(int64_t g) const {
        return fmt("%s/buffer_%lld.json", s_.state_dir.c_str(), ll(g));
    }
    Transport kept_channel(int64_t step) {
        return open_transport(rt_, "filesystem",
                              json{{"dir", s_.state_dir},
                                   {"channel", "kept_" + std::to_string(step)},
                                   {"mode", "latest"},
                                   {"keep", 1},
                                   {"poll_ms", 10}});
    }
    void remove_kept(const std::vector<int64_t> &steps) {
        std::vector<std::string> names;
        for (int64_t s : steps) names.push_back("kept_" + std::to_string(s));
        clear(s_.state_dir, names);
    }
    void save();
    void resume();
    void keep(int64_t step, Msg m) {
        remove_kept({step}); // of an attempt that did not commit
        send(kept_channel(step).get(), m, fmt("%s keeping the batch of step %lld", kTag, ll(step)));
        sent_[step] = std::move(m);
    }
    void credit(int64_t k, bool done = false) {
        const WorkerState &s = w_[k];
        Msg m;
        m.header = {
            {"kind", "rl.credit"},
            {"worker_run", s.run},
            {"seq", s.granted},
            {"done", done},
            {"min_version", std::max<int64_t>(0, next_step_.value_or(0) - s_.max_async_level)},
            {"trainer_run", trainer_.run ? json(*trainer_.run) : json()},
            {"trainer_version", trainer_.version}};
        send(credit_out_.at(k).get(), m, fmt("%s a credit to worker %lld", kTag, ll(k)));
    }
    void send_batch(int64_t step) {
        send(batches_.get(), sent_.at(step), fmt("%s the batch of step %lld", kTag, ll(step)));
    }
    void handle(Msg &m);
    void take_rollouts(const json &h, Msg &m);
    bool make_batch();
};

void Orchestrator::save() {
    ++generation_;
    check(rl_buffer_save(buffer_, buffer_file(generation_).c_str()), "saving its buffer");
    json workers = json::array(), kept = json::array();
    for (const auto &[k, s] : w_)
        workers.push_back({{"worker", k}, {"run", s.run}, {"seq", s.seq}, {"granted", s.granted}});
    for (const auto &kv : sent_) kept.push_back(kv.first);
    const json st = {{"format", kStateFormat},
                     {"generation", generation_},
                     {"next_step", next_step_ ? json(*next_step_) : json()},
                     {"trainer",
                      {{"run", trainer_.run ? json(*trainer_.run) : json()},
                       {"version", trainer_.version},
                       {"checkpoint", trainer_.checkpoint},
                       {"done", trainer_.done}}},
                     {"workers", workers},
                     {"kept", kept},
                     {"stats", stats_},
                     {"gid", gid_},
                     {"gid_map", gid_map_}};
    // Written beside, then renamed: a reader sees the old state or the new one.
    const std::string path = s_.state_dir + "/state.json", tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << st.dump();
        if (!f.good())
            throw HostError{RL_ERR_IO, std::string(kTag) + " cannot write '" + tmp + "'"};
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec)
        throw HostError{RL_ERR_IO,
                        std::string(kTag) + " cannot write '" + path + "': " + ec.message()};
    std::filesystem::remove(buffer_file(generation_ - 1), ec);
}

void Orchestrator::resume() {
    const std::string path = s_.state_dir + "/state.json";
    std::ifstream f(path, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    json st;
    try {
        st = json::parse(text.str());
        if (st.value("format", std::string()) != kStateFormat)
            throw HostError{RL_ERR_INVALID_ARG,
                            std::string(kTag) + " " + path + " is not an orchestrator state"};
        generation_ = st.at("generation").get<int64_t>();
        check(rl_buffer_load(buffer_, buffer_file(generation_).c_str()), "resuming its buffer");
        if (!st.at("next_step").is_null()) next_step_ = st["next_step"].get<int64_t>();
        const json &t = st.at("trainer");
        if (!t.at("run").is_null()) trainer_.run = t["run"].get<std::string>();
        trainer_.version = t.at("version").get<int64_t>();
        trainer_.checkpoint = t.at("checkpoint").get<int64_t>();
        trainer_.done = t.at("done").get<bool>();
        for (const auto &s : st.at("workers"))
            w_[s.at("worker").get<int64_t>()] = {s.at("run").get<std::string>(),
                                                 s.at("seq").get<int64_t>(),
                                                 s.at("granted").get<int64_t>()};
        for (const auto &kv : st.at("stats").items()) stats_[kv.key()] = kv.value().get<int64_t>();
        gid_ = st.at("gid").get<int64_t>();
        if (st.at("gid_map").is_object()) gid_map_ = st["gid_map"];
        for (const auto &k : st.at("kept")) {
            const int64_t step = k.get<int64_t>();
            auto m = recv(kept_channel(step).get(), 1000, kTag);
            if (!m)
                throw HostError{RL_ERR_NOT_FOUND,
                                fmt("%s the kept batch of step %lld is missing from %s", kTag,
                                    ll(step), s_.state_dir.c_str())};
            m->header.erase("protocol");
            sent_[step] = std::move(*m);
        }
    } catch (const json::exception &e) {
        throw HostError{RL_ERR_INVALID_ARG,
                        std::string(kTag) + " " + path + " is damaged: " + e.what()};
    }
    ++stats_["orchestrator_restarts"];
    rl_result_t *bs = nullptr;
    check(rl_buffer_stats(buffer_, 0, &bs), "reading its buffer's stats");
    double ready = 0, pending = 0;
    rl_result_scalar(bs, "ready_rollouts", &ready);
    rl_result_scalar(bs, "pending_rollouts", &pending);
    rl_result_destroy(bs);
    say(fmt("%s resumed: next batch for step %s, %zu kept batch(es), %lld rollout(s) in the buffer",
            kTag, next_step_ ? std::to_string(*next_step_).c_str() : "nil", st["kept"].size(),
            ll(static_cast<int64_t>(ready + pending))));
    resync_ = true;
}

void Orchestrator::take_rollouts(const json &h, Msg &m) {
    const int64_t k = h.at("worker").get<int64_t>();
    const std::string run = h.value("worker_run", std::string());
    const int64_t seq = h.value("seq", int64_t{0});
    auto it = w_.find(k);
    if (it == w_.end() || it->second.run != run) {
        // A chunk of a process we never heard hello from (its hello was lost): adopt it.
        if (it != w_.end()) ++stats_["worker_restarts"];
        w_[k] = {run, 0, seq};
    }
    WorkerState &s = w_[k];
    if (seq <= s.seq) {
        ++stats_["duplicates"]; // taken before: never twice
        return;
    }
    if (seq > s.seq + 1) stats_["lost_chunks"] += seq - s.seq - 1;
    s.seq = seq;
    ++stats_["chunks"];
    // A chunk's weights prove the trainer reached their version (a restarted
    // orchestrator may not have heard of it yet).
    check(rl_buffer_set_policy_version(
              buffer_,
              std::max<int64_t>({trainer_.version, 0, h.value("policy_version", int64_t{0})})),
          "setting the policy version");
    auto need = [&](const char *name) -> const OwnedTensor & {
        auto t = m.tensors.find(name);
        if (t == m.tensors.end())
            throw HostError{RL_ERR_INVALID_ARG, fmt("%s a chunk of worker %lld without tensor '%s'",
                                                    kTag, ll(k), name)};
        return t->second;
    };
    const OwnedTensor &ids = need("input_ids"), &cu = need("cu_seqlens"), &mask = need("loss_mask"),
                      &rewards = need("rewards"), &groups = need("group_ids"),
                      &versions = need("policy_versions");
    const auto lp = m.tensors.find("rollout_logprobs");
    // Routing replay (R3): [tokens, L_moe, K] rows, sliced with the tokens.
    std::vector<std::pair<std::string, const OwnedTensor *>> routing;
    for (const char *name : {"routed_experts", "routed_expert_weights"}) {
        const auto t = m.tensors.find(name);
        if (t == m.tensors.end()) continue;
        if (t->second.shape.size() != 3 || t->second.shape[0] != ids.numel())
            throw HostError{RL_ERR_INVALID_ARG,
                            fmt("%s chunk %lld of worker %lld: tensor '%s' must be [%lld tokens, "
                                "sparse layers, experts per token]",
                                kTag, ll(seq), ll(k), name, ll(ids.numel()))};
        routing.emplace_back(name, &t->second);
    }
    const auto *cu_p = reinterpret_cast<const int64_t *>(cu.bytes.data());
    const auto *g_p = reinterpret_cast<const int64_t *>(groups.bytes.data());
    const auto *v_p = reinterpret_cast<const int64_t *>(versions.bytes.data());
    const auto *r_p = reinterpret_cast<const double *>(rewards.bytes.data());
    const int64_t n = cu.numel() - 1;
    if (cu.dtype.bits != 64 || groups.dtype.bits != 64 || versions.dtype.bits != 64 ||
        rewards.dtype.bits != 64 || rewards.numel() != n || groups.numel() != n ||
        versions.numel() != n || ids.numel() != mask.numel() || ids.dtype.bits != 64 ||
        (lp != m.tensors.end() && lp->second.numel() != ids.numel()) ||
        (n >= 0 && cu_p[n] != ids.numel()))
        throw HostError{RL_ERR_INVALID_ARG,
                        fmt("%s a malformed chunk %lld of worker %lld (tensor sizes or dtypes)",
                            kTag, ll(seq), ll(k))};
    for (int64_t i = 0; i < n; ++i) {
        // Group ids of the orchestrator: unique over workers and their restarts.
        const std::string key = run + ":" + std::to_string(g_p[i]);
        if (!gid_map_.contains(key)) gid_map_[key] = ++gid_;
        const int64_t a = cu_p[i], b = cu_p[i + 1];
        if (a < 0 || b < a || b > ids.numel())
            throw HostError{RL_ERR_INVALID_ARG,
                            fmt("%s chunk %lld of worker %lld: cu_seqlens is not ascending "
                                "within its %lld tokens",
                                kTag, ll(seq), ll(k), ll(ids.numel()))};
        // Rows a..b of a tensor whose first dimension is the chunk's tokens.
        auto rows = [&](const OwnedTensor &t) {
            rl_tensor_view_t v = t.view();
            int64_t row = 1;
            for (size_t d = 1; d < t.shape.size(); ++d) row *= t.shape[d];
            v.data = static_cast<uint8_t *>(v.data) +
                     a * row * static_cast<int64_t>(rl::host::dtype_size(t.dtype));
            std::vector<int64_t> shape = t.shape;
            shape[0] = b - a;
            v.shape = shape.data();
            return OwnedTensor::copy_of(v);
        };
        std::map<std::string, OwnedTensor> parts;
        parts["token_ids"] = rows(ids);
        parts["loss_mask"] = rows(mask);
        if (lp != m.tensors.end()) parts["logprobs"] = rows(lp->second);
        for (const auto &[name, t] : routing) parts[name] = rows(*t);
        std::vector<rl_tensor_arg_t> args;
        for (const auto &kv : parts) args.push_back({kv.first.c_str(), kv.second.view()});
        json r = {{"group_id", gid_map_[key]}, {"reward", r_p[i]}, {"policy_version", v_p[i]}};
        if (h.contains("sampling_temperature"))
            r["sampling_temperature"] = h["sampling_temperature"];
        const std::string rj = r.dump();
        const rl_tensor_list_t list{args.data(), args.size()};
        check(rl_buffer_push(buffer_, rj.c_str(), &list),
              fmt("a rollout of worker %lld's chunk %lld", ll(k), ll(seq)));
    }
}

void Orchestrator::handle(Msg &m) {
    const json &h = m.header;
    last_heard_ = clock_s();
    const std::string kind = h.value("kind", std::string());
    if (kind == "rl.trainer") {
        const std::string run = h.value("trainer_run", std::string());
        const int64_t version = h.value("version", int64_t{0});
        const bool hello = h.value("hello", false);
        if (hello) {
            if (trainer_.run && run != *trainer_.run) {
                ++stats_["trainer_restarts"];
                say(fmt("%s the trainer restarted at version %lld", kTag, ll(version)));
            }
            trainer_.run = run;
            if (!next_step_) next_step_ = version;
            // Batches it lost with its process: again, in order.
            for (int64_t s = version; s < *next_step_; ++s) {
                if (!sent_.count(s))
                    throw HostError{RL_ERR_BAD_STATE,
                                    fmt("%s the trainer restarted at version %lld but the batch "
                                        "of step %lld is gone (run.checkpoint_every too far "
                                        "apart?)",
                                        kTag, ll(version), ll(s))};
                send_batch(s);
                ++stats_["resent"];
            }
        }
        if (trainer_.run && run == *trainer_.run) {
            trainer_.version = version;
            trainer_.checkpoint = h.value("checkpoint", int64_t{0});
            trainer_.done = h.value("done", false);
            for (auto it = sent_.begin(); it != sent_.end();) { // removed once the state is saved
                if (it->first < trainer_.checkpoint) {
                    obsolete_.push_back(it->first);
                    it = sent_.erase(it);
                } else {
                    ++it;
                }
            }
            if (resync_) {
                // Restarted: batches sent into the dead process's socket may
                // never have arrived; the trainer skips those it has.
                resync_ = false;
                for (int64_t s = version; s < next_step_.value_or(0); ++s)
                    if (sent_.count(s)) {
                        send_batch(s);
                        ++stats_["resent"];
                    }
            }
        }
        if (hello) {
            // The trainer repeats its hello until it hears from us.
            Msg welcome;
            welcome.header = {{"kind", "rl.orchestrator_hello"}, {"welcome", true}};
            send(batches_.get(), welcome, std::string(kTag) + " answering the trainer's hello");
            // Every worker hears of the trainer's run (after a restart they take
            // its older weights).
            for (const auto &kv : w_) credit(kv.first);
        }
    } else if (kind == "rl.hello" || kind == "rl.rollouts") {
        const json &wk = h.contains("worker") ? h["worker"] : json();
        if (!wk.is_number_integer() || wk.get<int64_t>() < 0 || wk.get<int64_t>() >= s_.workers)
            throw HostError{RL_ERR_INVALID_ARG,
                            fmt("%s a message from worker %s, but there are %lld "
                                "(rollout_workers / --roles rollout:K)",
                                kTag, wk.dump().c_str(), ll(s_.workers))};
        const int64_t k = wk.get<int64_t>();
        if (kind == "rl.hello") {
            const std::string run = h.value("worker_run", std::string());
            auto it = w_.find(k);
            if (it != w_.end() && it->second.run != run) {
                ++stats_["worker_restarts"];
                const int64_t lost = std::max<int64_t>(0, it->second.granted - it->second.seq);
                stats_["lost_chunks"] += lost;
                say(fmt("%s worker %lld restarted (%s -> %s); %lld chunk(s) in flight lost, none "
                        "trained",
                        kTag, ll(k), it->second.run.c_str(), run.c_str(), ll(lost)));
            }
            if (it == w_.end() || it->second.run != run) {
                w_[k] = {run, 0, 0};
                // Its first weights: the trainer sends the ones in use again.
                Msg want;
                want.header = {{"kind", "rl.weights_wanted"}, {"worker", k}, {"worker_run", run}};
                send(batches_.get(), want, fmt("%s asking for worker %lld's weights", kTag, ll(k)));
            }
        } else {
            take_rollouts(h, m);
        }
    } else {
        throw HostError{RL_ERR_INVALID_ARG,
                        fmt("%s unexpected message kind '%s'", kTag, kind.c_str())};
    }
    save();
    remove_kept(obsolete_);
    obsolete_.clear();
}

// The next batch from the buffer, kept and sent; false when the buffer has too few.
bool Orchestrator::make_batch() {
    rl_train_batch_t *batch = nullptr;
    check(rl_buffer_pop_train_batch(buffer_, static_cast<uint64_t>(s_.min_rollouts), 0, &batch),
          "taking a batch from its buffer");
    if (!batch) return false;
    std::unique_ptr<rl_train_batch_t, void (*)(rl_train_batch_t *)> owned(batch,
                                                                          rl_train_batch_destroy);
    rl_result_t *adv = nullptr;
    check(rl_train_batch_compute_advantages(batch, advantage_, &adv), "computing advantages");
    rl_result_destroy(adv);
    rl_result_t *info = nullptr;
    check(rl_train_batch_info(batch, &info), "reading a batch");
    std::unique_ptr<rl_result_t, void (*)(rl_result_t *)> info_owned(info, rl_result_destroy);
    double groups = 0, rollouts = 0, min_version = 0;
    rl_result_scalar(info, "groups", &groups);
    rl_result_scalar(info, "rollouts", &rollouts);
    rl_result_scalar(info, "min_policy_version", &min_version);
    rl_tensor_view_t rv{};
    check(rl_result_tensor(info, "rewards", &rv), "reading a batch's rewards");
    double sum = 0;
    const int64_t nr = rv.ndim > 0 ? rv.shape[0] : 0;
    for (int64_t i = 0; i < nr; ++i) sum += static_cast<const double *>(rv.data)[i];
    rl_batch_t view{};
    view.struct_size = sizeof(view);
    check(rl_train_batch_view(batch, &view), "viewing a batch");
    const int64_t step = *next_step_;
    Msg m;
    m.header = {{"kind", "rl.batch"},
                {"step", step},
                {"policy_version", static_cast<int64_t>(min_version)},
                {"reward", nr > 0 ? sum / static_cast<double>(nr) : 0.0},
                {"groups", static_cast<int64_t>(groups)},
                {"rollouts", static_cast<int64_t>(rollouts)}};
    for (const char *k : kStats) m.header[k] = stats_[k];
    m.tensors["input_ids"] = OwnedTensor::copy_of(view.input_ids);
    m.tensors["cu_seqlens"] = OwnedTensor::copy_of(view.cu_seqlens);
    for (uint64_t i = 0; i < view.tensors.count; ++i)
        m.tensors[view.tensors.items[i].name] = OwnedTensor::copy_of(view.tensors.items[i].view);
    keep(step, std::move(m));
    next_step_ = step + 1;
    save(); // committed before it leaves: a crash regenerates the same batch
    send_batch(step);
    last_heard_ = clock_s();
    return true;
}

rl_result_t *Orchestrator::run() {
    for (const char *k : kStats) stats_[k] = 0;
    require(!s_.state_dir.empty(), std::string(kTag) + " config key 'dir' (or 'state_dir') names "
                                                       "no folder for its state");
    const bool resuming =
        s_.resume && std::filesystem::is_regular_file(s_.state_dir + "/state.json");
    std::error_code gone, ec;
    if (!resuming) std::filesystem::remove_all(s_.state_dir, gone);
    std::filesystem::create_directories(s_.state_dir, ec);
    if (ec)
        throw HostError{RL_ERR_IO, std::string(kTag) + " cannot create '" + s_.state_dir +
                                       "': " + ec.message()};
    if (s_.transport == "filesystem") {
        // Messages waiting in the shared folder are real after a restart.
        if (!resuming) clear(s_.dir, {"to_orch_trainer"});
        inboxes_.push_back(to_orchestrator(rt_, s_, "trainer", true));
        for (int64_t k = 0; k < s_.workers; ++k) {
            if (!resuming) clear(s_.dir, {"to_orch_w" + std::to_string(k)});
            inboxes_.push_back(to_orchestrator(rt_, s_, "w" + std::to_string(k), true));
        }
    } else {
        inboxes_.push_back(to_orchestrator(rt_, s_, "", true));
    }
    batches_ = to_trainer(rt_, s_, false);
    for (int64_t k = 0; k < s_.workers; ++k) credit_out_[k] = to_worker(rt_, s_, k, false);
    last_heard_ = clock_s();

    if (resuming) {
        resume();
        // The trainer's acknowledgements and the workers' chunks sent while this
        // process was down may be lost: ask the trainer where it is, and give
        // every worker a fresh credit (a chunk that never comes is counted lost).
        // The fresh credit numbers and this restart are saved before anything
        // goes out: an orchestrator killed right after this one resumes above
        // them, never granting again a number a worker has already used.
        for (auto &kv : w_) kv.second.granted = std::max(kv.second.granted, kv.second.seq) + 1;
        save();
        Msg hello;
        hello.header = {{"kind", "rl.orchestrator_hello"}};
        send(batches_.get(), hello, std::string(kTag) + " hello to the trainer");
        for (const auto &kv : w_) credit(kv.first);
    } else {
        save();
    }

    while (!trainer_.done) {
        bool got = false; // everything that arrived
        for (auto &t : inboxes_)
            while (auto m = recv(t.get(), 0, kTag)) {
                got = true;
                handle(*m);
            }
        if (got) continue;
        if (next_step_ && *next_step_ < s_.steps &&
            trainer_.version >= *next_step_ - s_.max_async_level && !make_batch()) {
            // Rollouts needed: one credit per worker with none in flight.
            for (auto &[k, s] : w_)
                if (s.granted <= s.seq) {
                    s.granted = s.seq + 1;
                    save(); // before it leaves: a restart grants past every credit sent
                    credit(k);
                }
        }
        if (clock_s() - last_heard_ > s_.timeout)
            throw HostError{RL_ERR_TIMEOUT,
                            fmt("%s nothing from the trainer or the workers within %s (trainer at "
                                "version %lld, next batch for step %s); are they running?",
                                kTag, s_.timeout_text().c_str(), ll(trainer_.version),
                                next_step_ ? std::to_string(*next_step_).c_str() : "nil")};
        sleep_s(0.005);
    }
    for (const auto &kv : w_) credit(kv.first, true);
    say(fmt("%s done: %lld chunks, %lld batches, %lld duplicate(s) skipped, %lld chunk(s) lost, "
            "%lld worker restart(s), %lld trainer restart(s)",
            kTag, ll(stats_["chunks"]), ll(next_step_.value_or(0)), ll(stats_["duplicates"]),
            ll(stats_["lost_chunks"]), ll(stats_["worker_restarts"]),
            ll(stats_["trainer_restarts"])));
    rl::host::CallSink out;
    for (const auto &kv : stats_) out.scalars[kv.first] = static_cast<double>(kv.second);
    out.scalars["batches"] = static_cast<double>(next_step_.value_or(0));
    return new_result(std::move(out));
}

} // namespace

RL_API rl_status_t rl_disagg_orchestrator_run(rl_runtime_t *runtime, const char *config_json,
                                              rl_buffer_t *buffer, rl_instance_t *advantage,
                                              rl_result_t **out_result) {
    return boundary([&] {
        const char *fn = "rl_disagg_orchestrator_run";
        require(runtime && buffer && advantage,
                std::string(fn) + ": runtime, buffer and advantage are required");
        Orchestrator o(runtime, Settings::parse(config_json, fn), buffer, advantage);
        rl_result_t *r = o.run();
        if (out_result)
            *out_result = r;
        else
            rl_result_destroy(r);
        return RL_OK;
    });
}
