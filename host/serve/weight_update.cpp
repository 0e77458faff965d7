#include "weight_update.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/names.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/weight_set.hpp"
#include "rl/core/json.hpp"

#include <rl/sdk/transport.hpp>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <set>

namespace rl::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char *kSingleFile = "model.safetensors";
constexpr const char *kIndexFile = "model.safetensors.index.json";
constexpr const char *kChecksumsFile = "rl_checksums.json";

[[noreturn]] void refuse(const std::string &what, int status = 400) {
    throw UpdateRefused(status, what);
}

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}

// The safetensors files of an HF folder, in index order.
std::vector<std::string> weight_files(const std::string &dir) {
    const fs::path root(dir);
    if (!fs::is_directory(root)) refuse("model_path '" + dir + "' is not a folder");
    if (fs::exists(root / kIndexFile)) {
        const core::SafetensorsIndex idx =
            core::read_safetensors_index((root / kIndexFile).string());
        std::vector<std::string> files;
        std::set<std::string> seen;
        for (const auto &[name, file] : idx.weight_map)
            if (seen.insert(file).second) files.push_back((root / file).string());
        if (files.empty()) refuse((root / kIndexFile).string() + ": weight_map is empty");
        return files;
    }
    if (fs::exists(root / kSingleFile)) return {(root / kSingleFile).string()};
    refuse("model_path '" + dir + "' has neither " + kSingleFile + " nor " + kIndexFile);
}

bool ignorable(const std::string &name, const core::ModelConfig &c) {
    const std::string inv = ".rotary_emb.inv_freq";
    if (name.size() >= inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0)
        return true;
    return name == "lm_head.weight" && c.tie_word_embeddings;
}

std::map<std::string, uint32_t> read_checksums_file(const std::string &path) {
    const json j = rl::core::parse_json_or_discarded(core::read_file(path));
    if (!j.is_object() || j.value("algorithm", "") != "crc32c" || !j.contains("tensors") ||
        !j["tensors"].is_object())
        refuse(path + ": expected {\"algorithm\": \"crc32c\", \"tensors\": {name: crc}}");
    std::map<std::string, uint32_t> out;
    for (const auto &[name, v] : j["tensors"].items()) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xffffffffu)
            refuse(path + ": tensors['" + name + "'] must be a 32-bit unsigned integer");
        out[name] = v.get<uint32_t>();
    }
    return out;
}

} // namespace

namespace {

// torch dtype names this server reads, each type's own name first (the one
// written); "float" and "half" are aliases.
constexpr core::Named<at::ScalarType> kDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kFloat, "float"}, {at::kBFloat16, "bfloat16"},
    {at::kHalf, "float16"},  {at::kHalf, "half"},   {at::kDouble, "float64"},
    {at::kLong, "int64"},    {at::kInt, "int32"},   {at::kShort, "int16"},
    {at::kChar, "int8"},     {at::kByte, "uint8"},  {at::kBool, "bool"}};

} // namespace

at::ScalarType scalar_type_of(const std::string &name, const std::string &field) {
    const std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
    const auto t = core::value_in(kDtypeNames, n);
    if (!t)
        refuse(field + ": '" + name +
               "' is not a dtype this server reads (float32, bfloat16, float16, float64, int64, "
               "int32, int16, int8, uint8, bool)");
    return *t;
}

std::string torch_dtype_name(at::ScalarType t) {
    if (at::isFloatingType(t)) return core::dtype_string(t); // float32, bfloat16, ...
    if (const char *name = core::name_in(kDtypeNames, t, nullptr)) return name;
    return c10::toString(t);
}

uint32_t tensor_crc32c(const at::Tensor &t) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    return sdk::transport::crc32c(c.data_ptr(), static_cast<size_t>(c.nbytes()));
}

void write_checksums_file(const std::string &dir) {
    json tensors = json::object();
    for (const auto &path : weight_files(dir)) {
        auto file = core::SafetensorsFile::open(path);
        for (const auto &info : file->tensors())
            tensors[info.name] =
                sdk::transport::crc32c(file->data(info), static_cast<size_t>(info.nbytes()));
    }
    core::atomic_write_file((fs::path(dir) / kChecksumsFile).string(),
                            json{{"algorithm", "crc32c"}, {"tensors", tensors}}.dump(1));
}

WeightUpdater::WeightUpdater(std::shared_ptr<core::Policy> policy, core::Scheduler &scheduler)
    : policy_(std::move(policy)), scheduler_(scheduler) {}

WeightUpdater::~WeightUpdater() = default;

bool WeightUpdater::has_group() const {
    std::lock_guard<std::mutex> lk(mu_);
    return group_ != nullptr;
}

