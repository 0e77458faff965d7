// plugins/transports/zmq: messages over ZeroMQ PUSH/PULL (docs/transports.md).
//
// One instance is one end: role "push" (sends) or "pull" (receives). A message
// is one multipart ZeroMQ message: frame 0 the wire header
// (rl/sdk/transport.hpp), then one frame per tensor with its bytes, so the
// tensors travel without any encoding. ZeroMQ delivers a multipart message
// whole or not at all; the receiver still checks the frame count, every size
// and every checksum. Keys as Surogate's rollout_transport: host, port, hwm.
#include <rl/sdk/plugin.hpp>
#include <rl/sdk/transport.hpp>

#include <zmq.h>

#include <cerrno>
#include <string>
#include <vector>

namespace {

namespace tp = rl::sdk::transport;

std::string zmq_error() {
    return zmq_strerror(zmq_errno());
}

class Zmq : public rl::sdk::Transport {
public:
    explicit Zmq(rl::sdk::Params &p)
        : host_(p.string("host", "127.0.0.1")), port_(p.integer("port", 0, 0, 65535)),
          role_(p.choice("role", "pull", {"push", "pull"})), hwm_(p.integer("hwm", 16, 1)),
          timeout_ms_(p.integer("timeout_ms", 60000, -1)) {
        // By default the receiver binds and the senders connect (one trainer
        // or orchestrator, any number of producers).
        bind_ = p.boolean("bind", role_ == "pull");
        p.finish();
        if (port_ == 0) rl::sdk::invalid(p.owner() + ": parameter 'port' is required (1-65535)");
        ctx_ = zmq_ctx_new();
        sock_ = zmq_socket(ctx_, role_ == "push" ? ZMQ_PUSH : ZMQ_PULL);
        const int hwm = static_cast<int>(hwm_), linger = 1000;
        zmq_setsockopt(sock_, role_ == "push" ? ZMQ_SNDHWM : ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof linger);
        endpoint_ = "tcp://" + (bind_ && host_ == "*" ? std::string("*") : host_) + ":" +
                    std::to_string(port_);
        const int rc =
            bind_ ? zmq_bind(sock_, endpoint_.c_str()) : zmq_connect(sock_, endpoint_.c_str());
        if (rc != 0) {
            const std::string err = zmq_error();
            close();
            rl::sdk::fail(RL_ERR_IO, "zmq transport: cannot " +
                                         std::string(bind_ ? "bind" : "connect") + " " + endpoint_ +
                                         ": " + err);
        }
    }
    ~Zmq() override { close(); }

    void send(rl::sdk::Call &call, const rl_message_view_t &m) override {
        if (role_ != "push")
            rl::sdk::invalid("zmq transport: this end has role 'pull'; it cannot send");
        std::vector<tp::OutTensor> tensors;
        const std::string header = tp::encode_header(m, &tensors);
        // The first frame waits (up to timeout_ms) for room in the queue; once
        // it is queued, the rest of the message follows.
        zmq_pollitem_t item{sock_, 0, ZMQ_POLLOUT, 0};
        const int ready = zmq_poll(&item, 1, static_cast<long>(timeout_ms_));
        if (ready == 0)
            rl::sdk::fail(RL_ERR_TIMEOUT, "zmq transport: no receiver took the message at " +
                                              endpoint_ + " within " + std::to_string(timeout_ms_) +
                                              " ms (is the peer running?)");
        if (ready < 0) rl::sdk::fail(RL_ERR_IO, "zmq transport: poll: " + zmq_error());
        const int more = tensors.empty() ? 0 : ZMQ_SNDMORE;
        if (zmq_send(sock_, header.data(), header.size(), more) < 0)
            rl::sdk::fail(RL_ERR_IO, "zmq transport: send to " + endpoint_ + ": " + zmq_error());
        uint64_t bytes = header.size();
        for (size_t i = 0; i < tensors.size(); ++i) {
            const int flags = i + 1 < tensors.size() ? ZMQ_SNDMORE : 0;
            if (zmq_send(sock_, tensors[i].data, tensors[i].nbytes, flags) < 0)
                rl::sdk::fail(RL_ERR_IO,
                              "zmq transport: send to " + endpoint_ + ": " + zmq_error());
            bytes += tensors[i].nbytes;
        }
        call.metric("transport/bytes", static_cast<double>(bytes));
    }

