// bench_weight_sync: how long one weight sync of a 0.5B-parameter model takes
// over each transport plugin on this machine (filesystem, zmq, and nccl on
// its Gloo backend, a broadcast to one receiver): the tensors of Qwen2.5-0.5B's
// shapes (494M parameters, tied embeddings) in bfloat16 and float32, sent and
// received through librl (checksums computed and checked on both sides).
//
//   bench_weight_sync [--dtype bfloat16|float32|both] [--dir /tmp] [--repeat N]
//
// Prints one line per transport and dtype: seconds per sync (send + receive,
// the receiver in another thread) and GB/s. A target lives here, never in a test.
#include <rl_api.h>

#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;

struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// Qwen2.5-0.5B: hidden 896, 24 layers, MLP 4864, 14 query / 2 key-value heads
// of 64, vocabulary 151936, tied embeddings.
std::vector<Tensor> qwen_0_5b(size_t elem) {
    const int64_t h = 896, kv = 128, mlp = 4864, vocab = 151936;
    std::vector<Tensor> t;
    auto add = [&](std::string n, std::vector<int64_t> s) {
        int64_t numel = 1;
        for (auto d : s) numel *= d;
        Tensor x{std::move(n), std::move(s), std::vector<uint8_t>(numel * elem)};
        for (size_t i = 0; i < x.bytes.size(); i += 4096)
            x.bytes[i] = static_cast<uint8_t>(i >> 12);
        t.push_back(std::move(x));
    };
    add("model.embed_tokens.weight", {vocab, h});
    for (int l = 0; l < 24; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "self_attn.q_proj.weight", {h, h});
        add(p + "self_attn.q_proj.bias", {h});
        add(p + "self_attn.k_proj.weight", {kv, h});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.weight", {kv, h});
        add(p + "self_attn.v_proj.bias", {kv});
        add(p + "self_attn.o_proj.weight", {h, h});
        add(p + "mlp.gate_proj.weight", {mlp, h});
        add(p + "mlp.up_proj.weight", {mlp, h});
        add(p + "mlp.down_proj.weight", {h, mlp});
        add(p + "input_layernorm.weight", {h});
        add(p + "post_attention_layernorm.weight", {h});
    }
    add("model.norm.weight", {h});
    return t;
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

void check(rl_status_t s, const char *what) {
    if (s != RL_OK) throw std::runtime_error(std::string(what) + ": " + rl_last_error());
}

rl_instance_t *make(rl_runtime_t *rt, const char *name, const json &params) {
    rl_instance_t *i = nullptr;
    const std::string p = params.dump();
    check(rl_instance_create(rt, "transport", name, p.c_str(), &i), name);
    return i;
}

