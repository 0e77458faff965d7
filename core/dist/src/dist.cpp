#include "rl/core/dist.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace rl::core::dist {
namespace {

[[noreturn]] void bad_env(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, "distributed launch: " + msg);
}

std::optional<std::string> getenv_str(const char *name) {
    const char *v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
}

int env_int(const char *name, int fallback, int min_value) {
    const auto v = getenv_str(name);
    if (!v) return fallback;
    char *end = nullptr;
    errno = 0;
    const long x = std::strtol(v->c_str(), &end, 10);
    if (errno != 0 || end == v->c_str() || *end != '\0' || x < min_value || x > (1 << 20))
        bad_env(std::string(name) + "='" + *v +
                "' is not an integer >= " + std::to_string(min_value));
    return static_cast<int>(x);
}

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string to_string(const std::vector<uint8_t> &v) {
    return std::string(v.begin(), v.end());
}

std::vector<uint8_t> to_bytes(const std::string &s) {
    return std::vector<uint8_t>(s.begin(), s.end());
}

std::string seconds(std::chrono::milliseconds ms) {
    const double s = static_cast<double>(ms.count()) / 1000.0;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
}

c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(const Env &env,
                                                                 const Options &options) {
    auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
    if (const auto ifname = getenv_str("GLOO_SOCKET_IFNAME"))
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
    else if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost")
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
        o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return o;
}

// The Gloo backend of env's ranks over `store` (its keys under "gloo/").
c10::intrusive_ptr<c10d::Backend>
gloo_backend(const c10::intrusive_ptr<c10d::Store> &store, const Env &env,
             const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> &options) {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", store), env.rank, env.world_size, options);
}

#if defined(USE_C10D_NCCL)
// The NCCL backend of env's ranks over `store` (its keys under "nccl/").
c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store> &store,
                                               const Env &env, const Options &options) {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("nccl", store), env.rank, env.world_size,
        nccl_options);
}
#endif

std::shared_ptr<Group> g_current;
bool g_tried_env = false;
std::mutex g_mutex;

} // namespace

// -- environment --------------------------------------------------------------

Env env_from_environment() {
    Env e;
    if (!getenv_str("WORLD_SIZE")) return e;
    e.from_environment = true;
    e.world_size = env_int("WORLD_SIZE", 1, 1);
    if (!getenv_str("RANK") && e.world_size > 1)
        bad_env("WORLD_SIZE=" + std::to_string(e.world_size) + " is set but RANK is not");
    e.rank = env_int("RANK", 0, 0);
    if (e.rank >= e.world_size)
        bad_env("RANK=" + std::to_string(e.rank) +
                " is not below WORLD_SIZE=" + std::to_string(e.world_size));
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank % e.local_world_size, 0);
    if (e.local_rank >= e.local_world_size)
        bad_env("LOCAL_RANK=" + std::to_string(e.local_rank) +
                " is not below LOCAL_WORLD_SIZE=" + std::to_string(e.local_world_size));
    if (e.world_size > 1) {
        if (!getenv_str("MASTER_ADDR")) bad_env("WORLD_SIZE > 1 but MASTER_ADDR is not set");
        if (!getenv_str("MASTER_PORT")) bad_env("WORLD_SIZE > 1 but MASTER_PORT is not set");
    }
    e.master_addr = getenv_str("MASTER_ADDR").value_or("127.0.0.1");
    e.master_port = env_int("MASTER_PORT", 29500, 1);
    if (e.master_port > 65535)
        bad_env("MASTER_PORT=" + std::to_string(e.master_port) + " is not a TCP port (1-65535)");
    return e;
}

// -- the group ------------------------------------------------------------------

