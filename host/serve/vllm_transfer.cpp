#include "vllm_transfer.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if defined(RL_TORCH_HAS_CUDA) && defined(RL_HAVE_NCCL_H)
#define RL_VLLM_NCCL 1
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

#include <cstring>
#include <mutex>

namespace rl::serve::vllm {

using core::Error;
using core::ErrorKind;

namespace {

// pickle.dumps(ncclUniqueId()) at protocol 4 (Python 3.11): PROTO 4, FRAME of
// the rest, STACK_GLOBAL _ctypes._unpickle, STACK_GLOBAL of vLLM's class, an
// empty dict (the structure's __dict__), SHORT_BINBYTES of the 128 bytes, then
// the tuples and REDUCE that call _unpickle(cls, ({}, bytes)). Every object is
// memoized (MEMOIZE after each), as the pickler does.
std::string layout_head(uint8_t protocol) {
    std::string h;
    h += '\x80';
    h += static_cast<char>(protocol);
    h += '\x95';
    const uint64_t frame = 236; // every byte after the frame header
    for (int i = 0; i < 8; ++i) h += static_cast<char>((frame >> (8 * i)) & 0xff);
    auto unicode = [&](const std::string &s) {
        h += '\x8c';
        h += static_cast<char>(s.size());
        h += s;
        h += '\x94';
    };
    unicode("_ctypes");
    unicode("_unpickle");
    h += "\x93\x94";
    unicode(kUniqueIdModule);
    unicode(kUniqueIdClass);
    h += "\x93\x94";
    h += "}\x94";
    h += 'C';
    h += static_cast<char>(128);
    return h;
}

// MEMOIZE, TUPLE2, MEMOIZE, TUPLE2, MEMOIZE, REDUCE, MEMOIZE, STOP.
const std::string kTail = "\x94\x86\x94\x86\x94R\x94.";
constexpr size_t kPickleSize = 247;

std::string where_of(const std::string &address, int port) {
    return address + ":" + std::to_string(port);
}

} // namespace

std::string pickle_unique_id(const UniqueId &id) {
    std::string out = layout_head(4);
    out.append(reinterpret_cast<const char *>(id.data()), id.size());
    out += kTail;
    return out;
}

UniqueId unpickle_unique_id(const std::string &bytes, const std::string &key) {
    const std::string what =
        "store key '" + key + "': not a pickled vLLM ncclUniqueId (pickle protocol 4 or 5 of " +
        kUniqueIdModule + "." + kUniqueIdClass + ", " + std::to_string(kPickleSize) + " bytes)";
    if (bytes.size() != kPickleSize)
        throw Error(ErrorKind::InvalidArgument,
                    what + ": the value has " + std::to_string(bytes.size()) + " bytes");
    if (bytes[0] != '\x80' || (bytes[1] != '\x04' && bytes[1] != '\x05'))
        throw Error(ErrorKind::InvalidArgument,
                    what + ": it does not start with PROTO 4 or 5 (other protocols are refused)");
    const std::string head = layout_head(static_cast<uint8_t>(bytes[1]));
    for (size_t i = 0; i < head.size(); ++i)
        if (bytes[i] != head[i])
            throw Error(ErrorKind::InvalidArgument,
                        what + ": byte " + std::to_string(i) +
                            " differs (another object, class or module; nothing is unpickled)");
    const size_t tail_at = head.size() + 128;
    for (size_t i = 0; i < kTail.size(); ++i)
        if (bytes[tail_at + i] != kTail[i])
            throw Error(ErrorKind::InvalidArgument,
                        what + ": byte " + std::to_string(tail_at + i) +
                            " differs (the pickle does not end as ncclUniqueId's does)");
    UniqueId id;
    std::memcpy(id.data(), bytes.data() + head.size(), id.size());
    return id;
}

std::string broadcast_key(int src, int64_t n) {
    return "broadcast_from/" + std::to_string(src) + "/" + std::to_string(n);
}

struct StatelessGroup::Impl {
    c10::intrusive_ptr<c10d::TCPStore> store;
};

StatelessGroup::StatelessGroup(const std::string &address, int port, int rank, int world_size,
                               std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), rank_(rank), world_size_(world_size),
      where_(where_of(address, port)) {
    auto bad = [](const std::string &m) { throw Error(ErrorKind::InvalidArgument, m); };
    if (address.empty()) bad("vLLM weight transfer: master_address is empty");
    if (port <= 0 || port > 65535)
        bad("vLLM weight transfer: master_port must be in 1..65535, got " + std::to_string(port));
    if (world_size < 2)
        bad("vLLM weight transfer: world_size must be >= 2 (the trainer and at least one "
            "worker), got " +
            std::to_string(world_size));
    if (rank < 0 || rank >= world_size)
        bad("vLLM weight transfer: rank " + std::to_string(rank) + " is outside 0.." +
            std::to_string(world_size - 1) + " (world_size " + std::to_string(world_size) + ")");
    if (timeout.count() <= 0) bad("vLLM weight transfer: timeout must be > 0");
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = static_cast<size_t>(world_size);
    so.waitWorkers = true; // as Python's TCPStore(wait_for_workers=True), vLLM's default
    so.timeout = timeout;
    so.useLibUV = false; // vLLM opens its store with use_libuv=False
    try {
        impl_->store = c10::make_intrusive<c10d::TCPStore>(address, so);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io,
                    "vLLM weight transfer: rank " + std::to_string(rank) +
                        (rank == 0 ? " cannot host the store at " : " cannot join the store at ") +
                        where_ + " (master_address:master_port) with " +
                        std::to_string(world_size) +
                        " members: " + std::string(e.what()).substr(0, 300));
    }
}

