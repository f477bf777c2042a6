// Checkpoint: reads (whole tensors and boxes of reshaped views) agree with naive indexing in every stored
// float type, bytes_read counts exactly the box, sharded directories resolve through the index, and
// every inconsistency is an hlm::Error naming the file and tensor.
#include <gtest/gtest.h>

#include <cmath>

#include <cstring>
#include <filesystem>
#include <random>

#include "base/half.h"
#include "safetensors_writer.h"
#include "weights/safetensors.h"
#include "weights_test_util.h"

namespace hlm {
namespace {

using test::error_of;
using test::fresh_dir;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

std::vector<float> iota_values(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// The box of `src` (row-major with shape `view`) by direct multi-index arithmetic.
std::vector<float> naive_box(const std::vector<float>& src, const Shape& view, const Ranges& ranges) {
  Shape ext(view.size());
  for (size_t d = 0; d < view.size(); ++d) ext[d] = ranges[d].second - ranges[d].first;
  std::vector<float> out;
  for (int64_t i = 0; i < shape_numel(ext); ++i) {
    int64_t rest = i;
    int64_t offset = 0;
    int64_t stride = 1;
    for (size_t d = view.size(); d-- > 0;) {
      offset += (ranges[d].first + rest % ext[d]) * stride;
      rest /= ext[d];
      stride *= view[d];
    }
    out.push_back(src[offset]);
  }
  return out;
}

std::vector<float> values_of(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

Shape extents_of(const Ranges& ranges) {
  Shape s;
  for (auto [b, e] : ranges) s.push_back(e - b);
  return s;
}

TEST(Checkpoint, RoundTripsFloatTypes) {
  std::string dir = fresh_dir("ck_roundtrip");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> f32(6), bf16(8);
  for (float& v : f32) v = normal(rng);
  for (float& v : bf16) v = normal(rng);
  // Every finite kind of f16 (non-finite weights are refused, see RefusesNonFiniteWeights).
  const std::vector<uint16_t> f16_bits = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff, 0x8000, 0x0400, 0x03ff};
  const std::vector<float> f16_values = {1.0f, -2.0f, 0.5f, 0x1p-24f, 65504.0f, -0.0f, 0x1p-14f, 0x3ffp-24f};
  test::write_safetensors(dir + "/model.safetensors", {{"a.f32", "F32", {2, 3}, test::f32_bytes(f32)},
                                                       {"a.bf16", "BF16", {2, 4}, test::bf16_bytes(bf16)},
                                                       {"a.f16", "F16", {8}, test::u16_bytes(f16_bits)},
                                                       {"a.i32", "I32", {3}, test::i32_bytes({-1, 0, 7})}});
  Checkpoint ck(dir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a.bf16", "a.f16", "a.f32", "a.i32"}));
  EXPECT_TRUE(ck.has("a.f32"));
  EXPECT_FALSE(ck.has("a.f64"));
  EXPECT_EQ(ck.file_of("a.f32"), dir + "/model.safetensors");
  EXPECT_EQ(ck.info("a.bf16").dtype, DType::kBF16);

  Tensor t = ck.read_f32("a.f32", {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of(t), f32);

  t = ck.read_f32("a.bf16", {2, 4});
  for (size_t i = 0; i < bf16.size(); ++i)
    EXPECT_EQ(t.data<float>()[i], bf16_to_f32(f32_to_bf16(bf16[i]))) << i;
  Tensor raw = ck.read_raw("a.bf16", {2, 4});
  EXPECT_EQ(raw.dtype(), DType::kBF16);
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(raw.data<uint16_t>()[i], f32_to_bf16(bf16[i])) << i;

  t = ck.read_f32("a.f16", {8});
  for (size_t i = 0; i < f16_values.size(); ++i) {
    EXPECT_EQ(t.data<float>()[i], f16_values[i]) << i;
    EXPECT_EQ(std::signbit(t.data<float>()[i]), std::signbit(f16_values[i])) << i;
  }

  raw = ck.read_raw("a.i32", {3});
  EXPECT_EQ(raw.dtype(), DType::kI32);
  EXPECT_EQ(raw.data<int32_t>()[0], -1);
  EXPECT_EQ(raw.data<int32_t>()[2], 7);
  EXPECT_EQ(ck.bytes_read(), 24u + 16u + 16u + 16u + 12u);
}

TEST(Checkpoint, BoxesMatchNaiveIndexing) {
  // A [H * 2d, L] weight with H = 3, d = 2, L = 4, stored in F32 and BF16 (small integers are exact).
  std::string dir = fresh_dir("ck_boxes");
  const std::vector<float> values = iota_values(48);
  test::write_safetensors(dir + "/model.safetensors",
                          {{"w.f32", "F32", {12, 4}, test::f32_bytes(values)},
                           {"w.bf16", "BF16", {12, 4}, test::bf16_bytes(values)}});
  Checkpoint ck(dir);
  struct Case {
    Shape view;
    Ranges ranges;
  };
  std::vector<Case> cases = {
      {{12, 4}, {{2, 5}, {0, 4}}},            // row slice
      {{12, 4}, {{0, 12}, {1, 3}}},           // column slice
      {{3, 4, 4}, {{0, 3}, {2, 4}, {0, 4}}},  // second half of the middle dim of [H, 2d, L]
      {{3, 4, 4}, {{1, 3}, {0, 2}, {1, 4}}},  // partial in every dim
      {{48}, {{5, 41}}},                      // flat range
      {{3, 2, 2, 4}, {{0, 3}, {1, 2}, {0, 2}, {0, 4}}},
      {{12, 4}, {{3, 3}, {0, 4}}},  // empty box
  };
  // Random boxes over a few views.
  std::mt19937 rng(11);
  for (const Shape& view : {Shape{12, 4}, Shape{3, 4, 4}, Shape{2, 6, 4}, Shape{3, 2, 2, 4}}) {
    for (int k = 0; k < 25; ++k) {
      Ranges ranges;
      for (int64_t n : view) {
        int64_t a = std::uniform_int_distribution<int64_t>(0, n)(rng);
        int64_t b = std::uniform_int_distribution<int64_t>(0, n)(rng);
        ranges.emplace_back(std::min(a, b), std::max(a, b));
      }
      cases.push_back({view, ranges});
    }
  }
  for (const Case& c : cases) {
    const std::vector<float> expected = naive_box(values, c.view, c.ranges);
    const TensorBox box{c.view, c.ranges};
    for (const char* name : {"w.f32", "w.bf16"}) {
      size_t before = ck.bytes_read();
      Tensor t = ck.read_f32(name, {12, 4}, box);
      EXPECT_EQ(t.shape(), extents_of(c.ranges));
      EXPECT_EQ(values_of(t), expected) << name << " view " << shape_str(c.view);
      EXPECT_EQ(ck.bytes_read() - before, expected.size() * dtype_size(ck.info(name).dtype));
    }
    Tensor raw = ck.read_raw("w.bf16", {12, 4}, box);
    ASSERT_EQ(raw.numel(), static_cast<int64_t>(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(bf16_to_f32(raw.data<uint16_t>()[i]), expected[i]);
  }
  // A view without ranges reads everything in the view's shape.
  Tensor t = ck.read_f32("w.f32", {12, 4}, {{3, 4, 4}, {}});
  EXPECT_EQ(t.shape(), (Shape{3, 4, 4}));
  EXPECT_EQ(values_of(t), values);
}

TEST(Checkpoint, LargeReadsMatchNaiveIndexing) {
  // Large enough that reads go parallel and single runs are split into pieces.
  std::string dir = fresh_dir("ck_large");
  const int64_t rows = 3, cols = 200000;
  std::vector<float> values(rows * cols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(static_cast<int>(i % 251) - 125);
  test::write_safetensors(dir + "/model.safetensors",
                          {{"big", "BF16", {rows, cols}, test::bf16_bytes(values)}});
  Checkpoint ck(dir);
  EXPECT_EQ(values_of(ck.read_f32("big", {rows, cols})), values);
  const std::vector<std::pair<Shape, Ranges>> boxes = {
      {{rows, cols}, {{1, 3}, {5, 180000}}},
      {{rows * cols}, {{100, 500000}}},
      {{rows, 2, cols / 2}, {{0, 3}, {1, 2}, {0, cols / 2}}}};
  for (const auto& [view, ranges] : boxes) {
    size_t before = ck.bytes_read();
    Tensor t = ck.read_f32("big", {rows, cols}, {view, ranges});
    EXPECT_EQ(values_of(t), naive_box(values, view, ranges)) << shape_str(view);
    EXPECT_EQ(ck.bytes_read() - before, static_cast<size_t>(t.numel()) * 2);
  }
}

TEST(Checkpoint, ReadsScalarAndEmptyTensors) {
  std::string dir = fresh_dir("ck_scalar");
  test::write_safetensors(dir + "/model.safetensors",
                          {{"s", "F32", {}, test::f32_bytes({2.5f})}, {"e", "F16", {0, 5}, {}}});
  Checkpoint ck(dir);
  Tensor s = ck.read_f32("s", {});
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.data<float>()[0], 2.5f);
  Tensor e = ck.read_f32("e", {0, 5}, {{}, {{0, 0}, {1, 3}}});
  EXPECT_EQ(e.shape(), (Shape{0, 2}));
  EXPECT_EQ(ck.bytes_read(), 4u);
}

TEST(Checkpoint, RejectsBadBoxes) {
  std::string dir = fresh_dir("ck_bad_box");
  test::write_safetensors(dir + "/model.safetensors",
                          {{"w", "F32", {4, 6}, test::f32_bytes(iota_values(24))}});
  Checkpoint ck(dir);
  const std::vector<std::pair<TensorBox, const char*>> cases = {
      {{{5, 5}, {}}, "25 elements"},        {{{4, 6}, {{0, 4}}}, "1 ranges"},
      {{{}, {{0, 4}, {2, 7}}}, "[2, 7)"},   {{{}, {{3, 2}, {0, 6}}}, "[3, 2)"},
      {{{}, {{-1, 2}, {0, 6}}}, "[-1, 2)"}, {{{24, -1}, {}}, "negative"},
  };
  for (const auto& [box, expect] : cases) {
    std::string msg = error_of([&] { ck.read_f32("w", {4, 6}, box); });
    EXPECT_CONTAINS(msg, "'w'");
    EXPECT_CONTAINS(msg, "model.safetensors");
    EXPECT_CONTAINS(msg, expect);
  }
  EXPECT_EQ(ck.bytes_read(), 0u);
}

TEST(Checkpoint, RejectsWrongShapeAndType) {
  std::string dir = fresh_dir("ck_shape");
  test::write_safetensors(dir + "/model.safetensors", {{"w", "F32", {2, 3}, test::f32_bytes(iota_values(6))},
                                                       {"ids", "I32", {2}, test::i32_bytes({1, 2})},
                                                       {"packed", "U8", {2}, {1, 2}}});
  Checkpoint ck(dir);
  std::string msg = error_of([&] { ck.read_f32("w", {3, 2}); });
  EXPECT_CONTAINS(msg, "tensor 'w' in " + dir + "/model.safetensors: expected shape [3, 2], found [2, 3]");
  EXPECT_CONTAINS(error_of([&] { ck.read_raw("w", {6}); }), "expected shape [6], found [2, 3]");
  for (const char* name : {"ids", "packed"}) {
    msg = error_of([&] { ck.read_f32(name, {2}); });
    EXPECT_CONTAINS(msg, std::string("'") + name + "'");
    EXPECT_CONTAINS(msg, "model.safetensors");
    EXPECT_CONTAINS(msg, name == std::string("ids") ? "I32" : "U8");
  }
  EXPECT_EQ(ck.read_raw("packed", {2}).data<uint8_t>()[1], 2);
}

TEST(Checkpoint, ReportsMissingTensorWithSimilarNames) {
  std::string dir = fresh_dir("ck_missing");
  test::write_safetensors(
      dir + "/model.safetensors",
      {{"language_model.model.layers.0.mlp.up_proj.weight", "F32", {1}, test::f32_bytes({1})},
       {"language_model.model.norm.weight", "F32", {1}, test::f32_bytes({1})}});
  Checkpoint ck(dir);
  std::string msg = error_of([&] { ck.info("model.layers.0.mlp.up_proj.weight"); });
  EXPECT_CONTAINS(msg, "'model.layers.0.mlp.up_proj.weight'");
  EXPECT_CONTAINS(msg, dir);
  EXPECT_CONTAINS(msg, "similar: language_model.model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(msg.find("norm"), std::string::npos);
  msg = error_of([&] { ck.read_f32("lm_head.weight", {1}); });
  EXPECT_CONTAINS(msg, "'lm_head.weight'");
  EXPECT_EQ(msg.find("similar"), std::string::npos);
  EXPECT_CONTAINS(error_of([&] { ck.file_of("x"); }), "'x'");
}

TEST(Checkpoint, RejectsDirectoryWithoutModel) {
  std::string dir = fresh_dir("ck_empty_dir");
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }),
                  "no model.safetensors or model.safetensors.index.json in " + dir);
}

void write_index(const std::string& dir, const nlohmann::json& weight_map) {
  std::string text = nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  test::write_file(dir + "/model.safetensors.index.json", std::vector<uint8_t>(text.begin(), text.end()));
}

TEST(Checkpoint, ReadsShardedCheckpoint) {
  std::string dir = fresh_dir("ck_sharded");
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  test::write_safetensors(dir + "/" + shard1, {{"a", "F32", {2}, test::f32_bytes({1, 2})},
                                               {"b", "BF16", {2}, test::bf16_bytes({3, 4})}});
  test::write_safetensors(dir + "/" + shard2, {{"c", "F32", {1, 2}, test::f32_bytes({5, 6})}});
  write_index(dir, {{"a", shard1}, {"b", shard1}, {"c", shard2}});
  // A stray single-file model is ignored in favour of the index.
  test::write_safetensors(dir + "/model.safetensors", {{"stray", "F32", {1}, test::f32_bytes({0})}});
  Checkpoint ck(dir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.file_of("a"), dir + "/" + shard1);
  EXPECT_EQ(ck.file_of("c"), dir + "/" + shard2);
  EXPECT_EQ(values_of(ck.read_f32("b", {2})), (std::vector<float>{3, 4}));
  EXPECT_EQ(values_of(ck.read_f32("c", {1, 2}, {{}, {{0, 1}, {1, 2}}})), std::vector<float>{6});
  EXPECT_EQ(ck.bytes_read(), 4u + 4u);
}

TEST(Checkpoint, RejectsInconsistentShards) {
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  {  // index names a shard that is not there
    std::string dir = fresh_dir("ck_no_shard");
    test::write_safetensors(dir + "/" + shard1, {{"a", "F32", {1}, test::f32_bytes({1})}});
    write_index(dir, {{"a", shard1}, {"layers.1.w", shard2}});
    std::string msg = error_of([&] { Checkpoint ck(dir); });
    EXPECT_CONTAINS(msg, "model.safetensors.index.json");
    EXPECT_CONTAINS(msg, shard2);
    EXPECT_CONTAINS(msg, "layers.1.w");
  }
  {  // index maps a tensor to a shard that does not hold it
    std::string dir = fresh_dir("ck_not_in_shard");
    test::write_safetensors(dir + "/" + shard1, {{"a", "F32", {1}, test::f32_bytes({1})}});
    write_index(dir, {{"a", shard1}, {"layers.1.w", shard1}});
    std::string msg = error_of([&] { Checkpoint ck(dir); });
    EXPECT_CONTAINS(msg, "'layers.1.w'");
    EXPECT_CONTAINS(msg, shard1);
  }
  {  // a tensor stored in two shards
    std::string dir = fresh_dir("ck_twice");
    test::write_safetensors(dir + "/" + shard1, {{"a", "F32", {1}, test::f32_bytes({1})}});
    test::write_safetensors(dir + "/" + shard2, {{"a", "F32", {1}, test::f32_bytes({1})},
                                                 {"b", "F32", {1}, test::f32_bytes({1})}});
    write_index(dir, {{"a", shard1}, {"b", shard2}});
    std::string msg = error_of([&] { Checkpoint ck(dir); });
    EXPECT_CONTAINS(msg, "'a'");
    EXPECT_CONTAINS(msg, shard1);
    EXPECT_CONTAINS(msg, shard2);
  }
  {  // a malformed shard is reported by its own name
    std::string dir = fresh_dir("ck_bad_shard");
    test::write_file(dir + "/" + shard1, {1, 2, 3});
    write_index(dir, {{"a", shard1}});
    EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), shard1);
  }
  {  // the index itself is malformed
    std::string dir = fresh_dir("ck_bad_index");
    test::write_file(dir + "/model.safetensors.index.json", {'{', 'x'});
    EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), "model.safetensors.index.json");
    write_index(dir, nlohmann::json::array());
    EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), "weight_map");
    write_index(dir, {{"a", 3}});
    EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), "'a'");
  }
}