struct Group::Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> gloo;
    c10::intrusive_ptr<c10d::Backend> nccl; // null without CUDA
    // Heartbeats: "<unix ms> <collectives issued>" under rl/hb/<rank>.
    c10::intrusive_ptr<c10d::Store> hb_store;
    std::atomic<int64_t> seq{0};
    std::thread heartbeat;
    std::mutex hb_mutex;
    std::condition_variable hb_cv;
    bool stopping = false;
    bool failed = false; // a collective failed: the group is unusable
    // Issued and not yet finished (issue_all_reduce_sum / finish_issued).
    std::vector<c10::intrusive_ptr<c10d::Work>> issued;
    std::vector<std::vector<at::Tensor>> issued_tensors;
    std::string issue_error;

    c10d::Backend &backend_for(const at::Tensor &t) {
        if (t.is_cuda()) {
            if (!nccl)
                throw Error(ErrorKind::InvalidArgument,
                            "distributed: a CUDA tensor but no NCCL process group (the group "
                            "was made for the CPU)");
            return *nccl;
        }
        return *gloo;
    }
};

Group::Group(Env env, Options options)
    : env_(std::move(env)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

Group::~Group() {
    if (impl_->heartbeat.joinable()) {
        {
            std::lock_guard<std::mutex> lock(impl_->hb_mutex);
            impl_->stopping = true;
        }
        impl_->hb_cv.notify_all();
        impl_->heartbeat.join();
    }
}

std::shared_ptr<Group> Group::create(const Env &env, const Options &options,
                                     const std::string &device) {
    if (options.backend != "auto" && options.backend != "gloo" && options.backend != "nccl")
        throw Error(ErrorKind::InvalidArgument,
                    "dist.backend must be auto, gloo or nccl, got '" + options.backend + "'");
    if (options.timeout.count() <= 0)
        throw Error(ErrorKind::InvalidArgument, "dist.timeout must be > 0");
    std::shared_ptr<Group> g(new Group(env, options));
    Impl &im = *g->impl_;
    const std::string where = env.master_addr + ":" + std::to_string(env.master_port);

    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.waitWorkers = false; // the ranks check in below, with clearer errors
    so.timeout = options.timeout;
    try {
        im.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    } catch (const std::exception &e) {
        const std::string msg = e.what();
        if (env.rank == 0 && (msg.find("in use") != std::string::npos ||
                              msg.find("EADDRINUSE") != std::string::npos))
            throw Error(ErrorKind::Io, "distributed: rank 0 cannot listen on " + where +
                                           " (MASTER_PORT): the port is in use; pick another "
                                           "MASTER_PORT");
        throw Error(ErrorKind::Io,
                    "distributed: rank " + std::to_string(env.rank) +
                        (env.rank == 0 ? " cannot host the rendezvous at "
                                       : " cannot reach the rendezvous master at ") +
                        where + " (MASTER_ADDR:MASTER_PORT) within " + seconds(options.timeout) +
                        " (dist.timeout), waiting for WORLD_SIZE=" +
                        std::to_string(env.world_size) + " ranks: " + msg.substr(0, 300));
    }

    // Every rank checks in with its world size; all must agree, and rank 0
    // waits for all of them.
    auto differs = [](const std::string &w0, int r, const std::string &wr) {
        return Error(ErrorKind::InvalidArgument,
                     "distributed: WORLD_SIZE differs between ranks: rank 0 has " + w0 + ", rank " +
                         std::to_string(r) + " has " + wr);
    };
    try {
        const std::string mine = std::to_string(env.world_size);
        im.store->set("rl/world_size/" + std::to_string(env.rank), to_bytes(mine));
        const std::string w0 = to_string(im.store->get("rl/world_size/0"));
        // Read: rank 0 may now stop on a mismatch without taking the store
        // away from a rank that still has to read its world size.
        im.store->set("rl/world_size_read/" + std::to_string(env.rank), to_bytes("1"));
        if (w0 != mine) throw differs(w0, env.rank, mine);
        if (env.rank == 0) {
            std::vector<std::string> missing;
            const auto deadline = std::chrono::steady_clock::now() + options.timeout;
            for (int r = 1; r < env.world_size; ++r) {
                const std::string key = "rl/world_size/" + std::to_string(r);
                while (!im.store->check({key}) && std::chrono::steady_clock::now() < deadline)
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                if (!im.store->check({key})) {
                    missing.push_back(std::to_string(r));
                    continue;
                }
                const std::string wr = to_string(im.store->get(key));
                if (wr != mine) {
                    // Rank r names the mismatch too once it has read rank 0's
                    // world size; give it a moment to do so (the store stops
                    // with this process).
                    const std::string read = "rl/world_size_read/" + std::to_string(r);
                    const auto until = std::min(deadline, std::chrono::steady_clock::now() +
                                                              std::chrono::seconds(5));
                    while (!im.store->check({read}) && std::chrono::steady_clock::now() < until)
                        std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    throw differs(mine, r, wr);
                }
            }
            if (!missing.empty()) {
                std::string list;
                for (const auto &m : missing) list += (list.empty() ? "" : ", ") + m;
                throw Error(ErrorKind::Io, "distributed: rank " + list + " did not join the " +
                                               "rendezvous at " + where + " within " +
                                               seconds(options.timeout) + " (dist.timeout)");
            }
        }
    } catch (const Error &) {
        throw;
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "distributed: rendezvous at " + where +
                                       " failed: " + std::string(e.what()).substr(0, 300));
    }

    auto gloo_opts = gloo_options(env, options);
    try {
        im.gloo = gloo_backend(im.store, env, gloo_opts);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "distributed: rank " + std::to_string(env.rank) +
                                       " cannot connect to the other ranks (Gloo): " +
                                       std::string(e.what()).substr(0, 300));
    }

    const bool cuda_device = device.rfind("cuda", 0) == 0 || (device == "auto" && at::hasCUDA());
    const bool want_nccl = options.backend == "nccl" || (options.backend == "auto" && cuda_device);
    if (want_nccl) {
#if defined(USE_C10D_NCCL)
        im.nccl = nccl_backend(im.store, env, options);
#else
        throw Error(ErrorKind::InvalidArgument,
                    "distributed: dist.backend nccl needs a libtorch built with NCCL; this one "
                    "has none");
#endif
    }

    im.hb_store = im.store->clone();
    im.heartbeat = std::thread([g_raw = g.get()] {
        Impl &m = *g_raw->impl_;
        const std::string key = "rl/hb/" + std::to_string(g_raw->rank());
        std::unique_lock<std::mutex> lock(m.hb_mutex);
        while (!m.stopping) {
            lock.unlock();
            try {
                m.hb_store->set(
                    key, to_bytes(std::to_string(now_ms()) + " " + std::to_string(m.seq.load())));
            } catch (...) {
                // The store's host (rank 0) is gone; collectives report it.
            }
            lock.lock();
            m.hb_cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return m.stopping; });
        }
    });
    g->barrier();
    return g;
}

