// plugins/transports/nccl: messages broadcast from one sender (rank 0, the
// trainer) to every receiver (ranks 1..world_size-1, the inference workers)
// over a collective group (docs/transports.md). The collectives are the
// host's (extension rl.host.collective/1: c10d TCPStore, Gloo for CPU
// tensors, NCCL for CUDA tensors), so this plugin links no collective
// library. Keys as Surogate's weight_broadcast: host, port, timeout.
//
// Rendezvous. The sender hosts the store at host:port. Each receiver, when it
// (re)connects, takes a ticket: join/r{rank} += 1. Before a send the sender
// compares every rank's ticket with those its group was formed with; when one
// changed (a receiver started or restarted) or there is no group, it forms
// generation g: publishes seen/g{g}/r{rank} = the ticket it saw, bumps gen,
// and joins group "g{g}". A receiver joins generation g once gen = g and
// seen/g{g}/r{rank} covers its own ticket, so it never waits in a group that
// formed without it.
//
// One message (protocols.md D.3, after the group init): the sender announces
// it (msg/g{g} += 1; receivers poll the store, so nobody waits inside a
// collective for a message that is not coming), then broadcasts
//   frame   int64[4] {header bytes, buckets, sequence number, magic}
//   sizes   int64[buckets]
//   header  the wire header (rl/sdk/transport.hpp): names, dtypes, shapes,
//           sizes and CRC-32C of every tensor, in order
//   buckets the tensors' bytes; consecutive tensors share a bucket up to
//           bucket_mb, a larger tensor is a bucket of its own
//   commit  int64[2] {sequence number, CRC-32C of the header}
// Each receiver's own thread takes every message into a bounded queue;
// recv() hands the next one over once its header, sizes, commit and every
// checksum passed. A malformed or corrupted message is refused (recv returns
// the error) and the stream goes on.
#include <rl/sdk/plugin.hpp>
#include <rl/sdk/transport.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace tp = rl::sdk::transport;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMagic = 0x726c6e63636c0001; // "rlnccl", format 1
constexpr int64_t kMaxHeader = int64_t{256} << 20;
constexpr int64_t kMaxBuckets = int64_t{1} << 20;

rl_tensor_arg_t arg_of(const char *name, void *data, rl_dtype_t dtype, int64_t *shape) {
    rl_tensor_arg_t a{};
    a.name = name;
    a.view.data = data;
    a.view.device = {RL_DEVICE_CPU, 0};
    a.view.ndim = 1;
    a.view.dtype = dtype;
    a.view.shape = shape;
    return a;
}

constexpr rl_dtype_t kI64{RL_DTYPE_INT, 64, 1}, kU8{RL_DTYPE_UINT, 8, 1};

// The store is gone (its host, the sender, stopped): reconnect from scratch.
struct StoreGone : rl::sdk::Error {
    explicit StoreGone(const std::string &m) : rl::sdk::Error(RL_ERR_IO, m) {}
};

// The store and group of one end, over the host's collective extension.
class Group {
public:
    Group(const rl_host_collective_t *ext, std::string host, int port, std::string backend,
          int device, int world, int64_t timeout_ms)
        : ext_(ext), host_(std::move(host)), port_(port), backend_(std::move(backend)),
          device_(device), world_(world), timeout_ms_(timeout_ms) {}
    ~Group() { close(); }

    std::string where() const { return host_ + ":" + std::to_string(port_); }
    std::string error() const { return ext_->last_error(); }
    bool has_store() const { return store_ != nullptr; }
    bool has_group() const { return group_ != nullptr; }

