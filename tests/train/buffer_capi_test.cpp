// The rollout buffer's C API (abi/rl/train.h): push scored rollouts, pop a
// training batch of the groups that kept learning signal, read drop counts.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

using namespace rl_train_test;
using nlohmann::json;

namespace {

BufferPtr make_buffer(const char *config) {
    rl_buffer_t *b = nullptr;
    if (rl_buffer_create(config, &b) != RL_OK) ADD_FAILURE() << rl_last_error();
    return BufferPtr(b);
}

rl_status_t push(rl_buffer_t *b, int64_t group, double reward, std::vector<int64_t> ids,
                 int64_t version = 0) {
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<float> lp(ids.size(), -1.5f), adv(ids.size(), static_cast<float>(reward));
    std::vector<float> mask(ids.size(), 1.0f);
    mask[0] = 0.0f;
    rl_tensor_arg_t args[4] = {{"token_ids", view_of(ids.data(), &n, kI64)},
                               {"logprobs", view_of(lp.data(), &n, kF32)},
                               {"loss_mask", view_of(mask.data(), &n, kF32)},
                               {"advantages", view_of(adv.data(), &n, kF32)}};
    const rl_tensor_list_t list{args, 4};
    const json r = {{"group_id", group},
                    {"reward", reward},
                    {"policy_version", version},
                    {"task", "t" + std::to_string(group)},
                    {"completion", "c"}};
    return rl_buffer_push(b, r.dump().c_str(), &list);
}

} // namespace

TEST(BufferCApi, PopBatchPacksTheGroupsWithSignalAndCountsDropsByReason) {
    BufferPtr b = make_buffer(R"({"group_size": 2, "max_off_policy_steps": 1})");
    RL_ASSERT_OK(rl_buffer_set_policy_version(b.get(), 1));
    RL_ASSERT_OK(push(b.get(), 1, 1.0, {1, 2, 3}, 1));
    RL_ASSERT_OK(push(b.get(), 1, 1.0, {1, 2}, 1)); // all equal: zero_variance
    RL_ASSERT_OK(push(b.get(), 2, 0.0, {4, 5, 6}, 1));
    RL_ASSERT_OK(push(b.get(), 2, 1.0, {4, 5}, 1)); // kept
    RL_ASSERT_OK(push(b.get(), 3, 0.5, {7, 8}, 0)); // becomes stale at version 2
    RL_ASSERT_OK(rl_buffer_set_policy_version(b.get(), 2));

    Result stats;
    RL_ASSERT_OK(rl_buffer_stats(b.get(), 0, stats.out()));
    EXPECT_EQ(stats.scalar("pushed_rollouts"), 5);
    EXPECT_EQ(stats.scalar("dropped.zero_variance.groups"), 1);
    EXPECT_EQ(stats.scalar("dropped.stale.rollouts"), 1);
    EXPECT_EQ(stats.scalar("ready_groups"), 1);

    Result none;
    RL_ASSERT_OK(rl_buffer_pop_batch(b.get(), 3, 0, none.out()));
    EXPECT_EQ(none.scalar("rollouts"), 0);
    EXPECT_FALSE(none.has_tensor("input_ids"));

    Result batch;
    RL_ASSERT_OK(rl_buffer_pop_batch(b.get(), 2, 0, batch.out()));
    EXPECT_EQ(batch.scalar("groups"), 1);
    EXPECT_EQ(batch.scalar("rollouts"), 2);
    EXPECT_EQ(batch.tensor<int64_t>("input_ids"), (std::vector<int64_t>{4, 5, 6, 4, 5}));
    EXPECT_EQ(batch.tensor<int64_t>("cu_seqlens"), (std::vector<int64_t>{0, 3, 5}));
    EXPECT_EQ(batch.tensor<float>("loss_mask"), (std::vector<float>{0, 1, 1, 0, 1}));
    EXPECT_EQ(batch.tensor<float>("rollout_logprobs").size(), 5u);
    EXPECT_EQ(batch.tensor<float>("advantages"), (std::vector<float>{0, 0, 0, 1, 1}));
    EXPECT_EQ(batch.tensor<double>("rewards"), (std::vector<double>{0.0, 1.0}));
    EXPECT_EQ(batch.tensor<int64_t>("group_ids"), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(json::parse(batch.text("tasks")), json({"t2", "t2"}));

    Result taken;
    RL_ASSERT_OK(rl_buffer_stats(b.get(), 1, taken.out()));
    EXPECT_EQ(taken.scalar("popped_rollouts"), 2);
    EXPECT_EQ(json::parse(taken.text("drop_log")).size(), 2u);
}

TEST(BufferCApi, BadRolloutsAreRefusedByName) {
    BufferPtr b = make_buffer(R"({"group_size": 2})");
    const int64_t n = 2;
    int64_t ids[2] = {1, 2};
    float mask[2] = {0.0f, 0.5f};
    rl_tensor_arg_t args[2] = {{"token_ids", view_of(ids, &n, kI64)},
                               {"loss_mask", view_of(mask, &n, kF32)}};
    const rl_tensor_list_t list{args, 2};
    EXPECT_EQ(rl_buffer_push(b.get(), R"({"group_id": 1, "reward": 1})", &list),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'loss_mask'"), std::string::npos);
    const rl_tensor_list_t only_ids{args, 1};
    EXPECT_EQ(rl_buffer_push(b.get(), R"({"group_id": 1, "rewrd": 1})", &only_ids),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'rewrd'"), std::string::npos);
    rl_buffer_t *bad = nullptr;
    EXPECT_EQ(rl_buffer_create(R"({"group_sise": 2})", &bad), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'buffer.group_sise'"), std::string::npos);
    EXPECT_EQ(rl_buffer_create(R"({"easy_threshold": 0.1, "hard_threshold": 0.5})", &bad),
              RL_ERR_INVALID_ARG);
    EXPECT_EQ(bad, nullptr);
}
