// plugins/envs/command: any external program is the verifier. See
// docs/envs.md for the protocol and how to write a verifier.
//
// The verifier is started lazily (first request) with `command` as argv, and
// spoken to one JSON line per request over its stdin/stdout ("id" first,
// "method" second, so line-oriented verifiers need no JSON parser):
//   -> {"id":7,"method":"score","task":{...},"completion":"..."}
//   <- {"id": 7, "reward": 0.5, "metrics": {"name": 1.0}}     (metrics optional)
//   -> {"id":8,"method":"sample","n":4,"seed":42}              (without `tasks`)
//   <- {"id": 8, "tasks": [{"prompt": "...", "answer": ..., "metadata": {...}}]}
//   <- {"id": 7, "error": "why it cannot judge"}              (any method)
// With multi_turn: true the env is multi-turn (kinds/env.h) and each assistant
// turn of an episode is one more request:
//   -> {"id":9,"method":"step","task":{...},"state":null,"completion":"..."}
//   <- {"id": 9, "done": false, "reward": 0, "observation": "...", "role": "user",
//       "state": {...}, "metrics": {...}}       (reward, role, state, metrics optional)
// `state` is null on an episode's first turn, then the last answer's "state".
// Each request has `timeout_s`. A verifier that does not answer in time is
// killed (RL_ERR_TIMEOUT); one that exits or closes a pipe (RL_ERR_IO), or
// prints anything but a well-formed answer with the right id (RL_ERR_IO), is
// killed too. That request fails; the next one starts a fresh verifier.
// A verifier's own {"error"} answer fails the request (RL_ERR_UNKNOWN) and
// keeps the process. Reward range: whatever the verifier returns (finite).
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>
#include "subprocess.hpp"

#include <map>
#include <memory>
#include <mutex>

