// Golden sizes and offsets of every ABI struct (x86-64 / aarch64 LP64). A change
// here is an ABI break: bump the version and say so in docs/abi.md.
#include <rl_api.h>

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <cstddef>

#define EXPECT_LAYOUT(type, size) EXPECT_EQ(sizeof(type), size_t{size}) << #type
#define EXPECT_OFFSET(type, field, off)                                                            \
    EXPECT_EQ(offsetof(type, field), size_t{off}) << #type "." #field

extern "C" int rl_abi_compile_c_check(void);
int rl_abi_compile_cxx_check();

TEST(AbiLayout, HeaderCompilesInEveryLanguageMode) {
    EXPECT_EQ(rl_abi_compile_c_check(), rl_abi_compile_cxx_check());
}

TEST(AbiLayout, BasicTypesHaveGoldenLayout) {
    EXPECT_LAYOUT(rl_status_t, 4);
    EXPECT_LAYOUT(rl_string_view_t, 16);
    EXPECT_OFFSET(rl_string_view_t, length, 8);
    EXPECT_LAYOUT(rl_chain_t, 16);
    EXPECT_OFFSET(rl_chain_t, stype, 8);
    EXPECT_OFFSET(rl_chain_t, struct_size, 12);
}

TEST(AbiLayout, TensorTypesHaveGoldenLayout) {
    EXPECT_LAYOUT(rl_dtype_t, 4);
    EXPECT_LAYOUT(rl_device_t, 8);
    EXPECT_LAYOUT(rl_tensor_view_t, 48);
    EXPECT_OFFSET(rl_tensor_view_t, device, 8);
    EXPECT_OFFSET(rl_tensor_view_t, ndim, 16);
    EXPECT_OFFSET(rl_tensor_view_t, dtype, 20);
    EXPECT_OFFSET(rl_tensor_view_t, shape, 24);
    EXPECT_OFFSET(rl_tensor_view_t, strides, 32);
    EXPECT_OFFSET(rl_tensor_view_t, byte_offset, 40);
    EXPECT_LAYOUT(rl_tensor_arg_t, 56);
    EXPECT_OFFSET(rl_tensor_arg_t, view, 8);
    EXPECT_LAYOUT(rl_tensor_list_t, 16);
}

TEST(AbiLayout, TensorViewIsDLTensorFieldForField) {
    static_assert(sizeof(rl_tensor_view_t) == sizeof(DLTensor), "DLTensor size");
    static_assert(offsetof(rl_tensor_view_t, data) == offsetof(DLTensor, data), "data");
    static_assert(offsetof(rl_tensor_view_t, device) == offsetof(DLTensor, device), "device");
    static_assert(offsetof(rl_tensor_view_t, ndim) == offsetof(DLTensor, ndim), "ndim");
    static_assert(offsetof(rl_tensor_view_t, dtype) == offsetof(DLTensor, dtype), "dtype");
    static_assert(offsetof(rl_tensor_view_t, shape) == offsetof(DLTensor, shape), "shape");
    static_assert(offsetof(rl_tensor_view_t, strides) == offsetof(DLTensor, strides), "strides");
    static_assert(offsetof(rl_tensor_view_t, byte_offset) == offsetof(DLTensor, byte_offset),
                  "byte_offset");
    static_assert(sizeof(rl_dtype_t) == sizeof(DLDataType), "DLDataType");
    static_assert(offsetof(rl_dtype_t, bits) == offsetof(DLDataType, bits), "bits");
    static_assert(offsetof(rl_dtype_t, lanes) == offsetof(DLDataType, lanes), "lanes");
    static_assert(sizeof(rl_device_t) == sizeof(DLDevice), "DLDevice");
    static_assert(offsetof(rl_device_t, index) == offsetof(DLDevice, device_id), "device_id");
    EXPECT_EQ(RL_DTYPE_INT, kDLInt);
    EXPECT_EQ(RL_DTYPE_UINT, kDLUInt);
    EXPECT_EQ(RL_DTYPE_FLOAT, kDLFloat);
    EXPECT_EQ(RL_DTYPE_BFLOAT, kDLBfloat);
    EXPECT_EQ(RL_DTYPE_COMPLEX, kDLComplex);
#if DLPACK_VERSION >= 80
    EXPECT_EQ(RL_DTYPE_BOOL, kDLBool);
#else
    EXPECT_EQ(RL_DTYPE_BOOL, 6); // kDLBool in DLPack 0.8 and later
#endif
    EXPECT_EQ(RL_DEVICE_CPU, kDLCPU);
    EXPECT_EQ(RL_DEVICE_CUDA, kDLCUDA);
    EXPECT_EQ(RL_DEVICE_CUDA_HOST, kDLCUDAHost);
}

