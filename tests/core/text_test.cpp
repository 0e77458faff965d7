// rl/core/text.hpp: base64 against RFC 4648's test vectors (section 10), and
// what the decoder refuses.
#include "rl/core/text.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace rl::core {
namespace {

const std::vector<std::pair<std::string, std::string>> kRfc4648 = {{"", ""},
                                                                   {"f", "Zg=="},
                                                                   {"fo", "Zm8="},
                                                                   {"foo", "Zm9v"},
                                                                   {"foob", "Zm9vYg=="},
                                                                   {"fooba", "Zm9vYmE="},
                                                                   {"foobar", "Zm9vYmFy"}};

std::string text_of(const std::vector<uint8_t> &bytes) {
    return std::string(bytes.begin(), bytes.end());
}

TEST(Base64, EncodesAndDecodesTheRfcVectors) {
    for (const auto &[plain, encoded] : kRfc4648) {
        EXPECT_EQ(base64_encode(plain.data(), plain.size()), encoded) << plain;
        const auto back = base64_decode(encoded);
        ASSERT_TRUE(back.has_value()) << encoded;
        EXPECT_EQ(text_of(*back), plain) << encoded;
    }
}

TEST(Base64, AllByteValuesRoundTripAndPaddingIsOptional) {
    std::vector<uint8_t> all(256);
    for (int i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
    const std::string enc = base64_encode(all.data(), all.size());
    EXPECT_EQ(base64_decode(enc), all);
    EXPECT_EQ(text_of(*base64_decode("Zm8")), "fo");
    EXPECT_EQ(text_of(*base64_decode("Zg")), "f");
}

TEST(Base64, RefusesOtherCharactersDataAfterPaddingAndLongPadding) {
    for (const char *bad : {"Zm9v!", "Zm 9v", "Zg==Zg", "Zg===", "Zm9v\n", "-_-_"})
        EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
}

} // namespace
} // namespace rl::core

TEST(ShapeText, WritesAnyShapeAsErrorsPrintIt) {
    EXPECT_EQ(rl::core::shape_text(std::vector<int64_t>{}), "[]");
    EXPECT_EQ(rl::core::shape_text(std::vector<int64_t>{7}), "[7]");
    EXPECT_EQ(rl::core::shape_text(std::vector<int64_t>{2, 0, 3}), "[2, 0, 3]");
}
