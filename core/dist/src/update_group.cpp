#include "rl/core/update_group.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace rl::core::dist {

struct UpdateGroup::Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> backend;
};

struct Rendezvous::Impl {
    c10::intrusive_ptr<c10d::Store> store;
};

namespace {

std::string where_of(const UpdateGroupOptions &o) {
    return o.master_address + ":" + std::to_string(o.master_port);
}

std::string short_what(const std::exception &e) {
    return std::string(e.what()).substr(0, 300);
}

constexpr const char *kSequenceNumberKey = "SEQ_NUM_STORE_KEY";

// The store a group's backend sees, prefixed as Python torch prefixes it, so
// that a peer that forms the group in Python (SGLang's
// init_custom_process_group, which verl and slime use too) meets ours:
// PrefixStore(group_name) around the rendezvous store, then
// torch.distributed's _new_process_group_helper adds "<group_name>/" and
// "<device>/" (cpu for Gloo, the first device Gloo is registered for; cuda
// for NCCL). Keys end up as "<g>/<g>//<device>//<key>" (PrefixStore joins
// with "/"). Checked against the Python code of torch 2.11 and 2.15.
c10::intrusive_ptr<c10d::Store> group_store(const c10::intrusive_ptr<c10d::Store> &store,
                                            const std::string &group_name,
                                            const std::string &device) {
    auto named = c10::make_intrusive<c10d::PrefixStore>(group_name, store);
    auto helper = c10::make_intrusive<c10d::PrefixStore>(group_name + "/", named);
    return c10::make_intrusive<c10d::PrefixStore>(device + "/", helper);
}

} // namespace

Rendezvous::Rendezvous(const std::string &address, int port, bool server,
                       std::chrono::milliseconds timeout)
    : where_(address + ":" + std::to_string(port)), impl_(std::make_unique<Impl>()) {
    if (address.empty()) throw Error(ErrorKind::InvalidArgument, "rendezvous: address is empty");
    if (port <= 0 || port > 65535)
        throw Error(ErrorKind::InvalidArgument,
                    "rendezvous: port must be in 1..65535, got " + std::to_string(port));
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = server;
    so.waitWorkers = false;
    so.timeout = timeout;
    try {
        impl_->store = c10::make_intrusive<c10d::TCPStore>(address, so);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, std::string(server ? "cannot host the store at "
                                                      : "cannot reach the store at ") +
                                       where_ + ": " + short_what(e));
    }
}

Rendezvous::~Rendezvous() = default;

int64_t Rendezvous::add(const std::string &key, int64_t delta) {
    try {
        return impl_->store->add(key, delta);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "the store at " + where_ + " is gone: " + short_what(e));
    }
}

UpdateGroup::UpdateGroup(const UpdateGroupOptions &o, Rendezvous &store)
    : options_(o), impl_(std::make_unique<Impl>()) {
    impl_->store = store.impl_->store;
    form(o, false);
}

UpdateGroup::UpdateGroup(const UpdateGroupOptions &o)
    : options_(o), impl_(std::make_unique<Impl>()) {
    form(o, true);
}

void UpdateGroup::form(const UpdateGroupOptions &o, bool own_store) {
    auto bad = [](const std::string &m) { throw Error(ErrorKind::InvalidArgument, m); };
    if (o.master_address.empty()) bad("weight update group: master_address is empty");
    if (o.master_port <= 0 || o.master_port > 65535)
        bad("weight update group: master_port must be in 1..65535, got " +
            std::to_string(o.master_port));
    if (o.world_size < 2)
        bad("weight update group: world_size must be >= 2 (the trainer and at least one "
            "server), got " +
            std::to_string(o.world_size));
    if (o.rank < 0 || o.rank >= o.world_size)
        bad("weight update group: rank " + std::to_string(o.rank) +
            " (rank_offset) is outside 0.." + std::to_string(o.world_size - 1) + " (world_size " +
            std::to_string(o.world_size) + ")");
    if (o.group_name.empty()) bad("weight update group: group_name is empty");
    if (o.backend != "gloo" && o.backend != "nccl")
        bad("weight update group: backend must be 'gloo' or 'nccl', got '" + o.backend + "'");
    if (o.timeout.count() <= 0) bad("weight update group: timeout must be > 0");

    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = o.world_size;
    // A joining rank counts itself in the store's worker key as every TCPStore
    // of Python's rendezvous does (a client's "wait" is only that count), so
    // a master made by Python torch, which waits for world_size of them, sees
    // it. Rank 0 does not wait: the servers join while it forms the group.
    so.waitWorkers = o.rank != 0;
    so.timeout = o.timeout;
    try {
        if (own_store) impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_address, so);
    } catch (const std::exception &e) {
        throw Error(
            ErrorKind::Io,
            "weight update group '" + o.group_name + "': rank " + std::to_string(o.rank) +
                (o.rank == 0 ? " cannot host the store at " : " cannot reach the store at ") +
                where_of(o) + " (master_address:master_port): " + short_what(e));
    }
    auto prefixed = group_store(impl_->store, o.group_name, o.backend == "gloo" ? "cpu" : "cuda");
    try {
        // A rank > 0 of torch <= 2.11 waits for rank 0's sequence number of
        // the group (_set_sequence_number_for_group); later versions neither
        // write nor read it.
        if (o.rank == 0)
            prefixed->set(kSequenceNumberKey, std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 0});
        if (o.backend == "gloo") {
            auto go = c10d::ProcessGroupGloo::Options::create(o.timeout);
            if (o.master_address == "127.0.0.1" || o.master_address == "localhost")
                go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
            else
                go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
            impl_->backend =
                c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, o.rank, o.world_size, go);
        } else {
#if defined(USE_C10D_NCCL)
            auto no = c10d::ProcessGroupNCCL::Options::create();
            no->timeout = o.timeout;
            impl_->backend =
                c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, o.rank, o.world_size, no);
#else
            throw Error(ErrorKind::InvalidArgument,
                        "weight update group: backend 'nccl' needs a libtorch built with NCCL; "
                        "this one has none (use 'gloo')");
#endif
        }
    } catch (const Error &) {
        throw;
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "weight update group '" + o.group_name + "' at " + where_of(o) +
                                       ": rank " + std::to_string(o.rank) + " of " +
                                       std::to_string(o.world_size) +
                                       " could not form the group: " + short_what(e));
    }
}

UpdateGroup::~UpdateGroup() = default;

void UpdateGroup::broadcast(std::vector<at::Tensor> &tensors, int root) {
    if (tensors.empty()) return;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    works.reserve(tensors.size());
    try {
        for (auto &t : tensors) {
            std::vector<at::Tensor> one{t};
            c10d::BroadcastOptions bo;
            bo.rootRank = root;
            bo.timeout = options_.timeout;
            works.push_back(impl_->backend->broadcast(one, bo));
        }
        for (auto &w : works) w->wait(options_.timeout);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "weight update group '" + options_.group_name + "': broadcast " +
                                       "of " + std::to_string(tensors.size()) +
                                       " tensors failed on rank " + std::to_string(options_.rank) +
                                       ": " + short_what(e));
    }
}

} // namespace rl::core::dist
