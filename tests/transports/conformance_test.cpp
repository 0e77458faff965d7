// tests/transports: one conformance suite that every transport plugin passes
// (docs/transports.md): order, a 256 MiB message, timeouts, a crashed peer, a
// malformed header and a checksum mismatch (both refused, nothing else lost),
// and the sender's refusals. Each plugin adds a Backend: how to make its two
// ends and how to put raw bytes on its wire.
#include "free_port.hpp"
#include "runtime_fixture.hpp"

#include <rl/core/update_group.hpp>
#include <rl/sdk/transport.hpp>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zmq.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using rltest::Result;

// ---- messages ---------------------------------------------------------------------

struct Tensor {
    std::string name;
    rl_dtype_t dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

template <class T>
Tensor make_tensor(std::string name, rl_dtype_t dtype, std::vector<int64_t> shape,
                   const std::vector<T> &values) {
    Tensor t{std::move(name), dtype, std::move(shape), {}};
    t.bytes.resize(values.size() * sizeof(T));
    // An empty tensor has no data pointer to copy from (memcpy wants non-null).
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    return t;
}

constexpr rl_dtype_t kF32{RL_DTYPE_FLOAT, 32, 1}, kI64{RL_DTYPE_INT, 64, 1},
    kBF16{RL_DTYPE_BFLOAT, 16, 1};

// A named view of CPU memory, contiguous unless strides are set after.
rl_tensor_arg_t tensor_arg(const char *name, void *data, rl_dtype_t dtype, int64_t *shape,
                           size_t ndim) {
    rl_tensor_arg_t a{};
    a.name = name;
    a.view.data = data;
    a.view.device = {RL_DEVICE_CPU, 0};
    a.view.ndim = static_cast<int32_t>(ndim);
    a.view.dtype = dtype;
    a.view.shape = shape;
    return a;
}

// Borrowed views of tensors, as rl_transport_send takes them.
struct Views {
    std::vector<rl_tensor_arg_t> args;
    rl_tensor_list_t list{};
    explicit Views(std::vector<Tensor> &ts) {
        for (auto &t : ts)
            args.push_back(tensor_arg(t.name.c_str(), t.bytes.data(), t.dtype, t.shape.data(),
                                      t.shape.size()));
        list.items = args.data();
        list.count = args.size();
    }
};

rl_status_t send(rl_instance_t *tx, const std::string &header, std::vector<Tensor> tensors = {}) {
    Views v(tensors);
    return rl_transport_send(tx, rl_string_view_t{header.data(), header.size()}, &v.list);
}

std::vector<uint8_t> tensor_bytes(const Result &r, const char *name) {
    rl_tensor_view_t v{};
    EXPECT_EQ(rl_result_tensor(r.r, name, &v), RL_OK) << name << ": " << rl_last_error();
    if (v.data == nullptr) return {};
    int64_t n = 1;
    for (int32_t d = 0; d < v.ndim; ++d) n *= v.shape[d];
    const auto *p = static_cast<const uint8_t *>(v.data) + v.byte_offset;
    return std::vector<uint8_t>(p, p + n * (v.dtype.bits / 8));
}

// ---- backends ---------------------------------------------------------------------

// How one transport plugin is set up for a test, and how raw bytes are put
// on its wire (to fake a broken or malicious peer).
class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string plugin() const = 0;
    virtual json sender_params() const = 0;
    virtual json receiver_params() const = 0;
    // A message as a broken peer would send it: the wire header text and the
    // tensors' bytes, unchecked.
    virtual void inject(const std::string &wire_header,
                        const std::vector<std::vector<uint8_t>> &payloads) = 0;
    // Called before a real sender is made (a broadcast transport has one
    // sender: the fake one steps aside).
    virtual void before_sender() {}
};

class FilesystemBackend : public Backend {
public:
    FilesystemBackend() {
        dir_ = fs::temp_directory_path() /
               ("rl-transport-" + std::to_string(::getpid()) + "-" + std::to_string(++counter_));
        fs::remove_all(dir_);
    }
    ~FilesystemBackend() override { fs::remove_all(dir_); }
    std::string plugin() const override { return "filesystem"; }
    json sender_params() const override { return {{"dir", dir_.string()}}; }
    json receiver_params() const override { return {{"dir", dir_.string()}, {"poll_ms", 5}}; }
    void inject(const std::string &wire_header,
                const std::vector<std::vector<uint8_t>> &payloads) override {
        int64_t step = 0;
        if (fs::exists(dir_ / "rollouts"))
            for (const auto &e : fs::directory_iterator(dir_ / "rollouts")) {
                const std::string n = e.path().filename().string();
                if (n.rfind("step_", 0) == 0)
                    step = std::max<int64_t>(step, std::stoll(n.substr(5)) + 1);
            }
        const fs::path d = dir_ / "rollouts" / ("step_" + std::to_string(step));
        fs::create_directories(d);
        std::ofstream(d / "header.json", std::ios::binary) << wire_header;
        std::ofstream bin(d / "tensors.bin", std::ios::binary);
        for (const auto &p : payloads)
            bin.write(reinterpret_cast<const char *>(p.data()),
                      static_cast<std::streamsize>(p.size()));
        bin.close();
        std::ofstream(d / "STABLE").close();
    }
    const fs::path &dir() const { return dir_; }

private:
    fs::path dir_;
    static inline int counter_ = 0;
};

