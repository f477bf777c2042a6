// SafetensorsFile: a valid file maps with the right infos; every malformed header is an hlm::Error that
// names the file and, where one is at fault, the tensor.
#include "weights/safetensors.h"

#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>

#include "safetensors_writer.h"
#include "weights_test_util.h"

namespace hlm {
namespace {

using test::error_of;
using test::fresh_dir;
using test::StEntry;

TEST(SafetensorsFile, MapsValidFile) {
  std::string path = fresh_dir("st_valid") + "/a.safetensors";
  test::write_safetensors(path, {{"w", "F32", {2, 3}, test::f32_bytes({1, 2, 3, 4, 5, 6})},
                                 {"b", "BF16", {4}, test::bf16_bytes({1, 2, 3, 4})},
                                 {"ids", "I64", {1}, std::vector<uint8_t>(8, 0)},
                                 {"packed", "U8", {3}, {7, 8, 9}},
                                 {"scalar", "I32", {}, test::i32_bytes({42})},
                                 {"empty", "F16", {0, 5}, {}}});
  SafetensorsFile file(path);
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.tensors().size(), 6u);
  const TensorInfo& w = file.tensors().at("w");
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.dtype, DType::kF32);
  EXPECT_EQ(w.shape, (Shape{2, 3}));
  EXPECT_EQ(w.data_begin, 0u);
  EXPECT_EQ(w.data_end, 24u);
  EXPECT_EQ(file.tensors().at("b").dtype, DType::kBF16);
  EXPECT_EQ(file.tensors().at("scalar").shape, Shape{});
  EXPECT_EQ(file.tensors().at("empty").shape, (Shape{0, 5}));
  float second;
  std::memcpy(&second, file.data(w) + 4, 4);
  EXPECT_EQ(second, 2.0f);
  EXPECT_EQ(std::to_integer<int>(file.data(file.tensors().at("packed"))[2]), 9);
}

TEST(SafetensorsFile, SkipsStringMetadataAndHeaderPadding) {
  std::string path = fresh_dir("st_meta") + "/a.safetensors";
  nlohmann::json header = test::safetensors_header({{"w", "F32", {1}, test::f32_bytes({1})}});
  header["__metadata__"] = {{"format", "pt"}};
  test::write_safetensors_raw(path, header.dump() + "    ", test::f32_bytes({1}));  // writers pad with spaces
  SafetensorsFile file(path);
  EXPECT_EQ(file.tensors().size(), 1u);
  EXPECT_EQ(file.tensors().count("__metadata__"), 0u);
}

// Builds a file from a raw header and returns the error opening it raises.
std::string open_error(const std::string& test, const std::string& header, const std::vector<uint8_t>& data,
                       std::string* path_out) {
  *path_out = fresh_dir(test) + "/bad.safetensors";
  test::write_safetensors_raw(*path_out, header, data);
  return error_of([&] { SafetensorsFile file(*path_out); });
}

TEST(SafetensorsFile, RejectsShortFiles) {
  std::string dir = fresh_dir("st_short");
  test::write_file(dir + "/empty.safetensors", {});
  std::string msg = error_of([&] { SafetensorsFile f(dir + "/empty.safetensors"); });
  EXPECT_CONTAINS(msg, "empty.safetensors");
  test::write_file(dir + "/trunc.safetensors", {10, 0, 0, 0, 0});
  msg = error_of([&] { SafetensorsFile f(dir + "/trunc.safetensors"); });
  EXPECT_CONTAINS(msg, "trunc.safetensors");
  EXPECT_CONTAINS(msg, "too short");
}

TEST(SafetensorsFile, RejectsMissingFileAndDirectory) {
  std::string dir = fresh_dir("st_missing");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(dir + "/nope.safetensors"); }), "nope.safetensors");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(dir); }), "not a regular file");
}

TEST(SafetensorsFile, RejectsHeaderLengthBeyondFile) {
  std::string path = fresh_dir("st_len") + "/len.safetensors";
  std::vector<uint8_t> bytes = {0xe8, 0x03, 0, 0, 0, 0, 0, 0};  // claims 1000 header bytes
  std::string header = "{}";
  bytes.insert(bytes.end(), header.begin(), header.end());
  test::write_file(path, bytes);
  std::string msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_CONTAINS(msg, "len.safetensors");
  EXPECT_CONTAINS(msg, "1000");
  // A length near 2^64 must not wrap around in the bounds check.
  std::fill(bytes.begin(), bytes.begin() + 8, 0xff);
  test::write_file(path, bytes);
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(path); }), "runs past the end");
}

TEST(SafetensorsFile, RejectsHugeHeader) {
  // A sparse 101 MB file whose header length claims all of it.
  std::string path = fresh_dir("st_huge") + "/huge.safetensors";
  uint64_t n = 101ull * 1000 * 1000;
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  test::write_file(path, bytes);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + n)), 0);
  std::string msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_CONTAINS(msg, "huge.safetensors");
  EXPECT_CONTAINS(msg, "limit");
}

