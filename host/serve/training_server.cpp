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
#include <torch/torch.h>

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

// ---- configuration ----------------------------------------------------------------------

TrainingServerConfig TrainingServerConfig::from_json(const std::string &text) {
    TrainingServerConfig c;
    c.trainer.learning_rate = 1e-4;
    c.trainer.gradient_clip = 0.0;
    read_options(text, "training server options", [&](const Fields &f) {
        f.only(http_options_and({"base_model", "checkpoint_dir", "session_timeout_s",
                                 "poll_timeout_s", "future_ttl_s", "max_queued", "workers",
                                 "max_models", "max_sample_tokens", "seq_gap_wait_s",
                                 "kv_cache_fraction", "lora", "trainer"}));
        read_http_options(f, c);
        if (auto v = f.string("base_model")) c.base_model = *v;
        if (auto v = f.string("checkpoint_dir")) c.checkpoint_dir = *v;
        if (auto v = f.number("session_timeout_s", 0.001, 1e9)) c.session_timeout_s = *v;
        if (auto v = f.number("poll_timeout_s", 0.0, 40)) c.poll_timeout_s = *v;
        if (auto v = f.number("future_ttl_s", 1, 1e9)) c.future_ttl_s = *v;
        if (auto v = f.integer("max_queued", 1, 1 << 30)) c.max_queued = *v;
        if (auto v = f.integer("workers", 1, 256)) c.workers = static_cast<int>(*v);
        if (auto v = f.integer("max_models", 1, 1 << 20)) c.max_models = *v;
        if (auto v = f.integer("max_sample_tokens", 1, int64_t{1} << 30)) c.max_sample_tokens = *v;
        if (auto v = f.number("seq_gap_wait_s", 0.0, 3600)) c.seq_gap_wait_s = *v;
        if (auto v = f.number("kv_cache_fraction", 1e-6, 1.0)) c.kv_cache_fraction = *v;
        if (auto v = f.string("lora")) {
            if (*v != "request" && *v != "off")
                throw core::Error("training server options: lora must be \"request\" or \"off\", "
                                  "got \"" +
                                  *v + "\"");
            c.lora = *v;
        }
        if (const json *t = f.get("trainer")) {
            if (!t->is_object())
                throw core::Error("training server options: trainer must be an object");
            json merged = json::parse(c.trainer.to_json());
            for (const auto &item : t->items()) merged[item.key()] = item.value();
            c.trainer = core::TrainerConfig::from_json(merged.dump());
        }
    });
    return c;
}

core::OptimOverrides tinker_adam_defaults() {
    core::OptimOverrides o;
    o.learning_rate = 1e-4;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-12;
    o.weight_decay = 0.0;
    o.gradient_clip = 0.0;
    return o;
}

// ---- state ------------------------------------------------------------------------------

