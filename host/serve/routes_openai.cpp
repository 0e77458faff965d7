// The OpenAI-compatible routes: GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions (with vLLM's return_token_ids, top_k,
// stop_token_ids, ignore_eos and return_tokens_as_token_ids; tools as in
// chat_tools.hpp). Fields that
// change nothing at their neutral value (penalties 0, echo false, ...) are
// accepted there and refused elsewhere; unknown fields are refused.
#include "api.hpp"
#include "chat_tools.hpp"

#include "rl/core/chat_template.hpp"
#include "rl/core/error.hpp"

#include <ctime>
#include <limits>

namespace rl::serve {

namespace {

/// What the completions and chat routes share, read from the request.
struct Common {
    std::vector<std::vector<int64_t>> prompts;
    core::SamplingParams params; ///< n = 1; seed unset
    int64_t n = 1;
    std::optional<uint64_t> seed;
    bool ignore_eos = false;
    std::vector<int64_t> extra_stop_ids;
    std::optional<int64_t> max_tokens;
    bool logprobs = false;
    int64_t top_logprobs = 0;
    bool stream = false, include_usage = false, return_token_ids = false, tokens_as_ids = false;
};

constexpr int64_t kMaxN = 128;
constexpr int64_t kMaxTopLogprobs = 20;

// The fields both routes read (not max_tokens, logprobs, prompt / messages).
void read_common(const Server &server, const Fields &f, Common &c) {
    if (auto m = f.string("model"); m && *m != server.model_name()) {
        // A loaded LoRA adapter's name selects it (vLLM's convention).
        if (server.policy().find_adapter(*m)) {
            c.params.adapter = *m;
        } else {
            throw ApiError(404,
                           "the model '" + *m + "' does not exist; this server serves '" +
                               server.model_name() + "' and the LoRA adapters of GET /v1/models",
                           "model");
        }
    }
    const int64_t vocab = vocab_size(server);
    if (auto v = f.number("temperature", 0, 1e4)) c.params.temperature = *v;
    if (auto v = f.number("top_p", 0, 1)) {
        if (*v <= 0) refuse("top_p", "top_p must be above 0 (and at most 1)");
        c.params.top_p = *v;
    }
    if (auto v = f.integer("top_k", -1, vocab)) c.params.top_k = *v < 0 ? 0 : *v;
    if (auto v = f.integer("n", 1, kMaxN)) c.n = *v;
    if (auto v = f.strings("stop", 16)) c.params.stop = *v;
    if (auto v = f.integers("stop_token_ids", 0, vocab - 1)) c.extra_stop_ids = *v;
    if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()))
        c.seed = static_cast<uint64_t>(*v);
    if (auto v = f.boolean("ignore_eos")) c.ignore_eos = *v;
    if (auto v = f.boolean("stream")) c.stream = *v;
    if (const json *so = f.get("stream_options")) {
        if (!so->is_object()) refuse("stream_options", "stream_options must be an object");
        Fields s(*so, "stream_options.");
        s.only({"include_usage", "continuous_usage_stats"});
        c.include_usage = s.boolean("include_usage").value_or(false);
        s.must_be_false("continuous_usage_stats", "usage comes once, at the end");
        if (!c.stream) refuse("stream_options", "stream_options needs stream: true");
    }
    if (auto v = f.boolean("return_token_ids")) c.return_token_ids = *v;
    if (auto v = f.boolean("return_tokens_as_token_ids")) c.tokens_as_ids = *v;
    f.string("user"); // accepted, not used
    f.neutral("frequency_penalty", 0);
    f.neutral("presence_penalty", 0);
    f.neutral("repetition_penalty", 1);
    f.neutral("min_p", 0);
    f.neutral("min_tokens", 0);
    if (const json *lb = f.get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
        refuse("logit_bias", "logit_bias is not supported (only {} is accepted)");
    if (auto v = f.integer("best_of", 1, kMaxN); v && *v != 1 && *v != c.n)
        refuse("best_of", "best_of other than 1 or n is not supported");
}

// The fields read_common reads, and after them a route's own.
std::vector<std::string_view> common_and(std::initializer_list<std::string_view> own) {
    std::vector<std::string_view> known = {"model",
                                           "temperature",
                                           "top_p",
                                           "top_k",
                                           "n",
                                           "stop",
                                           "stop_token_ids",
                                           "seed",
                                           "stream",
                                           "stream_options",
                                           "return_token_ids",
                                           "return_tokens_as_token_ids",
                                           "ignore_eos",
                                           "user",
                                           "frequency_penalty",
                                           "presence_penalty",
                                           "repetition_penalty",
                                           "min_p",
                                           "min_tokens",
                                           "logit_bias",
                                           "best_of"};
    known.insert(known.end(), own);
    return known;
}

// One scheduler request per sample: prompt-major, one seed per prompt.
std::vector<SampleSpec> make_specs(Server &server, Common &c) {
    c.params.n = 1;
    c.params.stop_token_ids = stop_ids(server, c.ignore_eos, c.extra_stop_ids);
    std::vector<SampleSpec> specs;
    for (const auto &prompt : c.prompts) {
        core::SamplingParams p = c.params;
        p.seed = c.seed ? *c.seed : server.policy().next_sampling_seed();
        for (int64_t j = 0; j < c.n; ++j) {
            SampleSpec s;
            s.prompt = prompt;
            s.params = p;
            s.sample_index = j;
            s.top_logprobs = c.top_logprobs;
            specs.push_back(std::move(s));
        }
    }
    return specs;
}

const char *finish_reason(const core::RequestResult &r) {
    switch (r.end) {
        case core::RequestEnd::Stop:
            return "stop";
        case core::RequestEnd::Length:
            return "length";
        default:
            return "abort";
    }
}

// A failed sample fails the whole (non-streamed) request.
void check_no_error(const std::vector<SampleOutput> &outs) {
    for (size_t i = 0; i < outs.size(); ++i)
        if (outs[i].result.end == core::RequestEnd::Error)
            throw ApiError(500, "sample " + std::to_string(i) + " failed: " + outs[i].result.error);
}

json usage_of(const Common &c, const std::vector<SampleOutput> &outs) {
    int64_t prompt = 0, completion = 0;
    for (const auto &p : c.prompts) prompt += static_cast<int64_t>(p.size());
    for (const auto &o : outs) completion += static_cast<int64_t>(o.result.tokens.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
}

// The answer without streaming: waits for every sample, then sends `object`
// with one choice per sample (choice(i, output)), the usage and the fields of
// `extra`.
template <class Choice>
void answer(Server &server, Responder &r, SampleGroup &group, const Common &c,
            const std::string &id, const char *object, const json &extra, Choice choice) {
    if (!group.wait(r)) return;
    const auto &outs = group.outputs();
    check_no_error(outs);
    json choices = json::array();
    for (size_t i = 0; i < outs.size(); ++i) choices.push_back(choice(i, outs[i]));
    json out = {{"id", id},
                {"object", object},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"model", server.model_name()},
                {"choices", choices},
                {"usage", usage_of(c, outs)}};
    out.update(extra);
    send_json(r, out);
}

std::string token_label(const Server &server, const Common &c, int64_t id) {
    return c.tokens_as_ids ? "token_id:" + std::to_string(id) : token_text(server, id);
}

json bytes_of(const Server &server, int64_t id) {
    json b = json::array();
    const auto &tok = server.policy().tokenizer();
    if (!tok || id < 0 || id >= tok->vocab_size()) return b;
    for (unsigned char ch : tok->token_bytes(static_cast<int32_t>(id))) b.push_back(int{ch});
    return b;
}

// Completions logprobs of tokens [from, to) of one sample; `offset` is the
// text length before token `from`.
json completion_logprobs(const Server &server, const Common &c, const SampleOutput &o, size_t from,
                         size_t to, size_t offset) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (size_t i = from; i < to && i < o.result.tokens.size(); ++i) {
        const int64_t id = o.result.tokens[i];
        const float lp = o.result.logprobs[i];
        const std::string label = token_label(server, c, id);
        tokens.push_back(label);
        lps.push_back(lp);
        json top = json::object();
        top[label] = lp;
        if (i < o.events.size())
            for (const auto &[alt, alp] : o.events[i].top) {
                const std::string l = token_label(server, c, alt);
                if (!top.contains(l)) top[l] = alp;
            }
        tops.push_back(std::move(top));
        offsets.push_back(offset);
        if (i < o.events.size()) offset += o.events[i].text.size();
    }
    return {{"tokens", tokens},
            {"token_logprobs", lps},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
}

// Chat logprobs entries of tokens [from, to) of one sample.
json chat_logprobs(const Server &server, const Common &c, const SampleOutput &o, size_t from,
                   size_t to) {
    json content = json::array();
    for (size_t i = from; i < to && i < o.result.tokens.size(); ++i) {
        const int64_t id = o.result.tokens[i];
        json top = json::array();
        if (i < o.events.size())
            for (const auto &[alt, alp] : o.events[i].top)
                top.push_back({{"token", token_label(server, c, alt)},
                               {"logprob", alp},
                               {"bytes", bytes_of(server, alt)}});
        content.push_back({{"token", token_label(server, c, id)},
                           {"logprob", o.result.logprobs[i]},
                           {"bytes", bytes_of(server, id)},
                           {"top_logprobs", top}});
    }
    return {{"content", content}};
}

/// Runs a streamed request: `delta` builds the choice objects of the events
/// for (text delta, token range), one event each (none: no event unless
/// logprobs or token ids are asked for); `finish` those of the last events,
/// the last with the finish reason. An ApiError `finish` throws is sent as an
/// error event in place of the sample's last event.
void run_stream(Server &server, Responder &r, SampleGroup &group, const Common &c,
                const std::string &id, const std::string &object,
                const std::vector<SampleSpec> &specs,
                const std::function<json(size_t, const std::string &, const SampleOutput &, size_t,
                                         size_t, size_t)> &delta,
                const std::function<json(size_t, const SampleOutput &)> &finish,
                const std::function<void()> &prologue) {
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    auto envelope = [&](json choices) {
        json j = {{"id", id},
                  {"object", object},
                  {"created", created},
                  {"model", server.model_name()},
                  {"choices", std::move(choices)}};
        if (c.include_usage) j["usage"] = nullptr;
        return j;
    };
    std::vector<std::string> sent(group.size());
    std::vector<size_t> offset(group.size(), 0);
    std::vector<SampleOutput> partial(group.size());
    if (!r.start_stream()) return;
    prologue();
    auto emit = [&](size_t i, const std::string &text, size_t from, size_t to) {
        json choices = delta(i, text, partial[i], from, to, offset[i]);
        if (c.return_token_ids && !choices.empty()) {
            json ids = json::array();
            for (size_t k = from; k < to; ++k) ids.push_back(partial[i].result.tokens[k]);
            choices[0]["token_ids"] = ids;
        }
        sent[i] += text;
        offset[i] += text.size();
        for (json &choice : choices)
            if (!r.event(dump(envelope(json::array({std::move(choice)}))))) return false;
        return true;
    };
    const bool completed = group.stream(
        r,
        [&](size_t i, const core::TokenEvent &e) {
            SampleOutput &p = partial[i];
            p.add_token(e);
            if (e.text.empty() && !c.logprobs && !c.return_token_ids) return true;
            const size_t k = p.result.tokens.size();
            return emit(i, e.text, k - 1, k);
        },
        [&](size_t i, const SampleOutput &o) {
            if (o.result.end == core::RequestEnd::Error) {
                return r.event(
                    error_body(500, "sample " + std::to_string(i) + " failed: " + o.result.error));
            }
            // Text the token events held back (an open stop string that did not match).
            if (o.result.text.size() > sent[i].size() &&
                o.result.text.compare(0, sent[i].size(), sent[i]) == 0) {
                const size_t k = partial[i].result.tokens.size();
                json choices =
                    delta(i, o.result.text.substr(sent[i].size()), partial[i], k, k, offset[i]);
                sent[i] = o.result.text;
                for (json &choice : choices)
                    if (!r.event(dump(envelope(json::array({std::move(choice)}))))) return false;
            }
            json lasts;
            try {
                lasts = finish(i, o);
            } catch (const ApiError &e) {
                return r.event(
                    error_body(e.status, "choice " + std::to_string(i) + ": " + e.what(), e.param));
            }
            lasts.back()["stop_reason"] = matched_stop(server, specs[i], o.result);
            for (json &last : lasts)
                if (!r.event(dump(envelope(json::array({std::move(last)}))))) return false;
            return true;
        });
    if (!completed) return;
    if (c.include_usage) {
        json j = envelope(json::array());
        j["usage"] = usage_of(c, group.outputs());
        if (!r.event(dump(j))) return;
    }
    r.event("[DONE]");
    r.end_stream();
}

// ---- /v1/completions ---------------------------------------------------------------------

void read_prompt(Server &server, const json &p, Common &c) {
    auto fail = [] {
        refuse("prompt", "prompt must be a string, a list of strings, a list of token ids or a "
                         "list of lists of token ids");
    };
    if (p.is_string()) {
        c.prompts.push_back(encode_text(server, p.get<std::string>(), "prompt"));
    } else if (p.is_array()) {
        if (p.empty()) refuse("prompt", "prompt is an empty list");
        if (p[0].is_string()) {
            for (size_t i = 0; i < p.size(); ++i) {
                if (!p[i].is_string()) fail();
                c.prompts.push_back(encode_text(server, p[i].get<std::string>(),
                                                "prompt[" + std::to_string(i) + "]"));
            }
        } else if (p[0].is_number()) {
            Fields f(json{{"prompt", p}});
            c.prompts.push_back(*f.integers("prompt", std::numeric_limits<int64_t>::min(),
                                            std::numeric_limits<int64_t>::max()));
        } else if (p[0].is_array()) {
            for (size_t i = 0; i < p.size(); ++i) {
                if (!p[i].is_array()) fail();
                const std::string name = "prompt[" + std::to_string(i) + "]";
                Fields f(json{{name, p[i]}});
                c.prompts.push_back(*f.integers(name.c_str(), std::numeric_limits<int64_t>::min(),
                                                std::numeric_limits<int64_t>::max()));
            }
        } else {
            fail();
        }
    } else {
        fail();
    }
    for (size_t i = 0; i < c.prompts.size(); ++i) {
        const std::string name =
            c.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
        check_token_ids(server, c.prompts[i], name);
    }
}

void completions(Server &server, const Request &req, Responder &r) {
    const json body = json_body(req);
    Fields f(body);
    f.only(common_and({"prompt", "max_tokens", "logprobs", "echo", "suffix"}));
    Common c;
    read_common(server, f, c);
    f.must_be_false("echo", "the prompt is not repeated in the output");
    if (f.has("suffix")) refuse("suffix", "suffix is not supported");
    if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) {
        c.logprobs = true;
        c.top_logprobs = *v;
    }
    const json *prompt = f.get("prompt");
    if (!prompt) refuse("prompt", "prompt is required");
    read_prompt(server, *prompt, c);
    const int64_t max_tokens =
        f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max()).value_or(16);
    for (size_t i = 0; i < c.prompts.size(); ++i)
        check_lengths(server, c.prompts[i].size(), max_tokens,
                      c.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]",
                      "max_tokens");
    c.params.max_tokens = max_tokens;

    const std::string id = server.new_request_id("cmpl");
    std::vector<SampleSpec> specs = make_specs(server, c);
    SampleGroup group(server, id);
    group.submit(specs);

    auto choice_base = [&](size_t i) {
        json ch = {{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
        return ch;
    };
    if (c.stream) {
        run_stream(
            server, r, group, c, id, "text_completion", specs,
            [&](size_t i, const std::string &text, const SampleOutput &o, size_t from, size_t to,
                size_t offset) {
                json ch = choice_base(i);
                ch["text"] = text;
                if (c.logprobs && to > from)
                    ch["logprobs"] = completion_logprobs(server, c, o, from, to, offset);
                if (c.return_token_ids && from == 0 && to == 1)
                    ch["prompt_token_ids"] = specs[i].prompt;
                return json::array({ch});
            },
            [&](size_t i, const SampleOutput &o) {
                json ch = choice_base(i);
                ch["finish_reason"] = finish_reason(o.result);
                return json::array({ch});
            },
            [] {});
        return;
    }
    answer(server, r, group, c, id, "text_completion", json::object(),
           [&](size_t i, const SampleOutput &o) {
               json ch = choice_base(i);
               ch["text"] = o.result.text;
               ch["finish_reason"] = finish_reason(o.result);
               ch["stop_reason"] = matched_stop(server, specs[i], o.result);
               if (c.logprobs)
                   ch["logprobs"] = completion_logprobs(server, c, o, 0, o.result.tokens.size(), 0);
               if (c.return_token_ids) {
                   ch["token_ids"] = o.result.tokens;
                   ch["prompt_token_ids"] = specs[i].prompt;
               }
               return ch;
           });
}

// ---- /v1/chat/completions -----------------------------------------------------------------

// The messages as the template reads them: content parts joined into text.
ojson read_messages(const ojson *m) {
    if (!m) refuse("messages", "messages is required");
    if (!m->is_array() || m->empty())
        refuse("messages", "messages must be a non-empty list of {role, content} objects");
    ojson out = ojson::array();
    for (size_t i = 0; i < m->size(); ++i) {
        const std::string at = "messages[" + std::to_string(i) + "]";
        const ojson &msg = (*m)[i];
        if (!msg.is_object()) refuse(at, at + " must be an object");
        ojson copy = msg;
        auto role = msg.find("role");
        if (role == msg.end() || !role->is_string() || role->get<std::string>().empty())
            refuse(at + ".role", at + ".role must be a non-empty string");
        auto content = msg.find("content");
        if (content != msg.end() && content->is_array()) {
            std::string text;
            for (size_t k = 0; k < content->size(); ++k) {
                const ojson &part = (*content)[k];
                const std::string pat = at + ".content[" + std::to_string(k) + "]";
                if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
                    refuse(pat, pat + " must be an object with a 'type'");
                if (part["type"] != "text")
                    refuse(pat + ".type", pat + ".type '" + part["type"].get<std::string>() +
                                              "' is not supported (text only)");
                if (!part.contains("text") || !part["text"].is_string())
                    refuse(pat + ".text", pat + ".text must be a string");
                if (!text.empty()) text += "\n";
                text += part["text"].get<std::string>();
            }
            copy["content"] = text;
        } else if (content != msg.end() && !content->is_string() && !content->is_null()) {
            refuse(at + ".content", at + ".content must be a string or a list of text parts");
        }
        out.push_back(template_message(copy, i));
    }
    return out;
}

// Renders the conversation with the model's template and encodes it so that
// special-token text inside message contents stays plain text, while the
// template's own special tokens stay control tokens (docs/model.md, "Special
// tokens in user text").
std::string odump(const ojson &j) {
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::vector<int64_t> encode_chat(Server &server, const ojson &messages,
                                 const core::ChatTemplateOptions &options) {
    const auto &tok_ptr = server.policy().tokenizer();
    if (!tok_ptr) refuse("messages", "the model has no tokenizer, so it cannot render chats");
    const core::Tokenizer &tok = *tok_ptr;
    if (tok.chat_template_source().empty())
        refuse("messages", "the model has no chat template (tokenizer_config.json "
                           "chat_template or chat_template.jinja); use /v1/completions");
    auto render = [&](const ojson &m) {
        try {
            return tok.apply_chat_template_json(odump(m), options);
        } catch (const core::Error &e) {
            throw ApiError(400, std::string("the chat template refused the messages: ") + e.what(),
                           "messages");
        }
    };
    const std::string text = render(messages);
    // Each content replaced by a marker no content holds: where the markers
    // land is where the contents are.
    ojson shaped = messages;
    std::vector<std::pair<size_t, std::string>> marks; // message, marker
    for (size_t i = 0; i < messages.size(); ++i) {
        const ojson &content = messages[i]["content"];
        if (!content.is_string()) continue;
        std::string mark = "RLSERVECONTENT" + std::to_string(i) + "Z";
        while (content.get<std::string>().find(mark) != std::string::npos) mark += "Z";
        shaped[i]["content"] = mark;
        marks.emplace_back(i, mark);
    }
    const std::string shape = render(shaped);
    core::EncodeOptions o;
    std::string rebuilt;
    size_t at = 0;
    bool located = true;
    for (const auto &[i, mark] : marks) {
        const size_t p = shape.find(mark, at);
        if (p == std::string::npos || shape.find(mark, p + 1) != std::string::npos) {
            located = false;
            break;
        }
        const std::string content = messages[i]["content"].get<std::string>();
        rebuilt += shape.substr(at, p - at);
        o.plain_spans.emplace_back(rebuilt.size(), rebuilt.size() + content.size());
        rebuilt += content;
        at = p + mark.size();
    }
    if (located) rebuilt += shape.substr(at);
    if (!located || rebuilt != text) {
        // The template rewrites contents (trimming, dropping old reasoning):
        // their places are unknown. Fine unless one holds special-token text.
        o.plain_spans.clear();
        for (const auto &[i, mark] : marks) {
            const std::string content = messages[i]["content"].get<std::string>();
            for (const auto &added : tok.added_tokens())
                if (added.special && content.find(added.content) != std::string::npos)
                    refuse("messages[" + std::to_string(i) + "].content",
                           "messages[" + std::to_string(i) + "].content holds the special token " +
                               added.content +
                               " and the chat template rewrites message contents, so it cannot "
                               "be kept plain text");
        }
    }
    const std::vector<int32_t> ids = tok.encode(text, o);
    return std::vector<int64_t>(ids.begin(), ids.end());
}

void chat_completions(Server &server, const Request &req, Responder &r) {
    const json body = json_body(req);
    Fields f(body);
    f.only(common_and({"messages", "max_tokens", "max_completion_tokens", "logprobs",
                       "top_logprobs", "chat_template_kwargs", "add_generation_prompt", "tools",
                       "tool_choice", "parallel_tool_calls", "response_format"}));
    Common c;
    read_common(server, f, c);
    c.logprobs = f.boolean("logprobs").value_or(false);
    if (auto v = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
        if (!c.logprobs && *v > 0) refuse("top_logprobs", "top_logprobs needs logprobs: true");
        c.top_logprobs = *v;
    }
    const auto &tokenizer = server.policy().tokenizer();
    // The request again with its keys in the order sent: messages and tools
    // render as the client wrote them (json_body accepted the same text).
    const ojson ordered = ojson::parse(req.body, nullptr, false);
    const ChatTools tools =
        read_chat_tools(f, ordered, tokenizer ? tokenizer->chat_template_source() : std::string());
    if (const json *rf = f.get("response_format")) {
        if (!rf->is_object() || rf->value("type", "") != "text")
            refuse("response_format",
                   "response_format other than {\"type\": \"text\"} is not supported");
    }
    core::ChatTemplateOptions opts;
    opts.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    if (const json *kw = f.get("chat_template_kwargs")) {
        if (!kw->is_object())
            refuse("chat_template_kwargs", "chat_template_kwargs must be an object");
        opts.variables_json = dump(*kw);
    }
    if (!tools.tools.is_null()) opts.tools_json = odump(tools.tools);
    const ojson messages = read_messages(f.get("messages") ? &ordered["messages"]
                                                           : static_cast<const ojson *>(nullptr));
    c.prompts.push_back(encode_chat(server, messages, opts));
    // --reasoning-parser qwen3: does the prompt leave a <think> block open? (A
    // forced tool call starts the turn with the call: no reasoning to read.)
    const bool reasoning = server.config().reasoning_parser == "qwen3" && !tools.forced();
    bool think_opened = false;
    if (reasoning) {
        const auto &p = c.prompts[0];
        const size_t tail = std::min<size_t>(p.size(), 8);
        think_opened = opens_thinking(tokenizer->decode(
            std::vector<int32_t>(p.end() - static_cast<std::ptrdiff_t>(tail), p.end())));
    }
    // tool_choice "required" or a named function: the assistant turn starts
    // with the family's call opening, and the model continues from there.
    const std::string forced = tools.forced_prefix();
    if (!forced.empty())
        for (int32_t t : tokenizer->encode(forced)) c.prompts[0].push_back(t);
    check_token_ids(server, c.prompts[0], "messages");

    const std::optional<int64_t> a =
        f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max());
    const std::optional<int64_t> b =
        f.integer("max_completion_tokens", 1, std::numeric_limits<int64_t>::max());
    if (a && b && *a != *b)
        refuse("max_completion_tokens", "max_tokens and max_completion_tokens disagree");
    const std::string max_name = b ? "max_completion_tokens" : "max_tokens";
    const int64_t room =
        server.scheduler().max_context() - static_cast<int64_t>(c.prompts[0].size());
    // Without a limit: what the context has room for, within the server's limit.
    const int64_t max_tokens =
        b   ? *b
        : a ? *a
            : std::max<int64_t>(1, std::min(server.config().max_tokens_limit, room));
    check_lengths(server, c.prompts[0].size(), max_tokens, "messages", max_name);
    c.params.max_tokens = max_tokens;

    const std::string id = server.new_request_id("chatcmpl");
    std::vector<SampleSpec> specs = make_specs(server, c);
    SampleGroup group(server, id);
    group.submit(specs);

    if (c.stream) {
        const int64_t created = static_cast<int64_t>(std::time(nullptr));
        // One reader of tool calls per sample (each passes content on without tools).
        std::vector<ToolCallStream> readers;
        std::vector<ReasoningStream> thinking;
        readers.reserve(specs.size());
        for (size_t i = 0; i < specs.size(); ++i) {
            readers.emplace_back(tools);
            thinking.emplace_back(think_opened);
        }
        // The deltas of a piece of text: its reasoning, then its content's.
        auto deltas_of = [&](size_t i, const std::pair<std::string, std::string> &parts) {
            std::vector<json> out;
            if (!parts.first.empty()) out.push_back({{"reasoning_content", parts.first}});
            for (json &d : readers[i].feed(parts.second)) out.push_back(std::move(d));
            return out;
        };
        auto choice_of = [](size_t i, json delta) {
            return json{{"index", i},
                        {"delta", std::move(delta)},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}};
        };
        run_stream(
            server, r, group, c, id, "chat.completion.chunk", specs,
            [&](size_t i, const std::string &text, const SampleOutput &o, size_t from, size_t to,
                size_t) {
                json choices = json::array();
                const auto parts =
                    reasoning ? thinking[i].feed(text) : std::make_pair(std::string(), text);
                for (json &d : deltas_of(i, parts)) choices.push_back(choice_of(i, std::move(d)));
                const bool lp = c.logprobs && to > from;
                // Tokens whose text is held back still carry their logprobs and ids.
                if (choices.empty() && (lp || c.return_token_ids || !tools.parse()))
                    choices.push_back(choice_of(i, {{"content", ""}}));
                if (lp) choices[0]["logprobs"] = chat_logprobs(server, c, o, from, to);
                return choices;
            },
            [&](size_t i, const SampleOutput &o) {
                std::string finish = finish_reason(o.result);
                json choices = json::array();
                if (reasoning)
                    for (json &d : deltas_of(i, thinking[i].finish()))
                        choices.push_back(choice_of(i, std::move(d)));
                for (json &d : readers[i].finish(finish))
                    choices.push_back(choice_of(i, std::move(d)));
                json last = choice_of(i, json::object());
                last["finish_reason"] = finish;
                choices.push_back(std::move(last));
                return choices;
            },
            [&] {
                // The role first, for every choice (and the prompt ids when asked).
                for (size_t i = 0; i < specs.size(); ++i) {
                    json j = {{"id", id},
                              {"object", "chat.completion.chunk"},
                              {"created", created},
                              {"model", server.model_name()},
                              {"choices",
                               json::array({{{"index", i},
                                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                                             {"logprobs", nullptr},
                                             {"finish_reason", nullptr}}})}};
                    if (c.include_usage) j["usage"] = nullptr;
                    if (c.return_token_ids && i == 0) j["prompt_token_ids"] = c.prompts[0];
                    if (!r.event(dump(j))) return;
                }
            });
        return;
    }
    const json extra =
        c.return_token_ids ? json{{"prompt_token_ids", c.prompts[0]}} : json::object();
    answer(server, r, group, c, id, "chat.completion", extra, [&](size_t i, const SampleOutput &o) {
        std::string finish = finish_reason(o.result);
        json message;
        try {
            if (reasoning) {
                const Reasoning parts = split_reasoning(o.result.text, think_opened);
                message = reply_message(parts.content, tools, finish);
                if (parts.found) {
                    message["reasoning_content"] = parts.reasoning;
                    if (message["content"] == "") message["content"] = nullptr;
                }
            } else {
                message = reply_message(forced + o.result.text, tools, finish);
            }
        } catch (const ApiError &e) {
            throw ApiError(e.status, "choice " + std::to_string(i) + ": " + e.what(), e.param);
        }
        json ch = {{"index", i},
                   {"message", std::move(message)},
                   {"logprobs", nullptr},
                   {"finish_reason", finish},
                   {"stop_reason", matched_stop(server, specs[i], o.result)}};
        if (c.logprobs) ch["logprobs"] = chat_logprobs(server, c, o, 0, o.result.tokens.size());
        if (c.return_token_ids) ch["token_ids"] = o.result.tokens;
        return ch;
    });
}

} // namespace