class ZmqBackend : public Backend {
public:
    ZmqBackend() : port_(rltest::free_tcp_port()) {}
    ~ZmqBackend() override {
        if (raw_) zmq_close(raw_);
        if (ctx_) zmq_ctx_term(ctx_);
    }
    std::string plugin() const override { return "zmq"; }
    json sender_params() const override {
        return {{"role", "push"}, {"port", port_}, {"timeout_ms", 2000}};
    }
    json receiver_params() const override { return {{"role", "pull"}, {"port", port_}}; }
    void inject(const std::string &wire_header,
                const std::vector<std::vector<uint8_t>> &payloads) override {
        if (!raw_) {
            ctx_ = zmq_ctx_new();
            raw_ = zmq_socket(ctx_, ZMQ_PUSH);
            const int linger = 2000;
            zmq_setsockopt(raw_, ZMQ_LINGER, &linger, sizeof linger);
            const std::string ep = "tcp://127.0.0.1:" + std::to_string(port_);
            ASSERT_EQ(zmq_connect(raw_, ep.c_str()), 0);
        }
        zmq_send(raw_, wire_header.data(), wire_header.size(), payloads.empty() ? 0 : ZMQ_SNDMORE);
        for (size_t i = 0; i < payloads.size(); ++i)
            zmq_send(raw_, payloads[i].data(), payloads[i].size(),
                     i + 1 < payloads.size() ? ZMQ_SNDMORE : 0);
    }

private:
    int port_;
    void *ctx_ = nullptr;
    void *raw_ = nullptr;
};

// The nccl plugin's wire: a store hosted by the sender, a group per
// generation, then per message: an announcement in the store and the
// broadcasts frame, sizes + header, buckets, commit (plugins/transports/nccl).
// The fake sender below plays that protocol with core/dist directly, as a
// foreign or broken sender would, one bucket per payload.
class NcclBackend : public Backend {
public:
    NcclBackend() : port_(rltest::free_tcp_port()) {}
    std::string plugin() const override { return "nccl"; }
    json sender_params() const override {
        return {
            {"role", "push"}, {"port", port_}, {"world_size", 2}, {"timeout", 20}, {"poll_ms", 2}};
    }
    json receiver_params() const override {
        return {{"role", "pull"}, {"port", port_}, {"rank", 1}, {"world_size", 2},
                {"timeout", 20},  {"poll_ms", 2},  {"queue", 8}};
    }
    void before_sender() override {
        group_.reset();
        store_.reset();
    }
    void inject(const std::string &wire_header,
                const std::vector<std::vector<uint8_t>> &payloads) override {
        namespace dist = rl::core::dist;
        if (!group_) {
            store_ = std::make_unique<dist::Rendezvous>("127.0.0.1", port_, true,
                                                        std::chrono::seconds(20));
            for (int i = 0; i < 2000 && store_->add("join/r1", 0) == 0; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            gen_ = store_->add("gen", 0) + 1;
            store_->add("seen/g" + std::to_string(gen_) + "/r1", store_->add("join/r1", 0));
            store_->add("gen", 1);
            dist::UpdateGroupOptions o;
            o.master_port = port_;
            o.group_name = "g" + std::to_string(gen_);
            o.timeout = std::chrono::seconds(20);
            group_ = std::make_unique<dist::UpdateGroup>(o, *store_);
        }
        const int64_t seq = store_->add("msg/g" + std::to_string(gen_), 1);
        auto longs = [](std::vector<int64_t> v) {
            return at::tensor(v, at::TensorOptions().dtype(at::kLong));
        };
        auto bytes = [](const void *p, size_t n) {
            at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kByte);
            if (n) std::memcpy(t.data_ptr(), p, n);
            return t;
        };
        std::vector<int64_t> sizes;
        for (const auto &p : payloads) sizes.push_back(static_cast<int64_t>(p.size()));
        std::vector<at::Tensor> ts{
            longs({static_cast<int64_t>(wire_header.size()), static_cast<int64_t>(payloads.size()),
                   seq, 0x726c6e63636c0001})};
        group_->broadcast(ts);
        // As the host's broadcast: an empty tensor (no buckets) does not travel.
        ts = {bytes(wire_header.data(), wire_header.size())};
        if (!sizes.empty()) ts.insert(ts.begin(), longs(sizes));
        group_->broadcast(ts);
        for (const auto &p : payloads) {
            if (p.empty()) continue;
            ts = {bytes(p.data(), p.size())};
            group_->broadcast(ts);
        }
        const auto crc = rl::sdk::transport::crc32c(wire_header.data(), wire_header.size());
        ts = {longs({seq, static_cast<int64_t>(crc)})};
        group_->broadcast(ts);
    }

private:
    int port_;
    int64_t gen_ = 0;
    std::unique_ptr<rl::core::dist::Rendezvous> store_;
    std::unique_ptr<rl::core::dist::UpdateGroup> group_;
};