    rl_status_t open(bool server, int64_t timeout_ms) {
        return ext_->store_open(rl::sdk::detail::library().host, host_.c_str(), port_,
                                server ? 1 : 0, timeout_ms, &store_);
    }
    // The integer at key plus delta; throws (status, message) when the store is gone.
    int64_t add(const std::string &key, int64_t delta = 0) {
        int64_t v = 0;
        const rl_status_t s = ext_->store_add(store_, key.c_str(), delta, &v);
        if (s != RL_OK) throw StoreGone("the store at " + where() + " is unreachable: " + error());
        return v;
    }
    rl_status_t join(int64_t gen, int rank) {
        leave();
        const std::string prefix = "g" + std::to_string(gen);
        return ext_->group_join(store_, prefix.c_str(), backend_.c_str(), rank, world_, device_,
                                timeout_ms_, &group_);
    }
    void broadcast(std::vector<rl_tensor_arg_t> &args, const char *what) {
        rl_tensor_list_t list{args.data(), args.size()};
        const rl_status_t s = ext_->broadcast(group_, &list, 0);
        if (s != RL_OK) {
            const std::string e = error();
            leave(); // a failed collective leaves the group unusable
            rl::sdk::fail(s == RL_ERR_TIMEOUT ? RL_ERR_TIMEOUT : RL_ERR_IO,
                          std::string("broadcast of the ") + what + " failed: " + e);
        }
    }
    void leave() {
        if (group_) ext_->group_leave(group_);
        group_ = nullptr;
    }
    void close() {
        leave();
        if (store_) ext_->store_close(store_);
        store_ = nullptr;
    }

private:
    const rl_host_collective_t *ext_;
    std::string host_;
    int port_;
    std::string backend_;
    int device_, world_;
    int64_t timeout_ms_;
    rl_collective_store_t *store_ = nullptr;
    rl_collective_group_t *group_ = nullptr;
};

// A received message, or the reason one was refused.
struct Received {
    std::string error; // non-empty: refused
    std::string user_header;
    std::vector<tp::InTensor> tensors;
    std::vector<uint8_t> bytes; // every tensor, in order
};