UpdateOutcome
WeightUpdater::from_disk(const std::string &dir,
                         const std::optional<std::map<std::string, uint32_t>> &checksums,
                         const std::optional<std::string> &weight_version) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto t0 = Clock::now();
    const core::ModelConfig &mc = policy_->model().config();
    std::optional<std::map<std::string, uint32_t>> crcs = checksums;
    const fs::path sums = fs::path(dir) / kChecksumsFile;
    if (!crcs && fs::exists(sums)) crcs = read_checksums_file(sums.string());

    std::vector<std::pair<std::string, at::Tensor>> received;
    std::vector<uint32_t> expected;
    try {
        for (const auto &path : weight_files(dir)) {
            auto file = core::SafetensorsFile::open(path);
            for (const auto &info : file->tensors()) {
                if (ignorable(info.name, mc)) continue;
                if (crcs) {
                    auto it = crcs->find(info.name);
                    if (it == crcs->end())
                        refuse(path + ": tensor '" + info.name + "' has no checksum (checksums " +
                               "list every tensor when given); the weights in use are kept");
                    const uint32_t got = sdk::transport::crc32c(file->data(info),
                                                                static_cast<size_t>(info.nbytes()));
                    if (got != it->second)
                        refuse(path + ": tensor '" + info.name + "' fails its checksum (CRC-32C " +
                               hex32(got) + ", expected " + hex32(it->second) +
                               "); nothing was swapped, the weights in use are kept");
                }
                received.emplace_back(info.name, core::tensor_from_file(file, info));
            }
        }
    } catch (const UpdateRefused &) {
        throw;
    } catch (const std::exception &e) {
        refuse(std::string("cannot read the weights at '") + dir + "': " + e.what());
    }
    return swap_in(std::move(received), std::nullopt, weight_version, true, seconds_since(t0));
}

void WeightUpdater::init_group(const core::dist::UpdateGroupOptions &options) {
    std::lock_guard<std::mutex> lk(mu_);
    if (group_)
        refuse("a weight update group ('" + group_->options().group_name +
               "') already exists; destroy it first (/destroy_weights_update_group)");
    const bool cuda = policy_->model().device().is_cuda();
    if (options.backend == "nccl" && !cuda)
        refuse("backend: 'nccl' needs the model on a CUDA device; this server runs on the CPU "
               "(use backend 'gloo')");
    try {
        group_ = std::make_unique<core::dist::UpdateGroup>(options);
    } catch (const std::exception &e) {
        refuse(e.what());
    }
}

void WeightUpdater::destroy_group(const std::string &group_name) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!group_ || group_->options().group_name != group_name)
        refuse("no weight update group named '" + group_name + "'");
    group_.reset();
}

UpdateOutcome WeightUpdater::from_distributed(const std::vector<AnnouncedTensor> &tensors,
                                              const std::string &group_name, bool flattened,
                                              const std::optional<std::vector<uint32_t>> &checksums,
                                              const std::optional<std::string> &weight_version) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto t0 = Clock::now();
    if (!group_ || group_->options().group_name != group_name)
        refuse("group_name: no weight update group named '" + group_name +
               "' (call /init_weights_update_group first)");
    if (tensors.empty()) refuse("names: no tensors announced");
    const at::Device device =
        group_->options().backend == "nccl" ? policy_->model().device() : at::Device(at::kCPU);
    std::vector<at::ScalarType> types;
    int64_t total_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const auto &a = tensors[i];
        types.push_back(scalar_type_of(a.dtype, "dtypes[" + std::to_string(i) + "]"));
        int64_t numel = 1;
        for (int64_t d : a.shape) {
            if (d < 0) refuse("shapes[" + std::to_string(i) + "]: negative dimension");
            numel *= d;
        }
        total_bytes += numel * static_cast<int64_t>(c10::elementSize(types.back()));
    }
    std::vector<at::Tensor> buffers;
    std::vector<std::pair<std::string, at::Tensor>> received;
    try {
        if (flattened) {
            buffers.push_back(at::empty({total_bytes}, at::TensorOptions(device).dtype(at::kByte)));
            group_->broadcast(buffers);
            int64_t offset = 0;
            for (size_t i = 0; i < tensors.size(); ++i) {
                const int64_t n = c10::multiply_integers(tensors[i].shape) *
                                  static_cast<int64_t>(c10::elementSize(types[i]));
                at::Tensor bytes = buffers[0].narrow(0, offset, n).clone();
                received.emplace_back(tensors[i].name,
                                      bytes.view(types[i]).reshape(tensors[i].shape));
                offset += n;
            }
        } else {
            for (size_t i = 0; i < tensors.size(); ++i)
                buffers.push_back(
                    at::empty(tensors[i].shape, at::TensorOptions(device).dtype(types[i])));
            group_->broadcast(buffers);
            for (size_t i = 0; i < tensors.size(); ++i)
                received.emplace_back(tensors[i].name, buffers[i]);
        }
    } catch (const UpdateRefused &) {
        throw;
    } catch (const std::exception &e) {
        refuse(
            std::string("receiving the announced tensors failed; the weights in use are kept: ") +
                e.what(),
            500);
    }
    return swap_in(std::move(received), checksums, weight_version, false, seconds_since(t0));
}

