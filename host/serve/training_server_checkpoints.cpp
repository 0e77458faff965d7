// The training server's checkpoint routes: save and load weights, weights
// for samplers, unload, weights info, the list of checkpoints and training runs.
#include "training_server_impl.hpp"

namespace rl::serve {

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
    const std::string uri = checkpoint_uri(m->id, "weights", name, m->session_id == kXorlSession);
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
        const std::string uri =
            checkpoint_uri(m->id, "sampler_weights", *name, m->session_id == kXorlSession);
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
    // `path` in the scheme of the model's client: xorl:// for a model of
    // xorl's implicit session (its owner in run.json), tinker:// otherwise.
    const json run = read_json_file(fs::path(cfg.checkpoint_dir) / model_id / "run.json");
    const bool xorl = run.is_object() && run.value("model_owner", json()) == json(kXorlSession);
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
                                        {"path", checkpoint_uri(model_id, kind, name, xorl)}});
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

} // namespace rl::serve
