// tests/advantages: the advantage plugins through librl.
#include "dl_plugin_host.hpp"
#include "runtime_fixture.hpp"

#include <cmath>

namespace {

using rltest::Owned;
using rltest::Result;

TEST(AdvantageRuntime, GrpoAdvantagesComeBackAsAFloat64Tensor) {
    rltest::RuntimeFixture rt({"advantage-grpo", "advantage-gae"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "advantage", "grpo", R"({"norm_by_std": false})", &inst),
              RL_OK)
        << rl_last_error();
    Owned<double> rewards{{1, 0, 0.5}}, mask{{0, 1, 1, 0, 1, 1}};
    Owned<int64_t> groups{{0, 0, 1}}, cu{{0, 2, 4, 6}};
    rl_tensor_arg_t arg{"loss_mask", mask.view()};
    rl_advantage_inputs_t in{};
    in.struct_size = sizeof in;
    in.rewards = rewards.view();
    in.group_ids = groups.view();
    in.cu_seqlens = cu.view();
    in.tensors = rl_tensor_list_t{&arg, 1};
    Result r;
    ASSERT_EQ(rl_advantage_compute(inst, &in, &r.r), RL_OK) << rl_last_error();
    rl_tensor_view_t v{};
    ASSERT_EQ(rl_result_tensor(r.r, "advantages", &v), RL_OK) << rl_last_error();
    ASSERT_EQ(v.ndim, 1);
    ASSERT_EQ(v.shape[0], 6);
    EXPECT_EQ(v.dtype.code, RL_DTYPE_FLOAT);
    EXPECT_EQ(v.dtype.bits, 64);
    const double *a = static_cast<const double *>(v.data);
    const double want[6] = {0, 0.5, -0.5, 0, 0, 0};
    for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(a[i], want[i]) << i;
    EXPECT_EQ(r.metric("groups_singleton"), 1.0);
    rl_instance_destroy(inst);
}

TEST(AdvantageRuntime, GaeWithoutValuesFailsWithAMessage) {
    rltest::RuntimeFixture rt({"advantage-gae"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "advantage", "gae", nullptr, &inst), RL_OK)
        << rl_last_error();
    Owned<double> rewards{{1}};
    Owned<int64_t> groups{{0}}, cu{{0, 2}};
    rl_advantage_inputs_t in{};
    in.struct_size = sizeof in;
    in.rewards = rewards.view();
    in.group_ids = groups.view();
    in.cu_seqlens = cu.view();
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_advantage_compute(inst, &in, &r), RL_ERR_INVALID_ARG);
    EXPECT_EQ(r, nullptr);
    EXPECT_NE(std::string(rl_last_error()).find("'values'"), std::string::npos) << rl_last_error();
    // The host names the plugin once: "advantage 'gae': missing per-token input
    // 'values'; ..." (it used to read "advantage 'gae': advantage 'gae': ...").
    const std::string msg = rl_last_error();
    EXPECT_EQ(msg.rfind("advantage 'gae': missing per-token input 'values'", 0), 0u) << msg;
    EXPECT_EQ(msg.find("advantage 'gae'", 1), std::string::npos) << msg;
    rl_instance_destroy(inst);
}

} // namespace