void WeightUpdater::vllm_init(const VllmInitInfo &info) {
    std::lock_guard<std::mutex> lk(mu_);
    if (vllm_comm_)
        refuse("init_info: vLLM's weight transfer engine is already initialized; shut it down "
               "first (/shutdown_weight_transfer_engine)");
    if (info.world_size < 2)
        refuse("init_info.world_size must be >= 2 (the trainer and this server), got " +
               std::to_string(info.world_size));
    if (info.rank_offset < 1 || info.rank_offset >= info.world_size)
        refuse("init_info.rank_offset " + std::to_string(info.rank_offset) + " is outside 1.." +
               std::to_string(info.world_size - 1) + " (rank 0 is the trainer)");
    if (info.packed && (info.packed_buffer_size_bytes <= 0 || info.packed_num_buffers <= 0))
        refuse("init_info.packed_buffer_size_bytes and packed_num_buffers must be > 0");
    const at::Device device = policy_->model().device();
    if (!device.is_cuda())
        refuse("init_info: vLLM's NCCL weight transfer needs the model on a CUDA device; this "
               "server runs on the CPU (use /update_weights {\"weight_dir\": ...} or SGLang's "
               "/init_weights_update_group with backend 'gloo')");
    std::string why;
    if (!vllm::nccl_available(&why)) refuse(why);
    // This server is one worker: its rank is rank_offset (vLLM adds the
    // worker's data- and tensor-parallel rank, 0 here).
    const int rank = info.rank_offset;
    try {
        vllm::UniqueId id;
        if (info.unique_id) {
            id = *info.unique_id;
        } else {
            vllm::StatelessGroup group(info.master_address, info.master_port, rank, info.world_size,
                                       info.timeout);
            id = group.broadcast_unique_id(std::nullopt);
        }
        vllm_comm_ = std::make_unique<vllm::NcclComm>(id, rank, info.world_size, device);
    } catch (const UpdateRefused &) {
        throw;
    } catch (const core::Error &e) {
        refuse(e.what(), e.kind() == core::ErrorKind::InvalidArgument ? 400 : 500);
    }
    vllm_info_ = info;
    vllm_last_.clear();
    vllm_open_ = false;
    vllm_pending_.clear();
}

void WeightUpdater::vllm_start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!vllm_comm_)
        refuse("no vLLM weight transfer engine: call /init_weight_transfer_engine first");
    vllm_open_ = true;
    vllm_pending_.clear();
}

std::vector<std::pair<std::string, at::Tensor>>
WeightUpdater::vllm_receive_locked(const std::vector<AnnouncedTensor> &tensors) {
    const at::Device device = vllm_comm_->device();
    std::vector<at::ScalarType> types;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < tensors.size(); ++i) {
        types.push_back(scalar_type_of(tensors[i].dtype, "dtype_names[" + std::to_string(i) + "]"));
        sizes.push_back(c10::multiply_integers(tensors[i].shape) *
                        static_cast<int64_t>(c10::elementSize(types.back())));
    }
    std::vector<std::pair<std::string, at::Tensor>> received;
    try {
        if (vllm_info_.packed) {
            size_t first = 0;
            for (size_t end : vllm::packed_chunk_ends(sizes, vllm_info_.packed_buffer_size_bytes)) {
                int64_t total = 0;
                for (size_t i = first; i < end; ++i) total += sizes[i];
                at::Tensor buffer = at::empty({total}, at::TensorOptions(device).dtype(at::kByte));
                vllm_comm_->broadcast({buffer});
                int64_t offset = 0;
                for (size_t i = first; i < end; ++i) {
                    at::Tensor bytes = buffer.narrow(0, offset, sizes[i]).clone();
                    received.emplace_back(tensors[i].name,
                                          bytes.view(types[i]).reshape(tensors[i].shape));
                    offset += sizes[i];
                }
                first = end;
            }
        } else {
            std::vector<at::Tensor> buffers;
            for (size_t i = 0; i < tensors.size(); ++i)
                buffers.push_back(
                    at::empty(tensors[i].shape, at::TensorOptions(device).dtype(types[i])));
            vllm_comm_->broadcast(buffers);
            for (size_t i = 0; i < tensors.size(); ++i)
                received.emplace_back(tensors[i].name, buffers[i]);
        }
    } catch (const std::exception &e) {
        refuse(
            std::string("receiving the announced tensors failed; the weights in use are kept: ") +
                e.what(),
            500);
    }
    return received;
}

