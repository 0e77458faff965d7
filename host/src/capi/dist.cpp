// abi/rl/dist.h: the process group of a distributed run.
#include "train_common.hpp"

#include "rl/core/dist.hpp"
#include "rl/core/params.hpp"

#include <chrono>

namespace {

using namespace rl::host::capi;
namespace dist = rl::core::dist;

CallSink info_sink(const std::shared_ptr<dist::Group> &g) {
    CallSink sink;
    sink.scalars["rank"] = g ? g->rank() : 0;
    sink.scalars["world_size"] = g ? g->size() : 1;
    sink.scalars["local_rank"] = g ? g->local_rank() : 0;
    sink.scalars["local_world_size"] = g ? g->env().local_world_size : 1;
    sink.texts["backend"] = g ? g->backend_name() : "none";
    return sink;
}

void set_out(rl_result_t **out, CallSink &&sink) {
    if (out != nullptr) *out = new_result(std::move(sink));
}

std::shared_ptr<dist::Group> group_or_null() {
    auto g = dist::current();
    return g && g->size() > 1 ? g : nullptr;
}

} // namespace

RL_API rl_status_t rl_dist_init(const char *config_json, const char *device,
                                rl_result_t **out_result) {
    return train_boundary([&] {
        if (out_result) *out_result = nullptr;
        const nlohmann::json j = rl::core::read_params_text(
            config_json ? config_json : "", rl::core::dist_params(), "dist", "dist config");
        dist::Options o;
        o.timeout =
            std::chrono::milliseconds(static_cast<int64_t>(j["timeout"].get<double>() * 1000.0));
        o.backend = j["backend"].get<std::string>();
        set_out(out_result, info_sink(dist::init(o, device ? device : "cpu")));
        return RL_OK;
    });
}

RL_API rl_status_t rl_dist_info(rl_result_t **out_result) {
    return train_boundary([&] {
        require(out_result != nullptr, "rl_dist_info: out_result is NULL");
        *out_result = nullptr;
        set_out(out_result, info_sink(group_or_null()));
        return RL_OK;
    });
}

RL_API rl_status_t rl_dist_barrier(void) {
    return train_boundary([&] {
        if (auto g = group_or_null()) g->barrier();
        return RL_OK;
    });
}

RL_API rl_status_t rl_dist_broadcast(rl_string_view_t value, int32_t root,
                                     rl_result_t **out_result) {
    return train_boundary([&] {
        require(out_result != nullptr, "rl_dist_broadcast: out_result is NULL");
        require(value.data != nullptr || value.length == 0, "rl_dist_broadcast: value is NULL");
        *out_result = nullptr;
        auto g = group_or_null();
        const int world = g ? g->size() : 1;
        require(root >= 0 && root < world, "rl_dist_broadcast: root " + std::to_string(root) +
                                               " is not a rank (world size " +
                                               std::to_string(world) + ")");
        std::string v(value.data ? value.data : "", static_cast<size_t>(value.length));
        CallSink sink;
        sink.texts["value"] = g ? g->broadcast_bytes(v, root) : v;
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_dist_all_gather(rl_string_view_t value, rl_result_t **out_result) {
    return train_boundary([&] {
        require(out_result != nullptr, "rl_dist_all_gather: out_result is NULL");
        require(value.data != nullptr || value.length == 0, "rl_dist_all_gather: value is NULL");
        *out_result = nullptr;
        std::string v(value.data ? value.data : "", static_cast<size_t>(value.length));
        auto g = group_or_null();
        const std::vector<std::string> all = g ? g->all_gather_bytes(v) : std::vector{v};
        CallSink sink;
        for (size_t r = 0; r < all.size(); ++r) sink.texts[std::to_string(r)] = all[r];
        sink.scalars["world_size"] = static_cast<double>(all.size());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}