std::unique_ptr<Backend> make_backend(const std::string &name) {
    if (name == "filesystem") return std::make_unique<FilesystemBackend>();
    if (name == "nccl") return std::make_unique<NcclBackend>();
    return std::make_unique<ZmqBackend>();
}

// ---- fixture ----------------------------------------------------------------------

class TransportConformance : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        backend_ = make_backend(GetParam());
        rt_ = std::make_unique<rltest::RuntimeFixture>(
            std::vector<std::string>{"transport-" + GetParam()});
        ASSERT_EQ(rt_->status(), RL_OK) << rl_last_error();
    }
    void TearDown() override {
        for (auto *i : instances_) rl_instance_destroy(i);
        instances_.clear();
        rt_.reset();
    }
    rl_instance_t *make(const json &params) {
        rl_instance_t *inst = nullptr;
        const std::string p = params.dump();
        EXPECT_EQ(rl_instance_create(rt_->get(), "transport", backend_->plugin().c_str(), p.c_str(),
                                     &inst),
                  RL_OK)
            << rl_last_error();
        if (inst) instances_.push_back(inst);
        return inst;
    }
    rl_instance_t *receiver() { return make(backend_->receiver_params()); }
    rl_instance_t *sender() {
        backend_->before_sender();
        return make(backend_->sender_params());
    }

    std::unique_ptr<Backend> backend_;
    std::unique_ptr<rltest::RuntimeFixture> rt_;
    std::vector<rl_instance_t *> instances_;
};

TEST_P(TransportConformance, DeliversMessagesInOrderWithTheirHeadersAndTensors) {
    rl_instance_t *rx = receiver();
    rl_instance_t *tx = sender();
    ASSERT_TRUE(rx && tx);
    for (int i = 0; i < 5; ++i) {
        std::vector<Tensor> ts;
        ts.push_back(make_tensor<float>("logprobs", kF32, {2, 2}, {-0.5f * i, 1.f, 2.f, 3.f}));
        ts.push_back(make_tensor<int64_t>("ids", kI64, {3}, {i, 7, -9}));
        ts.push_back(make_tensor<uint16_t>("w", kBF16, {1}, {uint16_t(0x3f80 + i)}));
        ts.push_back(make_tensor<float>("empty", kF32, {0, 4}, {}));
        ASSERT_EQ(send(tx, json{{"i", i}, {"tag", "batch"}}.dump(), ts), RL_OK) << rl_last_error();
    }
    for (int i = 0; i < 5; ++i) {
        Result r;
        ASSERT_EQ(rl_transport_recv(rx, 10000, &r.r), RL_OK) << rl_last_error();
        const json h = json::parse(r.text("header"));
        EXPECT_EQ(h.at("i"), i);
        EXPECT_EQ(h.at("tag"), "batch");
        EXPECT_FALSE(h.contains("tensors")) << "the transport's own key leaks to the receiver";
        const auto lp = tensor_bytes(r, "logprobs");
        ASSERT_EQ(lp.size(), 16u);
        float first;
        std::memcpy(&first, lp.data(), 4);
        EXPECT_EQ(first, -0.5f * i);
        const auto ids = tensor_bytes(r, "ids");
        ASSERT_EQ(ids.size(), 24u);
        int64_t id0;
        std::memcpy(&id0, ids.data(), 8);
        EXPECT_EQ(id0, i);
        rl_tensor_view_t w{};
        ASSERT_EQ(rl_result_tensor(r.r, "w", &w), RL_OK);
        EXPECT_EQ(w.dtype.code, RL_DTYPE_BFLOAT);
        uint16_t wv;
        std::memcpy(&wv, w.data, 2);
        EXPECT_EQ(wv, 0x3f80 + i);
        rl_tensor_view_t e{};
        ASSERT_EQ(rl_result_tensor(r.r, "empty", &e), RL_OK);
        ASSERT_EQ(e.ndim, 2);
        EXPECT_EQ(e.shape[0], 0);
        EXPECT_EQ(e.shape[1], 4);
    }
}