std::string Group::backend_name() const {
    return impl_->nccl ? "nccl+gloo" : "gloo";
}

template <typename F>
void Group::run(const char *what, F &&issue) {
    Impl &im = *impl_;
    if (im.failed)
        throw Error(ErrorKind::BadState, std::string("distributed ") + what +
                                             ": an earlier collective failed; the process group "
                                             "is unusable (restart the run)");
    const int64_t my_seq = ++im.seq;
    std::string failure;
    try {
        c10::intrusive_ptr<c10d::Work> work = issue();
        if (!work->wait(options_.timeout)) failure = "timed out";
    } catch (const std::exception &e) {
        failure = e.what();
    }
    if (failure.empty()) return;
    im.failed = true;

    // Find the rank at fault: heartbeats that stop advancing (dead or hung),
    // else ranks behind this one in the collective count.
    std::string culprit;
    try {
        // A subgroup's rank r is rank members_[r] of the world, whose
        // heartbeat counts the world's collectives (not comparable here).
        auto world_rank = [&](int r) {
            return members_.empty() ? r : members_[static_cast<size_t>(r)];
        };
        auto read = [&](int r) -> std::pair<int64_t, int64_t> {
            const std::string key = "rl/hb/" + std::to_string(world_rank(r));
            if (!im.hb_store->check({key})) return {-1, -1};
            const std::string v = to_string(im.hb_store->get(key));
            const auto sp = v.find(' ');
            return {std::stoll(v.substr(0, sp)), std::stoll(v.substr(sp + 1))};
        };
        std::vector<std::pair<int64_t, int64_t>> first(static_cast<size_t>(size()));
        for (int r = 0; r < size(); ++r) first[static_cast<size_t>(r)] = read(r);
        std::this_thread::sleep_for(std::chrono::milliseconds(2000));
        std::vector<int> stale, behind;
        for (int r = 0; r < size(); ++r) {
            if (r == rank()) continue;
            const auto now = read(r);
            if (now.first == first[static_cast<size_t>(r)].first)
                stale.push_back(world_rank(r));
            else if (now.second < my_seq && members_.empty())
                behind.push_back(r);
        }
        auto list = [](const std::vector<int> &v) {
            std::string s;
            for (int r : v) s += (s.empty() ? "" : ", ") + std::to_string(r);
            return s;
        };
        if (!stale.empty())
            culprit = "rank " + list(stale) + " stopped responding (died or hung)";
        else if (!behind.empty())
            culprit = "rank " + list(behind) + " did not reach collective #" +
                      std::to_string(my_seq) + " (hung, or running different code)";
    } catch (const std::exception &) {
        culprit = rank() == 0 ? "" : "rank 0 (host of the rendezvous store) is gone";
    }
    throw Error(ErrorKind::Io, std::string("distributed ") + what + " #" + std::to_string(my_seq) +
                                   " on rank " + std::to_string(rank()) + " failed" +
                                   (culprit.empty() ? "" : ": " + culprit) + " (" +
                                   failure.substr(0, failure.find('\n')).substr(0, 200) +
                                   "; dist.timeout = " + seconds(options_.timeout) + ")");
}