StatelessGroup::~StatelessGroup() = default;

std::string StatelessGroup::get(const std::string &key) {
    std::vector<uint8_t> v;
    try {
        v = impl_->store->get(key);
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "vLLM weight transfer: store key '" + key + "' at " + where_ +
                                       ": " + std::string(e.what()).substr(0, 300));
    }
    return std::string(v.begin(), v.end());
}

void StatelessGroup::set(const std::string &key, const std::string &value) {
    try {
        impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception &e) {
        throw Error(ErrorKind::Io, "vLLM weight transfer: cannot set store key '" + key + "' at " +
                                       where_ + ": " + std::string(e.what()).substr(0, 300));
    }
}

UniqueId StatelessGroup::broadcast_unique_id(const std::optional<UniqueId> &mine) {
    if (rank_ == 0) {
        if (!mine)
            throw Error(ErrorKind::InvalidArgument,
                        "vLLM weight transfer: rank 0 broadcasts the NCCL id and must have one");
        set(broadcast_key(0, sent_++), pickle_unique_id(*mine));
        return *mine;
    }
    const std::string key = broadcast_key(0, received_++);
    return unpickle_unique_id(get(key), key);
}

std::vector<size_t> packed_chunk_ends(const std::vector<int64_t> &sizes, int64_t buffer_bytes) {
    std::vector<size_t> ends;
    int64_t total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        total += sizes[i];
        if (total > buffer_bytes) {
            ends.push_back(i + 1);
            total = 0;
        }
    }
    if (ends.empty() ? !sizes.empty() : ends.back() != sizes.size()) ends.push_back(sizes.size());
    return ends;
}

// ---------------------------------------------------------------------------
// NCCL, loaded from the libnccl that libtorch uses (dlopen, as vLLM does).

#if defined(RL_VLLM_NCCL)
namespace {

struct Nccl {
    decltype(&ncclGetUniqueId) get_unique_id = nullptr;
    decltype(&ncclCommInitRank) comm_init_rank = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclAllReduce) all_reduce = nullptr;
    decltype(&ncclBroadcast) broadcast = nullptr;
    decltype(&ncclGetErrorString) error_string = nullptr;
    std::string error;
};

const Nccl &nccl() {
    static Nccl lib;
    static std::once_flag once;
    std::call_once(once, [] {
        void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
        if (h == nullptr) h = dlopen("libnccl.so.2", RTLD_NOW);
        if (h == nullptr) {
            const char *e = dlerror();
            lib.error = std::string("cannot load libnccl.so.2: ") + (e ? e : "unknown error");
            return;
        }
        auto sym = [&](const char *name) {
            void *p = dlsym(h, name);
            if (p == nullptr && lib.error.empty())
                lib.error = std::string("libnccl.so.2 has no ") + name;
            return p;
        };
        lib.get_unique_id = reinterpret_cast<decltype(lib.get_unique_id)>(sym("ncclGetUniqueId"));
        lib.comm_init_rank =
            reinterpret_cast<decltype(lib.comm_init_rank)>(sym("ncclCommInitRank"));
        lib.comm_destroy = reinterpret_cast<decltype(lib.comm_destroy)>(sym("ncclCommDestroy"));
        lib.all_reduce = reinterpret_cast<decltype(lib.all_reduce)>(sym("ncclAllReduce"));
        lib.broadcast = reinterpret_cast<decltype(lib.broadcast)>(sym("ncclBroadcast"));
        lib.error_string = reinterpret_cast<decltype(lib.error_string)>(sym("ncclGetErrorString"));
    });
    if (!lib.error.empty()) throw Error(ErrorKind::BadState, "vLLM weight transfer: " + lib.error);
    return lib;
}

