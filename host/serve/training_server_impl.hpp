// host/serve/training_server_impl.hpp: the training server's state (sessions,
// models, samplers, futures and their queues) and its Impl, shared by the
// files that implement its routes: training_server.cpp (service routes,
// create_model, futures), training_server_train.cpp (forward, backward,
// optimizer steps), training_server_checkpoints.cpp and
// training_server_sampling.cpp. Internal to rl_training_server.
#pragma once

#include "training_server.hpp"

#include "api.hpp"
#include "routed_experts_wire.hpp"
#include "tinker_losses.hpp"
#include "tinker_wire.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "inference_endpoints.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/text.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace rl::serve {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---- state ------------------------------------------------------------------------------

namespace tserver {

inline const std::regex kName("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$");

inline bool valid_name(const std::string &s) {
    return std::regex_match(s, kName) && s.find("..") == std::string::npos;
}

// Model ids may hold ':' too (Tinker's "<session>:train:<n>", which newer SDKs
// derive themselves); never '/'.
inline const std::regex kModelId("^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$");

inline bool valid_model_id(const std::string &s) {
    return std::regex_match(s, kModelId) && s.find("..") == std::string::npos;
}

inline double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Session {
    std::string id;
    Clock::time_point last_seen = Clock::now();
    bool pinned = false; ///< xorl's implicit session: never expires
    std::set<std::string> models, samplers;
    int64_t sampler_count = 0;
};

struct Model {
    std::string id, session_id;
    bool lora = false;
    int64_t lora_rank = 0;
    core::LoraConfig lora_config;
    std::shared_ptr<core::Policy> policy;       ///< a copy of the base, or the base (LoRA)
    std::shared_ptr<core::LoraAdapter> adapter; ///< LoRA: in the base's registry under the model id
    std::unique_ptr<core::Trainer> trainer;
};

struct Sampler {
    std::string id, session_id, model_path;
    std::shared_ptr<core::Policy> policy;
    /// LoRA: the adapter, in the base's registry under the sampler's id.
    std::shared_ptr<const core::LoraAdapter> adapter;
    std::unique_ptr<core::Engine> engine;
};

enum class FutureState { Queued, Running, Done, Failed };

struct Future {
    std::string id, type, model_id;
    FutureState state = FutureState::Queued;
    json result;
    std::string proto; ///< the result as protobuf, for the types that have one
    std::string error, category;
    Clock::time_point finished;
};

struct OpResult {
    json result;
    std::string proto;
};

struct Op {
    std::shared_ptr<Future> future;
    std::optional<int64_t> seq;
    std::function<OpResult()> run;
    Clock::time_point arrived = Clock::now();
    std::string session_id;
};

/// The calls of one model (or sampler), in seq_id order.
struct Lane {
    std::deque<Op> ops;
    int64_t last_seq = 0;
    bool busy = false;
};

/// A refusal while running: the future's error with category "user".
struct UserError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline std::string category_of(const std::exception &e) {
    if (dynamic_cast<const UserError *>(&e) || dynamic_cast<const ApiError *>(&e)) return "user";
    if (auto ce = dynamic_cast<const core::Error *>(&e))
        return ce->kind() == core::ErrorKind::InvalidArgument ||
                       ce->kind() == core::ErrorKind::NotFound ||
                       ce->kind() == core::ErrorKind::BadState
                   ? "user"
                   : "server";
    return "server";
}

/// A deep copy of a policy's weights (same config, dtype, device, tokenizer).
inline std::shared_ptr<core::Policy> clone_policy(const core::Policy &src) {
    const core::CausalLM &m = src.model();
    core::ModelOptions o;
    o.dtype = m.dtype();
    o.device = m.device();
    auto copy = std::make_shared<core::CausalLM>(m.config(), o);
    m.materialize_weights();
    {
        at::NoGradGuard no_grad;
        auto dst = copy->named_weights();
        auto from = m.named_weights();
        for (size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(from[i].second);
    }
    copy->aux_files() = m.aux_files();
    auto p = std::make_shared<core::Policy>(copy, src.tokenizer());
    p->set_version(src.version());
    p->set_sampling_state(src.sampling_state());
    return p;
}

inline void write_text(const fs::path &p, const std::string &text) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw core::Error(core::ErrorKind::Io, "cannot write " + p.string());
}

// "2026-11-27T07:31:02.123456+00:00" (Python's datetime.isoformat in UTC).
inline std::string iso_time_utc(int64_t microseconds) {
    const std::time_t secs = static_cast<std::time_t>(microseconds / 1000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(microseconds % 1000000));
    return buf;
}

inline json read_json_file(const fs::path &p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) return json();
    std::ostringstream text;
    text << f.rdbuf();
    return core::parse_json_or_discarded(text.str());
}