TEST(AbiLayout, HostAndCallContextHaveGoldenLayout) {
    EXPECT_LAYOUT(rl_call_ctx_t, 40);
    EXPECT_OFFSET(rl_call_ctx_t, host, 8);
    EXPECT_OFFSET(rl_call_ctx_t, stream, 16);
    EXPECT_OFFSET(rl_call_ctx_t, abort_flag, 24);
    EXPECT_OFFSET(rl_call_ctx_t, host_data, 32);
    EXPECT_LAYOUT(rl_host_api_t, 104); // 96 through ABI 0.5
    EXPECT_OFFSET(rl_host_api_t, abi_version, 4);
    EXPECT_OFFSET(rl_host_api_t, host_data, 8);
    EXPECT_OFFSET(rl_host_api_t, name, 16);
    EXPECT_OFFSET(rl_host_api_t, version, 24);
    EXPECT_OFFSET(rl_host_api_t, get_extension, 32);
    EXPECT_OFFSET(rl_host_api_t, log, 40);
    EXPECT_OFFSET(rl_host_api_t, fail, 48);
    EXPECT_OFFSET(rl_host_api_t, mem_alloc, 56);
    EXPECT_OFFSET(rl_host_api_t, mem_free, 64);
    EXPECT_OFFSET(rl_host_api_t, emit_metric, 72);
    EXPECT_OFFSET(rl_host_api_t, emit_tensor, 80);
    EXPECT_OFFSET(rl_host_api_t, emit_text, 88);
    // ABI 0.6: appended after the 0.5 table, read behind RL_HAS_FIELD.
    EXPECT_EQ(RL_SIZE_THROUGH(rl_host_api_t, emit_text), 96u);
    EXPECT_OFFSET(rl_host_api_t, emit_metric_reduced, 96);
    EXPECT_EQ(sizeof(rl_metric_reduction_t), 4u);
    EXPECT_EQ(RL_METRIC_DEFAULT, 0);
    EXPECT_EQ(RL_METRIC_TOKEN_MEAN, 1);
    EXPECT_EQ(RL_METRIC_SEQ_MEAN, 2);
    EXPECT_EQ(RL_METRIC_SUM, 3);
    EXPECT_EQ(RL_METRIC_MIN, 4);
    EXPECT_EQ(RL_METRIC_MAX, 5);
    EXPECT_LAYOUT(rl_host_thread_check_t, 16); // extension "rl.host.thread-check/1", ABI 0.2
    EXPECT_OFFSET(rl_host_thread_check_t, is_control_thread, 8);
    EXPECT_LAYOUT(rl_host_collective_t, 64); // extension "rl.host.collective/1", ABI 0.5
    EXPECT_OFFSET(rl_host_collective_t, store_open, 8);
    EXPECT_OFFSET(rl_host_collective_t, broadcast, 48);
    EXPECT_OFFSET(rl_host_collective_t, last_error, 56);
}

