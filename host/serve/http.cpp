// host/serve/http.cpp: the HTTP layer's requests, responders, errors and router, and the
// helpers http_internal.hpp declares; the server is in http_server.cpp, the client in
// http_client.cpp (Boost.Beast is included by these three only).
#include "http.hpp"
#include "http_internal.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>

namespace rl::serve {

using namespace http_detail;

namespace http_detail {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// Beast's string_view (boost::string_view in Boost 1.74) from / to the standard one.
beast::string_view bsv(std::string_view s) {
    return {s.data(), s.size()};
}
std::string_view ssv(beast::string_view s) {
    return {s.data(), s.size()};
}

std::chrono::steady_clock::duration seconds(double s) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::max(s, 0.001)));
}

} // namespace http_detail

namespace {

std::string find_header(const Headers &headers, std::string_view name) {
    const std::string want = lower(name);
    for (const auto &[k, v] : headers)
        if (lower(k) == want) return v;
    return {};
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// application/x-www-form-urlencoded decoding ('+' is a space).
std::string percent_decode(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '+') {
            out += ' ';
        } else if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 &&
                   hex_value(s[i + 2]) >= 0) {
            out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
            i += 2;
        } else {
            out += s[i];
        }
    }
    return out;
}

std::vector<std::pair<std::string, std::string>> parse_query(std::string_view q) {
    std::vector<std::pair<std::string, std::string>> out;
    while (!q.empty()) {
        const size_t amp = q.find('&');
        const std::string_view part = q.substr(0, amp);
        if (!part.empty()) {
            const size_t eq = part.find('=');
            out.emplace_back(percent_decode(part.substr(0, eq)),
                             eq == std::string_view::npos ? ""
                                                          : percent_decode(part.substr(eq + 1)));
        }
        if (amp == std::string_view::npos) break;
        q.remove_prefix(amp + 1);
    }
    return out;
}

} // namespace

// ---- requests, responders, errors --------------------------------------------------

std::string Request::header(std::string_view name) const {
    return find_header(headers, name);
}

std::optional<std::string> Request::query_param(std::string_view name) const {
    for (auto &[k, v] : parse_query(query))
        if (k == name) return v;
    return std::nullopt;
}

std::vector<std::string> Request::query_params(std::string_view name) const {
    std::vector<std::string> out;
    for (auto &[k, v] : parse_query(query))
        if (k == name) out.push_back(v);
    return out;
}

std::string HttpResponse::header(std::string_view name) const {
    return find_header(headers, name);
}

bool Responder::event(std::string_view payload) {
    std::string s;
    s.reserve(payload.size() + 8);
    s += "data: ";
    s += payload;
    s += "\n\n";
    return write(s);
}

std::string error_body(int status, const std::string &message, const std::string &param,
                       const std::string &type) {
    std::string t = type;
    if (t.empty()) {
        if (status == 401)
            t = "authentication_error";
        else if (status == 404)
            t = "not_found_error";
        else if (status == 503 || status == 429)
            t = "server_overloaded";
        else if (status >= 500)
            t = "internal_server_error";
        else
            t = "invalid_request_error";
    }
    nlohmann::json e = {{"message", message},
                        {"type", t},
                        {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                        {"code", status}};
    return nlohmann::json{{"error", e}}.dump(-1, ' ', false,
                                             nlohmann::json::error_handler_t::replace);
}

void send_error(Responder &r, int status, const std::string &message, const std::string &param,
                const std::string &type, const Headers &extra) {
    r.send(status, "application/json", error_body(status, message, param, type), extra);
}

// ---- router ----------------------------------------------------------------------------

struct Router::Impl {
    mutable std::mutex mu;
    std::map<std::string, std::map<std::string, std::shared_ptr<const Handler>>>
        routes; // path -> method
    std::shared_ptr<const std::function<bool(const Request &, Responder &)>> guard;
};

Router::Router() : impl_(std::make_unique<Impl>()) {}
Router::~Router() = default;

void Router::add(const std::string &method, const std::string &path, Handler handler) {
    if (path.empty() || path[0] != '/')
        throw std::invalid_argument("router: path '" + path + "' must start with '/'");
    if (!handler) throw std::invalid_argument("router: " + method + " " + path + ": no handler");
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto &by_method = impl_->routes[path];
    if (by_method.count(method))
        throw std::invalid_argument("router: " + method + " " + path + " is already registered");
    by_method[method] = std::make_shared<const Handler>(std::move(handler));
}

void Router::add(std::initializer_list<const char *> methods, const std::string &path,
                 const Handler &handler) {
    for (const char *m : methods) add(m, path, handler);
}

void Router::set_guard(std::function<bool(const Request &, Responder &)> guard) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->guard = guard
                       ? std::make_shared<const std::function<bool(const Request &, Responder &)>>(
                             std::move(guard))
                       : nullptr;
}

bool Router::has(const std::string &method, const std::string &path) const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->routes.find(path);
    return it != impl_->routes.end() && it->second.count(method) != 0;
}

void Router::dispatch(const Request &request, Responder &responder) const {
    std::shared_ptr<const Handler> handler;
    std::shared_ptr<const std::function<bool(const Request &, Responder &)>> guard;
    std::string allow;
    bool known_path = false;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        guard = impl_->guard;
        auto it = impl_->routes.find(request.path);
        if (it == impl_->routes.end()) {
            // A prefix route ("/a/b/*") holds every path under it; the longest wins.
            size_t best = 0;
            for (auto r = impl_->routes.begin(); r != impl_->routes.end(); ++r) {
                const std::string &key = r->first;
                if (key.back() != '*' || key.size() - 1 <= best) continue;
                if (request.path.compare(0, key.size() - 1, key, 0, key.size() - 1) == 0 &&
                    request.path.size() >= key.size()) {
                    best = key.size() - 1;
                    it = r;
                }
            }
        }
        if (it != impl_->routes.end()) {
            known_path = true;
            auto m = it->second.find(request.method);
            if (m != it->second.end()) handler = m->second;
            for (const auto &[name, h] : it->second) allow += (allow.empty() ? "" : ", ") + name;
        }
    }
    if (!known_path) {
        send_error(responder, 404, "no route for " + request.path, "", "not_found_error");
        return;
    }
    if (!handler) {
        send_error(responder, 405,
                   request.method + " is not allowed on " + request.path + " (allowed: " + allow +
                       ")",
                   "", "", {{"Allow", allow}});
        return;
    }
    if (guard && !(*guard)(request, responder)) return;
    (*handler)(request, responder);
}

} // namespace rl::serve
