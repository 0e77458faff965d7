// host/serve/http_client.cpp: the small synchronous HTTP client (http_request, http_stream).
#include "http.hpp"
#include "http_internal.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>

namespace rl::serve {

using namespace http_detail;

// ---- client ------------------------------------------------------------------------------

namespace {

struct Url {
    std::string host, port, prefix;
};

Url parse_url(const std::string &url) {
    const std::string scheme = "http://";
    if (url.compare(0, scheme.size(), scheme) != 0)
        throw std::runtime_error("http client: url '" + url +
                                 "' is not http://host:port (https is not supported)");
    std::string rest = url.substr(scheme.size());
    Url u;
    const size_t slash = rest.find('/');
    if (slash != std::string::npos) {
        u.prefix = rest.substr(slash);
        rest.resize(slash);
        while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
    }
    if (!rest.empty() && rest[0] == '[') { // [v6]:port
        const size_t close = rest.find(']');
        if (close == std::string::npos)
            throw std::runtime_error("http client: bad url '" + url + "'");
        u.host = rest.substr(1, close - 1);
        u.port = close + 2 <= rest.size() ? rest.substr(close + 2) : "";
    } else {
        const size_t colon = rest.rfind(':');
        u.host = rest.substr(0, colon);
        u.port = colon == std::string::npos ? "" : rest.substr(colon + 1);
    }
    if (u.port.empty()) u.port = "80";
    if (u.host.empty()) throw std::runtime_error("http client: url '" + url + "' has no host");
    return u;
}

} // namespace

HttpResponse http_stream(const std::string &url, const std::string &method, const std::string &path,
                         const std::string &body, const Headers &headers, double timeout_s,
                         const std::function<bool(std::string_view)> &on_data) {
    const Url u = parse_url(url);
    const std::string where = method + " " + url + path;
    auto fail = [&](const std::string &what, const error_code &ec) -> std::runtime_error {
        if (ec == beast::error::timeout)
            return std::runtime_error("http client: " + where + ": no complete answer within " +
                                      nlohmann::json(timeout_s).dump() + " s");
        return std::runtime_error("http client: " + where + ": " + what + ": " + ec.message());
    };
    const auto deadline = std::chrono::steady_clock::now() + seconds(timeout_s);

    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    tcp::resolver resolver(ioc);
    error_code ec;
    const auto endpoints = resolver.resolve(u.host, u.port, ec);
    if (ec) throw fail("cannot resolve " + u.host, ec);
    stream.expires_at(deadline);
    ec = run_op(ioc, [&](auto handler) {
        stream.async_connect(
            endpoints, [handler](error_code e, const tcp::endpoint &) mutable { handler(e, 0); });
    });
    if (ec) throw fail("cannot connect", ec);

    http::request<http::string_body> req;
    req.method_string(method);
    req.target(u.prefix + path);
    req.version(11);
    req.set(http::field::host, u.host + ":" + u.port);
    req.set(http::field::user_agent, "rl-http-client");
    bool has_type = false;
    for (const auto &[k, v] : headers) {
        req.set(k, v);
        has_type = has_type || lower(k) == "content-type";
    }
    if (!body.empty() && !has_type) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.keep_alive(false);
    req.prepare_payload();
    stream.expires_at(deadline);
    ec = run_op(ioc, [&](auto handler) { http::async_write(stream, req, std::move(handler)); });
    if (ec) throw fail("cannot send the request", ec);

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    // No limit (not boost::none: Boost 1.74 compares a known length against it as "above").
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    stream.expires_at(deadline);
    ec = run_op(ioc, [&](auto handler) {
        http::async_read_header(stream, buffer, parser, std::move(handler));
    });
    if (ec) throw fail("cannot read the response", ec);
    HttpResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    for (const auto &f : parser.get())
        out.headers.emplace_back(lower(ssv(f.name_string())), std::string(f.value()));
    char chunk[16384];
    while (!parser.is_done()) {
        parser.get().body().data = chunk;
        parser.get().body().size = sizeof(chunk);
        stream.expires_at(deadline);
        ec = run_op(ioc, [&](auto handler) {
            http::async_read_some(stream, buffer, parser, std::move(handler));
        });
        if (ec == http::error::need_buffer) ec = {};
        if (ec) throw fail("cannot read the response body", ec);
        const size_t n = sizeof(chunk) - parser.get().body().size;
        if (n > 0 && !on_data(std::string_view(chunk, n))) break;
    }
    error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
    return out;
}

HttpResponse http_request(const std::string &url, const std::string &method,
                          const std::string &path, const std::string &body, const Headers &headers,
                          double timeout_s) {
    std::string received;
    HttpResponse r = http_stream(url, method, path, body, headers, timeout_s,
                                 [&received](std::string_view piece) {
                                     received.append(piece);
                                     return true;
                                 });
    r.body = std::move(received);
    return r;
}

} // namespace rl::serve