TEST_P(TransportConformance, CarriesA256MiBMessageIntact) {
    rl_instance_t *rx = receiver();
    rl_instance_t *tx = sender();
    ASSERT_TRUE(rx && tx);
    std::vector<Tensor> ts;
    const int64_t per = 16 * 1024 * 1024; // 64 MiB of float32 each, 4 of them
    for (int k = 0; k < 4; ++k) {
        std::vector<float> v(static_cast<size_t>(per));
        for (int64_t i = 0; i < per; ++i) v[i] = static_cast<float>(k * per + i);
        ts.push_back(make_tensor<float>("layer" + std::to_string(k), kF32, {per / 1024, 1024}, v));
    }
    ASSERT_EQ(send(tx, R"({"kind": "weights"})", ts), RL_OK) << rl_last_error();
    ts.clear();
    Result r;
    ASSERT_EQ(rl_transport_recv(rx, 60000, &r.r), RL_OK) << rl_last_error();
    for (int k = 0; k < 4; ++k) {
        const std::string name = "layer" + std::to_string(k);
        rl_tensor_view_t v{};
        ASSERT_EQ(rl_result_tensor(r.r, name.c_str(), &v), RL_OK);
        ASSERT_EQ(v.shape[0] * v.shape[1], per);
        const auto *f = static_cast<const float *>(v.data);
        for (int64_t i = 0; i < per; i += 4099)
            ASSERT_EQ(f[i], static_cast<float>(k * per + i)) << name << "[" << i << "]";
        EXPECT_EQ(f[per - 1], static_cast<float>(k * per + per - 1));
    }
}

TEST_P(TransportConformance, ReceiveTimesOutWhenNothingWasSent) {
    rl_instance_t *rx = receiver();
    ASSERT_TRUE(rx);
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_transport_recv(rx, 100, &r), RL_ERR_TIMEOUT);
    EXPECT_EQ(r, nullptr);
    EXPECT_EQ(rl_transport_recv(rx, 0, &r), RL_ERR_TIMEOUT);
}

// A sender process that is killed -9: what it handed over arrives, then the
// receiver times out (no hang); a restarted sender is heard again.
TEST_P(TransportConformance, SurvivesASenderKilledMidRun) {
    rl_instance_t *rx = receiver();
    ASSERT_TRUE(rx);
    auto run_sender = [&](int first, int count) {
        int go[2];
        ASSERT_EQ(::pipe(go), 0);
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            ::close(go[1]);
            rltest::RuntimeFixture rt({"transport-" + GetParam()});
            rl_instance_t *tx = nullptr;
            const std::string p = backend_->sender_params().dump();
            if (rl_instance_create(rt.get(), "transport", backend_->plugin().c_str(), p.c_str(),
                                   &tx) != RL_OK)
                ::_exit(3);
            for (int i = first; i < first + count; ++i)
                if (send(tx, json{{"i", i}}.dump(), {make_tensor<int64_t>("x", kI64, {1}, {i})}) !=
                    RL_OK)
                    ::_exit(4);
            char c;
            (void)!::read(go[0], &c, 1); // wait until the parent has the messages
            ::raise(SIGKILL);
        }
        ::close(go[0]);
        for (int i = first; i < first + count; ++i) {
            Result r;
            ASSERT_EQ(rl_transport_recv(rx, 20000, &r.r), RL_OK) << rl_last_error();
            EXPECT_EQ(json::parse(r.text("header")).at("i"), i);
        }
        (void)!::write(go[1], "k", 1);
        ::close(go[1]);
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            << "sender exited with " << status;
    };
    run_sender(0, 3);
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_transport_recv(rx, 300, &r), RL_ERR_TIMEOUT) << "a dead sender must not hang";
    run_sender(3, 2); // restarted
}

TEST_P(TransportConformance, RefusesAMalformedHeaderAndKeepsReceiving) {
    rl_instance_t *rx = receiver();
    ASSERT_TRUE(rx);
    backend_->inject("this is not JSON", {});
    Result bad;
    EXPECT_EQ(rl_transport_recv(rx, 10000, &bad.r), RL_ERR_INVALID_ARG);
    EXPECT_EQ(bad.r, nullptr);
    RL_EXPECT_ERROR_HAS("malformed header");
    // A header whose tensor list lies about sizes.
    backend_->inject(
        R"({"tensors": [{"name": "x", "dtype": "float32", "shape": [4], "nbytes": 8, "crc32c": 0}]})",
        {std::vector<uint8_t>(8)});
    EXPECT_EQ(rl_transport_recv(rx, 10000, &bad.r), RL_ERR_INVALID_ARG);
    RL_EXPECT_ERROR_HAS("tensor 'x'");
    rl_instance_t *tx = sender();
    ASSERT_EQ(send(tx, R"({"after": true})"), RL_OK) << rl_last_error();
    Result good;
    ASSERT_EQ(rl_transport_recv(rx, 10000, &good.r), RL_OK) << rl_last_error();
    EXPECT_EQ(json::parse(good.text("header")).at("after"), true);
}