std::optional<UpdateOutcome> WeightUpdater::vllm_receive(std::vector<AnnouncedTensor> tensors) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto t0 = Clock::now();
    if (!vllm_comm_)
        refuse("update_info: no vLLM weight transfer engine; call /init_weight_transfer_engine "
               "first");
    if (tensors.empty()) {
        if (vllm_last_.empty())
            refuse("update_info: names is empty and no earlier update announced any (an empty "
                   "update_info repeats the previous one)");
        tensors = vllm_last_;
    }
    for (size_t i = 0; i < tensors.size(); ++i)
        (void)scalar_type_of(tensors[i].dtype, "dtype_names[" + std::to_string(i) + "]");
    vllm_last_ = tensors;
    auto received = vllm_receive_locked(tensors);
    if (vllm_open_) {
        for (auto &r : received) vllm_pending_.push_back(std::move(r));
        return std::nullopt;
    }
    return swap_in(std::move(received), std::nullopt, std::nullopt, false, seconds_since(t0));
}

UpdateOutcome WeightUpdater::vllm_finish(const std::optional<std::string> &weight_version) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!vllm_open_) refuse("no weight update was started (/start_weight_update)");
    vllm_open_ = false;
    auto pending = std::move(vllm_pending_);
    vllm_pending_.clear();
    if (pending.empty()) refuse("the weight update received no tensors (/update_weights)");
    return swap_in(std::move(pending), std::nullopt, weight_version, false, 0);
}

void WeightUpdater::vllm_shutdown() {
    std::lock_guard<std::mutex> lk(mu_);
    vllm_comm_.reset();
    vllm_open_ = false;
    vllm_pending_.clear();
    vllm_last_.clear();
}

UpdateOutcome
WeightUpdater::from_tensors(const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                            const std::optional<std::vector<uint32_t>> &checksums,
                            const std::optional<std::string> &weight_version) {
    std::lock_guard<std::mutex> lk(mu_);
    if (tensors.empty()) refuse("named_tensors: no tensors given");
    return swap_in(tensors, checksums, weight_version, false, 0);
}

UpdateOutcome WeightUpdater::swap_in(std::vector<std::pair<std::string, at::Tensor>> received,
                                     const std::optional<std::vector<uint32_t>> &checksums,
                                     const std::optional<std::string> &weight_version, bool full,
                                     double seconds_so_far) {
    const auto t0 = Clock::now();
    if (policy_->model().weight_hooks() != nullptr)
        refuse("the model is sharded; a serving model is never sharded", 500);
    // The wire's checksums cover the tensors as they arrived.
    if (checksums) {
        if (checksums->size() != received.size())
            refuse("checksums: " + std::to_string(checksums->size()) + " given for " +
                   std::to_string(received.size()) + " tensors");
        for (size_t i = 0; i < received.size(); ++i) {
            const uint32_t got = tensor_crc32c(received[i].second);
            if (got != (*checksums)[i])
                refuse("tensor '" + received[i].first + "' fails its checksum (CRC-32C " +
                       hex32(got) + ", expected " + hex32((*checksums)[i]) +
                       "); nothing was swapped, the weights in use are kept");
        }
    }
    // Checked and staged in the model's dtype and device before pausing anything.
    core::StagedWeights staged = [&] {
        try {
            return core::StagedWeights::stage(policy_->model(), std::move(received), full);
        } catch (const core::Error &e) {
            refuse(std::string(e.what()) + "; nothing was swapped, the weights in use are kept");
        }
    }();
    int64_t version = policy_->version() + 1;
    if (weight_version) {
        try {
            size_t used = 0;
            const long long v = std::stoll(*weight_version, &used);
            if (used == weight_version->size() && v >= 0) version = v;
        } catch (const std::exception &) {
        }
    }
    UpdateOutcome out;
    out.tensors = static_cast<int64_t>(staged.size());
    out.bytes = staged.bytes();
    scheduler_.exclusive([&] { staged.swap_into(*policy_, version); });
    out.seconds = seconds_so_far + seconds_since(t0);
    out.weight_version = weight_version.value_or(std::to_string(version));
    return out;
}

} // namespace rl::serve
