// host/serve/http.cpp: the HTTP layer on Boost.Beast (header-only Asio), the
// only translation unit that includes it.
//
// Every socket operation is an asynchronous Beast operation run to completion
// on a private io_context of the calling thread: that is how a blocking,
// thread-per-connection server gets Beast's timeouts (basic_stream closes the
// socket when an operation outlives its expiry), which plain synchronous Asio
// calls do not have.
#include "http.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace rl::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using beast::error_code;

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

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

const char *reason_of(int status) {
    const auto r = http::obsolete_reason(static_cast<http::status>(status));
    return r.empty() ? "Unknown" : r.data();
}

// Runs one asynchronous operation on `ioc` to completion and returns its error.
template <class Start>
error_code run_op(net::io_context &ioc, Start &&start) {
    error_code result = net::error::would_block;
    start([&result](error_code ec, std::size_t) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
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

// ---- server ------------------------------------------------------------------------------

namespace {

class Connection final : public Responder {
public:
    Connection(const HttpConfig &config, const Router &router)
        : config_(config), router_(router), stream_(ioc_) {}

    tcp::socket &socket() { return stream_.socket(); }

    // The socket's descriptor while open, else -1 (for stop()'s shutdown).
    int fd() {
        std::lock_guard<std::mutex> lock(fd_mu_);
        return fd_;
    }
    void shutdown() {
        std::lock_guard<std::mutex> lock(fd_mu_);
        shut_down_ = true;
        if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    }

    void serve() {
        {
            std::lock_guard<std::mutex> lock(fd_mu_);
            fd_ = stream_.socket().native_handle();
            if (shut_down_) ::shutdown(fd_, SHUT_RDWR);
        }
        error_code ec;
        const auto ep = stream_.socket().remote_endpoint(ec);
        if (!ec) peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
        while (serve_one()) {
        }
        std::lock_guard<std::mutex> lock(fd_mu_);
        error_code ignored;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream_.close();
        fd_ = -1;
    }

    // Responder ---------------------------------------------------------------------------

    void send(int status, std::string_view content_type, std::string body,
              const Headers &extra) override {
        if (responded_) return;
        responded_ = true;
        http::response<http::string_body> res{static_cast<http::status>(status), version_};
        res.reason(reason_of(status));
        res.set(http::field::server, "rlhost");
        res.set(http::field::content_type, bsv(content_type));
        for (const auto &[k, v] : extra) res.set(bsv(k), bsv(v));
        res.body() = std::move(body);
        res.keep_alive(keep_alive_);
        res.prepare_payload();
        stream_.expires_after(seconds(config_.write_timeout_s));
        const error_code ec = run_op(
            ioc_, [&](auto handler) { http::async_write(stream_, res, std::move(handler)); });
        if (ec) broken_ = true;
    }

    bool start_stream(int status, std::string_view content_type, const Headers &extra) override {
        if (responded_) return !broken_;
        responded_ = true;
        streaming_ = true;
        http::response<http::empty_body> res{static_cast<http::status>(status), version_};
        res.reason(reason_of(status));
        res.set(http::field::server, "rlhost");
        res.set(http::field::content_type, bsv(content_type));
        res.set(http::field::cache_control, "no-cache");
        for (const auto &[k, v] : extra) res.set(bsv(k), bsv(v));
        res.keep_alive(keep_alive_);
        res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        stream_.expires_after(seconds(config_.write_timeout_s));
        const error_code ec = run_op(
            ioc_, [&](auto handler) { http::async_write_header(stream_, sr, std::move(handler)); });
        if (ec) broken_ = true;
        return !broken_;
    }

    bool write(std::string_view data) override {
        if (!streaming_ || stream_ended_ || broken_) return false;
        if (data.empty()) return true;
        stream_.expires_after(seconds(config_.write_timeout_s));
        const error_code ec = run_op(ioc_, [&](auto handler) {
            net::async_write(stream_, http::make_chunk(net::const_buffer(data.data(), data.size())),
                             std::move(handler));
        });
        if (ec) broken_ = true;
        return !broken_;
    }

    void end_stream() override {
        if (!streaming_ || stream_ended_) return;
        stream_ended_ = true;
        if (broken_) return;
        stream_.expires_after(seconds(config_.write_timeout_s));
        const error_code ec = run_op(ioc_, [&](auto handler) {
            net::async_write(stream_, http::make_chunk_last(), std::move(handler));
        });
        if (ec) broken_ = true;
    }

    bool client_gone() override {
        if (broken_) return true;
        const int fd = stream_.socket().is_open() ? stream_.socket().native_handle() : -1;
        if (fd < 0) return broken_ = true;
        pollfd p{fd, static_cast<short>(POLLRDHUP), 0};
        const int n = ::poll(&p, 1, 0);
        if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) broken_ = true;
        return broken_;
    }

    bool responded() const override { return responded_; }

private:
    // Reads and answers one request; false when the connection is done.
    bool serve_one() {
        responded_ = streaming_ = stream_ended_ = broken_ = false;
        keep_alive_ = false;
        version_ = 11;
        http::request_parser<http::string_body> parser;
        parser.body_limit(config_.max_body_bytes);
        parser.header_limit(static_cast<std::uint32_t>(config_.max_header_bytes));

        stream_.expires_after(seconds(config_.idle_timeout_s));
        error_code ec = run_op(ioc_, [&](auto handler) {
            http::async_read_header(stream_, buffer_, parser, std::move(handler));
        });
        if (ec == http::error::end_of_stream || ec == net::error::eof ||
            ec == beast::error::timeout || ec == net::error::connection_reset ||
            ec == net::error::operation_aborted || ec == net::error::bad_descriptor ||
            ec == net::error::not_connected || ec == net::error::shut_down)
            return false;
        if (!ec && parser.get()[http::field::expect] == "100-continue" && !parser.is_done()) {
            http::response<http::empty_body> cont{http::status::continue_, parser.get().version()};
            stream_.expires_after(seconds(config_.write_timeout_s));
            ec = run_op(
                ioc_, [&](auto handler) { http::async_write(stream_, cont, std::move(handler)); });
            if (ec) return false;
        }
        if (!ec && !parser.is_done()) {
            stream_.expires_after(seconds(config_.read_timeout_s));
            ec = run_op(ioc_, [&](auto handler) {
                http::async_read(stream_, buffer_, parser, std::move(handler));
            });
        }
        if (ec) return refuse(ec);

        auto &msg = parser.get();
        version_ = msg.version();
        keep_alive_ = msg.keep_alive();
        Request req;
        req.method = std::string(msg.method_string());
        req.target = std::string(msg.target());
        const size_t q = req.target.find('?');
        req.path = req.target.substr(0, q);
        if (q != std::string::npos) req.query = req.target.substr(q + 1);
        for (const auto &f : msg)
            req.headers.emplace_back(lower(ssv(f.name_string())), std::string(f.value()));
        req.body = std::move(msg.body());
        req.peer = peer_;

        try {
            router_.dispatch(req, *this);
        } catch (const std::exception &e) {
            if (!responded_) send_error(*this, 500, std::string("internal error: ") + e.what());
        } catch (...) {
            if (!responded_) send_error(*this, 500, "internal error of unknown type");
        }
        if (!responded_ && client_gone()) return false; // nobody to answer
        if (!responded_) send_error(*this, 500, req.method + " " + req.path + " sent no response");
        if (streaming_ && !stream_ended_) end_stream();
        if (streaming_ && !stream_ended_) return false;
        return keep_alive_ && !broken_;
    }

    // Answers a request that could not be read (when the peer can still hear
    // it) and ends the connection.
    bool refuse(const error_code &ec) {
        keep_alive_ = false;
        auto too_large = [&](int status, const std::string &what, size_t limit,
                             const char *setting) {
            send_error(*this, status,
                       what + " exceeds the limit of " + std::to_string(limit) + " bytes" + setting,
                       "", "invalid_request_error");
            linger();
        };
        if (ec == http::error::body_limit) {
            too_large(413, "request body", config_.max_body_bytes, " (max_body_bytes)");
        } else if (ec == http::error::header_limit) {
            too_large(431, "request header", config_.max_header_bytes, "");
        } else if (ec == beast::error::timeout) {
            send_error(*this, 408,
                       "the request did not arrive within " +
                           nlohmann::json(config_.read_timeout_s).dump() + " s (read timeout)");
        } else if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
            send_error(*this, 400, "malformed HTTP request: " + ec.message());
            linger();
        }
        return false;
    }

    // After an early answer: stop sending, read and drop what the client still
    // sends for a short while, so it sees the answer rather than a reset.
    void linger() {
        error_code ignored;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        char sink[16384];
        while (std::chrono::steady_clock::now() < until) {
            stream_.expires_at(until);
            const error_code ec = run_op(ioc_, [&](auto handler) {
                stream_.async_read_some(net::buffer(sink), std::move(handler));
            });
            if (ec) break;
        }
    }

    const HttpConfig &config_;
    const Router &router_;
    net::io_context ioc_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::string peer_;
    std::mutex fd_mu_;
    int fd_ = -1;
    bool shut_down_ = false;
    unsigned version_ = 11;
    bool keep_alive_ = false, responded_ = false, streaming_ = false, stream_ended_ = false,
         broken_ = false;
};

} // namespace

