// safetensors reader / writer: layout, round trips and malformed input.
#include "rl/core/error.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>

#include <filesystem>
#include <random>

namespace rl::core {
namespace {

using test::error_of;
using test::TempDir;

std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return s;
}

// A file image: header JSON (unpadded) + data bytes.
std::string image(const std::string &header, const std::string &data) {
    return le64(header.size()) + header + data;
}

SafetensorsHeader parse(const std::string &bytes) {
    return parse_safetensors(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(),
                             "mem.safetensors");
}

TEST(Safetensors, WriterProducesTheReferenceByteLayout) {
    // The reference implementation serializes {"attn.0": F32 [1,2,3] = 0..5}
    // with no metadata into exactly these bytes: 64-byte header, no padding.
    const float values[6] = {0, 1, 2, 3, 4, 5};
    std::vector<TensorBytes> t = {{"attn.0", DType::F32, {1, 2, 3}, values, sizeof values}};
    const std::string header = safetensors_header(&t, {});
    const std::string json = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    EXPECT_EQ(header, le64(64) + json);
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToEightBytesAndMetadataComesFirst) {
    // The reference writes this 65-byte header as 72 bytes: 7 trailing spaces.
    const float v[6] = {0, 1, 2, 3, 4, 5};
    std::vector<TensorBytes> t = {{"attn0", DType::F32, {1, 1, 2, 3}, v, sizeof v}};
    EXPECT_EQ(safetensors_header(&t, {}),
              le64(72) + R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                  "       ");
    const std::string h = safetensors_header(&t, {{"format", "pt"}});
    ASSERT_EQ((h.size() - 8) % 8, 0u);
    EXPECT_EQ(h.substr(8).rfind(R"({"__metadata__":{"format":"pt"},"attn0":)", 0), 0u) << h;
}

TEST(Safetensors, WriterOrdersTensorsByDtypeWidthThenName) {
    const double d = 1;
    const float f[2] = {1, 2};
    const uint16_t h = 0x3c00;
    const int64_t i = 7;
    std::vector<TensorBytes> t = {{"z.f32", DType::F32, {2}, f, 8},
                                  {"a.f16", DType::F16, {1}, &h, 2},
                                  {"b.f64", DType::F64, {1}, &d, 8},
                                  {"a.f32", DType::F32, {2}, f, 8},
                                  {"c.i64", DType::I64, {1}, &i, 8}};
    safetensors_header(&t, {});
    std::vector<std::string> order;
    for (const auto &x : t) order.push_back(x.name);
    // Reference dtype order, widest (by enum rank) first: I64 > F64 > F32 > F16.
    EXPECT_EQ(order, (std::vector<std::string>{"c.i64", "b.f64", "a.f32", "z.f32", "a.f16"}));
}

TEST(Safetensors, RoundTripKeepsEveryDtypeShapeAndByte) {
    TempDir dir;
    std::vector<std::pair<std::string, at::Tensor>> in = {
        {"f32", at::randn({3, 4})},
        {"bf16", at::randn({5}).to(at::kBFloat16)},
        {"f16", at::randn({2, 2}).to(at::kHalf)},
        {"f64", at::randn({1, 1, 3}, at::kDouble)},
        {"i64", at::arange(10, at::kLong).view({2, 5})},
        {"i32", at::arange(4, at::kInt)},
        {"i16", at::arange(3, at::kShort)},
        {"i8", at::arange(-2, 2, at::kChar)},
        {"u8", at::arange(5, at::kByte)},
        {"bool", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)},
        {"scalar", at::tensor(3.5f).view({})},
        {"empty", at::empty({0, 4})},
        {"strided", at::randn({4, 6}).t()},
    };
    const std::string path = dir / "x.safetensors";
    save_safetensors(path, in, {{"format", "pt"}, {"step", "12"}});
    auto f = SafetensorsFile::open(path);
    EXPECT_EQ(f->metadata().at("step"), "12");
    auto out = load_safetensors(path);
    ASSERT_EQ(out.size(), in.size());
    for (const auto &[name, t] : in) {
        ASSERT_TRUE(out.count(name)) << name;
        EXPECT_EQ(out[name].scalar_type(), t.scalar_type()) << name;
        EXPECT_EQ(out[name].sizes(), t.sizes()) << name;
        EXPECT_TRUE(at::equal(out[name], t)) << name;
    }
}