/// A checkpoint reference: tinker://<model>/<kind>/<name> (or xorl://), or
/// xorl's short forms weights/<model>/<name>, <model>/<name>, <name>.
struct CheckpointRef {
    std::string model_id, kind, name;
};

inline CheckpointRef parse_checkpoint_path(const std::string &path,
                                           const std::string &default_model,
                                           const std::string &default_kind,
                                           const std::string &field) {
    std::string rest = path;
    bool uri = false;
    for (const char *scheme : {"tinker://", "xorl://"}) {
        if (rest.rfind(scheme, 0) == 0) {
            rest = rest.substr(std::strlen(scheme));
            uri = true;
        }
    }
    const std::vector<std::string> parts = core::split(rest, '/');
    CheckpointRef r;
    if (uri && parts.size() == 3) {
        r = {parts[0], parts[1], parts[2]};
    } else if (!uri && parts.size() == 3 &&
               (parts[0] == "weights" || parts[0] == "sampler_weights")) {
        r = {parts[1], parts[0], parts[2]};
    } else if (!uri && parts.size() == 2 &&
               (parts[0] == "weights" || parts[0] == "sampler_weights")) {
        r = {default_model, parts[0], parts[1]};
    } else if (!uri && parts.size() == 2) {
        r = {parts[0], default_kind, parts[1]};
    } else if (!uri && parts.size() == 1) {
        r = {default_model, default_kind, parts[0]};
    } else {
        throw ApiError(400,
                       field + " '" + path +
                           "' is not a checkpoint path (tinker://<model_id>/weights/<name> or "
                           "tinker://<model_id>/sampler_weights/<name>)",
                       field);
    }
    if (r.kind != "weights" && r.kind != "sampler_weights")
        throw ApiError(
            400, field + " '" + path + "': the kind must be 'weights' or 'sampler_weights'", field);
    if (!valid_model_id(r.model_id) || !valid_name(r.name))
        throw ApiError(400, field + " '" + path + "' has a model id or name outside [A-Za-z0-9._-]",
                       field);
    return r;
}

/// A create_model (or create-via-load) body's user_metadata as Tinker's
/// TrainingRun carries it, an object of strings: the request's values (the SDK
/// types them Any) kept when strings, else as their JSON text; empty when
/// absent or null.
inline json user_metadata_of(const Fields &f) {
    json meta = json::object();
    const json *um = f.get("user_metadata");
    if (!um) return meta;
    if (!um->is_object())
        throw ApiError(400, f.name("user_metadata") + " must be an object (of strings)",
                       f.name("user_metadata"));
    for (const auto &[k, v] : um->items()) meta[k] = v.is_string() ? v : json(v.dump());
    return meta;
}

/// The id of xorl's implicit session (models created without a Tinker session).
inline constexpr const char *kXorlSession = "xorl";

/// tinker://<model>/<kind>/<name>, or xorl://... for a model of xorl's
/// implicit session (xorl-client parses the paths it is handed as xorl://).
inline std::string checkpoint_uri(const std::string &model_id, const std::string &kind,
                                  const std::string &name, bool xorl = false) {
    return (xorl ? "xorl://" : "tinker://") + model_id + "/" + kind + "/" + name;
}

} // namespace tserver

