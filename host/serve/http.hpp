// host/serve/http.hpp: the HTTP/1.1 layer of `rlhost serve`, and a small
// synchronous client. Boost.Beast stays inside http.cpp, http_server.cpp and
// http_client.cpp; this header is all the routes see.
//
// Server model: one thread per connection (keep-alive: one request after the
// other on it) up to `max_connections`; a connection beyond the cap is
// answered 503 with Retry-After and closed. A handler runs on its
// connection's thread and answers through its Responder, either with one
// whole response or with a chunked stream (server-sent events). Because the
// handler owns the socket while it runs, it can ask client_gone() at any time
// (a hung-up or reset peer, a failed write) and cancel work nobody waits for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::serve {

/// Header (name, value) pairs in order. Request header names are lower case.
using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
    std::string method; ///< "GET", "POST", ... (as sent; methods are case-sensitive)
    std::string target; ///< as sent: path and query
    std::string path;   ///< target before '?'
    std::string query;  ///< target after '?' (raw), empty when none
    Headers headers;    ///< names lower case
    std::string body;
    std::string peer; ///< "address:port" of the client

    /// Value of header `name` (any case); empty when absent.
    std::string header(std::string_view name) const;
    /// The first value of query parameter `name`, percent-decoded; none when absent.
    std::optional<std::string> query_param(std::string_view name) const;
    /// Every value of query parameter `name` (?tags=a&tags=b), percent-decoded.
    std::vector<std::string> query_params(std::string_view name) const;
};

/// How a handler answers. Exactly one of send() or start_stream() per request;
/// a handler that returns without either gets a 500 sent for it.
class Responder {
public:
    virtual ~Responder() = default;
    /// A complete response. Write errors are not reported (see client_gone()).
    virtual void send(int status, std::string_view content_type, std::string body,
                      const Headers &extra = {}) = 0;
    /// Starts a chunked response; false when the client is gone.
    virtual bool start_stream(int status = 200, std::string_view content_type = "text/event-stream",
                              const Headers &extra = {}) = 0;
    /// One chunk of a started stream; false when it could not be written (the
    /// client is gone or too slow: the write timeout).
    virtual bool write(std::string_view data) = 0;
    /// One server-sent event: "data: <payload>\n\n".
    bool event(std::string_view payload);
    /// Ends a started stream (the last chunk). Idempotent.
    virtual void end_stream() = 0;
    /// True once the peer hung up or reset, or a write failed. Does not wait.
    virtual bool client_gone() = 0;
    /// True once send() or start_stream() was called.
    virtual bool responded() const = 0;
};

using Handler = std::function<void(const Request &, Responder &)>;

/// Routes by method and exact path. Register routes before the server starts
/// (add() is thread-safe, but a request can race a route being added).
class Router {
public:
    Router();
    ~Router();
    Router(const Router &) = delete;
    Router &operator=(const Router &) = delete;

    /// Registers `handler` for `method` and `path` ("/v1/completions"); a
    /// path ending in "*" ("/api/v1/samplers/*") is a prefix route that holds
    /// every longer path under it (exact routes win, then the longest prefix). A
    /// second registration of the same method and path throws
    /// std::invalid_argument naming both.
    void add(const std::string &method, const std::string &path, Handler handler);
    void add(std::initializer_list<const char *> methods, const std::string &path,
             const Handler &handler);
    /// Runs before every handler; returns false when it answered the request
    /// itself (e.g. 401). One guard; a second call replaces it.
    void set_guard(std::function<bool(const Request &, Responder &)> guard);
    /// Runs the route's handler; unknown paths get 404, known paths with
    /// another method 405 (with Allow), both as JSON errors.
    void dispatch(const Request &request, Responder &responder) const;
    bool has(const std::string &method, const std::string &path) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// The JSON body {"error": {"message", "type", "param", "code"}} of an error
/// response with HTTP status `status` (OpenAI's shape; `code` is the status).
std::string error_body(int status, const std::string &message, const std::string &param = "",
                       const std::string &type = "");
/// Sends error_body(...) as application/json.
void send_error(Responder &r, int status, const std::string &message, const std::string &param = "",
                const std::string &type = "", const Headers &extra = {});

struct HttpConfig {
    std::string host = "127.0.0.1";
    int port = 0;                               ///< 0: any free port (see HttpServer::port())
    int max_connections = 256;                  ///< open connections; beyond: 503 and close
    size_t max_body_bytes = size_t{8} << 20;    ///< beyond: 413 naming the limit
    size_t max_header_bytes = size_t{64} << 10; ///< beyond: 431
    double read_timeout_s = 60;                 ///< a request's header and body, once started
    double idle_timeout_s = 60;                 ///< keep-alive: wait for the next request
    double write_timeout_s = 60;                ///< one response or stream chunk
};

class HttpServer {
public:
    /// `router` must outlive the server.
    HttpServer(HttpConfig config, const Router &router);
    /// stop()
    ~HttpServer();
    HttpServer(const HttpServer &) = delete;
    HttpServer &operator=(const HttpServer &) = delete;

    /// Binds and listens, then accepts on a thread of its own. Throws
    /// std::runtime_error naming host:port when it cannot bind.
    void start();
    /// The bound port (after start()).
    int port() const;
    /// Stops accepting, shuts every open connection down (handlers see
    /// client_gone()), and joins their threads. Thread-safe, idempotent.
    void stop();
    /// Blocks until stop() has finished.
    void wait();
    /// Connections open now.
    int connections() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// ---- client --------------------------------------------------------------------------

struct HttpResponse {
    int status = 0;
    Headers headers; ///< names lower case
    std::string body;
    std::string header(std::string_view name) const;
};

/// One request on a fresh connection. `url` is "http://host:port" (a path
/// prefix after it is kept: "http://h:1/api" + "/x" asks for "/api/x"). A
/// body without a Content-Type header is sent as application/json. Throws
/// std::runtime_error naming the url on connection errors and when no
/// complete response came within `timeout_s` (the whole exchange).
HttpResponse http_request(const std::string &url, const std::string &method,
                          const std::string &path, const std::string &body = "",
                          const Headers &headers = {}, double timeout_s = 60);

/// As http_request, but hands the response body to `on_data` piece by piece
/// as it arrives (the returned body is empty). When on_data returns false the
/// connection is closed at once (a client that goes away) and the call
/// returns the status and headers read so far.
HttpResponse http_stream(const std::string &url, const std::string &method, const std::string &path,
                         const std::string &body, const Headers &headers, double timeout_s,
                         const std::function<bool(std::string_view)> &on_data);

} // namespace rl::serve
