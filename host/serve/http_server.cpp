// host/serve/http_server.cpp: the HTTP server: a thread per connection (Connection, the
// Responder of its requests) and HttpServer's accept loop, start and stop.
#include "http.hpp"
#include "http_internal.hpp"

#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace rl::serve {

using namespace http_detail;

// ---- server ------------------------------------------------------------------------------

namespace {

const char *reason_of(int status) {
    const auto r = http::obsolete_reason(static_cast<http::status>(status));
    return r.empty() ? "Unknown" : r.data();
}

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

} // namespace rl::serve