namespace {

const std::regex kName("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$");

bool valid_name(const std::string &s) {
    return std::regex_match(s, kName) && s.find("..") == std::string::npos;
}

// Model ids may hold ':' too (Tinker's "<session>:train:<n>", which newer SDKs
// derive themselves); never '/'.
const std::regex kModelId("^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$");

bool valid_model_id(const std::string &s) {
    return std::regex_match(s, kModelId) && s.find("..") == std::string::npos;
}

double seconds_since(Clock::time_point t) {
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

std::string category_of(const std::exception &e) {
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
std::shared_ptr<core::Policy> clone_policy(const core::Policy &src) {
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

void write_text(const fs::path &p, const std::string &text) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw core::Error(core::ErrorKind::Io, "cannot write " + p.string());
}

// "2026-11-27T07:31:02.123456+00:00" (Python's datetime.isoformat in UTC).
std::string iso_time_utc(int64_t microseconds) {
    const std::time_t secs = static_cast<std::time_t>(microseconds / 1000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(microseconds % 1000000));
    return buf;
}

json read_json_file(const fs::path &p) {
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

CheckpointRef parse_checkpoint_path(const std::string &path, const std::string &default_model,
                                    const std::string &default_kind, const std::string &field) {
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
json user_metadata_of(const Fields &f) {
    json meta = json::object();
    const json *um = f.get("user_metadata");
    if (!um) return meta;
    if (!um->is_object())
        throw ApiError(400, f.name("user_metadata") + " must be an object (of strings)",
                       f.name("user_metadata"));
    for (const auto &[k, v] : um->items()) meta[k] = v.is_string() ? v : json(v.dump());
    return meta;
}

std::string checkpoint_uri(const std::string &model_id, const std::string &kind,
                           const std::string &name) {
    return "tinker://" + model_id + "/" + kind + "/" + name;
}

} // namespace

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
        auto &s = sessions["xorl"];
        if (!s) {
            s = std::make_shared<Session>();
            s->id = "xorl";
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
                if (it->second.ops.empty()) lanes.erase(it);
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

namespace {

std::string model_id_of(const Fields &f) {
    if (auto v = f.string("model_id")) return *v;
    if (auto v = f.string("session_id")) return *v; // xorl maps session_id to model_id
    throw ApiError(400, "model_id is required", "model_id");
}

// The call's place in its model's order (absent: runs when submitted).
std::optional<int64_t> seq_id_of(const Fields &f) {
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

void submitted(Responder &r, const std::string &request_id, const std::string &model_id) {
    send_json(r, {{"request_id", request_id},
                  {"model_id", model_id.empty() ? json(nullptr) : json(model_id)}});
}

} // namespace

void TrainingServer::Impl::add_routes() {
    // Tinker's service routes.
    route("/api/v1/client/config", [](const Request &, Responder &r) {
        // No pyqwest transport, no JWT exchange; forward_backward may come as
        // protobuf (0.22-0.24 opt in with proto_write_fwdbwd), never compressed.
        send_json(r, {{"use_pyqwest_transport", false},
                      {"pjwt_auth_enabled", false},
                      {"proto_write_fwdbwd", true},
                      {"proto_compress_fwdbwd", false},
                      {"create_model_via_load_weights", false},
                      {"sample_use_retrieve_futures", false},
                      {"custom_loss_server_side", false},
                      {"sample_join_sampling_session", false}});
    });
    route("/api/v1/client/dynamic_config", [](const Request &, Responder &r) {
        send_json(r, {{"refresh_interval_sec", 300}});
    });
    route("/api/v1/telemetry", [](const Request &, Responder &r) {
        send_json(r, {{"status", "accepted"}});
    });
    route("/api/v1/healthz",
          [](const Request &, Responder &r) {
              send_json(r, {{"status", "ok"}});
          },
          {"GET"});
    route("/health",
          [this](const Request &, Responder &r) {
              std::lock_guard<std::mutex> lock(mu);
              send_json(r, {{"status", "healthy"},
                            {"engine_running", !stopping},
                            {"active_requests", queued + running},
                            {"total_requests", total}});
          },
          {"GET"});
    route("/api/v1/get_server_capabilities",
          [this](const Request &, Responder &r) {
              const auto &c = base->model().config();
              send_json(r, {{"supported_models",
                             {{{"model_name", base_name},
                               {"max_context_length", c.max_position_embeddings},
                               {"trainable", true},
                               {"sampleable", true}}}}});
          },
          {"GET", "POST"});
    route("/api/v1/create_session", [this](const Request &req, Responder &r) {
        json body = json_body(req, true);
        (void)body;
        std::lock_guard<std::mutex> lock(mu);
        auto s = std::make_shared<Session>();
        s->id = new_id("session-");
        sessions[s->id] = s;
        send_json(r, {{"type", "create_session"},
                      {"session_id", s->id},
                      {"info_message", nullptr},
                      {"warning_message", nullptr},
                      {"error_message", nullptr}});
    });
    route("/api/v1/session_heartbeat", [this](const Request &req, Responder &r) {
        json body = json_body(req);
        Fields f(body);
        std::string id;
        if (auto v = f.string("session_id"))
            id = *v;
        else if (auto m = f.string("model_id"))
            id = *m;
        else
            throw ApiError(400, "session_id is required", "session_id");
        std::lock_guard<std::mutex> lock(mu);
        session_locked(id, "session_id");
        send_json(r, {{"type", "session_heartbeat"}, {"session_id", id}});
    });
    // tinker >= 0.38: ServiceClient.close() (and leaving `with ServiceClient()`)
    // finishes its session: {"reason": {"type": "success" | "errored" |
    // "interrupted"}, "detail": str | null}. The session becomes terminal
    // (later calls on it and its models get 410 naming the reason); the first
    // reason wins, a second finish changes nothing.
    route("/api/v1/sessions/*", [this](const Request &req, Responder &r) {
        const std::string rest = req.path.substr(std::string("/api/v1/sessions/").size());
        const size_t slash = rest.find('/');
        if (slash == std::string::npos || rest.substr(slash) != "/finish" || slash == 0)
            throw ApiError(404, "unknown route '" + req.path +
                                    "' (sessions have /api/v1/sessions/{session_id}/finish)");
        const std::string id = rest.substr(0, slash);
        json body = json_body(req, true);
        Fields f(body);
        f.only({"reason", "detail"});
        std::string reason = "success";
        if (const json *rj = f.get("reason"); rj && !rj->is_null()) {
            Fields rf(*rj, "reason.");
            rf.only({"type"});
            reason = rf.string("type").value_or("success");
            if (reason != "success" && reason != "errored" && reason != "interrupted")
                throw ApiError(400,
                               "reason.type must be success, errored or interrupted, not '" +
                                   reason + "'",
                               "reason.type");
        }
        const std::string detail = f.string("detail").value_or("");
        std::lock_guard<std::mutex> lock(mu);
        if (gone_sessions.count(id) && gone_sessions[id].rfind("was finished", 0) == 0) {
            send_json(r, {{"type", "session_finished"}, {"session_id", id}});
            return;
        }
        session_locked(id, "session_id");
        expire_locked(id, "was finished by its client (" + reason +
                              (detail.empty() ? std::string() : ": " + detail) + ")");
        send_json(r, {{"type", "session_finished"}, {"session_id", id}});
    });
    route("/api/v1/session_info",
          [this](const Request &, Responder &r) {
              std::lock_guard<std::mutex> lock(mu);
              json activity = json::object(), ids = json::array();
              for (const auto &[id, s] : sessions) activity[id] = seconds_since(s->last_seen);
              for (const auto &[id, m] : models) ids.push_back(id);
              send_json(r, {{"registered_models", ids},
                            {"active_sessions", sessions.size()},
                            {"session_idle_seconds", activity},
                            {"idle_timeout_seconds", cfg.session_timeout_s}});
          },
          {"GET"});

    // Training.
    route("/api/v1/create_model", [this](const Request &q, Responder &r) { create_model(q, r); });
    // xorl's inference endpoints: servers this one pushes its weights to.
    route("/add_inference_endpoint", [this](const Request &req, Responder &r) {
        const json body = json_body(req);
        json out = endpoints->add(body);
        if (out.value("success", false) && body.value("sync_weights", false)) {
            json sync = run_sync(InferenceEndpoints::SyncRequest::from_json(sync_part(body)));
            out["weights_synced"] = sync.value("success", false);
            out["sync_message"] = sync.value("message", "");
        }
        send_json(r, out);
    });
    route("/list_inference_endpoints",
          [this](const Request &, Responder &r) { send_json(r, endpoints->list()); },
          {"GET", "POST"});
    route("/remove_inference_endpoint", [this](const Request &req, Responder &r) {
        send_json(r, endpoints->remove(json_body(req)));
    });
    for (const char *path : {"/sync_inference_weights", "/api/v1/sync_inference_weights"})
        route(path, [this](const Request &req, Responder &r) {
            send_json(r,
                      run_sync(InferenceEndpoints::SyncRequest::from_json(json_body(req, true))));
        });
    route("/api/v1/get_info", [this](const Request &req, Responder &r) {
        json body = json_body(req);
        Fields f(body);
        const std::string id = model_id_of(f);
        std::lock_guard<std::mutex> lock(mu);
        send_json(r, model_info(*model_locked(id, "model_id")));
    });
    route("/api/v1/forward_backward",
          [this](const Request &q, Responder &r) { forward_backward(q, r, false); });
    route("/api/v1/forward",
          [this](const Request &q, Responder &r) { forward_backward(q, r, true); });
    route("/api/v1/optim_step", [this](const Request &q, Responder &r) { optim_step(q, r); });
    route("/api/v1/save_weights", [this](const Request &q, Responder &r) { save_weights(q, r); });
    route("/api/v1/load_weights", [this](const Request &q, Responder &r) { load_weights(q, r); });
    route("/api/v1/save_weights_for_sampler",
          [this](const Request &q, Responder &r) { save_weights_for_sampler(q, r); });
    route("/api/v1/unload_model",
          [this](const Request &q, Responder &r) { unload_model(q, r, false); });
    route("/api/v1/kill_session",
          [this](const Request &q, Responder &r) { unload_model(q, r, true); });
    route("/api/v1/weights_info", [this](const Request &q, Responder &r) { weights_info(q, r); });
    route("/api/v1/list_checkpoints",
          [this](const Request &q, Responder &r) { list_checkpoints(q, r); });
    // The REST client's get_training_run (tinker-cookbook reads the renderer
    // name a run was trained with from its user_metadata when it loads a
    // checkpoint of it).
    route("/api/v1/training_runs/*", [this](const Request &q, Responder &r) { training_run(q, r); },
          {"GET"});

    // Sampling.
    route("/api/v1/create_sampling_session",
          [this](const Request &q, Responder &r) { create_sampling_session(q, r); });
    route("/api/v1/asample", [this](const Request &q, Responder &r) { asample(q, r); });
    route("/api/v1/samplers/*",
          [this](const Request &req, Responder &r) {
              const std::string id = req.path.substr(std::string("/api/v1/samplers/").size());
              std::lock_guard<std::mutex> lock(mu);
              auto s = sampler_locked(id, "sampler_id");
              send_json(
                  r, {{"sampler_id", s->id},
                      {"base_model", base_name},
                      {"model_path", s->model_path.empty() ? json(nullptr) : json(s->model_path)}});
          },
          {"GET"});

    // Futures.
    route("/api/v1/retrieve_future",
          [this](const Request &q, Responder &r) { retrieve_future(q, r); });
    route("/api/v1/cancel_future", [this](const Request &req, Responder &r) {
        json body = json_body(req);
        Fields f(body);
        const auto id = f.string("request_id");
        if (!id) throw ApiError(400, "request_id is required", "request_id");
        std::lock_guard<std::mutex> lock(mu);
        for (auto &[name, lane] : lanes) {
            for (auto op = lane.ops.begin(); op != lane.ops.end(); ++op) {
                if (op->future->id != *id) continue;
                finish_locked(*op->future, std::nullopt, "cancelled by the client", "user");
                --queued;
                lane.ops.erase(op);
                send_json(r, json::object());
                return;
            }
        }
        send_json(r, json::object()); // running or finished: nothing to cancel
    });
}

// ---- create_model ------------------------------------------------------------------------

void TrainingServer::Impl::create_model(const Request &req, Responder &r) {
    const auto [id, model_id] = create_model_submit(json_body(req));
    submitted(r, id, model_id);
}

std::pair<std::string, std::string> TrainingServer::Impl::create_model_submit(const json &body) {
    Fields f(body);
    const auto base_model = f.string("base_model");
    if (base_model && !is_base_model(*base_model))
        throw ApiError(400,
                       "base_model '" + *base_model + "' is not served here; this server trains '" +
                           base_name + "'",
                       "base_model");
    if (const json *oc = f.get("optimizer_config")) {
        Fields o(*oc, "optimizer_config.");
        const auto type = o.string("type").value_or("adamw");
        if (type != "adamw")
            throw ApiError(400,
                           "optimizer_config.type '" + type + "' is not supported (adamw only)",
                           "optimizer_config.type");
    }
    const json user_metadata = user_metadata_of(f);
    bool lora = false;
    int64_t rank = 0;
    core::LoraConfig lcfg;
    // With lora "off" every model trains its full weights whatever the client
    // asks (xorl's server decides: xorl-client sends lora_config even for
    // create_training_client).
    if (const json *lc = cfg.lora == "off" ? nullptr : f.get("lora_config")) {
        // Tinker: rank, seed, train_attn / train_mlp / train_unembed; xorl-client:
        // lora_rank, alpha / lora_alpha, dropout, target_modules, lora_seed.
        Fields l(*lc, "lora_config.");
        auto v = l.integer("rank", 1, 1 << 16);
        if (!v) v = l.integer("lora_rank", 1, 1 << 16);
        if (!v) throw ApiError(400, "lora_config.rank is required", "lora_config.rank");
        lora = true;
        rank = *v;
        json c = json::object();
        c["rank"] = rank;
        if (auto a = l.number("alpha", 1e-9, 1e9)) c["alpha"] = *a;
        if (auto a = l.number("lora_alpha", 1e-9, 1e9)) c["alpha"] = *a;
        if (auto d = l.number("dropout", 0, 0.999)) c["dropout"] = *d;
        if (auto d = l.number("lora_dropout", 0, 0.999)) c["dropout"] = *d;
        if (auto sd = l.integer("seed", 0, std::numeric_limits<int64_t>::max())) c["seed"] = *sd;
        if (auto sd = l.integer("lora_seed", 0, std::numeric_limits<int64_t>::max()))
            c["seed"] = *sd;
        if (const json *tm = l.get("target_modules")) {
            c["target_modules"] = *tm;
        } else {
            const bool attn = l.boolean("train_attn").value_or(true);
            const bool mlp = l.boolean("train_mlp").value_or(true);
            if (!attn && !mlp)
                throw ApiError(400,
                               "lora_config: train_attn and train_mlp are both false: nothing "
                               "would train",
                               "lora_config.train_attn");
            json mods = json::array();
            if (attn)
                for (const char *m : {"q_proj", "k_proj", "v_proj", "o_proj"}) mods.push_back(m);
            if (mlp)
                for (const char *m : {"gate_proj", "up_proj", "down_proj"}) mods.push_back(m);
            c["target_modules"] = mods;
        }
        (void)l.boolean("train_unembed"); // the unembedding has no adapter: it stays frozen
        try {
            lcfg = core::LoraConfig::from_json(c.dump());
        } catch (const core::Error &e) {
            throw ApiError(400, std::string("lora_config: ") + e.what(), "lora_config");
        }
        if (lcfg.base_model_name_or_path.empty()) lcfg.base_model_name_or_path = cfg.model_path;
    }

    std::string session_id, model_id;
    std::shared_ptr<Session> session;
    std::shared_ptr<Model> created;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto s = f.string("session_id")) {
            session = session_locked(*s, "session_id");
            const int64_t seq = f.integer("model_seq_id", 0, 1 << 30)
                                    .value_or(static_cast<int64_t>(session->models.size()));
            model_id = session->id + ":train:" + std::to_string(seq);
        } else {
            // xorl: the client names the model (default "default").
            model_id = f.string("model_id").value_or("default");
            if (!valid_name(model_id))
                throw ApiError(400,
                               "model_id '" + model_id + "' must match [A-Za-z0-9][A-Za-z0-9_-]*",
                               "model_id");
            session = xorl_session_locked();
        }
        session_id = session->id;
        if (models.count(model_id))
            throw ApiError(400, "model_id '" + model_id + "' exists already (unload it first)",
                           "model_id");
        if (static_cast<int64_t>(models.size()) >= cfg.max_models)
            throw ApiError(429,
                           "this server holds " + std::to_string(cfg.max_models) +
                               " training models already (max_models); unload one first",
                           "", {{"Retry-After", "5"}});
        auto m = std::make_shared<Model>();
        m->id = model_id;
        m->session_id = session_id;
        m->lora = lora;
        m->lora_rank = rank;
        m->lora_config = lcfg;
        models[model_id] = m; // reserved; weights come in the call
        session->models.insert(model_id);
        gone_models.erase(model_id);
        created = m;
    }
    std::shared_ptr<Model> m = created;
    const std::string id = submit(
        "model:" + model_id, "CreateModel", model_id, session_id, 0, [this, m, user_metadata]() {
            write_run_info(m->id, m->session_id, m->lora, m->lora_rank, user_metadata);
            if (m->lora) { // an adapter of its own over the shared, frozen base
                m->adapter = base->create_adapter(m->id, m->lora_config);
                m->policy = base;
                m->trainer = std::make_unique<core::Trainer>(base, cfg.trainer, m->adapter);
            } else {
                m->policy = clone_policy(*base);
                m->trainer = std::make_unique<core::Trainer>(m->policy, cfg.trainer);
            }
            return OpResult{{{"model_id", m->id}, {"type", "create_model"}}, {}};
        });
    return {id, model_id};
}

// ---- forward / forward_backward ------------------------------------------------------------

namespace {

/// A request's datums as one trainer batch, and where each datum's tokens are.
struct PreparedBatch {
    core::TrainBatch batch;
    std::vector<int64_t> starts; ///< first token of each datum's outputs in the batch
    std::vector<int64_t> lengths;
    bool plugin = false;
};

const std::set<std::string> kTinkerInputs{"target_tokens", "weights", "logprobs", "advantages"};

} // namespace

void TrainingServer::Impl::forward_backward(const Request &req, Responder &r, bool forward_route) {
    tinker::ForwardBackwardRequest fb;
    json body; // a JSON request's body (xorl's routed_experts ride in it)
    const std::string ctype = req.header("content-type");
    if (ctype.find("application/x-protobuf") != std::string::npos) {
        const std::string enc = req.header("content-encoding");
        if (!enc.empty() && enc != "identity")
            throw ApiError(415,
                           "Content-Encoding '" + enc +
                               "' is not supported (the server does not advertise "
                               "proto_compress_fwdbwd)",
                           "content-encoding");
        fb = tinker::forward_backward_from_proto(req.body);
        if (forward_route) fb.forward_only = true;
    } else {
        body = json_body(req);
        fb = tinker::forward_backward_from_json(body, forward_route);
    }
    if (fb.model_id.empty()) throw ApiError(400, "model_id is required", "model_id");
    if (fb.data.empty())
        throw ApiError(400, "forward_backward_input.data is empty: at least one Datum is needed",
                       "forward_backward_input.data");
    const std::string in = forward_route ? "forward_input" : "forward_backward_input";

    // The loss: a loss plugin by name with its params. Tinker's built-in names
    // run the plugins that implement them, as sums (tinker_losses.hpp).
    const std::optional<tinker::PluginLoss> builtin =
        tinker::builtin_plugin(fb.loss_fn, fb.loss_fn_config);
    const bool plugin = !builtin.has_value(); // a plugin named by the client itself
    const std::string plugin_name = builtin ? builtin->plugin : fb.loss_fn;
    const std::string runs =
        builtin ? " (Tinker's " + fb.loss_fn + " runs loss plugin '" + plugin_name + "')" : "";
    if (fb.loss_fn == "dro" || fb.loss_fn == "custom" || fb.loss_fn == "stable_reinforce")
        throw ApiError(400,
                       in + ".loss_fn '" + fb.loss_fn +
                           "' is not implemented: its formula is not published (use "
                           "cross_entropy, importance_sampling, ppo, cispo or a loss plugin)",
                       in + ".loss_fn");
    if (!plugins)
        throw ApiError(400,
                       in + ".loss_fn '" + fb.loss_fn + "' is unknown" + runs +
                           ": no loss plugins are loaded",
                       in + ".loss_fn");
    std::optional<core::LossFunction> loss;
    try {
        loss = plugins(plugin_name, builtin ? builtin->params.dump() : fb.loss_fn_config.dump());
    } catch (const core::Error &e) {
        if (e.kind() == core::ErrorKind::NotFound && builtin)
            throw ApiError(400,
                           in + ".loss_fn '" + fb.loss_fn + "' runs loss plugin '" + plugin_name +
                               "', which is not loaded (is the plugins folder on the plugin "
                               "path?)",
                           in + ".loss_fn");
        if (e.kind() == core::ErrorKind::NotFound)
            throw ApiError(400,
                           in + ".loss_fn '" + fb.loss_fn +
                               "' is unknown: no loss plugin has that name (Tinker's built-in "
                               "names are cross_entropy, importance_sampling, ppo, cispo)",
                           in + ".loss_fn");
        throw ApiError(400, in + ".loss_fn_config" + runs + ": " + e.what(),
                       in + ".loss_fn_config");
    }
    {
        // Keep the per-token logprobs for the response.
        auto inner = loss->compute;
        loss->compute = [inner](const core::LossCall &call) {
            core::LossResult res = inner(call);
            if (!res.tensors.count("logprobs"))
                for (const auto &kv : call.tensors)
                    if (kv.first == "logprobs") res.tensors["logprobs"] = kv.second.to(at::kFloat);
            return res;
        };
    }
    // The batch always carries the labels (Tinker's targets); a loss that does
    // not read them gets its call without them.
    if (!loss->signature.accepts("labels")) {
        loss->signature.optional.push_back("labels");
        auto inner = loss->compute;
        loss->compute = [inner](const core::LossCall &call) {
            core::LossCall c = call;
            c.tensors.erase(std::remove_if(c.tensors.begin(), c.tensors.end(),
                                           [](const auto &kv) { return kv.first == "labels"; }),
                            c.tensors.end());
            return inner(c);
        };
    }
    const core::LossSignature &sig = loss->signature;
    auto fill_value = [](const std::string &name) {
        return name == "weights" || name == "loss_mask" ? 1.0 : 0.0;
    };
    auto inputs_list = [&] {
        auto bi = tinker::builtin_inputs(fb.loss_fn);
        std::string s;
        for (const auto &x : bi.required) s += (s.empty() ? "" : ", ") + x;
        for (const auto &x : bi.optional) s += ", " + x;
        return s;
    };

    // Datums -> one packed batch. Tinker's datums are shifted (token i of the
    // model input predicts target_tokens[i]): the sequence is the model input
    // plus the last target, scored from its second token on. xorl's
    // input_ids + labels are aligned as the trainer's batches are.
    auto pb = std::make_shared<PreparedBatch>();
    pb->plugin = plugin;
    std::vector<int64_t> ids, labels, cu{0};
    std::map<std::string, std::vector<double>> per_token;
    for (size_t i = 0; i < fb.data.size(); ++i) {
        const tinker::Datum &d = fb.data[i];
        const std::string dn = in + ".data[" + std::to_string(i) + "]";
        const int64_t n = static_cast<int64_t>(d.tokens.size());
        if (n == 0) throw ApiError(400, dn + ".model_input has no tokens", dn + ".model_input");
        check_tokens(d.tokens, dn + ".model_input");
        const tinker::Tensor *targets = nullptr, *xlabels = nullptr;
        for (const auto &kv : d.inputs) {
            const std::string field = dn + ".loss_fn_inputs." + kv.first;
            const tinker::Tensor &t = kv.second;
            if (t.shape.size() != 1 || t.shape[0] != n)
                throw ApiError(400,
                               field + " has shape " + json(t.shape).dump() +
                                   " but the model input has " + std::to_string(n) +
                                   " tokens: per-token inputs must have shape [" +
                                   std::to_string(n) + "]",
                               field);
            if (kv.first == "target_tokens") targets = &t;
            if (kv.first == "labels") xlabels = &t;
        }
        const bool shifted = xlabels == nullptr || targets != nullptr;
        if (shifted && targets == nullptr)
            throw ApiError(400, dn + ".loss_fn_inputs.target_tokens is required by " + fb.loss_fn,
                           dn + ".loss_fn_inputs.target_tokens");
        const tinker::Tensor &tgt = targets ? *targets : *xlabels;
        const std::string tname = dn + ".loss_fn_inputs." + (targets ? "target_tokens" : "labels");
        if (!tgt.is_int) throw ApiError(400, tname + " must be int64", tname);
        const int64_t start = static_cast<int64_t>(ids.size());
        ids.insert(ids.end(), d.tokens.begin(), d.tokens.end());
        if (shifted) {
            check_tokens(tgt.ints, tname);
            ids.push_back(tgt.ints.back());
            labels.push_back(-100);
            labels.insert(labels.end(), tgt.ints.begin(), tgt.ints.end());
            pb->starts.push_back(start + 1);
        } else {
            for (size_t k = 0; k < tgt.ints.size(); ++k) {
                const int64_t l = tgt.ints[k];
                if (l != -100 && (l < 0 || l >= vocab()))
                    throw ApiError(400,
                                   tname + "[" + std::to_string(k) + "] = " + std::to_string(l) +
                                       " is outside the vocabulary and not -100",
                                   tname);
            }
            labels.insert(labels.end(), tgt.ints.begin(), tgt.ints.end());
            pb->starts.push_back(start);
        }
        pb->lengths.push_back(n);
        cu.push_back(static_cast<int64_t>(ids.size()));

        // The loss inputs under the trainer's names.
        std::set<std::string> seen;
        for (const auto &kv : d.inputs) {
            const std::string field = dn + ".loss_fn_inputs." + kv.first;
            if (kv.first == "target_tokens" || kv.first == "labels") continue;
            std::string name = kv.first;
            if (!plugin) {
                if (!kTinkerInputs.count(name))
                    throw ApiError(400,
                                   field + " is not an input of " + fb.loss_fn + " (it reads " +
                                       inputs_list() + ")",
                                   field);
                if (name == "logprobs") name = "old_logprobs";
                if (!sig.accepts(name)) continue; // a Tinker input this loss does not read
            } else {
                if (name == "logprobs") name = "old_logprobs";
                if (name == "weights") name = "loss_mask";
                if (!sig.accepts(name) || name == "logprobs" || name == "entropy")
                    throw ApiError(400,
                                   field + " is not an input of loss plugin '" + fb.loss_fn +
                                       "' (read as '" + name + "')",
                                   field);
            }
            seen.insert(name);
            auto &vec = per_token[name];
            vec.resize(static_cast<size_t>(start), fill_value(name)); // datums without it
            if (shifted) vec.push_back(0.0);
            for (size_t k = 0; k < kv.second.numel(); ++k) vec.push_back(kv.second.at(k));
        }
        for (const auto &want : sig.required) {
            if (want == "logprobs" || want == "labels" || want == "entropy" ||
                want == "loss_mask" || want == "weights" || seen.count(want))
                continue;
            const std::string tinker_name = want == "old_logprobs" ? "logprobs" : want;
            throw ApiError(400,
                           dn + ".loss_fn_inputs." + tinker_name + " is required by " + fb.loss_fn,
                           dn + ".loss_fn_inputs." + tinker_name);
        }
    }
    const int64_t T = static_cast<int64_t>(ids.size());
    pb->batch.input_ids = at::tensor(ids, at::kLong);
    pb->batch.cu_seqlens = cu;
    pb->batch.tensors["labels"] = at::tensor(labels, at::kLong);
    // Tinker's losses run over the tokens with a target; a plugin that does
    // not read labels learns them from its loss mask.
    if (!plugin && !sig.accepts("labels") && sig.accepts("loss_mask"))
        pb->batch.tensors["loss_mask"] = (pb->batch.tensors["labels"] != -100).to(at::kDouble);
    for (auto &[name, vec] : per_token) {
        vec.resize(static_cast<size_t>(T), fill_value(name));
        pb->batch.tensors[name] = at::tensor(vec, at::kDouble);
    }
    // Routing replay (R3): xorl's routed_experts, one routing per datum.
    if (!body.is_null()) {
        const core::ModelConfig &mc = base->model().config();
        int64_t layers = 0;
        for (int64_t l = 0; l < mc.num_hidden_layers; ++l) layers += mc.is_moe_layer(l) ? 1 : 0;
        const int64_t k = mc.num_experts_per_tok;
        std::vector<int32_t> routes = request_routed_experts(body, in, cu, layers, k);
        if (!routes.empty())
            pb->batch.tensors["routed_experts"] =
                at::tensor(routes, at::kInt).view({T, layers, k}).clone();
    }
    if (plugin && pb->batch.tensors.count("loss_mask")) {
        const at::Tensor &mk = pb->batch.tensors["loss_mask"];
        if (!((mk == 0) | (mk == 1)).all().item<bool>())
            throw ApiError(400,
                           in + ".data[*].loss_fn_inputs.weights must be 0 or 1 for loss plugin '" +
                               fb.loss_fn + "' (read as its loss_mask)",
                           in + ".data");
    }

    std::string session_id;
    const std::shared_ptr<Model> m = model_of(fb.model_id, &session_id);
    const bool fwd_only = fb.forward_only;
    const std::string loss_name = fb.loss_fn;
    auto lf = std::make_shared<core::LossFunction>(std::move(*loss));
    const std::string id = submit(
        "model:" + m->id, fwd_only ? "Forward" : "ForwardBackward", m->id, session_id, fb.seq_id,
        [m, pb, lf, fwd_only, loss_name]() {
            if (!m->trainer)
                throw UserError("model '" + m->id + "' has no weights (create_model failed)");
            core::StepResult R = fwd_only ? m->trainer->forward(pb->batch, lf.get())
                                          : m->trainer->forward_backward(pb->batch, *lf);
            tinker::ForwardBackwardOutput out;
            out.loss_fn_output_type = pb->plugin ? "PluginLossReturn" : "TensorLossReturn";
            auto slice = [&](const char *name, size_t i) -> std::optional<std::vector<float>> {
                auto it = R.tensors.find(name);
                if (it == R.tensors.end()) return std::nullopt;
                at::Tensor t = it->second.to(at::kFloat).contiguous();
                const float *p = t.data_ptr<float>() + pb->starts[i];
                return std::vector<float>(p, p + pb->lengths[i]);
            };
            for (size_t i = 0; i < pb->starts.size(); ++i) {
                std::vector<std::pair<std::string, std::vector<float>>> fields;
                if (auto v = slice("logprobs", i)) fields.emplace_back("logprobs", std::move(*v));
                if (auto v = slice(fwd_only ? "loss.elementwise_loss" : "elementwise_loss", i))
                    fields.emplace_back("elementwise_loss", std::move(*v));
                else if (auto v2 = slice("elementwise_loss", i))
                    fields.emplace_back("elementwise_loss", std::move(*v2));
                out.outputs.push_back(std::move(fields));
            }
            out.metrics["loss:sum"] = R.loss;
            for (const auto &kv : R.metrics)
                out.metrics[kv.first.find(':') == std::string::npos ? kv.first + ":mean"
                                                                    : kv.first] = kv.second;
            out.metrics["num_tokens:sum"] = static_cast<double>(R.tokens);
            OpResult res;
            res.result = tinker::to_json(out);
            res.proto = tinker::to_proto(out);
            return res;
        });
    submitted(r, id, m->id);
}

// ---- optim_step ------------------------------------------------------------------------------

void TrainingServer::Impl::optim_step(const Request &req, Responder &r) {
    const ModelCall call(req);
    const Fields &f = call.f;
    // Tinker's AdamParams defaults fill what a 0.16 client leaves out.
    core::OptimOverrides o = tinker_adam_defaults();
    const json *ap = f.get("adam_params");
    if (const json *op = f.get("optimizer_params")) {
        Fields p(*op, "optimizer_params.");
        const auto type = p.string("type").value_or("adamw");
        if (type != "adamw" && type != "adam")
            throw ApiError(400, "optimizer_params.type '" + type + "' is not supported (Adam only)",
                           "optimizer_params.type");
        ap = op;
    }
    if (ap) {
        const std::string pre = f.get("adam_params") ? "adam_params." : "optimizer_params.";
        Fields a(*ap, pre);
        if (auto v = a.number("learning_rate", 0, 1e3)) o.learning_rate = *v;
        if (auto v = a.number("beta1", 0, 0.999999999)) o.beta1 = *v;
        if (auto v = a.number("beta2", 0, 0.999999999)) o.beta2 = *v;
        if (auto v = a.number("eps", 0, 1)) o.eps = *v;
        if (auto v = a.number("weight_decay", 0, 1e3)) o.weight_decay = *v;
        if (auto v = a.number("grad_clip_norm", 0, 1e12)) o.gradient_clip = *v;
    }
    // xorl's top-level fields win.
    if (auto v = f.number("learning_rate", 0, 1e3)) o.learning_rate = *v;
    if (auto v = f.number("lr", 0, 1e3)) o.learning_rate = *v;
    if (auto v = f.number("gradient_clip", 0, 1e12)) o.gradient_clip = *v;
    std::string session_id;
    const std::shared_ptr<Model> m = model_of(call.model_id, &session_id);
    const std::string id =
        submit("model:" + m->id, "OptimStep", m->id, session_id, call.seq, [m, o]() {
            if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
            const core::OptimResult res = m->trainer->optim_step(o);
            return OpResult{{{"metrics",
                              {{"grad_norm", res.grad_norm},
                               {"learning_rate", res.learning_rate},
                               {"step", static_cast<double>(res.step)}}},
                             {"type", "optim_step"}},
                            {}};
        });
    submitted(r, id, m->id);
}

// ---- checkpoints ------------------------------------------------------------------------------

void TrainingServer::Impl::save_weights(const Request &req, Responder &r) {
    const ModelCall call(req);
    const Fields &f = call.f;
    std::string name = f.string("path").value_or("");
    if (name.empty()) name = "checkpoint-" + std::to_string(std::time(nullptr));
    if (!valid_name(name))
        throw ApiError(400, "path '" + name + "' must be a name of [A-Za-z0-9._-] (at most 128)",
                       "path");
    const bool overwrite = f.boolean("overwrite").value_or(false);
    std::string session_id;
    const std::shared_ptr<Model> m = model_of(call.model_id, &session_id);
    const fs::path dir = checkpoint_path({m->id, "weights", name});
    const std::string uri = checkpoint_uri(m->id, "weights", name);
    const std::string base_model = base_name;
    const std::string id =
        submit("model:" + m->id, "SaveWeights", m->id, session_id, call.seq,
               [m, dir, uri, overwrite, name, base_model]() {
                   if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
                   if (fs::exists(dir)) {
                       if (!overwrite)
                           throw UserError("checkpoint '" + name + "' of model '" + m->id +
                                           "' exists already (pass overwrite: true to replace it)");
                       fs::remove_all(dir);
                   }
                   fs::create_directories(dir);
                   m->trainer->save_checkpoint(dir.string(), "{}");
                   write_text(dir / "tinker.json",
                              json{{"base_model", base_model},
                                   {"model_id", m->id},
                                   {"is_lora", m->lora},
                                   {"lora_rank", m->lora ? json(m->lora_rank) : json(nullptr)},
                                   {"lora_config", m->lora ? json::parse(m->lora_config.to_json())
                                                           : json(nullptr)}}
                                  .dump(2));
                   return OpResult{{{"path", uri}, {"type", "save_weights"}}, {}};
               });
    submitted(r, id, m->id);
}

void TrainingServer::Impl::load_weights(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    std::string model_id;
    if (!f.has("model_id") && f.has("session_id") && f.has("model_seq_id")) {
        // Create-via-load (newer SDKs' create_training_client_from_state): the
        // model of (session_id, model_seq_id) is created like the checkpoint's
        // model, then loaded.
        const auto p = f.string("path");
        if (!p) throw ApiError(400, "path is required", "path");
        const CheckpointRef ref = parse_checkpoint_path(*p, "", "weights", "path");
        const json meta = read_json_file(checkpoint_path(ref) / "tinker.json");
        if (!meta.is_object()) throw ApiError(404, "path '" + *p + "': no such checkpoint", "path");
        json create = {{"session_id", body["session_id"]},
                       {"model_seq_id", body["model_seq_id"]},
                       {"user_metadata", body.value("user_metadata", json())}};
        if (meta.value("is_lora", false)) {
            json lc = meta.contains("lora_config") && meta["lora_config"].is_object()
                          ? meta["lora_config"]
                          : json{{"rank", meta.value("lora_rank", 8)}};
            create["lora_config"] = lc;
        }
        model_id = create_model_submit(create).second;
    } else {
        model_id = model_id_of(f);
    }
    const auto seq = seq_id_of(f);
    const auto path = f.string("path");
    if (!path) throw ApiError(400, "path is required (a tinker://.../weights/<name> path)", "path");
    const bool with_optimizer = f.boolean("optimizer").value_or(false);
    const CheckpointRef ref = parse_checkpoint_path(*path, model_id, "weights", "path");
    if (ref.kind != "weights")
        throw ApiError(400,
                       "path '" + *path +
                           "' is a sampler checkpoint; load_weights needs a "
                           "training checkpoint (weights/<name>)",
                       "path");
    const fs::path dir = checkpoint_path(ref);
    std::string session_id;
    const std::shared_ptr<Model> m = model_of(model_id, &session_id);
    const TrainingServerConfig *c = &cfg;
    const std::string p = *path;
    const std::string base_model = base_name;
    const std::string id = submit(
        "model:" + m->id, "LoadWeights", m->id, session_id, seq,
        [m, dir, p, with_optimizer, c, base_model]() {
            if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
            if (!fs::is_directory(dir))
                throw UserError("path '" + p + "': no such checkpoint (" + dir.string() + ")");
            const json meta = read_json_file(dir / "tinker.json");
            if (meta.is_object() && meta.value("is_lora", false) != m->lora)
                throw UserError("path '" + p + "' is a " +
                                (meta.value("is_lora", false) ? "LoRA" : "full-weight") +
                                " checkpoint; model '" + m->id + "' is not");
            m->trainer->load_checkpoint(dir.string());
            if (!with_optimizer) // fresh optimizer state over the loaded weights
                m->trainer =
                    m->adapter ? std::make_unique<core::Trainer>(m->policy, c->trainer, m->adapter)
                               : std::make_unique<core::Trainer>(m->policy, c->trainer);
            return OpResult{{{"path", p}, {"model_id", m->id}, {"type", "load_weights"}}, {}};
        });
    submitted(r, id, m->id);
}

std::shared_ptr<Sampler> TrainingServer::Impl::make_sampler(const std::string &session_id,
                                                            std::shared_ptr<core::Policy> policy,
                                                            const std::string &model_path,
                                                            const AdapterMaker &adapter) {
    auto s = std::make_shared<Sampler>();
    s->session_id = session_id;
    s->model_path = model_path;
    s->policy = std::move(policy);
    {
        std::lock_guard<std::mutex> lock(mu);
        auto sess = sessions.find(session_id);
        if (sess == sessions.end()) throw UserError("session '" + session_id + "' is gone");
        s->id = session_id + "-sampler-" + std::to_string(sess->second->sampler_count++);
    }
    core::EngineConfig ec;
    ec.kv_cache_fraction = cfg.kv_cache_fraction;
    if (adapter) {
        s->adapter = adapter(s->id);
        ec.adapter = s->adapter->name();
    }
    s->engine = std::make_unique<core::Engine>(s->policy, ec);
    std::lock_guard<std::mutex> lock(mu);
    auto sess = sessions.find(session_id);
    if (sess == sessions.end()) {
        if (s->adapter) base->remove_adapter(s->adapter->name());
        throw UserError("session '" + session_id + "' is gone");
    }
    sess->second->samplers.insert(s->id);
    samplers[s->id] = s;
    return s;
}

void TrainingServer::Impl::save_weights_for_sampler(const Request &req, Responder &r) {
    const ModelCall call(req);
    const Fields &f = call.f;
    std::optional<std::string> name = f.string("path");
    if (!name) name = f.string("name"); // xorl
    const auto sampling_seq = f.integer("sampling_session_seq_id", 0, 1 << 30);
    if (!name && !sampling_seq)
        throw ApiError(400, "path (a name) or sampling_session_seq_id is required", "path");
    if (name && !valid_name(*name))
        throw ApiError(400, "path '" + *name + "' must be a name of [A-Za-z0-9._-] (at most 128)",
                       "path");
    std::string session_id;
    const std::shared_ptr<Model> m = model_of(call.model_id, &session_id);
    std::string id;
    if (name) {
        const fs::path dir = checkpoint_path({m->id, "sampler_weights", *name});
        const std::string uri = checkpoint_uri(m->id, "sampler_weights", *name);
        const std::string base_model = base_name;
        id = submit("model:" + m->id, "SaveWeightsForSampler", m->id, session_id, call.seq,
                    [m, dir, uri, base_model]() {
                        if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
                        if (m->adapter) { // a PEFT adapter folder
                            core::save_adapter(*m->adapter, dir.string());
                        } else {
                            fs::create_directories(dir);
                            core::save_pretrained(m->policy->model(), dir.string());
                        }
                        write_text(dir / "tinker.json",
                                   json{{"base_model", base_model},
                                        {"model_id", m->id},
                                        {"is_lora", m->lora},
                                        {"lora_rank", m->lora ? json(m->lora_rank) : json(nullptr)}}
                                       .dump(2));
                        return OpResult{{{"path", uri}, {"type", "save_weights_for_sampler"}}, {}};
                    });
    } else {
        id =
            submit("model:" + m->id, "SaveWeightsForSampler", m->id, session_id, call.seq,
                   [this, m, session_id]() {
                       if (!m->trainer) throw UserError("model '" + m->id + "' has no weights");
                       // A snapshot: later steps of the model do not change what it samples.
                       std::shared_ptr<Sampler> s;
                       if (m->adapter) {
                           s = make_sampler(session_id, base, "", [this, m](const std::string &id) {
                               auto a = base->create_adapter(id, m->adapter->config());
                               std::map<std::string, at::Tensor> params;
                               for (const auto &kv : m->adapter->named_parameters())
                                   params[kv.first] = kv.second;
                               a->assign(params, "model '" + m->id + "'");
                               a->set_version(m->adapter->version());
                               return a;
                           });
                       } else {
                           s = make_sampler(session_id, clone_policy(*m->policy), "");
                       }
                       return OpResult{{{"path", nullptr},
                                        {"sampling_session_id", s->id},
                                        {"type", "save_weights_for_sampler"}},
                                       {}};
                   });
    }
    submitted(r, id, m->id);
}

void TrainingServer::Impl::unload_model(const Request &req, Responder &r, bool sync) {
    json body = json_body(req);
    Fields f(body);
    const std::string model_id = model_id_of(f);
    std::string session_id;
    const std::shared_ptr<Model> m = model_of(model_id, &session_id);
    const std::string id =
        submit("model:" + m->id, "UnloadModel", m->id, session_id, std::nullopt, [this, m]() {
            std::lock_guard<std::mutex> lock(mu);
            drop_model_locked(m->id, "was unloaded");
            return OpResult{{{"model_id", m->id}, {"type", "unload_model"}}, {}};
        });
    if (!sync) {
        submitted(r, id, m->id);
        return;
    }
    std::unique_lock<std::mutex> lock(mu);
    auto fut = futures[id];
    cv.wait(lock,
            [&] { return fut->state == FutureState::Done || fut->state == FutureState::Failed; });
    send_json(r, {{"success", fut->state == FutureState::Done},
                  {"message", fut->state == FutureState::Done ? "model '" + m->id + "' unloaded"
                                                              : fut->error}});
}

void TrainingServer::Impl::weights_info(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    auto path = f.string("tinker_path");
    std::string field = "tinker_path";
    if (!path) {
        path = f.string("xorl_path");
        field = "xorl_path";
    }
    if (!path) throw ApiError(400, "tinker_path is required", "tinker_path");
    const CheckpointRef ref = parse_checkpoint_path(*path, "", "weights", field);
    const json meta = read_json_file(checkpoint_path(ref) / "tinker.json");
    if (!meta.is_object())
        throw ApiError(404, field + " '" + *path + "': no such checkpoint", field);
    send_json(r, {{"base_model", meta.value("base_model", base_name)},
                  {"is_lora", meta.value("is_lora", false)},
                  {"lora_rank", meta.contains("lora_rank") ? meta["lora_rank"] : json(nullptr)},
                  {"train_unembed", nullptr},
                  {"train_mlp", nullptr},
                  {"train_attn", nullptr}});
}

void TrainingServer::Impl::list_checkpoints(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    const std::string model_id = model_id_of(f);
    if (!valid_model_id(model_id)) throw ApiError(400, "model_id is not a valid id", "model_id");
    json out = json::array();
    for (json &entry : checkpoints_of(model_id)) out.push_back(std::move(entry));
    send_json(r, {{"checkpoints", out}});
}

std::vector<json> TrainingServer::Impl::checkpoints_of(const std::string &model_id) const {
    // Newest first, each with its time (ISO 8601, UTC: when its tinker.json,
    // written last, was) and size, as xorl's and Tinker's Checkpoint carry them.
    std::vector<std::pair<int64_t, json>> found; // (microseconds since the epoch, entry)
    for (const char *kind : {"weights", "sampler_weights"}) {
        const fs::path dir = fs::path(cfg.checkpoint_dir) / model_id / kind;
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        for (const auto &e : fs::directory_iterator(dir, ec)) {
            if (!e.is_directory()) continue;
            const std::string name = e.path().filename().string();
            struct stat st {};
            if (::stat((e.path() / "tinker.json").c_str(), &st) != 0) continue; // not complete
            const int64_t us = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000 +
                               static_cast<int64_t>(st.st_mtim.tv_nsec / 1000);
            uint64_t bytes = 0;
            for (const auto &f : fs::recursive_directory_iterator(e.path(), ec))
                if (f.is_regular_file(ec)) bytes += f.file_size(ec);
            found.emplace_back(us, json{{"checkpoint_id", std::string(kind) + "/" + name},
                                        {"checkpoint_type",
                                         std::string(kind) == "weights" ? "training" : "sampler"},
                                        {"time", iso_time_utc(us)},
                                        {"size_bytes", bytes},
                                        {"tinker_path", checkpoint_uri(model_id, kind, name)},
                                        {"path", checkpoint_uri(model_id, kind, name)}});
        }
    }
    std::stable_sort(found.begin(), found.end(), [](const auto &a, const auto &b) {
        return a.first != b.first ? a.first > b.first
                                  : a.second["checkpoint_id"] < b.second["checkpoint_id"];
    });
    std::vector<json> out;
    for (auto &[us, entry] : found) out.push_back(std::move(entry));
    return out;
}

namespace {
int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
} // namespace

void TrainingServer::Impl::write_run_info(const std::string &model_id,
                                          const std::string &session_id, bool lora, int64_t rank,
                                          const json &user_metadata) const {
    const fs::path dir = fs::path(cfg.checkpoint_dir) / model_id;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw core::Error(core::ErrorKind::Io,
                          "cannot create " + dir.string() + ": " + ec.message());
    write_text(dir / "run.json", json{{"training_run_id", model_id},
                                      {"base_model", base_name},
                                      {"model_owner", session_id},
                                      {"is_lora", lora},
                                      {"lora_rank", lora ? json(rank) : json(nullptr)},
                                      {"created_us", now_us()},
                                      {"user_metadata", user_metadata}}
                                     .dump(2));
}

void TrainingServer::Impl::training_run(const Request &req, Responder &r) {
    const std::string id = req.path.substr(std::string("/api/v1/training_runs/").size());
    if (id.empty() || id.find('/') != std::string::npos)
        throw ApiError(404, "unknown route '" + req.path +
                                "' (training runs are /api/v1/training_runs/{training_run_id})");
    if (!valid_model_id(id))
        throw ApiError(400, "training_run_id '" + id + "' is not a model id ([A-Za-z0-9._:-])",
                       "training_run_id");
    json run = read_json_file(fs::path(cfg.checkpoint_dir) / id / "run.json");
    const std::vector<json> checkpoints = checkpoints_of(id);
    if (!run.is_object()) {
        // A run without run.json (a checkpoint folder from an older server):
        // what its newest checkpoint says.
        if (checkpoints.empty())
            throw ApiError(404, "unknown training_run_id '" + id + "' (no model of that id)",
                           "training_run_id");
        const std::string &name =
            checkpoints.front()["checkpoint_id"].get_ref<const std::string &>();
        const json meta = read_json_file(fs::path(cfg.checkpoint_dir) / id / name / "tinker.json");
        run = {{"training_run_id", id},
               {"base_model", meta.value("base_model", base_name)},
               {"model_owner", ""},
               {"is_lora", meta.value("is_lora", false)},
               {"lora_rank", meta.contains("lora_rank") ? meta["lora_rank"] : json(nullptr)},
               {"user_metadata", json::object()}};
    }
    json last_checkpoint, last_sampler_checkpoint; // null when none
    for (const json &c : checkpoints) {
        json &slot = c["checkpoint_type"] == "training" ? last_checkpoint : last_sampler_checkpoint;
        if (slot.is_null()) slot = c;
    }
    // The last request: the session's last call while the model is live, else
    // the newest of its checkpoints and its creation.
    int64_t last_us = run.value("created_us", int64_t{0});
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto m = models.find(id); m != models.end()) {
            if (auto s = sessions.find(m->second->session_id); s != sessions.end())
                last_us = now_us() - std::chrono::duration_cast<std::chrono::microseconds>(
                                         Clock::now() - s->second->last_seen)
                                         .count();
        }
    }
    if (!checkpoints.empty()) {
        // checkpoints_of sorts by time; the newest one's time, in microseconds.
        const fs::path newest = fs::path(cfg.checkpoint_dir) / id /
                                checkpoints.front()["checkpoint_id"].get<std::string>() /
                                "tinker.json";
        struct stat st {};
        if (::stat(newest.c_str(), &st) == 0)
            last_us = std::max(last_us, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000 +
                                            static_cast<int64_t>(st.st_mtim.tv_nsec / 1000));
    }
    send_json(r, {{"training_run_id", id},
                  {"base_model", run.value("base_model", base_name)},
                  {"model_owner", run.value("model_owner", "")},
                  {"is_lora", run.value("is_lora", false)},
                  {"corrupted", false},
                  {"lora_rank", run.contains("lora_rank") ? run["lora_rank"] : json(nullptr)},
                  {"last_request_time", iso_time_utc(last_us)},
                  {"last_checkpoint", last_checkpoint},
                  {"last_sampler_checkpoint", last_sampler_checkpoint},
                  {"user_metadata", run.value("user_metadata", json::object())}});
}

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
            // A LoRA checkpoint: its adapter over the shared base.
            auto s = make_sampler(session_id, base, path, [this, dir](const std::string &id) {
                auto a = core::load_adapter(base->model(), dir.string(), id);
                base->add_adapter(a);
                return a;
            });
            send_json(r, {{"type", "create_sampling_session"},
                          {"sampling_session_id", s->id},
                          {"success", true},
                          {"model_path", path},
                          {"lora_name", s->id}});
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

// ---- futures ----------------------------------------------------------------------------------

void TrainingServer::Impl::retrieve_future(const Request &req, Responder &r) {
    json body = json_body(req);
    Fields f(body);
    const auto id = f.string("request_id");
    if (!id) throw ApiError(400, "request_id is required", "request_id");
    std::unique_lock<std::mutex> lock(mu);
    auto it = futures.find(*id);
    if (it == futures.end())
        throw ApiError(410, "request_id '" + *id + "' is unknown or expired", "request_id");
    std::shared_ptr<Future> fut = it->second;
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(cfg.poll_timeout_s * 1000));
    auto ended = [&] {
        return fut->state == FutureState::Done || fut->state == FutureState::Failed;
    };
    while (!ended() && !stopping && Clock::now() < deadline) {
        cv.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(250)));
        if (!ended() && r.client_gone()) return; // the call goes on; its result stays retrievable
    }
    if (!ended()) {
        const bool queued_now = fut->state == FutureState::Queued;
        lock.unlock();
        send_json(r,
                  {{"type", "try_again"},
                   {"request_id", *id},
                   {"queue_state", "active"},
                   {"queue_state_reason", queued_now ? "queued behind earlier calls" : "running"}});
        return;
    }
    if (fut->state == FutureState::Failed) {
        const json e = {{"error", fut->error}, {"category", fut->category}};
        lock.unlock();
        send_json(r, e);
        return;
    }
    const bool proto = !fut->proto.empty() &&
                       req.header("accept").find("application/x-protobuf") != std::string::npos;
    if (proto) {
        std::string bytes = fut->proto;
        lock.unlock();
        r.send(200, "application/x-protobuf", std::move(bytes));
        return;
    }
    const std::string text = dump(fut->result);
    lock.unlock();
    r.send(200, "application/json", text);
}