// Seconds for one send + receive of `ts`.
double one_sync(rl_instance_t *tx, rl_instance_t *rx, std::vector<Tensor> &ts,
                const rl_dtype_t dtype, int version) {
    std::vector<rl_tensor_arg_t> args(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
        args[i].name = ts[i].name.c_str();
        args[i].view.data = ts[i].bytes.data();
        args[i].view.device = {RL_DEVICE_CPU, 0};
        args[i].view.ndim = static_cast<int32_t>(ts[i].shape.size());
        args[i].view.dtype = dtype;
        args[i].view.shape = ts[i].shape.data();
    }
    const rl_tensor_list_t list{args.data(), args.size()};
    // A new version each time: a "latest" reader takes only newer steps.
    const std::string header =
        json{{"kind", "rl.weights"}, {"version", version}, {"step", version}}.dump();
    const auto t0 = std::chrono::steady_clock::now();
    rl_status_t recv_status = RL_OK;
    std::string recv_error;
    std::thread receiver([&] {
        rl_result_t *r = nullptr;
        recv_status = rl_transport_recv(rx, 600000, &r);
        if (recv_status != RL_OK) recv_error = rl_last_error();
        rl_result_destroy(r);
    });
    const rl_status_t s =
        rl_transport_send(tx, rl_string_view_t{header.data(), header.size()}, &list);
    const std::string send_error = s == RL_OK ? "" : rl_last_error();
    receiver.join();
    if (s != RL_OK) throw std::runtime_error("send: " + send_error);
    if (recv_status != RL_OK) throw std::runtime_error("recv: " + recv_error);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char **argv) {
    std::string which = "both", dir = std::filesystem::temp_directory_path().string();
    int repeat = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--dtype")
            which = v;
        else if (k == "--dir")
            dir = v;
        else if (k == "--repeat")
            repeat = std::stoi(v);
        else {
            std::fprintf(stderr, "unknown option %s\n", k.c_str());
            return 2;
        }
    }
    rl_runtime_desc_t d = RL_RUNTIME_DESC_INIT;
    d.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
    d.plugin_path = RL_BENCH_PLUGIN_DIR;
    d.log_level = "warn";
    rl_runtime_t *rt = nullptr;
    check(rl_runtime_create(&d, &rt), "runtime");
    const std::string fs_dir = dir + "/rl-bench-weight-sync-" + std::to_string(::getpid());
    try {
        for (const std::string dt : {"bfloat16", "float32"}) {
            if (which != "both" && which != dt) continue;
            const bool bf = dt == "bfloat16";
            std::vector<Tensor> ts = qwen_0_5b(bf ? 2 : 4);
            uint64_t bytes = 0, params = 0;
            for (const auto &t : ts) {
                bytes += t.bytes.size();
                params += t.bytes.size() / (bf ? 2 : 4);
            }
            const rl_dtype_t dtype =
                bf ? rl_dtype_t{RL_DTYPE_BFLOAT, 16, 1} : rl_dtype_t{RL_DTYPE_FLOAT, 32, 1};
            for (const char *name : {"filesystem", "zmq", "nccl"}) {
                rl_instance_t *tx = nullptr, *rx = nullptr;
                if (std::string(name) == "nccl") {
                    // One receiver rank; Gloo on this CPU (the sender forms
                    // the group on its first send, inside the timed sync).
                    const int port = free_port();
                    tx = make(rt, name, {{"role", "push"}, {"port", port}, {"world_size", 2}});
                    rx = make(rt, name,
                              {{"role", "pull"}, {"port", port}, {"rank", 1}, {"world_size", 2}});
                } else if (std::string(name) == "filesystem") {
                    tx = make(rt, name, {{"dir", fs_dir}, {"channel", "broadcasts"}});
                    rx = make(rt, name,
                              {{"dir", fs_dir},
                               {"channel", "broadcasts"},
                               {"mode", "latest"},
                               {"poll_ms", 1}});
                } else {
                    const int port = free_port();
                    rx = make(rt, name, {{"role", "pull"}, {"port", port}});
                    tx = make(rt, name, {{"role", "push"}, {"port", port}, {"hwm", 1}});
                }
                double best = 1e30;
                // nccl: the first sync also forms the group; best-of keeps the steady state.
                for (int r = 0; r < repeat; ++r) {
                    best = std::min(best, one_sync(tx, rx, ts, dtype, r + 1));
                }
                std::printf(
                    "weight sync %-10s %-8s %6.1f M params %6.2f GB: %6.2f s  (%5.2f GB/s)\n", name,
                    dt.c_str(), params / 1e6, bytes / 1e9, best, bytes / 1e9 / best);
                std::fflush(stdout);
                rl_instance_destroy(tx);
                rl_instance_destroy(rx);
                std::filesystem::remove_all(fs_dir);
            }
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_weight_sync: %s\n", e.what());
        std::filesystem::remove_all(fs_dir);
        rl_runtime_destroy(rt);
        return 1;
    }
    std::filesystem::remove_all(fs_dir);
    rl_runtime_destroy(rt);
    return 0;
}