    bool recv(rl::sdk::Call &call, int64_t timeout_ms) override {
        if (role_ != "pull")
            rl::sdk::invalid("zmq transport: this end has role 'push'; it cannot receive");
        zmq_pollitem_t item{sock_, 0, ZMQ_POLLIN, 0};
        const int ready = zmq_poll(&item, 1, static_cast<long>(timeout_ms));
        if (ready == 0) return false;
        if (ready < 0) rl::sdk::fail(RL_ERR_IO, "zmq transport: poll: " + zmq_error());
        // The whole multipart message.
        std::vector<zmq_msg_t> frames;
        struct Closer {
            std::vector<zmq_msg_t> &f;
            ~Closer() {
                for (auto &m : f) zmq_msg_close(&m);
            }
        } closer{frames};
        for (;;) {
            frames.emplace_back();
            zmq_msg_init(&frames.back());
            if (zmq_msg_recv(&frames.back(), sock_, 0) < 0)
                rl::sdk::fail(RL_ERR_IO,
                              "zmq transport: receive at " + endpoint_ + ": " + zmq_error());
            if (!zmq_msg_more(&frames.back())) break;
        }
        const std::string where = "zmq transport (" + endpoint_ + ")";
        std::vector<tp::InTensor> tensors;
        const std::string user =
            tp::decode_header(std::string_view(static_cast<const char *>(zmq_msg_data(&frames[0])),
                                               zmq_msg_size(&frames[0])),
                              &tensors, where);
        if (frames.size() != tensors.size() + 1)
            rl::sdk::fail(RL_ERR_INVALID_ARG, where + ": the header announces " +
                                                  std::to_string(tensors.size()) +
                                                  " tensors, the message has " +
                                                  std::to_string(frames.size() - 1) + " frames");
        uint64_t total = 0;
        for (size_t i = 0; i < tensors.size(); ++i) {
            zmq_msg_t &f = frames[i + 1];
            if (zmq_msg_size(&f) != tensors[i].nbytes)
                rl::sdk::fail(RL_ERR_INVALID_ARG, where + ": tensor '" + tensors[i].name +
                                                      "' has " + std::to_string(zmq_msg_size(&f)) +
                                                      " bytes, the header announces " +
                                                      std::to_string(tensors[i].nbytes));
            tp::verify(tensors[i], static_cast<const uint8_t *>(zmq_msg_data(&f)), where);
            total += tensors[i].nbytes;
        }
        call.text("header", user);
        for (size_t i = 0; i < tensors.size(); ++i)
            call.tensor(tensors[i].name,
                        tp::view_of(tensors[i],
                                    static_cast<const uint8_t *>(zmq_msg_data(&frames[i + 1]))));
        call.metric("transport/bytes", static_cast<double>(total));
        return true;
    }

private:
    void close() {
        if (sock_) zmq_close(sock_);
        if (ctx_) zmq_ctx_term(ctx_);
        sock_ = ctx_ = nullptr;
    }

    std::string host_;
    int64_t port_;
    std::string role_;
    int64_t hwm_, timeout_ms_;
    bool bind_ = false;
    std::string endpoint_;
    void *ctx_ = nullptr;
    void *sock_ = nullptr;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Zmq>("org.rl.transport.zmq", "zmq", "1.0.0",
                                      "Messages over ZeroMQ PUSH/PULL: a JSON header frame and "
                                      "one frame per tensor"))