void Group::all_reduce_sum(at::Tensor &t) {
    std::vector<at::Tensor> v{t};
    run("all_reduce", [&] { return impl_->backend_for(t).allreduce(v); });
}

void Group::all_reduce_max(at::Tensor &t) {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    run("all_reduce", [&] { return impl_->backend_for(t).allreduce(v, o); });
}

void Group::all_reduce_sum(std::vector<at::Tensor> &ts) {
    if (ts.empty()) return;
    // Issue every bucket, then wait for each (communication of bucket k
    // overlaps the issue of k + 1).
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<std::vector<at::Tensor>> holders;
    holders.reserve(ts.size());
    size_t i = 0;
    run("all_reduce (buckets)", [&]() -> c10::intrusive_ptr<c10d::Work> {
        for (; i + 1 < ts.size(); ++i) {
            holders.push_back({ts[i]});
            works.push_back(impl_->backend_for(ts[i]).allreduce(holders.back()));
        }
        for (auto &w : works)
            if (!w->wait(options_.timeout)) throw std::runtime_error("timed out");
        holders.push_back({ts[i]});
        return impl_->backend_for(ts[i]).allreduce(holders.back());
    });
}

void Group::issue_all_reduce_sum(const at::Tensor &t) {
    Impl &im = *impl_;
    if (im.failed || !im.issue_error.empty()) return; // reported by finish_issued
    try {
        im.issued_tensors.push_back({t});
        im.issued.push_back(im.backend_for(t).allreduce(im.issued_tensors.back()));
    } catch (const std::exception &e) {
        im.issue_error = e.what();
    }
}

void Group::finish_issued(const char *what) {
    Impl &im = *impl_;
    auto works = std::move(im.issued);
    auto tensors = std::move(im.issued_tensors);
    std::string issue_error = std::move(im.issue_error);
    im.issued.clear();
    im.issued_tensors.clear();
    im.issue_error.clear();
    if (works.empty() && issue_error.empty()) return;
    run(what, [&]() -> c10::intrusive_ptr<c10d::Work> {
        if (!issue_error.empty()) throw std::runtime_error(issue_error);
        for (size_t i = 0; i + 1 < works.size(); ++i)
            if (!works[i]->wait(options_.timeout)) throw std::runtime_error("timed out");
        return works.back();
    });
}