namespace {

using namespace rl::sdk::env;
using namespace rl::envs; // subprocess.hpp

class CommandEnv : public rl::sdk::Env {
public:
    explicit CommandEnv(rl::sdk::Params &p) : owner_(p.owner()) {
        const json cmd = p.raw("command");
        const std::string example = R"(e.g. ["python3", "verify.py"])";
        if (cmd.is_null())
            invalid(owner_ + ": parameter 'command' (the verifier's argv) is required, " + example);
        if (!cmd.is_array() || cmd.empty())
            invalid(owner_ + ": parameter 'command' must be a non-empty array of strings (argv), " +
                    example + ", got " + dump(cmd));
        ProcessSpec spec;
        for (const auto &a : cmd) {
            if (!a.is_string())
                invalid(owner_ + ": parameter 'command' must hold strings only, got " + dump(a));
            spec.argv.push_back(a.get<std::string>());
        }
        if (spec.argv[0].empty())
            invalid(owner_ + ": parameter 'command' has an empty program name");
        timeout_s_ = p.number("timeout_s", 10.0, 0.001, 86400.0);
        max_line_ = static_cast<size_t>(
            p.integer("max_response_bytes", 16 * 1024 * 1024, 1024, int64_t(1) << 30));
        spec.discard_stderr = p.choice("stderr", "inherit", {"inherit", "discard"}) == "discard";
        spec.cwd = p.string("cwd", "");
        if (!spec.cwd.empty()) {
            struct stat st {};
            if (::stat(spec.cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
                rl::sdk::fail(RL_ERR_NOT_FOUND,
                              owner_ + ": parameter 'cwd': '" + spec.cwd + "' is not a directory");
        }

        // The child's environment: the host's, with `env` entries added or replaced.
        std::map<std::string, std::string> env;
        for (char **e = environ; e && *e; ++e) {
            const std::string kv(*e);
            const size_t eq = kv.find('=');
            if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
        const json extra = p.raw("env");
        if (!extra.is_null()) {
            if (!extra.is_object())
                invalid(owner_ + ": parameter 'env' must be an object of strings, got " +
                        dump(extra));
            for (auto it = extra.begin(); it != extra.end(); ++it) {
                if (!it.value().is_string() || it.key().empty() ||
                    it.key().find('=') != std::string::npos)
                    invalid(owner_ + ": parameter 'env' entry '" + it.key() +
                            "' must be a string under a name without '='");
                env[it.key()] = it.value().get<std::string>();
            }
        }
        for (const auto &kv : env) spec.env.push_back(kv.first + "=" + kv.second);

        const auto path = env.find("PATH");
        spec.executable = resolve_executable(spec.argv[0], spec.cwd,
                                             path == env.end() ? "/usr/bin:/bin" : path->second);
        if (spec.executable.empty())
            rl::sdk::fail(
                RL_ERR_NOT_FOUND,
                owner_ + ": parameter 'command': program '" + spec.argv[0] +
                    "' is not an executable file" +
                    (spec.argv[0].find('/') == std::string::npos ? " found in PATH" : ""));

        multi_turn_ = p.boolean("multi_turn", false);
        const std::string tasks = p.string("tasks", "");
        shuffle_ = p.boolean("shuffle", true);
        if (!tasks.empty())
            rows_ = load_jsonl(tasks, "prompt", "answer", /*answer_required=*/false, owner_);
        proc_ = std::make_unique<Subprocess>(std::move(spec));
    }

    json sample(rl::sdk::Call &call, uint64_t n, uint64_t seed) override {
        if (!rows_.empty()) {
            json out = json::array();
            for (size_t k : pick_rows(rows_.size(), n, seed, shuffle_)) {
                json meta = rows_[k].metadata;
                meta["source_line"] = rows_[k].line;
                out.push_back(make_task(rows_[k].prompt, rows_[k].answer, meta));
            }
            return out;
        }
        std::lock_guard<std::mutex> lock(mu_);
        const json resp = request(
            call, "sample", ",\"n\":" + std::to_string(n) + ",\"seed\":" + std::to_string(seed));
        auto it = resp.find("tasks");
        if (it == resp.end() || !it->is_array())
            protocol_error("its answer to 'sample' has no \"tasks\" array: " + clip(dump(resp)));
        if (it->size() != n)
            protocol_error("it returned " + std::to_string(it->size()) +
                           " tasks for n = " + std::to_string(n));
        json out = json::array();
        for (const auto &t : *it) {
            if (!t.is_object() || !t.contains("prompt") || !t["prompt"].is_string())
                protocol_error("a task lacks a string \"prompt\": " + clip(dump(t)));
            out.push_back(make_task(t["prompt"].get<std::string>(),
                                    t.contains("answer") ? t["answer"] : json(),
                                    t.contains("metadata") ? t["metadata"] : json::object()));
        }
        return out;
    }

    bool multi_turn() const override { return multi_turn_; }

    json step(rl::sdk::Call &call, const json &task, const json &state,
              std::string_view completion) override {
        std::lock_guard<std::mutex> lock(mu_);
        const json resp = request(call, "step",
                                  ",\"task\":" + dump(task) + ",\"state\":" + dump(state) +
                                      ",\"completion\":" + dump(json(std::string(completion))));
        auto d = resp.find("done");
        if (d == resp.end() || !d->is_boolean())
            protocol_error("its answer to 'step' has no boolean \"done\": " + clip(dump(resp)));
        json out{{"done", d->get<bool>()}, {"reward", 0.0}, {"state", nullptr}};
        auto r = resp.find("reward");
        if (r != resp.end() && !r->is_null()) {
            if (!r->is_number() || !std::isfinite(r->get<double>()))
                protocol_error("its \"reward\" is not a finite number: " + clip(dump(resp)));
            out["reward"] = r->get<double>();
        }
        auto o = resp.find("observation");
        if (o != resp.end() && !o->is_null()) {
            if (!o->is_string())
                protocol_error("its \"observation\" is not a string: " + clip(dump(resp)));
            out["observation"] = *o;
        } else if (!d->get<bool>()) {
            protocol_error("its answer is not done but has no \"observation\": " +
                           clip(dump(resp)));
        }
        auto role = resp.find("role");
        if (role != resp.end() && !role->is_null()) {
            if (!role->is_string() || (*role != "user" && *role != "tool"))
                protocol_error("its \"role\" must be \"user\" or \"tool\": " + clip(dump(resp)));
            out["role"] = *role;
        }
        if (resp.contains("state")) out["state"] = resp["state"];
        emit_metrics(call, resp);
        return out;
    }

    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        std::lock_guard<std::mutex> lock(mu_);
        const auto t0 = Clock::now();
        const json resp = request(call, "score",
                                  ",\"task\":" + dump(task) +
                                      ",\"completion\":" + dump(json(std::string(completion))));
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        auto r = resp.find("reward");
        if (r == resp.end() || !r->is_number() || !std::isfinite(r->get<double>()))
            protocol_error("its answer has no finite numeric \"reward\": " + clip(dump(resp)));
        const double reward = r->get<double>();
        const std::map<std::string, double> metrics = emit_metrics(call, resp);
        if (!metrics.count("verifier_seconds")) call.metric("verifier_seconds", seconds);
        return reward;
    }

private:
    // The answer's "metrics" (optional: an object of numbers), emitted.
    std::map<std::string, double> emit_metrics(rl::sdk::Call &call, const json &resp) {
        std::map<std::string, double> metrics;
        auto m = resp.find("metrics");
        if (m != resp.end() && !m->is_null()) {
            if (!m->is_object())
                protocol_error("its \"metrics\" is not an object: " + clip(dump(*m)));
            for (auto it = m->begin(); it != m->end(); ++it) {
                if (!it.value().is_number())
                    protocol_error("metric '" + it.key() +
                                   "' is not a number: " + clip(dump(it.value())));
                metrics[it.key()] = it.value().get<double>();
            }
        }
        for (const auto &kv : metrics) call.metric(kv.first, kv.second);
        return metrics;
    }

    static std::string clip(const std::string &s) {
        return s.size() <= 200 ? s : s.substr(0, 200) + "...";
    }

    // Fails the current request with RL_ERR_IO and kills the verifier (its
    // output can no longer be trusted to line up with our requests).
    [[noreturn]] void protocol_error(const std::string &what) {
        const std::string who = proc_->name();
        proc_->kill();
        rl::sdk::fail(RL_ERR_IO, owner_ + ": request " + std::to_string(next_id_) + ": " + who +
                                     " broke the protocol: " + what +
                                     "; it was stopped and will be restarted for the next request");
    }

    // One exchange; the caller holds mu_. The request line is
    // {"id":N,"method":"<method>"<rest>}: id first, then method, so verifiers
    // in line-oriented languages can pick them out without a JSON parser.
    json request(rl::sdk::Call &call, const char *method, const std::string &rest) {
        // A verifier that died since the last request is restarted first, so
        // this request does not pay for it.
        const std::string ended = proc_->poll_exit();
        if (!ended.empty())
            call.log(RL_LOG_WARN, owner_ + ": " + proc_->name() + " " + ended +
                                      " between requests; restarting it");
        try {
            proc_->start();
        } catch (const rl::sdk::Error &e) {
            rl::sdk::fail(e.status(), owner_ + ": " + e.what());
        }
        const uint64_t id = ++next_id_;
        const std::string req =
            "{\"id\":" + std::to_string(id) + ",\"method\":\"" + method + "\"" + rest + "}\n";
        const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(timeout_s_));
        std::string line;
        try {
            line = proc_->exchange(req, deadline, call.ctx() ? call.ctx()->abort_flag : nullptr,
                                   max_line_);
        } catch (const rl::sdk::Error &e) {
            proc_->kill();
            std::string msg = owner_ + ": request " + std::to_string(id) + ": " + e.what();
            if (e.status() == RL_ERR_TIMEOUT)
                msg += " (timeout_s = " + json(timeout_s_).dump() + ")";
            msg += "; it was stopped and will be restarted for the next request";
            rl::sdk::fail(e.status(), msg);
        }
        json resp;
        try {
            resp = json::parse(line);
        } catch (const json::parse_error &) {
            protocol_error("it printed a line that is not JSON: '" + clip(line) + "'");
        }
        if (!resp.is_object()) protocol_error("its answer is not a JSON object: " + clip(line));
        auto rid = resp.find("id");
        if (rid == resp.end() || !rid->is_number_integer() || rid->get<uint64_t>() != id)
            protocol_error("its answer does not carry \"id\": " + std::to_string(id) + ": " +
                           clip(line));
        auto err = resp.find("error");
        if (err != resp.end() && !err->is_null())
            rl::sdk::fail(RL_ERR_UNKNOWN,
                          owner_ + ": " + proc_->name() + " could not judge request " +
                              std::to_string(id) + ": " +
                              (err->is_string() ? err->get<std::string>() : dump(*err)));
        return resp;
    }

    std::string owner_;
    double timeout_s_ = 10.0;
    size_t max_line_ = 0;
    bool shuffle_ = true;
    bool multi_turn_ = false;
    std::vector<Row> rows_;
    std::mutex mu_; // one request at a time per verifier process
    std::unique_ptr<Subprocess> proc_;
    uint64_t next_id_ = 0;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<CommandEnv>(
    "org.rl.env.command", "command", "1.0.0",
    "Runs an external verifier program: one JSON line per request over stdin/stdout, with a "
    "timeout"))