TEST_P(TransportConformance, RefusesAChecksumMismatchAndKeepsReceiving) {
    rl_instance_t *rx = receiver();
    ASSERT_TRUE(rx);
    // The header a real sender would write for w = [1, 2, 3, 4] ...
    std::vector<float> w{1, 2, 3, 4};
    int64_t shape[1] = {4};
    rl_tensor_arg_t arg = tensor_arg("w", w.data(), kF32, shape, 1);
    rl_message_view_t m{};
    m.struct_size = sizeof m;
    m.tensors.items = &arg;
    m.tensors.count = 1;
    std::vector<rl::sdk::transport::OutTensor> outs;
    const std::string header = rl::sdk::transport::encode_header(m, &outs);
    // ... with one bit flipped in the payload.
    std::vector<uint8_t> payload(16);
    std::memcpy(payload.data(), w.data(), 16);
    payload[9] ^= 0x01;
    backend_->inject(header, {payload});
    Result bad;
    EXPECT_EQ(rl_transport_recv(rx, 10000, &bad.r), RL_ERR_INVALID_ARG);
    EXPECT_EQ(bad.r, nullptr);
    RL_EXPECT_ERROR_HAS("checksum mismatch in tensor 'w'");
    // The intact message is accepted.
    std::memcpy(payload.data(), w.data(), 16);
    backend_->inject(header, {payload});
    Result good;
    ASSERT_EQ(rl_transport_recv(rx, 10000, &good.r), RL_OK) << rl_last_error();
    EXPECT_EQ(tensor_bytes(good, "w"), payload);
}

TEST_P(TransportConformance, SenderRefusesMessagesItCannotCarryNamingTheProblem) {
    rl_instance_t *rx = receiver();
    rl_instance_t *tx = sender();
    ASSERT_TRUE(rx && tx);
    auto refused = [&](const std::string &header, std::vector<Tensor> ts, const char *needle) {
        EXPECT_EQ(send(tx, header, std::move(ts)), RL_ERR_INVALID_ARG) << needle;
        RL_EXPECT_ERROR_HAS(needle);
    };
    refused("[1, 2]", {}, "must be a JSON object");
    refused("{not json", {}, "must be a JSON object");
    refused(R"({"tensors": []})", {}, "'tensors' is reserved");
    refused("{}", {make_tensor<float>("", kF32, {1}, {1.f})}, "has no name");
    // Non-contiguous: a transposed 2x2 view.
    std::vector<float> v{1, 2, 3, 4};
    int64_t shape[2] = {2, 2}, strides[2] = {1, 2};
    rl_tensor_arg_t a = tensor_arg("t", v.data(), kF32, shape, 2);
    a.view.strides = strides;
    rl_tensor_list_t list{&a, 1};
    EXPECT_EQ(rl_transport_send(tx, rl_string_view_t{"{}", 2}, &list), RL_ERR_INVALID_ARG);
    RL_EXPECT_ERROR_HAS("'t' is not contiguous");
    // Nothing half-sent reached the receiver.
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_transport_recv(rx, 200, &r), RL_ERR_TIMEOUT);
}

INSTANTIATE_TEST_SUITE_P(Plugins, TransportConformance,
                         ::testing::Values(std::string("filesystem"), std::string("zmq"),
                                           std::string("nccl")),
                         [](const auto &info) { return info.param; });

// ---- the wire format's checksum ------------------------------------------------------

TEST(WireFormat, Crc32cGivesTheStandardValuesWithAndWithoutTheCpuInstruction) {
    namespace tp = rl::sdk::transport;
    const std::string check = "123456789";
    EXPECT_EQ(tp::crc32c(check.data(), check.size()), 0xE3069283u); // the CRC-32C check value
    EXPECT_EQ(tp::crc32c_portable(check.data(), check.size()), 0xE3069283u);
    EXPECT_EQ(tp::crc32c(nullptr, 0), 0u);
    std::vector<uint8_t> buf(1000);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
    for (size_t off = 0; off < 9; ++off)
        for (size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 500u, 991u}) {
            const uint32_t hw = tp::crc32c(buf.data() + off, n);
            EXPECT_EQ(hw, tp::crc32c_portable(buf.data() + off, n)) << off << " " << n;
            // Continuing a checksum equals one pass over both parts.
            const size_t k = n / 3;
            EXPECT_EQ(tp::crc32c(buf.data() + off + k, n - k, tp::crc32c(buf.data() + off, k)), hw);
        }
}

// ---- zmq: a sender needs a receiver -------------------------------------------------

TEST(ZmqTransport, SenderWithoutAReceiverTimesOutWithAClearError) {
    rltest::RuntimeFixture rt({"transport-zmq"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const std::string p = json{
        {"role", "push"},
        {"port", rltest::free_tcp_port()},
        {"hwm", 1},
        {"timeout_ms", 200}}.dump();
    rl_instance_t *tx = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "zmq", p.c_str(), &tx), RL_OK)
        << rl_last_error();
    rl_status_t st = RL_OK;
    for (int i = 0; i < 16 && st == RL_OK; ++i) st = send(tx, "{}");
    EXPECT_EQ(st, RL_ERR_TIMEOUT);
    RL_EXPECT_ERROR_HAS("is the peer running");
    rl_instance_destroy(tx);
}