void Group::all_gather(at::Tensor &out, const at::Tensor &in) {
    if (out.numel() != in.numel() * size())
        throw Error(ErrorKind::InvalidArgument, "all_gather: output must hold W x input elements");
    at::Tensor src = in.contiguous();
    run("all_gather", [&] { return impl_->backend_for(in)._allgather_base(out, src); });
}

void Group::reduce_scatter_sum(at::Tensor &out, const at::Tensor &in) {
    if (in.numel() != out.numel() * size())
        throw Error(ErrorKind::InvalidArgument,
                    "reduce_scatter: input must hold W x output elements");
    at::Tensor src = in.contiguous();
    run("reduce_scatter", [&] { return impl_->backend_for(in)._reduce_scatter_base(out, src); });
}

void Group::broadcast(at::Tensor &t, int root) {
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    run("broadcast", [&] { return impl_->backend_for(t).broadcast(v, o); });
}

void Group::all_to_all(at::Tensor &out, const at::Tensor &in, const std::vector<int64_t> &out_rows,
                       const std::vector<int64_t> &in_rows) {
    const auto W = static_cast<size_t>(size());
    if (out_rows.size() != W || in_rows.size() != W)
        throw Error(ErrorKind::InvalidArgument, "all_to_all: one row count per rank is needed");
    int64_t n_in = 0, n_out = 0;
    for (size_t r = 0; r < W; ++r) {
        n_in += in_rows[r];
        n_out += out_rows[r];
    }
    if (in.dim() < 1 || out.dim() < 1 || in.size(0) != n_in || out.size(0) != n_out ||
        !out.is_contiguous())
        throw Error(ErrorKind::InvalidArgument,
                    "all_to_all: the tensors' rows must add up to the row counts (output "
                    "contiguous)");
    at::Tensor src = in.contiguous();
    std::vector<int64_t> o = out_rows, i = in_rows;
    run("all_to_all", [&] { return impl_->backend_for(in).alltoall_base(out, src, o, i); });
}

std::shared_ptr<Group> Group::subgroup(const std::vector<int> &ranks, const std::string &name) {
    const auto me = std::find(ranks.begin(), ranks.end(), rank());
    if (me == ranks.end())
        throw Error(ErrorKind::InvalidArgument, "distributed: rank " + std::to_string(rank()) +
                                                    " is not a member of subgroup '" + name + "'");
    for (int r : ranks)
        if (r < 0 || r >= size() || std::count(ranks.begin(), ranks.end(), r) != 1)
            throw Error(ErrorKind::InvalidArgument,
                        "distributed: subgroup '" + name + "' names rank " + std::to_string(r) +
                            " twice or outside the world of " + std::to_string(size()));
    Env env = env_;
    env.rank = static_cast<int>(me - ranks.begin());
    env.world_size = static_cast<int>(ranks.size());
    std::shared_ptr<Group> g(new Group(env, options_));
    for (int r : ranks)
        g->members_.push_back(members_.empty() ? r : members_[static_cast<size_t>(r)]);
    Impl &im = *g->impl_;
    im.store = c10::make_intrusive<c10d::PrefixStore>("rl/sub/" + name, impl_->store);
    im.hb_store = impl_->store->clone();
    try {
        im.gloo = gloo_backend(im.store, env, gloo_options(env, options_));
#if defined(USE_C10D_NCCL)
        if (impl_->nccl) im.nccl = nccl_backend(im.store, env, options_);
#endif
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "distributed: rank " + std::to_string(rank()) +
                                       " cannot form subgroup '" + name +
                                       "': " + std::string(e.what()).substr(0, 300));
    }
    g->barrier();
    return g;
}

void Group::barrier() {
    // A tiny all-reduce: Gloo's barrier has no per-call timeout.
    at::Tensor t = at::zeros({1}, at::kFloat);
    std::vector<at::Tensor> v{t};
    run("barrier", [&] { return impl_->gloo->allreduce(v); });
}