TEST(Safetensors, AlignedTensorsAreViewsOfTheMappingNotCopies) {
    TempDir dir;
    const std::string path = dir / "v.safetensors";
    save_safetensors(path, {{"w", at::randn({64})}});
    auto f = SafetensorsFile::open(path);
    at::Tensor t = tensor_from_file(f, f->at("w"));
    EXPECT_EQ(t.data_ptr(), static_cast<void *>(f->data(f->at("w"))));
    // The view keeps the mapping alive after the file object is dropped, and
    // writes to it never reach the file.
    const std::string before = test::slurp(path);
    f.reset();
    t.add_(1.0);
    EXPECT_EQ(test::slurp(path), before);
}

TEST(Safetensors, MisalignedTensorsAreCopied) {
    // One U8 byte first shifts the F32 tensor to an odd address.
    const std::string header =
        R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
    const float one = 1.0f;
    std::string data(1, '\x07');
    data.append(reinterpret_cast<const char *>(&one), 4);
    TempDir dir;
    const std::string path = dir / "m.safetensors";
    test::spit(path, image(header, data));
    auto f = SafetensorsFile::open(path);
    at::Tensor b = tensor_from_file(f, f->at("b"));
    EXPECT_NE(b.data_ptr(), static_cast<void *>(f->data(f->at("b"))));
    EXPECT_EQ(b.item<float>(), 1.0f);
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryFilesAndReplacesTheOldFile) {
    TempDir dir;
    const std::string path = dir / "w.safetensors";
    save_safetensors(path, {{"a", at::zeros({2})}});
    save_safetensors(path, {{"b", at::ones({3})}});
    auto out = load_safetensors(path);
    EXPECT_EQ(out.size(), 1u);
    EXPECT_TRUE(out.count("b"));
    int files = 0;
    for (const auto &e : std::filesystem::directory_iterator(dir.path())) {
        (void)e;
        ++files;
    }
    EXPECT_EQ(files, 1);
}

TEST(Safetensors, WriterRefusesInconsistentTensors) {
    const float v[2] = {1, 2};
    std::vector<TensorBytes> wrong_size = {{"x", DType::F32, {3}, v, 8}};
    EXPECT_NE(error_of([&] { safetensors_header(&wrong_size, {}); }).find("'x'"),
              std::string::npos);
    std::vector<TensorBytes> dup = {{"x", DType::F32, {2}, v, 8}, {"x", DType::F32, {2}, v, 8}};
    EXPECT_NE(error_of([&] { safetensors_header(&dup, {}); }).find("twice"), std::string::npos);
    std::vector<TensorBytes> meta = {{"__metadata__", DType::F32, {2}, v, 8}};
    error_of([&] { safetensors_header(&meta, {}); });
}

TEST(Safetensors, OpenNamesTheMissingFile) {
    const std::string msg =
        error_of([] { SafetensorsFile::open("/nonexistent/dir/w.safetensors"); });
    EXPECT_NE(msg.find("/nonexistent/dir/w.safetensors"), std::string::npos) << msg;
    TempDir dir;
    EXPECT_NE(error_of([&] { SafetensorsFile::open(dir.path()); }).find(dir.path()),
              std::string::npos);
}

struct BadCase {
    const char *what;
    std::string bytes;
    const char *expect; // substring of the error
};

TEST(Safetensors, MalformedHeadersAreErrorsNamingTheProblem) {
    const std::string f4(4, '\0');
    // One tensor "t" of this dtype, shape and data_offsets (JSON) over 4 bytes.
    auto one = [&](const char *dtype, const char *shape, const char *offsets) {
        return image(std::string(R"({"t":{"dtype":")") + dtype + R"(","shape":)" + shape +
                         R"(,"data_offsets":)" + offsets + "}}",
                     f4);
    };
    const std::vector<BadCase> cases = {
        {"empty", "", "too short"},
        {"short", "abc", "too short"},
        {"huge header length", le64(uint64_t{1} << 40) + "{}", "exceeds the 100 MB limit"},
        {"header past end", le64(100) + "{}", "truncated"},
        {"not an object start", image("[1,2]   ", ""), "does not start with '{'"},
        {"invalid json", image("{\"a\":", ""), "corrupt safetensors header"},
        {"unknown dtype", one("F128", "[1]", "[0,4]"), "'t'"},
        {"negative shape", one("F32", "[-1]", "[0,4]"), "non-negative"},
        {"float shape", one("F32", "[1.5]", "[0,4]"), "non-negative"},
        {"missing offsets", image(R"({"t":{"dtype":"F32","shape":[1]}})", f4), "data_offsets"},
        {"three offsets", one("F32", "[1]", "[0,4,8]"), "data_offsets"},
        {"end before begin", one("F32", "[0]", "[4,0]"), "end before"},
        {"size mismatch", one("F32", "[2]", "[0,4]"), "needs 8 bytes"},
        {"overflowing shape", one("F32", "[4294967296,4294967296,4294967296]", "[0,4]"),
         "overflows"},
        {"truncated data", one("F32", "[2]", "[0,8]"), "truncated"},
        {"overlap",
         image(
             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
             f4 + f4),
         "inside"},
        {"gap", image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f4 + f4), "gap"},
        {"trailing bytes",
         image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f4 + "xx"), "holds 6"},
        {"duplicate name",
         image(
             R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             f4 + f4),
         "listed twice"},
        {"metadata not strings", image(R"({"__metadata__":{"a":1}})", ""), "__metadata__"},
        {"entry not object", image(R"({"t":5})", ""), "'t'"},
        {"invalid utf8", image("{\"\xff\":1}", ""), "corrupt"},
    };
    for (const auto &c : cases) {
        const std::string msg = error_of([&] { parse(c.bytes); });
        EXPECT_NE(msg.find("mem.safetensors"), std::string::npos) << c.what << ": " << msg;
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    }
}