using namespace tserver;

struct TrainingServer::Impl {
    TrainingServerConfig cfg;
    std::shared_ptr<core::Policy> base;
    LossFactory plugins;
    std::string base_name;
    Router router;
    std::unique_ptr<HttpServer> http;

    std::mutex mu;
    std::condition_variable cv;      // lanes and futures changed
    std::condition_variable work_cv; // work to do (or stop)
    std::map<std::string, std::shared_ptr<Session>> sessions;
    std::map<std::string, std::string> gone_sessions; // id -> why
    std::map<std::string, std::shared_ptr<Model>> models;
    std::map<std::string, std::string> gone_models;
    std::map<std::string, std::shared_ptr<Sampler>> samplers;
    std::map<std::string, std::string> gone_samplers;
    std::map<std::string, std::shared_ptr<Future>> futures;
    std::map<std::string, Lane> lanes;
    std::string last_lane; // round-robin position
    int64_t queued = 0, running = 0, total = 0;
    bool stopping = false;
    std::vector<std::thread> workers;
    std::thread reaper;
    std::mutex stop_mu;
    std::mt19937_64 rng{std::random_device{}()};
    std::unique_ptr<InferenceEndpoints> endpoints; // xorl's inference endpoints

    Impl(std::shared_ptr<core::Policy> b, TrainingServerConfig c, LossFactory p)
        : cfg(std::move(c)), base(std::move(b)), plugins(std::move(p)),
          endpoints(std::make_unique<InferenceEndpoints>(cfg.host)) {}

    std::string new_id(const std::string &prefix) {
        static const char *hex = "0123456789abcdef";
        std::string s = prefix;
        uint64_t v = rng();
        for (int i = 0; i < 12; ++i, v >>= 4) s += hex[v & 15];
        return s;
    }

    // -- sessions (mu held) ------------------------------------------------------------------

    // The live entry `id` of `live` (its session seen now), else 410 naming
    // `what` and why it is gone, else 404 with `unknown`.
    template <class T>
    std::shared_ptr<T> live_locked(std::map<std::string, std::shared_ptr<T>> &live,
                                   const std::map<std::string, std::string> &gone,
                                   const std::string &id, const std::string &field,
                                   const std::string &what, const std::string &unknown) {
        if (auto it = live.find(id); it != live.end()) {
            touch_session_locked(*it->second);
            return it->second;
        }
        if (auto g = gone.find(id); g != gone.end())
            throw ApiError(410, what + " '" + id + "' " + g->second, field);
        throw ApiError(404, unknown, field);
    }
    void touch_session_locked(Session &s) { s.last_seen = Clock::now(); }
    template <class T>
    void touch_session_locked(const T &owned) {
        if (auto s = sessions.find(owned.session_id); s != sessions.end())
            s->second->last_seen = Clock::now();
    }

    std::shared_ptr<Session> session_locked(const std::string &id, const std::string &field) {
        return live_locked(sessions, gone_sessions, id, field, "session",
                           "unknown session '" + id + "' (create one with /api/v1/create_session)");
    }

    std::shared_ptr<Model> model_locked(const std::string &id, const std::string &field) {
        return live_locked(models, gone_models, id, field, "model",
                           "unknown model_id '" + id + "' (create it with /api/v1/create_model)");
    }

    /// The model `id` names (as model_locked) and, into *session_id, its
    /// session: both read under the lock.
    std::shared_ptr<Model> model_of(const std::string &id, std::string *session_id) {
        std::lock_guard<std::mutex> lock(mu);
        std::shared_ptr<Model> m = model_locked(id, "model_id");
        *session_id = m->session_id;
        return m;
    }

    std::shared_ptr<Sampler> sampler_locked(const std::string &id, const std::string &field) {
        return live_locked(samplers, gone_samplers, id, field, "sampling session",
                           "unknown sampling_session_id '" + id + "'");
    }