void add_openai_routes(Server &server) {
    Router &router = server.router();
    Server *s = &server;
    router.add("GET", "/v1/models", guarded([s](const Request &, Responder &r) {
                   json model = {{"id", s->model_name()},
                                 {"object", "model"},
                                 {"created", 0},
                                 {"owned_by", "rl"},
                                 {"root", s->config().model_path.empty() ? s->model_name()
                                                                         : s->config().model_path},
                                 {"parent", nullptr},
                                 {"max_model_len", s->scheduler().max_context()}};
                   json data = json::array({model});
                   // Loaded LoRA adapters, as SGLang and vLLM list them: their
                   // parent is the base model.
                   for (const auto &[name, path] : s->adapters())
                       data.push_back({{"id", name},
                                       {"object", "model"},
                                       {"created", 0},
                                       {"owned_by", "rl"},
                                       {"root", path},
                                       {"parent", s->model_name()},
                                       {"max_model_len", s->scheduler().max_context()}});
                   send_json(r, {{"object", "list"}, {"data", std::move(data)}});
               }));
    router.add("POST", "/v1/completions",
               guarded([s](const Request &req, Responder &r) { completions(*s, req, r); }));
    router.add("POST", "/v1/chat/completions",
               guarded([s](const Request &req, Responder &r) { chat_completions(*s, req, r); }));
}

} // namespace rl::serve