struct HttpServer::Impl {
    HttpConfig config;
    const Router &router;
    net::io_context ioc;
    tcp::acceptor acceptor{ioc};
    int port = 0;
    int wake[2] = {-1, -1};
    std::thread accept_thread;

    struct Slot {
        std::shared_ptr<Connection> conn;
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    mutable std::mutex mu;
    std::condition_variable cv;
    std::list<Slot> slots;
    bool started = false, stopping = false, stopped = false;

    Impl(HttpConfig c, const Router &r) : config(std::move(c)), router(r) {}

    // Joins finished connection threads; returns the number still open.
    int reap() {
        std::list<Slot> finished;
        int open = 0;
        {
            std::lock_guard<std::mutex> lock(mu);
            for (auto it = slots.begin(); it != slots.end();) {
                if (it->done->load()) {
                    auto next = std::next(it);
                    finished.splice(finished.end(), slots, it);
                    it = next;
                } else {
                    ++open;
                    ++it;
                }
            }
        }
        for (auto &s : finished) s.thread.join();
        return open;
    }

    void accept_loop() {
        for (;;) {
            pollfd fds[2] = {{acceptor.native_handle(), POLLIN, 0}, {wake[0], POLLIN, 0}};
            const int n = ::poll(fds, 2, 500);
            {
                std::lock_guard<std::mutex> lock(mu);
                if (stopping) return;
            }
            const int open = reap();
            if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
            auto conn = std::make_shared<Connection>(config, router);
            error_code ec;
            acceptor.accept(conn->socket(), ec);
            if (ec) continue; // would_block, or the peer left before we took it
            if (open >= config.max_connections) {
                const std::string body =
                    error_body(503,
                               "the server is at its connection limit (" +
                                   std::to_string(config.max_connections) + "); retry later",
                               "", "server_overloaded");
                const std::string res =
                    "HTTP/1.1 503 Service Unavailable\r\nServer: rlhost\r\nContent-Type: "
                    "application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
                const int fd = conn->socket().native_handle();
                [[maybe_unused]] const ssize_t w =
                    ::send(fd, res.data(), res.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                ::shutdown(fd, SHUT_WR);
                error_code ignored;
                conn->socket().close(ignored);
                continue;
            }
            auto done = std::make_shared<std::atomic<bool>>(false);
            std::lock_guard<std::mutex> lock(mu);
            slots.push_back(Slot{conn, std::thread([conn, done] {
                                     try {
                                         conn->serve();
                                     } catch (...) {
                                     }
                                     done->store(true);
                                 }),
                                 done});
        }
    }
};

HttpServer::HttpServer(HttpConfig config, const Router &router)
    : impl_(std::make_unique<Impl>(std::move(config), router)) {}

HttpServer::~HttpServer() {
    stop();
}

void HttpServer::start() {
    Impl &m = *impl_;
    {
        std::lock_guard<std::mutex> lock(m.mu);
        if (m.started) throw std::logic_error("http server: already started");
        m.started = true;
    }
    const std::string where = m.config.host + ":" + std::to_string(m.config.port);
    error_code ec;
    const auto address = net::ip::make_address(m.config.host, ec);
    tcp::endpoint ep;
    if (ec) {
        // A host name: the first address it resolves to.
        tcp::resolver resolver(m.ioc);
        auto results = resolver.resolve(m.config.host, std::to_string(m.config.port), ec);
        if (ec || results.empty())
            throw std::runtime_error("http server: cannot resolve host '" + m.config.host +
                                     "': " + ec.message());
        ep = results.begin()->endpoint();
    } else {
        if (m.config.port < 0 || m.config.port > 65535)
            throw std::runtime_error("http server: port " + std::to_string(m.config.port) +
                                     " is outside 0..65535");
        ep = tcp::endpoint(address, static_cast<unsigned short>(m.config.port));
    }
    m.acceptor.open(ep.protocol(), ec);
    if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) m.acceptor.bind(ep, ec);
    if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) m.acceptor.non_blocking(true, ec);
    if (ec)
        throw std::runtime_error("http server: cannot listen on " + where + ": " + ec.message());
    m.port = m.acceptor.local_endpoint().port();
    if (::pipe2(m.wake, O_CLOEXEC | O_NONBLOCK) != 0)
        throw std::runtime_error("http server: pipe2 failed");
    m.accept_thread = std::thread([&m] { m.accept_loop(); });
}