// ---- TrainingServer
// -------------------------------------------------------------------------------

TrainingServer::TrainingServer(std::shared_ptr<core::Policy> base, TrainingServerConfig config,
                               LossFactory plugins)
    : impl_(std::make_unique<Impl>(std::move(base), std::move(config), std::move(plugins))) {
    Impl &I = *impl_;
    if (!I.base) throw core::Error("training server: the base model is null");
    if (I.cfg.checkpoint_dir.empty())
        throw core::Error("training server options: checkpoint_dir is required");
    fs::create_directories(I.cfg.checkpoint_dir);
    I.base_name = I.cfg.base_model;
    if (I.base_name.empty()) {
        fs::path p(I.cfg.model_path);
        while (!p.empty() && p.filename().empty()) p = p.parent_path();
        I.base_name = p.filename().string();
        if (I.base_name.empty() || I.base_name == "." || I.base_name == "..") I.base_name = "model";
    }
    if (!I.cfg.api_key.empty()) {
        I.router.set_guard([key = I.cfg.api_key](const Request &req, Responder &r) {
            if (req.method == "GET" && (req.path == "/health" || req.path == "/api/v1/healthz"))
                return true;
            if (req.header("x-api-key") == key || req.header("authorization") == "Bearer " + key)
                return true;
            const bool none =
                req.header("x-api-key").empty() && req.header("authorization").empty();
            send_error(r, 401,
                       none ? "this server needs an API key: send 'X-API-Key: <key>'"
                            : "the API key is not valid",
                       "x-api-key", "authentication_error");
            return false;
        });
    }
    I.add_routes();
}