TEST(ZmqTransport, EachEndRefusesTheOtherEndsVerb) {
    rltest::RuntimeFixture rt({"transport-zmq"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const int port = rltest::free_tcp_port();
    rl_instance_t *rx = nullptr, *tx = nullptr;
    const std::string pr = json{{"role", "pull"}, {"port", port}}.dump();
    const std::string pt = json{{"role", "push"}, {"port", port}}.dump();
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "zmq", pr.c_str(), &rx), RL_OK);
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "zmq", pt.c_str(), &tx), RL_OK);
    EXPECT_EQ(send(rx, "{}"), RL_ERR_INVALID_ARG);
    RL_EXPECT_ERROR_HAS("role 'pull'");
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_transport_recv(tx, 0, &r), RL_ERR_INVALID_ARG);
    RL_EXPECT_ERROR_HAS("role 'push'");
    // A second receiver on a port in use is named.
    rl_instance_t *again = nullptr;
    EXPECT_EQ(rl_instance_create(rt.get(), "transport", "zmq", pr.c_str(), &again), RL_ERR_IO);
    RL_EXPECT_ERROR_HAS("cannot bind");
    rl_instance_destroy(rx);
    rl_instance_destroy(tx);
}

// ---- nccl: a broadcast group that loses and regains a receiver ------------------------

// A receiver process for the tests below: this test binary run again with
// RL_NCCL_RECEIVER_PORT set (fork + exec, so the child starts clean). It
// writes "ready", then the header's "i" of every message, one per line, to
// RL_NCCL_RECEIVER_OUT until it is killed.
TEST(NcclReceiverProcess, HelperOfTheNcclTransportTests) {
    const char *port = std::getenv("RL_NCCL_RECEIVER_PORT");
    const char *out = std::getenv("RL_NCCL_RECEIVER_OUT");
    if (!port || !out) GTEST_SKIP() << "runs only as a process started by NcclTransport tests";
    rltest::RuntimeFixture rt({"transport-nccl"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const std::string p = json{
        {"role", "pull"}, {"port", std::atoi(port)}, {"rank", 1}, {"world_size", 2}, {"timeout", 5},
        {"poll_ms", 2}}.dump();
    rl_instance_t *rx = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "nccl", p.c_str(), &rx), RL_OK)
        << rl_last_error();
    std::ofstream(out, std::ios::app) << "ready" << std::endl;
    const pid_t parent = ::getppid();
    while (::getppid() == parent) { // ends with the test that started it
        Result r;
        if (rl_transport_recv(rx, 1000, &r.r) == RL_OK)
            std::ofstream(out, std::ios::app) << json::parse(r.text("header")).at("i") << std::endl;
    }
}

pid_t spawn_receiver(int port, const std::string &out) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setenv("RL_NCCL_RECEIVER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("RL_NCCL_RECEIVER_OUT", out.c_str(), 1);
        ::execl("/proc/self/exe", "transport_conformance_test",
                "--gtest_filter=NcclReceiverProcess.*", static_cast<char *>(nullptr));
        ::_exit(127);
    }
    return pid;
}

// Waits up to 30 s for `line` in the file.
bool wait_line(const std::string &path, const std::string &line) {
    for (int i = 0; i < 600; ++i) {
        std::ifstream in(path);
        std::string l;
        while (std::getline(in, l))
            if (l == line) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

TEST(NcclTransport, ASenderNamesAVanishedReceiverAndTakesARestartedOneBack) {
    rltest::RuntimeFixture rt({"transport-nccl"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const int port = rltest::free_tcp_port();
    const std::string p =
        json{{"role", "push"}, {"port", port}, {"world_size", 2}, {"timeout", 3}, {"poll_ms", 2}}
            .dump();
    rl_instance_t *tx = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "nccl", p.c_str(), &tx), RL_OK)
        << rl_last_error();
    const fs::path dir = fs::temp_directory_path() / ("rl-nccl-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    auto message = [](int i) { return json{{"i", i}}.dump(); };
    auto one = [](int i) { return std::vector<Tensor>{make_tensor<int64_t>("x", kI64, {1}, {i})}; };

    const pid_t first = spawn_receiver(port, (dir / "first").string());
    ASSERT_TRUE(wait_line((dir / "first").string(), "ready"));
    ASSERT_EQ(send(tx, message(0), one(0)), RL_OK) << rl_last_error();
    ASSERT_TRUE(wait_line((dir / "first").string(), "0"));
    ::kill(first, SIGKILL);
    ::waitpid(first, nullptr, 0);

    // The broadcast to the dead rank fails, naming the sender's group ...
    EXPECT_NE(send(tx, message(1), one(1)), RL_OK);
    RL_EXPECT_ERROR_HAS("nccl transport (sender at 127.0.0.1:");
    // ... and a new group without it fails after the timeout (never a hang).
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(send(tx, message(2), one(2)), RL_ERR_TIMEOUT);
    RL_EXPECT_ERROR_HAS("forming the group");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));

    // A restarted receiver is taken into the next group.
    const pid_t second = spawn_receiver(port, (dir / "second").string());
    ASSERT_TRUE(wait_line((dir / "second").string(), "ready"));
    rl_status_t st = RL_ERR_TIMEOUT;
    for (int attempt = 0; attempt < 3 && st != RL_OK; ++attempt) st = send(tx, message(3), one(3));
    EXPECT_EQ(st, RL_OK) << rl_last_error();
    EXPECT_TRUE(wait_line((dir / "second").string(), "3"));
    ::kill(second, SIGKILL);
    ::waitpid(second, nullptr, 0);
    rl_instance_destroy(tx);
    fs::remove_all(dir);
}

TEST(NcclTransport, AReceiverWithoutASenderTimesOutNamingTheUnreachableStore) {
    rltest::RuntimeFixture rt({"transport-nccl"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const std::string p =
        json{{"role", "pull"}, {"port", rltest::free_tcp_port()}, {"rank", 1}}.dump();
    rl_instance_t *rx = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "transport", "nccl", p.c_str(), &rx), RL_OK)
        << rl_last_error();
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_transport_recv(rx, 300, &r), RL_ERR_TIMEOUT);
    RL_EXPECT_ERROR_HAS("is the sender running?");
    rl_instance_destroy(rx);
}