int HttpServer::port() const {
    return impl_->port;
}

int HttpServer::connections() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    int open = 0;
    for (const auto &s : impl_->slots) open += s.done->load() ? 0 : 1;
    return open;
}

void HttpServer::stop() {
    Impl &m = *impl_;
    {
        std::unique_lock<std::mutex> lock(m.mu);
        if (!m.started || m.stopped) {
            m.stopped = true;
            m.cv.notify_all();
            return;
        }
        if (m.stopping) {
            m.cv.wait(lock, [&] { return m.stopped; });
            return;
        }
        m.stopping = true;
    }
    if (m.wake[1] >= 0) {
        const char c = 1;
        [[maybe_unused]] const ssize_t w = ::write(m.wake[1], &c, 1);
    }
    if (m.accept_thread.joinable()) m.accept_thread.join();
    error_code ignored;
    m.acceptor.close(ignored);
    std::list<Impl::Slot> all;
    {
        std::lock_guard<std::mutex> lock(m.mu);
        all.swap(m.slots);
    }
    for (auto &s : all) s.conn->shutdown();
    for (auto &s : all) s.thread.join();
    for (int &fd : m.wake)
        if (fd >= 0) {
            ::close(fd);
            fd = -1;
        }
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopped = true;
    m.cv.notify_all();
}

void HttpServer::wait() {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->cv.wait(lock, [&] { return impl_->stopped; });
}

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
