// host/serve/fields.hpp: the torch-free part of what every route shares:
// refusals that name the field (ApiError), strict reading of JSON request
// bodies (unknown fields and wrong types are 400s) and of a server's options.
// The Tinker wire (tinker_wire.hpp) and the fuzz targets (fuzz/) use it
// without the engine.
#pragma once

#include "http.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rl::serve {

using nlohmann::json;

/// A refused request: the HTTP status, a message naming the bad thing and
/// the field (`param`, OpenAI's error.param).
class ApiError : public std::runtime_error {
public:
    ApiError(int status, const std::string &message, std::string param = "", Headers headers = {})
        : std::runtime_error(message), status(status), param(std::move(param)),
          headers(std::move(headers)) {}
    int status;
    std::string param;
    Headers headers;
};

/// Throws ApiError 400 naming `param`.
[[noreturn]] void refuse(const std::string &param, const std::string &message);

/// The request body as a JSON object; an empty body is {} when allow_empty.
/// ApiError 400 for bad JSON (with the parser's position) or a non-object.
json json_body(const Request &req, bool allow_empty = false);
/// JSON text; invalid UTF-8 is replaced, never an exception.
std::string dump(const json &j);

/// Reads the fields of one JSON object strictly. Errors name the field as
/// `prefix + key` ("sampling_params.top_k"). Null counts as absent.
class Fields {
public:
    explicit Fields(const json &object, std::string prefix = "");
    /// Refuses the first key not in `known` ("unknown field 'x'").
    void only(const std::vector<std::string_view> &known) const;
    const json *get(const char *key) const; ///< null when absent or null
    bool has(const char *key) const { return get(key) != nullptr; }
    std::string name(const char *key) const { return prefix_ + key; }

    std::optional<int64_t> integer(const char *key, int64_t min, int64_t max) const;
    std::optional<double> number(const char *key, double min, double max) const;
    std::optional<bool> boolean(const char *key) const;
    std::optional<std::string> string(const char *key) const;
    /// A string or a list of strings (OpenAI's `stop`), at most `max_items`.
    std::optional<std::vector<std::string>> strings(const char *key, size_t max_items) const;
    /// A list of integers in [min, max].
    std::optional<std::vector<int64_t>> integers(const char *key, int64_t min, int64_t max) const;
    /// A field accepted only at its neutral value (frequency_penalty: 0):
    /// any other number is refused as not supported.
    void neutral(const char *key, double value) const;
    /// A field accepted only as false / absent (echo: true is refused).
    void must_be_false(const char *key, const std::string &why) const;

private:
    json o_; // a copy: callers pass temporaries
    std::string prefix_;
};

/// Reads a server's options: `text` is a JSON object (empty or null: none),
/// handed to read() as Fields; errors are core::Error starting "<what>: ".
void read_options(const std::string &text, const std::string &what,
                  const std::function<void(const Fields &)> &read);

/// The options of the HTTP side every server has, followed by `own`.
std::vector<std::string_view> http_options_and(std::initializer_list<std::string_view> own);

/// Reads the HTTP-side options (host, port, api_key, model_path,
/// max_body_bytes, max_connections, idle_timeout_s) into a server config.
template <class Config>
void read_http_options(const Fields &f, Config &c) {
    if (auto v = f.string("host")) c.host = *v;
    if (auto v = f.integer("port", 0, 65535)) c.port = static_cast<int>(*v);
    if (auto v = f.string("api_key")) c.api_key = *v;
    if (auto v = f.string("model_path")) c.model_path = *v;
    if (auto v = f.integer("max_body_bytes", 1024, int64_t{1} << 40))
        c.max_body_bytes = static_cast<size_t>(*v);
    if (auto v = f.integer("max_connections", 1, 1 << 20)) c.max_connections = static_cast<int>(*v);
    if (auto v = f.number("idle_timeout_s", 0.001, 1e9)) c.idle_timeout_s = *v;
}

/// The HttpServer settings of a server config: its host, port and limits,
/// with idle_timeout_s for the read and write timeouts too.
template <class Config>
HttpConfig http_config_of(const Config &c) {
    HttpConfig h;
    h.host = c.host;
    h.port = c.port;
    h.max_connections = c.max_connections;
    h.max_body_bytes = c.max_body_bytes;
    h.read_timeout_s = h.idle_timeout_s = h.write_timeout_s = c.idle_timeout_s;
    return h;
}

} // namespace rl::serve