TEST(NcclTransport, BadParametersAreNamed) {
    rltest::RuntimeFixture rt({"transport-nccl"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    auto refused = [&](const json &params, const char *needle) {
        rl_instance_t *inst = nullptr;
        const std::string p = params.dump();
        EXPECT_NE(rl_instance_create(rt.get(), "transport", "nccl", p.c_str(), &inst), RL_OK);
        RL_EXPECT_ERROR_HAS(needle);
        rl_instance_destroy(inst);
    };
    refused({{"role", "push"}}, "'port' is required");
    refused({{"role", "pull"}, {"port", 5000}, {"rank", 0}}, "rank 0 is the sender");
    refused({{"role", "push"}, {"port", 5000}, {"rank", 1}}, "the sender (role 'push') is rank 0");
    refused({{"role", "pull"}, {"port", 5000}, {"rank", 2}, {"world_size", 2}}, "rank");
    refused({{"role", "push"}, {"port", 5000}, {"backend", "mpi"}}, "backend");
}

// ---- filesystem layout ------------------------------------------------------------

class FilesystemLayout : public ::testing::Test {
protected:
    void SetUp() override {
        rt_ = std::make_unique<rltest::RuntimeFixture>(
            std::vector<std::string>{"transport-filesystem"});
        ASSERT_EQ(rt_->status(), RL_OK) << rl_last_error();
    }
    void TearDown() override {
        for (auto *i : instances_) rl_instance_destroy(i);
        rt_.reset();
    }
    rl_instance_t *make(json params) {
        params["dir"] = b_.dir().string();
        rl_instance_t *inst = nullptr;
        const std::string p = params.dump();
        EXPECT_EQ(rl_instance_create(rt_->get(), "transport", "filesystem", p.c_str(), &inst),
                  RL_OK)
            << rl_last_error();
        if (inst) instances_.push_back(inst);
        return inst;
    }
    FilesystemBackend b_;
    std::unique_ptr<rltest::RuntimeFixture> rt_;
    std::vector<rl_instance_t *> instances_;
};

TEST_F(FilesystemLayout, WritesStepFoldersWithStableLastAndKeepsTheNewestK) {
    rl_instance_t *tx = make({{"channel", "broadcasts"}, {"keep", 2}});
    for (int s = 0; s < 5; ++s)
        ASSERT_EQ(send(tx, json{{"step", 10 + s}}.dump(),
                       {make_tensor<float>("w", kF32, {1}, {float(s)})}),
                  RL_OK)
            << rl_last_error();
    std::vector<std::string> names;
    for (const auto &e : fs::directory_iterator(b_.dir() / "broadcasts"))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"step_13", "step_14"}));
    for (const char *f : {"header.json", "tensors.bin", "STABLE"})
        EXPECT_TRUE(fs::exists(b_.dir() / "broadcasts" / "step_14" / f)) << f;
}