    /// xorl's implicit session for models created without a Tinker session.
    std::shared_ptr<Session> xorl_session_locked() {
        auto &s = sessions[kXorlSession];
        if (!s) {
            s = std::make_shared<Session>();
            s->id = kXorlSession;
            s->pinned = true;
        }
        s->last_seen = Clock::now();
        return s;
    }

    // Releases the entry `id` of `live` (its adapter, its place in its
    // session's `owned` set), remembered in `gone` with why.
    template <class T>
    void drop_locked(std::map<std::string, std::shared_ptr<T>> &live,
                     std::map<std::string, std::string> &gone,
                     std::set<std::string> Session::*owned, const std::string &id,
                     const std::string &why) {
        auto it = live.find(id);
        if (it == live.end()) return;
        if (it->second->adapter) base->remove_adapter(it->second->adapter->name());
        if (auto s = sessions.find(it->second->session_id); s != sessions.end())
            (s->second.get()->*owned).erase(id);
        live.erase(it);
        gone[id] = why;
    }
    void drop_model_locked(const std::string &id, const std::string &why) {
        drop_locked(models, gone_models, &Session::models, id, why);
        // Its lane, kept for the seq_id order, goes with it once no call is left in it.
        auto lane = lanes.find("model:" + id);
        if (lane != lanes.end() && lane->second.ops.empty() && !lane->second.busy)
            lanes.erase(lane);
    }
    void drop_sampler_locked(const std::string &id, const std::string &why) {
        drop_locked(samplers, gone_samplers, &Session::samplers, id, why);
    }

    void expire_locked(const std::string &id, const std::string &why) {
        auto it = sessions.find(id);
        if (it == sessions.end()) return;
        auto s = it->second;
        for (const auto &m : std::set<std::string>(s->models))
            drop_model_locked(m, "was released: its session " + why);
        for (const auto &m : std::set<std::string>(s->samplers))
            drop_sampler_locked(m, "was released: its session " + why);
        // Queued calls of the session fail; running ones finish.
        for (auto &[name, lane] : lanes) {
            for (auto op = lane.ops.begin(); op != lane.ops.end();) {
                if (op->session_id != id) {
                    ++op;
                    continue;
                }
                finish_locked(*op->future, std::nullopt, "session '" + id + "' " + why, "user");
                --queued;
                op = lane.ops.erase(op);
            }
        }
        sessions.erase(it);
        gone_sessions[id] = why;
        cv.notify_all();
    }

    // -- futures and lanes -------------------------------------------------------------------

    void finish_locked(Future &f, std::optional<OpResult> r, const std::string &error,
                       const std::string &category) {
        if (r) {
            f.state = FutureState::Done;
            f.result = std::move(r->result);
            f.proto = std::move(r->proto);
        } else {
            f.state = FutureState::Failed;
            f.error = error;
            f.category = category;
        }
        f.finished = Clock::now();
        cv.notify_all();
    }