class Nccl : public rl::sdk::Transport {
public:
    explicit Nccl(rl::sdk::Params &p)
        : host_(p.string("host", "127.0.0.1")), port_(p.integer("port", 0, 0, 65535)),
          role_(p.choice("role", "pull", {"push", "pull"})),
          world_(static_cast<int>(p.integer("world_size", 2, 2, 4096))),
          backend_(p.choice("backend", "gloo", {"gloo", "nccl"})),
          device_(static_cast<int>(p.integer("device", 0, 0, 1024))),
          timeout_ms_(static_cast<int64_t>(p.number("timeout", 600, 0.001) * 1000)),
          bucket_bytes_(p.integer("bucket_mb", 64, 1, 1 << 20) << 20),
          poll_ms_(p.integer("poll_ms", 5, 1, 10000)), queue_max_(p.integer("queue", 4, 1, 1024)),
          latest_(p.choice("mode", "queue", {"queue", "latest"}) == "latest") {
        rank_ = static_cast<int>(p.integer("rank", role_ == "push" ? 0 : 1, 0, world_ - 1));
        p.finish();
        if (port_ == 0) rl::sdk::invalid(p.owner() + ": parameter 'port' is required (1-65535)");
        if (role_ == "push" && rank_ != 0)
            rl::sdk::invalid(p.owner() + ": the sender (role 'push') is rank 0, got rank " +
                             std::to_string(rank_));
        if (role_ == "pull" && rank_ == 0)
            rl::sdk::invalid(p.owner() + ": rank 0 is the sender; a receiver's 'rank' is 1.." +
                             std::to_string(world_ - 1) + " (world_size " + std::to_string(world_) +
                             ")");
        const rl_host_api_t *h = rl::sdk::detail::library().host;
        const rl_host_collective_t *ext = nullptr;
        if (h && RL_HAS_FIELD(h, rl_host_api_t, get_extension) && h->get_extension)
            ext = static_cast<const rl_host_collective_t *>(
                h->get_extension(h, RL_EXT_HOST_COLLECTIVE));
        if (!ext || ext->struct_size < RL_SIZE_THROUGH(rl_host_collective_t, last_error))
            rl::sdk::fail(RL_ERR_UNSUPPORTED,
                          "nccl transport: the host has no collectives (extension " +
                              std::string(RL_EXT_HOST_COLLECTIVE) + "); use librl 0.5 or newer");
        group_ = std::make_unique<Group>(ext, host_, static_cast<int>(port_), backend_, device_,
                                         world_, timeout_ms_);
        if (role_ == "push") {
            if (group_->open(true, timeout_ms_) != RL_OK)
                rl::sdk::fail(RL_ERR_IO, "nccl transport: cannot host the store at " +
                                             group_->where() + ": " + group_->error());
            tickets_.assign(static_cast<size_t>(world_), 0);
        } else {
            thread_ = std::thread([this] { receive_loop(); });
        }
    }
    ~Nccl() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
        group_.reset();
    }

    // ---- sender -------------------------------------------------------------------

    void send(rl::sdk::Call &call, const rl_message_view_t &m) override {
        if (role_ != "push")
            rl::sdk::invalid("nccl transport: this end has role 'pull'; it cannot send");
        std::vector<tp::OutTensor> tensors;
        std::string header = tp::encode_header(m, &tensors);
        // Buckets: consecutive tensors up to bucket_bytes; a larger one alone.
        struct Bucket {
            size_t first, last;
            int64_t bytes;
        };
        std::vector<Bucket> buckets;
        for (size_t i = 0; i < tensors.size(); ++i) {
            const auto n = static_cast<int64_t>(tensors[i].nbytes);
            if (!buckets.empty() && buckets.back().bytes + n <= bucket_bytes_ && n > 0)
                buckets.back().last = i + 1, buckets.back().bytes += n;
            else
                buckets.push_back({i, i + 1, n});
        }
        const std::string where = "nccl transport (sender at " + group_->where() + ")";
        try {
            ensure_group();
            const int64_t seq = group_->add("msg/g" + std::to_string(gen_), 1);
            int64_t frame[4] = {static_cast<int64_t>(header.size()),
                                static_cast<int64_t>(buckets.size()), seq, kMagic};
            int64_t four = 4, nb = static_cast<int64_t>(buckets.size()),
                    hl = static_cast<int64_t>(header.size());
            std::vector<int64_t> sizes;
            for (const auto &b : buckets) sizes.push_back(b.bytes);
            std::vector<rl_tensor_arg_t> a{arg_of("frame", frame, kI64, &four)};
            group_->broadcast(a, "frame");
            a = {arg_of("sizes", sizes.data(), kI64, &nb),
                 arg_of("header", header.data(), kU8, &hl)};
            group_->broadcast(a, "header");
            std::vector<uint8_t> staging;
            for (const auto &b : buckets) {
                int64_t n = b.bytes;
                void *data = nullptr;
                if (b.last - b.first == 1) {
                    data = const_cast<uint8_t *>(tensors[b.first].data);
                } else {
                    staging.resize(static_cast<size_t>(n));
                    size_t off = 0;
                    for (size_t i = b.first; i < b.last; ++i) {
                        if (tensors[i].nbytes)
                            std::memcpy(staging.data() + off, tensors[i].data, tensors[i].nbytes);
                        off += tensors[i].nbytes;
                    }
                    data = staging.data();
                }
                if (n == 0) continue; // nothing travels for empty tensors
                a = {arg_of("bucket", data, kU8, &n)};
                group_->broadcast(a, "tensors");
            }
            int64_t two = 2;
            int64_t commit[2] = {seq,
                                 static_cast<int64_t>(tp::crc32c(header.data(), header.size()))};
            a = {arg_of("commit", commit, kI64, &two)};
            group_->broadcast(a, "commit");
        } catch (const rl::sdk::Error &e) {
            rl::sdk::fail(e.status(), where + ": " + e.what() +
                                          " (a receiver gone? the group is formed anew at the "
                                          "next send)");
        }
        uint64_t bytes = header.size();
        for (const auto &t : tensors) bytes += t.nbytes;
        call.metric("transport/bytes", static_cast<double>(bytes));
        call.metric("transport/generation", static_cast<double>(gen_));
    }

    // ---- receiver -----------------------------------------------------------------

    bool recv(rl::sdk::Call &call, int64_t timeout_ms) override {
        if (role_ != "pull")
            rl::sdk::invalid("nccl transport: this end has role 'push'; it cannot receive");
        std::unique_lock<std::mutex> lk(mu_);
        auto ready = [&] { return !queue_.empty(); };
        if (timeout_ms < 0)
            cv_.wait(lk, ready);
        else
            cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready);
        if (queue_.empty()) {
            if (timeout_ms == 0) return false;
            rl::sdk::fail(
                RL_ERR_TIMEOUT,
                "nccl transport (rank " + std::to_string(rank_) + ", store at " + group_->where() +
                    "): no message within " + std::to_string(timeout_ms) + " ms" +
                    (connected_ ? ""
                                : "; the sender's store is unreachable (is the sender running?)"));
        }
        Received r = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        cv_.notify_all();
        if (!r.error.empty()) rl::sdk::fail(RL_ERR_INVALID_ARG, r.error);
        call.text("header", r.user_header);
        size_t off = 0;
        for (const auto &t : r.tensors) {
            call.tensor(t.name, tp::view_of(t, r.bytes.data() + off));
            off += t.nbytes;
        }
        call.metric("transport/bytes", static_cast<double>(r.bytes.size()));
        if (latest_) call.metric("transport/skipped", static_cast<double>(skipped_.exchange(0)));
        return true;
    }