TEST(SafetensorsFile, RejectsInvalidJson) {
  std::string path;
  std::string msg = open_error("st_json", "{\"w\": {\"dtype\": ", {}, &path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "invalid JSON");
  msg = open_error("st_json_array", "[1, 2]", {}, &path);
  EXPECT_CONTAINS(msg, "not a JSON object");
  msg = open_error("st_json_empty", "", {}, &path);
  EXPECT_CONTAINS(msg, "invalid JSON");
}

TEST(SafetensorsFile, RejectsBadMetadata) {
  std::string path;
  std::string msg = open_error("st_meta_bad", R"({"__metadata__": {"format": 3}})", {}, &path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "format");
}

TEST(SafetensorsFile, RejectsEntriesMissingFields) {
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    nlohmann::json header = test::safetensors_header({{"layer.w", "F32", {2}, test::f32_bytes({1, 2})}});
    header["layer.w"].erase(field);
    std::string path;
    std::string msg =
        open_error(std::string("st_missing_") + field, header.dump(), test::f32_bytes({1, 2}), &path);
    EXPECT_CONTAINS(msg, path);
    EXPECT_CONTAINS(msg, "layer.w");
    EXPECT_CONTAINS(msg, field);
  }
  std::string path;
  std::string msg = open_error("st_not_object", R"({"layer.w": [1, 2]})", {}, &path);
  EXPECT_CONTAINS(msg, "layer.w");
}

TEST(SafetensorsFile, RejectsMalformedFields) {
  struct Case {
    const char* entry;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"dtype": 7, "shape": [2], "data_offsets": [0, 8]})", "dtype"},
      {R"({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})", "shape"},
      {R"({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})", "non-negative"},
      {R"({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]})", "non-negative"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})", "data_offsets"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]})", "data_offsets"},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})", "overflows"},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]})", "overflows"},
  };
  for (const Case& c : cases) {
    std::string path;
    std::string msg =
        open_error("st_fields", std::string(R"({"t.w": )") + c.entry + "}", std::vector<uint8_t>(8), &path);
    EXPECT_CONTAINS(msg, path);
    EXPECT_CONTAINS(msg, "t.w");
    EXPECT_CONTAINS(msg, c.expect);
  }
}

TEST(SafetensorsFile, RejectsUnknownDtype) {
  for (const char* dtype : {"F64", "I8", "BOOL", "F8_E4M3", "bf16"}) {
    std::string path;
    std::string msg = open_error(
        "st_dtype", test::safetensors_header({{"x.w", dtype, {1}, std::vector<uint8_t>(8)}}).dump(),
        std::vector<uint8_t>(8), &path);
    EXPECT_CONTAINS(msg, path);
    EXPECT_CONTAINS(msg, "x.w");
    EXPECT_CONTAINS(msg, std::string("'") + dtype + "'");
  }
}

TEST(SafetensorsFile, RejectsOffsetsBeyondData) {
  std::string path;
  std::string msg =
      open_error("st_beyond", R"({"x.w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                 std::vector<uint8_t>(16), &path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "x.w");
  EXPECT_CONTAINS(msg, "outside the data section");
  msg = open_error("st_reversed", R"({"x.w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                   std::vector<uint8_t>(16), &path);
  EXPECT_CONTAINS(msg, "x.w");
}

TEST(SafetensorsFile, RejectsOverlappingTensors) {
  std::string path;
  std::string msg = open_error("st_overlap",
                               R"({"a.w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                   "z.w": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]},
                                   "b.w": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]}})",
                               std::vector<uint8_t>(32), &path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "overlap");
  EXPECT_CONTAINS(msg, "a.w");
  EXPECT_CONTAINS(msg, "b.w");
  // Empty tensors sharing an offset with a real one are not an overlap.
  path = fresh_dir("st_touching") + "/ok.safetensors";
  test::write_safetensors_raw(path,
                              R"({"a.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "e.w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                  "b.w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                              std::vector<uint8_t>(16));
  EXPECT_NO_THROW(SafetensorsFile file(path));
}

TEST(SafetensorsFile, RejectsByteLengthMismatch) {
  std::string path;
  std::string msg =
      open_error("st_length", R"({"m.w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 16]}})",
                 std::vector<uint8_t>(16), &path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "m.w");
  EXPECT_CONTAINS(msg, "needs 12");
}

// Regression (issue 12): a 98 MB header of nested brackets cost 3.6 GB before it was refused, and a key
// given twice was silently resolved to its last value.
TEST(SafetensorsFile, RefusesDeepNestingAndDuplicateKeysInTheHeader) {
  std::string path;
  std::string msg = open_error("st_deep", R"({"w": )" + std::string(20'000'000, '['), {}, &path);
  EXPECT_CONTAINS(msg, path + ": header: JSON nested more than 64 levels deep");
  const std::string entry = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  msg = open_error("st_dup", R"({"w": )" + entry + R"(, "w": )" + entry + "}", test::f32_bytes({1}), &path);
  EXPECT_CONTAINS(msg, path + ": header: key \"w\" appears twice in one JSON object");
  msg = open_error("st_dup_field",
                   R"({"w": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                   test::f32_bytes({1}), &path);
  EXPECT_CONTAINS(msg, "key \"dtype\" appears twice");
}

}  // namespace
}  // namespace hlm
