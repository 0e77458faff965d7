// Golden sizes and offsets of every ABI struct (x86-64 / aarch64 LP64). A change
// here is an ABI break: bump the version and say so in docs/abi.md.
#include <rl_api.h>

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>

#include <cstddef>

namespace {

// One row a struct: GOLDEN(type, size, facts...), each fact a field's offset
// (AT) or the size of the struct's first published layout, through that field
// (FIRST: the minimum size the host accepts; newer fields sit behind
// RL_HAS_FIELD).
struct Fact {
    const char *what;
    size_t actual;
    size_t golden;
};

template <class... Facts>
void expect_golden(const char *type, size_t size, size_t golden, const Facts &...facts) {
    EXPECT_EQ(size, golden) << "sizeof " << type;
    for (const Fact &f : std::initializer_list<Fact>{facts...})
        EXPECT_EQ(f.actual, f.golden) << type << " " << f.what;
}

} // namespace

#define GOLDEN(type, ...)                                                                          \
    do {                                                                                           \
        using T = type;                                                                            \
        expect_golden(#type, sizeof(T), __VA_ARGS__);                                              \
    } while (0)
// clang-format off
#define AT(field, off) Fact{"offset of " #field, offsetof(T, field), off}
#define FIRST(field, size) Fact{"first layout through " #field, RL_SIZE_THROUGH(T, field), size}
// clang-format on

extern "C" int rl_abi_compile_c_check(void);
int rl_abi_compile_cxx_check();

TEST(AbiLayout, HeaderCompilesInEveryLanguageMode) {
    EXPECT_EQ(rl_abi_compile_c_check(), rl_abi_compile_cxx_check());
}

TEST(AbiLayout, BasicTypesHaveGoldenLayout) {
    GOLDEN(rl_status_t, 4);
    GOLDEN(rl_string_view_t, 16, AT(length, 8));
    GOLDEN(rl_chain_t, 16, AT(stype, 8), AT(struct_size, 12));
}

TEST(AbiLayout, TensorTypesHaveGoldenLayout) {
    GOLDEN(rl_dtype_t, 4);
    GOLDEN(rl_device_t, 8);
    GOLDEN(rl_tensor_view_t, 48, AT(device, 8), AT(ndim, 16), AT(dtype, 20), AT(shape, 24),
           AT(strides, 32), AT(byte_offset, 40));
    GOLDEN(rl_tensor_arg_t, 56, AT(view, 8));
    GOLDEN(rl_tensor_list_t, 16);
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
    GOLDEN(rl_call_ctx_t, 40, AT(host, 8), AT(stream, 16), AT(abort_flag, 24), AT(host_data, 32));
    // 96 bytes through ABI 0.5; ABI 0.6 appends emit_metric_reduced (read behind RL_HAS_FIELD)
    GOLDEN(rl_host_api_t, 104, AT(abi_version, 4), AT(host_data, 8), AT(name, 16), AT(version, 24),
           AT(get_extension, 32), AT(log, 40), AT(fail, 48), AT(mem_alloc, 56), AT(mem_free, 64),
           AT(emit_metric, 72), AT(emit_tensor, 80), AT(emit_text, 88), FIRST(emit_text, 96),
           AT(emit_metric_reduced, 96));
    EXPECT_EQ(sizeof(rl_metric_reduction_t), 4u);
    EXPECT_EQ(RL_METRIC_DEFAULT, 0);
    EXPECT_EQ(RL_METRIC_TOKEN_MEAN, 1);
    EXPECT_EQ(RL_METRIC_SEQ_MEAN, 2);
    EXPECT_EQ(RL_METRIC_SUM, 3);
    EXPECT_EQ(RL_METRIC_MIN, 4);
    EXPECT_EQ(RL_METRIC_MAX, 5);
    // extension "rl.host.thread-check/1", ABI 0.2
    GOLDEN(rl_host_thread_check_t, 16, AT(is_control_thread, 8));
    // extension "rl.host.collective/1", ABI 0.5
    GOLDEN(rl_host_collective_t, 64, AT(store_open, 8), AT(broadcast, 48), AT(last_error, 56));
}

// The first published (0.1) layout of every struct a plugin provides (FIRST in
// its row) is its minimum accepted size; the host reads newer fields behind
// RL_HAS_FIELD.
TEST(AbiLayout, FieldsPastAnOlderStructSizeAreAbsent) {
    rl_plugin_t old{};
    old.struct_size = 40;
    EXPECT_TRUE(RL_HAS_FIELD(&old, rl_plugin_t, get_interface));
    EXPECT_FALSE(RL_HAS_FIELD(&old, rl_plugin_t, get_params));
    old.struct_size = sizeof(rl_plugin_t);
    EXPECT_TRUE(RL_HAS_FIELD(&old, rl_plugin_t, get_params));
}

TEST(AbiLayout, EntryFactoryAndPluginHaveGoldenLayout) {
    GOLDEN(rl_plugin_entry_t, 32, AT(init, 8), AT(deinit, 16), AT(get_factory, 24),
           FIRST(get_factory, 32));
    GOLDEN(rl_plugin_desc_t, 56, AT(id, 8), AT(kind, 16), AT(name, 24), AT(version, 32),
           AT(description, 40), AT(features, 48), FIRST(features, 56));
    GOLDEN(rl_plugin_create_desc_t, 32, AT(next_in_chain, 8), AT(params, 16));
    // 40 in ABI 0.1; get_params came in ABI 0.2.
    GOLDEN(rl_plugin_t, 48, AT(desc, 8), AT(plugin_data, 16), AT(destroy, 24),
           AT(get_interface, 32), FIRST(get_interface, 40), AT(get_params, 40));
    GOLDEN(rl_plugin_factory_t, 32, AT(count, 8), AT(get_desc, 16), AT(create, 24),
           FIRST(create, 32));
}

TEST(AbiLayout, KindInterfacesHaveGoldenLayout) {
    GOLDEN(rl_loss_signature_t, 32, AT(required, 8), AT(optional, 16), AT(differentiable, 24));
    GOLDEN(rl_loss_inputs_t, 88, AT(tensors, 8), AT(cu_seqlens, 24), AT(global_tokens, 72),
           AT(global_seqs, 80));
    GOLDEN(rl_loss_outputs_t, 32, AT(loss, 8), AT(grads, 16));
    GOLDEN(rl_loss_iface_t, 24, FIRST(compute, 24));
    GOLDEN(rl_advantage_inputs_t, 168, AT(rewards, 8), AT(group_ids, 56), AT(cu_seqlens, 104),
           AT(tensors, 152));
    GOLDEN(rl_advantage_iface_t, 16, FIRST(compute, 16));
    GOLDEN(rl_rollout_view_t, 112, AT(token_ids, 8), AT(logprobs, 56), AT(vocab_size, 104));
    GOLDEN(rl_filter_verdict_t, 72, AT(flagged, 4), AT(reason, 8));
    GOLDEN(rl_filter_iface_t, 16, FIRST(check, 16));
    GOLDEN(rl_env_iface_t, 32, AT(sample, 8), AT(score, 16), AT(step, 24), FIRST(step, 32));
    GOLDEN(rl_message_view_t, 40, AT(header, 8), AT(tensors, 24));
    GOLDEN(rl_transport_iface_t, 32, FIRST(broadcast, 32));
}

TEST(AbiLayout, RuntimeDescriptorHasGoldenLayout) {
    GOLDEN(rl_runtime_desc_t, 32, AT(flags, 4), AT(next_in_chain, 8), AT(plugin_path, 16),
           AT(log_level, 24));
}

TEST(AbiLayout, TrainBatchHasGoldenLayout) {
    // ABI 0.3 fields (flags on) after the 0.1 layout, which stays the minimum size.
    GOLDEN(rl_batch_t, 136, AT(input_ids, 8), AT(cu_seqlens, 56), AT(tensors, 104),
           FIRST(tensors, 120), AT(flags, 120), AT(reserved1, 124), AT(sampling_temperature, 128));
}

TEST(AbiLayout, VersionMacrosRoundTrip) {
    const uint32_t v = RL_MAKE_VERSION(1023, 1023, 4095);
    EXPECT_EQ(RL_VERSION_MAJOR(v), 1023u);
    EXPECT_EQ(RL_VERSION_MINOR(v), 1023u);
    EXPECT_EQ(RL_VERSION_PATCH(v), 4095u);
    EXPECT_EQ(RL_ABI_VERSION, RL_MAKE_VERSION(0, 10, 0));
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