TEST(Safetensors, EveryTruncationOfAValidFileIsAnError) {
    const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<TensorBytes> t = {{"a", DType::F32, {2, 2}, v, 16},
                                  {"b", DType::F32, {4}, v + 4, 16}};
    std::string bytes = safetensors_header(&t, {{"format", "pt"}});
    bytes.append(reinterpret_cast<const char *>(v), 32);
    EXPECT_NO_THROW(parse(bytes));
    for (size_t n = 0; n < bytes.size(); ++n) {
        EXPECT_THROW(parse(bytes.substr(0, n)), Error) << "truncated to " << n;
    }
}

TEST(Safetensors, RandomCorruptionIsRejectedOrStaysInBounds) {
    const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<TensorBytes> t = {{"layer.0.w", DType::F32, {2, 2}, v, 16},
                                  {"layer.1.w", DType::BF16, {8}, v, 16}};
    std::string good = safetensors_header(&t, {{"format", "pt"}});
    good.append(reinterpret_cast<const char *>(v), 32);
    std::mt19937 rng(42);
    int parsed = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string b = good;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; ++k) {
            const size_t pos = rng() % b.size();
            switch (rng() % 3) {
                case 0:
                    b[pos] = static_cast<char>(rng() & 0xff);
                    break;
                case 1:
                    b[pos] = "{}[]\":,0123456789-e. "[rng() % 22];
                    break;
                default:
                    b.erase(pos, 1 + rng() % 3);
                    break;
            }
        }
        try {
            SafetensorsHeader h = parse(b);
            ++parsed;
            for (const auto &ti : h.tensors) {
                ASSERT_LE(h.data_start + ti.end, b.size());
                ASSERT_EQ(ti.nbytes(), static_cast<uint64_t>(ti.numel()) * dtype_size(ti.dtype));
            }
        } catch (const Error &) {
        }
    }
    EXPECT_LT(parsed, 3000); // most corruptions are caught
}

TEST(SafetensorsIndex, ParsesAndRejectsBadEntries) {
    TempDir dir;
    const std::string path = dir / "model.safetensors.index.json";
    SafetensorsIndex idx;
    idx.weight_map = {{"a", "model-00001-of-00002.safetensors"},
                      {"b", "model-00002-of-00002.safetensors"}};
    test::spit(path, safetensors_index_json(idx, 1234));
    SafetensorsIndex back = read_safetensors_index(path);
    EXPECT_EQ(back.weight_map, idx.weight_map);
    EXPECT_EQ(back.metadata.at("total_size"), "1234");
    EXPECT_EQ(test::slurp(path),
              "{\n  \"metadata\": {\n    \"total_size\": 1234\n  },\n  \"weight_map\": {\n"
              "    \"a\": \"model-00001-of-00002.safetensors\",\n"
              "    \"b\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");

    test::spit(path, R"({"weight_map": {"a": "../evil.safetensors"}})");
    EXPECT_NE(error_of([&] { read_safetensors_index(path); }).find("weight_map['a']"),
              std::string::npos);
    test::spit(path, R"({"weight_map": {"a": 3}})");
    EXPECT_NE(error_of([&] { read_safetensors_index(path); }).find(path), std::string::npos);
    test::spit(path, R"({"metadata": {}})");
    EXPECT_NE(error_of([&] { read_safetensors_index(path); }).find("weight_map"),
              std::string::npos);
    test::spit(path, "{not json");
    EXPECT_NE(error_of([&] { read_safetensors_index(path); }).find("not valid JSON"),
              std::string::npos);
}

} // namespace
} // namespace rl::core