// Regression (issue 12): an lm_head of NaNs loaded silently and generate printed 0,0,0,... Non-finite
// weights are refused as they are copied, naming the tensor, the file and the first bad element as stored.
TEST(Checkpoint, RefusesNonFiniteWeights) {
  const std::string dir = fresh_dir("ck_non_finite");
  std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
  f32[4] = NAN;
  std::vector<uint16_t> bf16(8, 0x3f80);  // 1.0
  bf16[6] = 0xff80;                       // -Inf
  std::vector<uint16_t> f16(4, 0x3c00);
  f16[1] = 0x7e00;  // NaN
  test::write_safetensors(dir + "/model.safetensors", {{"w.f32", "F32", {2, 3}, test::f32_bytes(f32)},
                                                       {"w.bf16", "BF16", {2, 4}, test::u16_bytes(bf16)},
                                                       {"w.f16", "F16", {4}, test::u16_bytes(f16)},
                                                       {"ok", "F32", {2}, test::f32_bytes({1, 2})}});
  const Checkpoint ck(dir);
  const std::string file = dir + "/model.safetensors";
  EXPECT_EQ(
      error_of([&] {
        ck.read_f32("w.f32", {2, 3});
      }),
      "tensor 'w.f32' in " + file + " holds a non-finite value (NaN at [1, 1]): the checkpoint is corrupt");
  EXPECT_CONTAINS(error_of([&] { ck.read_f32("w.bf16", {2, 4}); }), "'w.bf16' in " + file);
  EXPECT_CONTAINS(error_of([&] { ck.read_f32("w.bf16", {2, 4}); }), "(Inf at [1, 2])");
  EXPECT_CONTAINS(error_of([&] { ck.read_raw("w.f16", {4}); }), "'w.f16' in " + file);
  EXPECT_CONTAINS(error_of([&] { ck.read_raw("w.f16", {4}); }), "(NaN at [1])");
  // A box holding the bad value names it by its stored index; a box without it reads fine.
  TensorBox second_row{{}, {{1, 2}, {0, 4}}};
  EXPECT_CONTAINS(error_of([&] { ck.read_raw("w.bf16", {2, 4}, second_row); }), "(Inf at [1, 2])");
  TensorBox first_row{{}, {{0, 1}, {0, 4}}};
  EXPECT_EQ(ck.read_f32("w.bf16", {2, 4}, first_row).data<float>()[3], 1.0f);
  EXPECT_EQ(ck.read_f32("ok", {2}).data<float>()[1], 2.0f);
}