void check(ncclResult_t r, const char *what) {
    if (r != ncclSuccess)
        throw Error(ErrorKind::Io, std::string("vLLM weight transfer: ") + what +
                                       " failed: " + nccl().error_string(r));
}

ncclDataType_t nccl_type(at::ScalarType t) {
    switch (t) {
        case at::kFloat:
            return ncclFloat32;
        case at::kBFloat16:
            return ncclBfloat16;
        case at::kHalf:
            return ncclFloat16;
        case at::kDouble:
            return ncclFloat64;
        case at::kLong:
            return ncclInt64;
        case at::kInt:
            return ncclInt32;
        case at::kChar:
            return ncclInt8;
        case at::kByte:
            return ncclUint8;
        default:
            throw Error(ErrorKind::InvalidArgument,
                        std::string("vLLM weight transfer: dtype ") + c10::toString(t) +
                            " has no NCCL type vLLM sends (float32, bfloat16, float16, float64, "
                            "int64, int32, int8, uint8)");
    }
}

} // namespace
#endif

bool nccl_available(std::string *why) {
#if defined(RL_VLLM_NCCL)
    try {
        (void)nccl();
    } catch (const std::exception &e) {
        if (why) *why = e.what();
        return false;
    }
    if (!at::hasCUDA()) {
        if (why) *why = "vLLM weight transfer: NCCL needs a CUDA device; this machine has none";
        return false;
    }
    return true;
#else
    if (why)
        *why = "vLLM weight transfer: NCCL needs a CUDA build (libtorch with CUDA and nccl.h); "
               "this build has none";
    return false;
#endif
}

#if defined(RL_VLLM_NCCL)

UniqueId NcclComm::new_unique_id() {
    ncclUniqueId raw;
    check(nccl().get_unique_id(&raw), "ncclGetUniqueId");
    UniqueId id;
    static_assert(sizeof(raw.internal) == std::tuple_size<UniqueId>::value);
    std::memcpy(id.data(), raw.internal, id.size());
    return id;
}

NcclComm::NcclComm(const UniqueId &id, int rank, int world_size, at::Device device)
    : device_(device) {
    if (!device.is_cuda())
        throw Error(ErrorKind::InvalidArgument,
                    "vLLM weight transfer: NCCL needs a CUDA device, got " + device.str());
    if (!device.has_index()) device = at::Device(at::kCUDA, c10::cuda::current_device());
    device_ = device;
    c10::cuda::CUDAGuard guard(device);
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.data(), id.size());
    ncclComm_t comm = nullptr;
    check(nccl().comm_init_rank(&comm, world_size, raw, rank), "ncclCommInitRank");
    comm_ = comm;
    // The warm-up every PyNcclCommunicator runs right after ncclCommInitRank:
    // a one-element float32 sum (a collective: each peer must run it too).
    at::Tensor warm = at::zeros({1}, at::TensorOptions(device).dtype(at::kFloat));
    auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    try {
        check(nccl().all_reduce(warm.data_ptr(), warm.data_ptr(), 1, ncclFloat32, ncclSum, comm,
                                stream.stream()),
              "the warm-up all_reduce");
        stream.synchronize();
    } catch (...) {
        nccl().comm_destroy(comm);
        comm_ = nullptr;
        throw;
    }
}

NcclComm::~NcclComm() {
    if (comm_ != nullptr) nccl().comm_destroy(static_cast<ncclComm_t>(comm_));
}

void NcclComm::broadcast(const std::vector<at::Tensor> &tensors, int root) {
    c10::cuda::CUDAGuard guard(device_);
    auto stream = c10::cuda::getCurrentCUDAStream(device_.index());
    for (const auto &t : tensors) {
        if (t.device() != device_ || !t.is_contiguous())
            throw Error(ErrorKind::InvalidArgument,
                        "vLLM weight transfer: broadcast needs contiguous tensors on " +
                            device_.str() + ", got one on " + t.device().str());
        check(nccl().broadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                               nccl_type(t.scalar_type()), root, static_cast<ncclComm_t>(comm_),
                               stream.stream()),
              "ncclBroadcast");
    }
    stream.synchronize();
}

#else

UniqueId NcclComm::new_unique_id() {
    std::string why;
    nccl_available(&why);
    throw Error(ErrorKind::BadState, why);
}

NcclComm::NcclComm(const UniqueId &, int, int, at::Device device) : device_(device) {
    std::string why;
    nccl_available(&why);
    throw Error(ErrorKind::BadState, why);
}

NcclComm::~NcclComm() = default;

void NcclComm::broadcast(const std::vector<at::Tensor> &, int) {
    throw Error(ErrorKind::BadState, "vLLM weight transfer: no NCCL in this build");
}

#endif

} // namespace rl::serve::vllm
