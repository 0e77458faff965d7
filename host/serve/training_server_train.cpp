// The training server's forward, forward_backward and optim_step routes.
#include "training_server_impl.hpp"

namespace rl::serve {

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
        std::vector<int64_t> rows;
        std::vector<int32_t> routes = request_routed_experts(body, in, cu, layers, k, &rows);
        // xorl's routed_expert_logits: the recorded weights of those experts.
        std::vector<float> weights = request_routed_expert_logits(body, in, cu, layers, k, rows);
        if (!routes.empty())
            pb->batch.tensors["routed_experts"] =
                at::tensor(routes, at::kInt).view({T, layers, k}).clone();
        if (!weights.empty())
            pb->batch.tensors["routed_expert_weights"] =
                at::tensor(weights, at::kFloat).view({T, layers, k}).clone();
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

} // namespace rl::serve