std::string Group::broadcast_bytes(const std::string &value, int root) {
    at::Tensor n = at::full({1}, static_cast<int64_t>(value.size()), at::kLong);
    {
        std::vector<at::Tensor> v{n};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        run("broadcast", [&] { return impl_->gloo->broadcast(v, o); });
    }
    const int64_t len = n.item<int64_t>();
    at::Tensor bytes = at::empty({std::max<int64_t>(len, 1)}, at::kByte);
    if (rank() == root && len > 0) std::memcpy(bytes.data_ptr(), value.data(), value.size());
    std::vector<at::Tensor> v{bytes};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    run("broadcast", [&] { return impl_->gloo->broadcast(v, o); });
    return std::string(static_cast<const char *>(bytes.data_ptr()), static_cast<size_t>(len));
}

std::vector<std::string> Group::all_gather_bytes(const std::string &value) {
    const int W = size();
    at::Tensor n = at::full({1}, static_cast<int64_t>(value.size()), at::kLong);
    at::Tensor lens = at::empty({W}, at::kLong);
    run("all_gather", [&] { return impl_->gloo->_allgather_base(lens, n); });
    const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
    at::Tensor mine = at::zeros({max_len}, at::kByte);
    std::memcpy(mine.data_ptr(), value.data(), value.size());
    at::Tensor all = at::empty({W * max_len}, at::kByte);
    run("all_gather", [&] { return impl_->gloo->_allgather_base(all, mine); });
    std::vector<std::string> out;
    const char *p = static_cast<const char *>(all.data_ptr());
    for (int r = 0; r < W; ++r)
        out.emplace_back(p + r * max_len, static_cast<size_t>(lens[r].item<int64_t>()));
    return out;
}

// -- the process-wide group ----------------------------------------------------

std::shared_ptr<Group> init(const Options &options, const std::string &device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_current) {
        if (g_current->options().timeout != options.timeout ||
            g_current->options().backend != options.backend)
            throw Error(ErrorKind::BadState,
                        "distributed: the process group exists already with other options "
                        "(dist.timeout / dist.backend); set them before the first use");
        return g_current;
    }
    g_tried_env = true;
    const Env env = env_from_environment();
    if (env.world_size <= 1) return nullptr;
    g_current = Group::create(env, options, device);
    return g_current;
}

std::shared_ptr<Group> current(const std::string &device) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (g_current || g_tried_env) return g_current;
    }
    return init(Options{}, device);
}

void shutdown() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_current.reset();
    g_tried_env = false;
}

// -- balanced split ----------------------------------------------------------------

std::vector<std::pair<size_t, size_t>> balanced_ranges(const std::vector<int64_t> &costs,
                                                       int world) {
    if (world < 1) throw Error(ErrorKind::InvalidArgument, "balanced_ranges: world < 1");
    const size_t n = costs.size();
    std::vector<std::pair<size_t, size_t>> out;
    size_t begin = 0;
    int64_t remaining = 0;
    for (int64_t c : costs) remaining += c;
    for (int r = 0; r < world; ++r) {
        const size_t ranks_left = static_cast<size_t>(world - r);
        if (ranks_left == 1) {
            out.emplace_back(begin, n);
            break;
        }
        // Leave at least one item for each later rank when there are enough.
        const size_t items_left = n - begin;
        const size_t max_end = items_left >= ranks_left ? n - (ranks_left - 1) : n;
        const double target = static_cast<double>(remaining) / static_cast<double>(ranks_left);
        size_t end = begin;
        int64_t sum = 0;
        while (end < max_end) {
            const int64_t c = costs[end];
            // Take the item when it brings the total closer to the target.
            if (end > begin && static_cast<double>(sum) + static_cast<double>(c) / 2.0 > target)
                break;
            sum += c;
            ++end;
        }
        out.emplace_back(begin, end);
        remaining -= sum;
        begin = end;
    }
    return out;
}

} // namespace rl::core::dist