private:
    // Forms a new generation when a receiver (re)joined or there is no group.
    void ensure_group() {
        std::vector<int64_t> now(static_cast<size_t>(world_), 0);
        for (int r = 1; r < world_; ++r) now[r] = group_->add("join/r" + std::to_string(r));
        if (group_->has_group() && now == tickets_) return;
        group_->leave();
        const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
        for (;;) {
            std::string missing;
            for (int r = 1; r < world_; ++r) {
                now[r] = group_->add("join/r" + std::to_string(r));
                if (now[r] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            }
            if (missing.empty()) break;
            if (Clock::now() > deadline)
                rl::sdk::fail(RL_ERR_TIMEOUT,
                              "receiver rank(s) " + missing + " never reached the store within " +
                                  std::to_string(timeout_ms_ / 1000.0) + " s (world_size " +
                                  std::to_string(world_) + "; are all workers running?)");
            std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms_));
        }
        gen_ = group_->add("gen") + 1;
        for (int r = 1; r < world_; ++r)
            group_->add("seen/g" + std::to_string(gen_) + "/r" + std::to_string(r), now[r]);
        group_->add("gen", 1);
        if (group_->join(gen_, 0) != RL_OK)
            rl::sdk::fail(RL_ERR_TIMEOUT, "forming the group (generation " + std::to_string(gen_) +
                                              ", world_size " + std::to_string(world_) +
                                              ") failed: " + group_->error());
        tickets_ = now;
    }

    void receive_loop() {
        int64_t ticket = 0, my_gen = 0, handled = 0;
        while (!stopping()) {
            try {
                if (!group_->has_store()) {
                    if (group_->open(false, 1000) != RL_OK) {
                        connected_ = false;
                        nap(100);
                        continue;
                    }
                    connected_ = true;
                    ticket = group_->add("join/r" + std::to_string(rank_), 1);
                    my_gen = handled = 0;
                }
                const int64_t g = group_->add("gen");
                if (g > my_gen && group_->add("seen/g" + std::to_string(g) + "/r" +
                                              std::to_string(rank_)) >= ticket) {
                    my_gen = g;
                    handled = 0;
                    if (group_->join(g, rank_) != RL_OK)
                        log(RL_LOG_WARN, "nccl transport (rank " + std::to_string(rank_) +
                                             "): joining generation " + std::to_string(g) +
                                             " failed: " + group_->error());
                    continue;
                }
                if (group_->has_group() &&
                    group_->add("msg/g" + std::to_string(my_gen)) > handled) {
                    if (!latest_ && !wait_for_room()) break;
                    ++handled;
                    receive_one(handled);
                    continue;
                }
            } catch (const StoreGone &e) {
                // The sender stopped: drop everything and reach the store
                // again (a new ticket). A message in flight is lost whole,
                // never delivered in part.
                log(RL_LOG_WARN, "nccl transport (rank " + std::to_string(rank_) +
                                     "): " + e.what() + "; reconnecting");
                group_->close();
                connected_ = false;
            } catch (const rl::sdk::Error &e) {
                // A collective failed (the group lost a rank): the group is
                // left; the same ticket joins the sender's next generation.
                log(RL_LOG_WARN, "nccl transport (rank " + std::to_string(rank_) +
                                     "): " + e.what() + "; waiting for the next group");
                group_->leave();
            }
            nap(poll_ms_);
        }
    }

    void receive_one(int64_t expect_seq) {
        const std::string where = "nccl transport (rank " + std::to_string(rank_) + ", message " +
                                  std::to_string(expect_seq) + ")";
        int64_t frame[4] = {0, 0, 0, 0}, four = 4;
        std::vector<rl_tensor_arg_t> a{arg_of("frame", frame, kI64, &four)};
        group_->broadcast(a, "frame");
        if (frame[3] != kMagic || frame[0] < 0 || frame[0] > kMaxHeader || frame[1] < 0 ||
            frame[1] > kMaxBuckets) {
            // Not our protocol: nothing after it can be trusted to line up.
            group_->leave();
            push({where + ": malformed header: bad frame (not an rl nccl sender?)", "", {}, {}});
            return;
        }
        std::vector<int64_t> sizes(static_cast<size_t>(frame[1]));
        std::string header(static_cast<size_t>(frame[0]), '\0');
        int64_t nb = frame[1], hl = frame[0];
        a = {arg_of("sizes", sizes.data(), kI64, &nb), arg_of("header", header.data(), kU8, &hl)};
        group_->broadcast(a, "header");
        int64_t total = 0;
        for (int64_t s : sizes) {
            if (s < 0) {
                group_->leave();
                push({where + ": malformed header: negative bucket size", "", {}, {}});
                return;
            }
            total += s;
        }
        Received r;
        r.bytes.resize(static_cast<size_t>(total));
        int64_t off = 0;
        for (int64_t s : sizes) {
            int64_t n = s;
            if (n == 0) continue;
            a = {arg_of("bucket", r.bytes.data() + off, kU8, &n)};
            group_->broadcast(a, "tensors");
            off += n;
        }
        int64_t commit[2] = {0, 0}, two = 2;
        a = {arg_of("commit", commit, kI64, &two)};
        group_->broadcast(a, "commit");
        // Everything arrived: check it before anything is handed over.
        try {
            if (commit[0] != frame[2] ||
                commit[1] != static_cast<int64_t>(tp::crc32c(header.data(), header.size())))
                rl::sdk::fail(RL_ERR_INVALID_ARG,
                              where + ": the commit does not match the header (corrupted header)");
            r.user_header = tp::decode_header(header, &r.tensors, where);
            uint64_t sum = 0;
            for (const auto &t : r.tensors) sum += t.nbytes;
            if (sum != static_cast<uint64_t>(total))
                rl::sdk::fail(RL_ERR_INVALID_ARG,
                              where + ": malformed header: the tensors announce " +
                                  std::to_string(sum) + " bytes, the buckets carried " +
                                  std::to_string(total));
            uint64_t at = 0;
            for (const auto &t : r.tensors) {
                tp::verify(t, r.bytes.data() + at, where);
                at += t.nbytes;
            }
        } catch (const rl::sdk::Error &e) {
            push({e.what(), "", {}, {}});
            return;
        }
        push(std::move(r));
    }

    void push(Received r) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (latest_ && r.error.empty()) {
                // Mode latest: the newest message replaces unread ones, so the
                // sender never waits for a busy receiver.
                skipped_ += static_cast<int64_t>(queue_.size());
                queue_.clear();
            }
            queue_.push_back(std::move(r));
        }
        cv_.notify_all();
    }
    bool wait_for_room() {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < queue_max_; });
        return !stop_;
    }
    bool stopping() {
        std::lock_guard<std::mutex> lk(mu_);
        return stop_;
    }
    void nap(int64_t ms) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return stop_; });
    }
    void log(rl_log_level_t level, const std::string &msg) {
        const rl_host_api_t *h = rl::sdk::detail::library().host;
        if (h && h->log) h->log(h, level, msg.c_str());
    }

    std::string host_;
    int64_t port_;
    std::string role_;
    int world_;
    std::string backend_;
    int device_;
    int64_t timeout_ms_, bucket_bytes_, poll_ms_, queue_max_;
    int rank_ = 0;
    std::unique_ptr<Group> group_;
    // sender
    std::vector<int64_t> tickets_;
    int64_t gen_ = 0;
    // receiver
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Received> queue_;
    bool stop_ = false;
    bool latest_ = false;
    std::atomic<int64_t> skipped_{0};
    std::atomic<bool> connected_{false};
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Nccl>("org.rl.transport.nccl", "nccl", "1.0.0",
                                       "Messages broadcast from rank 0 to every receiver over a "
                                       "collective group (NCCL for CUDA, Gloo for CPU tensors)"))