// The index of a sharded checkpoint is outside JSON too: bounded nesting, no duplicate keys.
TEST(Checkpoint, IndexJsonIsParsedWithBounds) {
  const std::string dir = fresh_dir("ck_index_bounds");
  test::write_safetensors(dir + "/s1.safetensors", {{"a", "F32", {1}, test::f32_bytes({1})}});
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string deep = R"({"weight_map": )" + std::string(100000, '[');
  test::write_file(index, std::vector<uint8_t>(deep.begin(), deep.end()));
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), index + ": JSON nested more than 64 levels deep");
  const std::string twice = R"({"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}})";
  test::write_file(index, std::vector<uint8_t>(twice.begin(), twice.end()));
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir); }), index + ": key \"a\" appears twice");
}

TEST(Checkpoint, OpensTinyFixture) {
  const std::string dir = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not generated yet";
  Checkpoint ck(dir);
  EXPECT_EQ(ck.info("model.embed_tokens.weight").shape, (Shape{512, 64}));
  EXPECT_EQ(ck.info("model.norm.weight").shape, Shape{64});
  Tensor embed = ck.read_f32("model.embed_tokens.weight", {512, 64}, {{}, {{10, 12}, {0, 64}}});
  EXPECT_EQ(embed.shape(), (Shape{2, 64}));
  for (const std::string& name : ck.names()) {
    const TensorInfo& info = ck.info(name);
    if (info.dtype == DType::kF32 || info.dtype == DType::kBF16 || info.dtype == DType::kF16) {
      EXPECT_EQ(ck.read_f32(name, info.shape).shape(), info.shape) << name;
    }
  }
}

}  // namespace
}  // namespace hlm