TEST_F(FilesystemLayout, LatestModeReadsTheNewestStepAndIgnoresUnfinishedOnes) {
    rl_instance_t *tx = make({{"channel", "broadcasts"}, {"keep", 0}});
    rl_instance_t *rx = make({{"channel", "broadcasts"}, {"mode", "latest"}, {"poll_ms", 5}});
    for (int s = 1; s <= 3; ++s) ASSERT_EQ(send(tx, json{{"step", s}}.dump()), RL_OK);
    // A crashed writer's leftovers: a folder without STABLE, a temporary one.
    fs::create_directories(b_.dir() / "broadcasts" / "step_9");
    std::ofstream(b_.dir() / "broadcasts" / "step_9" / "header.json") << "{";
    fs::create_directories(b_.dir() / "broadcasts" / ".tmp-step_8-1-1");
    Result r;
    ASSERT_EQ(rl_transport_recv(rx, 1000, &r.r), RL_OK) << rl_last_error();
    EXPECT_EQ(json::parse(r.text("header")).at("step"), 3);
    EXPECT_EQ(r.metric("transport/step"), 3.0);
    rl_result_t *none = nullptr;
    EXPECT_EQ(rl_transport_recv(rx, 50, &none), RL_ERR_TIMEOUT) << "step 3 was already read";
}

TEST_F(FilesystemLayout, AQueueReaderRemovesWhatItConsumedAndNothingElse) {
    rl_instance_t *tx = make({});
    rl_instance_t *rx = make({{"poll_ms", 5}});
    for (int s = 0; s < 3; ++s) ASSERT_EQ(send(tx, json{{"step", s}}.dump()), RL_OK);
    Result r;
    ASSERT_EQ(rl_transport_recv(rx, 1000, &r.r), RL_OK) << rl_last_error();
    EXPECT_FALSE(fs::exists(b_.dir() / "rollouts" / "step_0"));
    EXPECT_TRUE(fs::exists(b_.dir() / "rollouts" / "step_1"));
    EXPECT_TRUE(fs::exists(b_.dir() / "rollouts" / "step_2"));
    // consume=false leaves them for other readers.
    rl_instance_t *peek = make({{"poll_ms", 5}, {"consume", false}});
    Result p;
    ASSERT_EQ(rl_transport_recv(peek, 1000, &p.r), RL_OK) << rl_last_error();
    EXPECT_EQ(json::parse(p.text("header")).at("step"), 1);
    EXPECT_TRUE(fs::exists(b_.dir() / "rollouts" / "step_1"));
}

TEST_F(FilesystemLayout, AnUnreadStepIsNeverReplacedOutsideBroadcasts) {
    // Two writers (say, a crashed worker and its restart) both send "step 5".
    rl_instance_t *a = make({});
    rl_instance_t *b = make({});
    ASSERT_EQ(send(a, json{{"step", 5}, {"from", "a"}}.dump()), RL_OK) << rl_last_error();
    ASSERT_EQ(send(b, json{{"step", 5}, {"from", "b"}}.dump()), RL_OK) << rl_last_error();
    rl_instance_t *rx = make({{"poll_ms", 5}});
    for (const char *from : {"a", "b"}) {
        Result r;
        ASSERT_EQ(rl_transport_recv(rx, 1000, &r.r), RL_OK) << rl_last_error();
        EXPECT_EQ(json::parse(r.text("header")).at("from"), from);
    }
    // On the broadcasts channel a re-sent step replaces: the newest weights of a version.
    rl_instance_t *w = make({{"channel", "broadcasts"}});
    ASSERT_EQ(send(w, json{{"step", 3}, {"n", 1}}.dump()), RL_OK);
    ASSERT_EQ(send(w, json{{"step", 3}, {"n", 2}}.dump()), RL_OK);
    EXPECT_FALSE(fs::exists(b_.dir() / "broadcasts" / "step_4"));
    rl_instance_t *wr = make({{"channel", "broadcasts"}, {"mode", "latest"}});
    Result r;
    ASSERT_EQ(rl_transport_recv(wr, 1000, &r.r), RL_OK) << rl_last_error();
    EXPECT_EQ(json::parse(r.text("header")).at("n"), 2);
}

TEST_F(FilesystemLayout, QueueModeReportsStepsCollectedBeforeTheyWereRead) {
    rl_instance_t *tx = make({{"keep", 2}});
    rl_instance_t *rx = make({{"poll_ms", 5}, {"start_step", 0}, {"consume", false}});
    for (int s = 0; s < 4; ++s) ASSERT_EQ(send(tx, json{{"step", s}}.dump()), RL_OK);
    Result r;
    ASSERT_EQ(rl_transport_recv(rx, 1000, &r.r), RL_OK) << rl_last_error();
    EXPECT_EQ(json::parse(r.text("header")).at("step"), 2);
    EXPECT_EQ(r.metric("transport/skipped_steps"), 2.0);
}

TEST_F(FilesystemLayout, BadParametersAreNamed) {
    rl_instance_t *inst = nullptr;
    EXPECT_NE(rl_instance_create(rt_->get(), "transport", "filesystem", "{}", &inst), RL_OK);
    RL_EXPECT_ERROR_HAS("'dir'");
    EXPECT_NE(rl_instance_create(rt_->get(), "transport", "filesystem",
                                 R"({"dir": "/tmp/x", "mode": "newest"})", &inst),
              RL_OK);
    RL_EXPECT_ERROR_HAS("mode");
}

} // namespace