TrainingServer::~TrainingServer() {
    stop();
}

const TrainingServerConfig &TrainingServer::config() const {
    return impl_->cfg;
}

void TrainingServer::start() {
    Impl &I = *impl_;
    I.http = std::make_unique<HttpServer>(http_config_of(I.cfg), I.router);
    I.http->start();
    for (int i = 0; i < I.cfg.workers; ++i) I.workers.emplace_back([&I] { I.worker_loop(); });
    I.reaper = std::thread([&I] { I.reaper_loop(); });
}

int TrainingServer::port() const {
    return impl_->http ? impl_->http->port() : 0;
}

std::string TrainingServer::url() const {
    const std::string &h = impl_->cfg.host;
    return "http://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" +
           std::to_string(port());
}

void TrainingServer::stop() {
    Impl &I = *impl_;
    std::lock_guard<std::mutex> serial(I.stop_mu); // a second caller waits for the first
    {
        std::lock_guard<std::mutex> lock(I.mu);
        I.stopping = true;
        for (auto &[name, lane] : I.lanes) {
            for (auto &op : lane.ops)
                I.finish_locked(*op.future, std::nullopt, "the server stopped", "server");
            I.queued -= static_cast<int64_t>(lane.ops.size());
            lane.ops.clear();
        }
        I.cv.notify_all();
        I.work_cv.notify_all();
    }
    if (I.http) I.http->stop();
    for (auto &t : I.workers)
        if (t.joinable()) t.join();
    I.workers.clear();
    if (I.reaper.joinable()) I.reaper.join();
}

void TrainingServer::wait() {
    if (impl_->http) impl_->http->wait();
    std::lock_guard<std::mutex> serial(impl_->stop_mu); // until stop() has joined its threads
}

} // namespace rl::serve
