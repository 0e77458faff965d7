#include "training_server_impl.hpp"

namespace rl::serve {

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
    // xorl-client 0.1.0 also has connect_inference_endpoint /
    // disconnect_inference_endpoint (a persistent NCCL group kept between
    // syncs), which xorl's own server does not define: refused, saying so,
    // in the shape the client reads ({success, message}).
    for (const char *name : {"connect_inference_endpoint", "disconnect_inference_endpoint"})
        route(std::string("/") + name, [name](const Request &req, Responder &r) {
            (void)json_body(req, true);
            send_json(r, {{"success", false},
                          {"message",
                           std::string(name) +
                               " is not supported: xorl's training server defines no persistent "
                               "connection to inference endpoints; sync_inference_weights forms "
                               "the weight-update group with each registered endpoint on every "
                               "call, so there is nothing to connect or disconnect"},
                          {"connected_endpoints", json::array()}});
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