// The first published (0.1) layout of every struct a plugin provides is its
// minimum accepted size; the host reads newer fields behind RL_HAS_FIELD.
TEST(AbiLayout, FirstPublishedLayoutsArePrefixesOfToday) {
    EXPECT_EQ(RL_SIZE_THROUGH(rl_plugin_entry_t, get_factory), size_t{32});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_plugin_factory_t, create), size_t{32});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_plugin_desc_t, features), size_t{56});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_plugin_t, get_interface), size_t{40});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_loss_iface_t, compute), size_t{24});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_advantage_iface_t, compute), size_t{16});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_filter_iface_t, check), size_t{16});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_env_iface_t, step), size_t{32});
    EXPECT_EQ(RL_SIZE_THROUGH(rl_transport_iface_t, broadcast), size_t{32});
    rl_plugin_t old{};
    old.struct_size = 40;
    EXPECT_TRUE(RL_HAS_FIELD(&old, rl_plugin_t, get_interface));
    EXPECT_FALSE(RL_HAS_FIELD(&old, rl_plugin_t, get_params));
    old.struct_size = sizeof(rl_plugin_t);
    EXPECT_TRUE(RL_HAS_FIELD(&old, rl_plugin_t, get_params));
}

TEST(AbiLayout, EntryFactoryAndPluginHaveGoldenLayout) {
    EXPECT_LAYOUT(rl_plugin_entry_t, 32);
    EXPECT_OFFSET(rl_plugin_entry_t, init, 8);
    EXPECT_OFFSET(rl_plugin_entry_t, deinit, 16);
    EXPECT_OFFSET(rl_plugin_entry_t, get_factory, 24);
    EXPECT_LAYOUT(rl_plugin_desc_t, 56);
    EXPECT_OFFSET(rl_plugin_desc_t, id, 8);
    EXPECT_OFFSET(rl_plugin_desc_t, kind, 16);
    EXPECT_OFFSET(rl_plugin_desc_t, name, 24);
    EXPECT_OFFSET(rl_plugin_desc_t, version, 32);
    EXPECT_OFFSET(rl_plugin_desc_t, description, 40);
    EXPECT_OFFSET(rl_plugin_desc_t, features, 48);
    EXPECT_LAYOUT(rl_plugin_create_desc_t, 32);
    EXPECT_OFFSET(rl_plugin_create_desc_t, next_in_chain, 8);
    EXPECT_OFFSET(rl_plugin_create_desc_t, params, 16);
    EXPECT_LAYOUT(rl_plugin_t, 48); // 40 in ABI 0.1
    EXPECT_EQ(RL_SIZE_THROUGH(rl_plugin_t, get_interface), size_t{40}) << "0.1 layout";
    EXPECT_OFFSET(rl_plugin_t, get_params, 40); // ABI 0.2
    EXPECT_OFFSET(rl_plugin_t, desc, 8);
    EXPECT_OFFSET(rl_plugin_t, plugin_data, 16);
    EXPECT_OFFSET(rl_plugin_t, destroy, 24);
    EXPECT_OFFSET(rl_plugin_t, get_interface, 32);
    EXPECT_LAYOUT(rl_plugin_factory_t, 32);
    EXPECT_OFFSET(rl_plugin_factory_t, count, 8);
    EXPECT_OFFSET(rl_plugin_factory_t, get_desc, 16);
    EXPECT_OFFSET(rl_plugin_factory_t, create, 24);
}