    /// Queues `run` on `lane`; returns the future's id. 429 when the queue is full.
    std::string submit(const std::string &lane_name, const std::string &type,
                       const std::string &model_id, const std::string &session_id,
                       std::optional<int64_t> seq, std::function<OpResult()> run) {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) throw ApiError(503, "the server is stopping");
        if (queued >= cfg.max_queued)
            throw ApiError(429,
                           "the training server's queue is full (" +
                               std::to_string(cfg.max_queued) + " calls waiting); retry shortly",
                           "", {{"Retry-After", "1"}});
        auto f = std::make_shared<Future>();
        f->id = new_id("future-");
        f->type = type;
        f->model_id = model_id;
        futures[f->id] = f;
        Op op;
        op.future = f;
        op.seq = seq;
        op.run = std::move(run);
        op.session_id = session_id;
        Lane &lane = lanes[lane_name];
        // Sorted by seq_id; calls without one go last, in arrival order.
        auto pos = lane.ops.end();
        if (seq) {
            pos = std::find_if(lane.ops.begin(), lane.ops.end(),
                               [&](const Op &o) { return !o.seq || *o.seq > *seq; });
        }
        lane.ops.insert(pos, std::move(op));
        ++queued;
        ++total;
        work_cv.notify_one();
        return f->id;
    }

    /// Whether an empty lane stays (mu held): a live model's lane remembers the last
    /// seq_id it ran, so that the client's next call (seq_id + 1) runs at once instead
    /// of waiting seq_gap_wait_s for calls "before" it that were long done.
    bool keeps_order_locked(const std::string &lane_name, const Lane &lane) const {
        const std::string prefix = "model:";
        if (lane.last_seq == 0 || lane_name.compare(0, prefix.size(), prefix) != 0) return false;
        return models.count(lane_name.substr(prefix.size())) > 0;
    }

    /// The next runnable op (mu held): round-robin over lanes; a lane's head
    /// runs when it is the next seq_id, carries none, or waited seq_gap_wait_s.
    bool pick_locked(std::string &lane_name, Op &op) {
        if (lanes.empty()) return false;
        auto start = lanes.upper_bound(last_lane);
        for (size_t n = 0; n < lanes.size(); ++n, ++start) {
            if (start == lanes.end()) start = lanes.begin();
            Lane &lane = start->second;
            if (lane.busy || lane.ops.empty()) continue;
            const Op &head = lane.ops.front();
            const bool ready = !head.seq || *head.seq <= lane.last_seq + 1 ||
                               seconds_since(head.arrived) >= cfg.seq_gap_wait_s;
            if (!ready) continue;
            lane_name = start->first;
            last_lane = lane_name;
            op = std::move(lane.ops.front());
            lane.ops.pop_front();
            lane.busy = true;
            if (op.seq) lane.last_seq = std::max(lane.last_seq, *op.seq);
            return true;
        }
        return false;
    }

    void worker_loop() {
        std::unique_lock<std::mutex> lock(mu);
        while (true) {
            std::string lane_name;
            Op op;
            if (!pick_locked(lane_name, op)) {
                if (stopping) return;
                work_cv.wait_for(lock, std::chrono::milliseconds(100));
                continue;
            }
            --queued;
            ++running;
            op.future->state = FutureState::Running;
            lock.unlock();
            std::optional<OpResult> result;
            std::string error, category;
            try {
                result = op.run();
            } catch (const c10::Error &e) {
                error = std::string("libtorch: ") + e.what_without_backtrace();
                category = "server";
            } catch (const std::exception &e) {
                error = e.what();
                category = category_of(e);
            }
            op.run = nullptr; // release what the call held (models, tensors) outside the lock
            lock.lock();
            --running;
            finish_locked(*op.future, std::move(result), error, category);
            auto it = lanes.find(lane_name);
            if (it != lanes.end()) {
                it->second.busy = false;
                if (it->second.ops.empty() && !keeps_order_locked(lane_name, it->second))
                    lanes.erase(it);
            }
            work_cv.notify_all();
        }
    }

    void reaper_loop() {
        std::unique_lock<std::mutex> lock(mu);
        while (!stopping) {
            cv.wait_for(lock, std::chrono::milliseconds(static_cast<int64_t>(
                                  std::min(1.0, cfg.session_timeout_s / 4) * 1000)));
            if (stopping) break;
            std::vector<std::string> stale;
            for (const auto &[id, s] : sessions)
                if (!s->pinned && seconds_since(s->last_seen) > cfg.session_timeout_s)
                    stale.push_back(id);
            for (const auto &id : stale)
                expire_locked(id, "expired after " + json(cfg.session_timeout_s).dump() +
                                      " s without a heartbeat");
            for (auto it = futures.begin(); it != futures.end();) {
                const bool ended = it->second->state == FutureState::Done ||
                                   it->second->state == FutureState::Failed;
                if (ended && seconds_since(it->second->finished) > cfg.future_ttl_s)
                    it = futures.erase(it);
                else
                    ++it;
            }
        }
    }

    // -- helpers -----------------------------------------------------------------------------

    bool is_base_model(const std::string &name) const {
        if (name == base_name || name == cfg.model_path) return true;
        std::error_code ec;
        return !cfg.model_path.empty() && fs::equivalent(name, cfg.model_path, ec);
    }

    fs::path checkpoint_path(const CheckpointRef &r) const {
        return fs::path(cfg.checkpoint_dir) / r.model_id / r.kind / r.name;
    }

    int64_t vocab() const { return base->model().config().vocab_size; }

    void check_tokens(const std::vector<int64_t> &ids, const std::string &field) const {
        const int64_t v = vocab();
        for (size_t i = 0; i < ids.size(); ++i)
            if (ids[i] < 0 || ids[i] >= v)
                throw ApiError(400,
                               field + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                   " is outside the vocabulary [0, " + std::to_string(v) + ")",
                               field);
    }

    json model_info(const Model &m) const {
        return {{"type", "get_info"},
                {"model_id", m.id},
                {"model_data",
                 {{"arch", base->model().config().model_type},
                  {"model_name", base_name},
                  {"tokenizer_id", cfg.model_path.empty() ? base_name : cfg.model_path}}},
                {"is_lora", m.lora},
                {"lora_rank", m.lora ? json(m.lora_rank) : json(nullptr)},
                {"model_name", base_name}};
    }

    void add_routes();
    void route(const std::string &path, std::function<void(const Request &, Responder &)> fn,
               std::initializer_list<const char *> methods = {"POST"}) {
        router.add(methods, path, guarded(std::move(fn)));
    }

    // -- xorl's weight sync to inference endpoints ---------------------------------------------

    /// The sync keys of an add_inference_endpoint body.
    static json sync_part(const json &body) {
        json out = json::object();
        for (const char *k : {"master_address", "master_port", "group_name", "buffer_size_mb"})
            if (body.contains(k)) out[k] = body[k];
        return out;
    }

    /// Sends the model's weights to every endpoint, as a call on the model's
    /// lane (after its queued training calls), and waits for it: the model
    /// is the request's model_id, else the only live model.
    json run_sync(const InferenceEndpoints::SyncRequest &request) {
        // What cannot be synced is a SyncWeightsResponse with success false
        // (xorl-client shows its message; an HTTP error would lose it).
        auto refused = [](const std::string &why) {
            return json{{"success", false}, {"message", why}, {"endpoints_synced", json::array()}};
        };
        std::shared_ptr<Model> m;
        std::string session_id;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (!request.model_id.empty()) {
                m = model_locked(request.model_id, "model_id");
            } else if (models.size() == 1) {
                m = models.begin()->second;
            } else if (models.empty()) {
                return refused(
                    "no training model to sync: create one first (/api/v1/create_model)");
            } else {
                std::string ids;
                for (const auto &kv : models) ids += (ids.empty() ? "" : ", ") + kv.first;
                return refused("several training models are live (" + ids +
                               "): name the one to sync with model_id");
            }
            if (m->lora)
                return refused("model '" + m->id +
                               "' is a LoRA adapter; sync_inference_weights sends full weights "
                               "(start the training server with --lora off for full-weight "
                               "models, or sample the adapter through "
                               "/api/v1/create_sampling_session)");
            session_id = m->session_id;
        }
        const std::string id =
            submit("model:" + m->id, "SyncInferenceWeights", m->id, session_id, std::nullopt,
                   [this, m, request]() {
                       if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
                       OpResult out;
                       out.result = endpoints->sync(*m->policy, m->policy->version(), request);
                       return out;
                   });
        std::unique_lock<std::mutex> lock(mu);
        std::shared_ptr<Future> fut = futures.at(id);
        cv.wait(lock, [&] {
            return fut->state == FutureState::Done || fut->state == FutureState::Failed || stopping;
        });
        if (fut->state == FutureState::Failed)
            throw ApiError(fut->category == "user" ? 400 : 500, fut->error);
        if (fut->state != FutureState::Done) throw ApiError(503, "the server is stopping");
        return fut->result;
    }

    // The handlers (below).
    void create_model(const Request &req, Responder &r);
    /// Registers the model of a create_model body and queues its creation:
    /// (request id, model id).
    std::pair<std::string, std::string> create_model_submit(const json &body);
    void forward_backward(const Request &req, Responder &r, bool forward_only_route);
    void optim_step(const Request &req, Responder &r);
    void save_weights(const Request &req, Responder &r);
    void load_weights(const Request &req, Responder &r);
    void save_weights_for_sampler(const Request &req, Responder &r);
    void create_sampling_session(const Request &req, Responder &r);
    void asample(const Request &req, Responder &r);
    void retrieve_future(const Request &req, Responder &r);
    void unload_model(const Request &req, Responder &r, bool sync);
    void weights_info(const Request &req, Responder &r);
    void list_checkpoints(const Request &req, Responder &r);
    void training_run(const Request &req, Responder &r);

    /// The checkpoints of a model on disk (those whose tinker.json is written),
    /// newest first, each as Tinker's and xorl's Checkpoint: checkpoint_id,
    /// checkpoint_type, time, size_bytes, tinker_path, path.
    std::vector<json> checkpoints_of(const std::string &model_id) const;
    /// Writes <checkpoint_dir>/<model_id>/run.json: what GET
    /// /api/v1/training_runs/<model_id> answers after the model (and its
    /// session) are gone: base model, LoRA rank, owner (the session), the
    /// client's user_metadata (from user_metadata_of).
    void write_run_info(const std::string &model_id, const std::string &session_id, bool lora,
                        int64_t rank, const json &user_metadata) const;

    /// A sampler of the session over `policy`; `adapter` (may be empty) makes
    /// its LoRA adapter, registered in the base under the sampler's id.
    using AdapterMaker = std::function<std::shared_ptr<core::LoraAdapter>(const std::string &id)>;
    std::shared_ptr<Sampler> make_sampler(const std::string &session_id,
                                          std::shared_ptr<core::Policy> policy,
                                          const std::string &model_path,
                                          const AdapterMaker &adapter = {});
    tinker::SampleOutput run_sample(Sampler &s, const std::vector<int64_t> &prompt,
                                    int64_t num_samples, const core::SamplingParams &params,
                                    bool prompt_logprobs, std::optional<int64_t> last_n);
};

// ---- sessions and service routes ---------------------------------------------------------

namespace tserver {

inline std::string model_id_of(const Fields &f) {
    if (auto v = f.string("model_id")) return *v;
    if (auto v = f.string("session_id")) return *v; // xorl maps session_id to model_id
    throw ApiError(400, "model_id is required", "model_id");
}

// The call's place in its model's order (absent: runs when submitted).
inline std::optional<int64_t> seq_id_of(const Fields &f) {
    return f.integer("seq_id", 0, std::numeric_limits<int64_t>::max());
}

// The body of a call on a model: its fields, model_id (required) and seq_id.
struct ModelCall {
    json body;
    Fields f;
    std::string model_id;
    std::optional<int64_t> seq;
    explicit ModelCall(const Request &req)
        : body(json_body(req)), f(body), model_id(model_id_of(f)), seq(seq_id_of(f)) {}
    ModelCall(const ModelCall &) = delete; // f refers to body
    ModelCall &operator=(const ModelCall &) = delete;
};

inline void submitted(Responder &r, const std::string &request_id, const std::string &model_id) {
    send_json(r, {{"request_id", request_id},
                  {"model_id", model_id.empty() ? json(nullptr) : json(model_id)}});
}

} // namespace tserver

} // namespace rl::serve