TEST(AbiLayout, KindInterfacesHaveGoldenLayout) {
    EXPECT_LAYOUT(rl_loss_signature_t, 32);
    EXPECT_OFFSET(rl_loss_signature_t, required, 8);
    EXPECT_OFFSET(rl_loss_signature_t, optional, 16);
    EXPECT_OFFSET(rl_loss_signature_t, differentiable, 24);
    EXPECT_LAYOUT(rl_loss_inputs_t, 88);
    EXPECT_OFFSET(rl_loss_inputs_t, tensors, 8);
    EXPECT_OFFSET(rl_loss_inputs_t, cu_seqlens, 24);
    EXPECT_OFFSET(rl_loss_inputs_t, global_tokens, 72);
    EXPECT_OFFSET(rl_loss_inputs_t, global_seqs, 80);
    EXPECT_LAYOUT(rl_loss_outputs_t, 32);
    EXPECT_OFFSET(rl_loss_outputs_t, loss, 8);
    EXPECT_OFFSET(rl_loss_outputs_t, grads, 16);
    EXPECT_LAYOUT(rl_loss_iface_t, 24);
    EXPECT_LAYOUT(rl_advantage_inputs_t, 168);
    EXPECT_OFFSET(rl_advantage_inputs_t, rewards, 8);
    EXPECT_OFFSET(rl_advantage_inputs_t, group_ids, 56);
    EXPECT_OFFSET(rl_advantage_inputs_t, cu_seqlens, 104);
    EXPECT_OFFSET(rl_advantage_inputs_t, tensors, 152);
    EXPECT_LAYOUT(rl_advantage_iface_t, 16);
    EXPECT_LAYOUT(rl_rollout_view_t, 112);
    EXPECT_OFFSET(rl_rollout_view_t, token_ids, 8);
    EXPECT_OFFSET(rl_rollout_view_t, logprobs, 56);
    EXPECT_OFFSET(rl_rollout_view_t, vocab_size, 104);
    EXPECT_LAYOUT(rl_filter_verdict_t, 72);
    EXPECT_OFFSET(rl_filter_verdict_t, flagged, 4);
    EXPECT_OFFSET(rl_filter_verdict_t, reason, 8);
    EXPECT_LAYOUT(rl_filter_iface_t, 16);
    EXPECT_LAYOUT(rl_env_iface_t, 32);
    EXPECT_OFFSET(rl_env_iface_t, sample, 8);
    EXPECT_OFFSET(rl_env_iface_t, score, 16);
    EXPECT_OFFSET(rl_env_iface_t, step, 24);
    EXPECT_LAYOUT(rl_message_view_t, 40);
    EXPECT_OFFSET(rl_message_view_t, header, 8);
    EXPECT_OFFSET(rl_message_view_t, tensors, 24);
    EXPECT_LAYOUT(rl_transport_iface_t, 32);
}

TEST(AbiLayout, RuntimeDescriptorHasGoldenLayout) {
    EXPECT_LAYOUT(rl_runtime_desc_t, 32);
    EXPECT_OFFSET(rl_runtime_desc_t, flags, 4);
    EXPECT_OFFSET(rl_runtime_desc_t, next_in_chain, 8);
    EXPECT_OFFSET(rl_runtime_desc_t, plugin_path, 16);
    EXPECT_OFFSET(rl_runtime_desc_t, log_level, 24);
}

TEST(AbiLayout, TrainBatchHasGoldenLayout) {
    EXPECT_LAYOUT(rl_batch_t, 136);
    EXPECT_OFFSET(rl_batch_t, input_ids, 8);
    EXPECT_OFFSET(rl_batch_t, cu_seqlens, 56);
    EXPECT_OFFSET(rl_batch_t, tensors, 104);
    // ABI 0.3 fields after the 0.1 layout, which stays the minimum size.
    EXPECT_EQ(RL_SIZE_THROUGH(rl_batch_t, tensors), 120u);
    EXPECT_OFFSET(rl_batch_t, flags, 120);
    EXPECT_OFFSET(rl_batch_t, reserved1, 124);
    EXPECT_OFFSET(rl_batch_t, sampling_temperature, 128);
}

TEST(AbiLayout, VersionMacrosRoundTrip) {
    const uint32_t v = RL_MAKE_VERSION(1023, 1023, 4095);
    EXPECT_EQ(RL_VERSION_MAJOR(v), 1023u);
    EXPECT_EQ(RL_VERSION_MINOR(v), 1023u);
    EXPECT_EQ(RL_VERSION_PATCH(v), 4095u);
    EXPECT_EQ(RL_ABI_VERSION, RL_MAKE_VERSION(0, 6, 0));
}

// docs/abi.md lists every header of abi/ (a header added without a line there
// fails here).
TEST(AbiDocs, EveryHeaderIsListed) {
    const std::filesystem::path root = std::filesystem::path(RL_TEST_SOURCE_DIR) / "abi";
    std::ifstream in(std::filesystem::path(RL_TEST_SOURCE_DIR) / "docs" / "abi.md");
    ASSERT_TRUE(in) << "docs/abi.md is missing";
    const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto &e : std::filesystem::recursive_directory_iterator(root)) {
        if (e.path().extension() != ".h") continue;
        const std::string rel = std::filesystem::relative(e.path(), root).generic_string();
        EXPECT_NE(doc.find("`" + rel + "`"), std::string::npos)
            << "docs/abi.md does not list " << rel;
    }
}
