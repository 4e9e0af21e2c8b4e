// The weight products of exact mode (GGML_CPU_SGEMM_SINGLE_ROW=1, as Engine
// sets it; scripts/patches/ggml-sgemm-single-row.patch: llamafile's sgemm at
// every column count, and for Q4_K, Q5_K and Q6_K ggml's tiled kernels with
// their one-column kernel below 8 columns) through ggml alone (no model):
// an activation column
// (one token) gets the same bits whatever the other columns of its product
// (none, a few, more than a tile holds) and the thread count, for every
// weight type a model file commonly holds; and its result is within
// rounding of the product in double precision. The same for the weights
// exact mode lets into the CPU's extra buffer types (Q4_0 and IQ4_NL
// repacked for ggml's int8 gemm and gemv), and no other weight goes there
// under the switch.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gtest/gtest.h>

extern "C" __attribute__((weak)) int ggml_cpu_has_fa_batch_invariant(void);
extern "C" __attribute__((weak)) int ggml_cpu_has_tiled_batch_invariant(void);
extern "C" __attribute__((weak)) int ggml_cpu_has_repack_batch_invariant(void);

namespace {

// Columns of one product: out[column][row] as raw bits.
using Columns = std::vector<std::vector<uint32_t>>;

struct Weights {
  ggml_type type;
  int k;  // inner size (a multiple of 256: every K-quant block)
  int m;  // output rows
  std::vector<uint8_t> data;
  std::vector<float> decoded;  // what the rows decode to
};

Weights random_weights(ggml_type type, int k, int m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(k) * m);
  for (float& f : x) f = normal(rng);
  Weights w{type, k, m, std::vector<uint8_t>(ggml_row_size(type, k) * m), {}};
  if (type == GGML_TYPE_F32) {
    std::memcpy(w.data.data(), x.data(), w.data.size());
  } else if (type == GGML_TYPE_F16) {
    auto* h = reinterpret_cast<ggml_fp16_t*>(w.data.data());
    for (size_t i = 0; i < x.size(); ++i) h[i] = ggml_fp32_to_fp16(x[i]);
  } else if (type == GGML_TYPE_BF16) {
    auto* h = reinterpret_cast<ggml_bf16_t*>(w.data.data());
    for (size_t i = 0; i < x.size(); ++i) h[i] = ggml_fp32_to_bf16(x[i]);
  } else {
    ggml_quantize_chunk(type, x.data(), w.data.data(), 0, m, k, nullptr);
  }
  w.decoded.resize(x.size());
  const size_t row = ggml_row_size(type, k);
  for (int r = 0; r < m; ++r) {
    if (type == GGML_TYPE_F32) {
      std::memcpy(&w.decoded[static_cast<size_t>(r) * k], &w.data[r * row], row);
    } else {
      ggml_get_type_traits(type)->to_float(&w.data[r * row], &w.decoded[static_cast<size_t>(r) * k],
                                           k);
    }
  }
  return w;
}

// The CPU's extra buffer types (repacked weights, AMX where built), by name.
std::vector<ggml_backend_buffer_type_t> extra_buffer_types() {
  ggml_backend_reg_t reg = ggml_backend_cpu_reg();
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  std::vector<ggml_backend_buffer_type_t> out;
  if (get == nullptr) return out;
  for (ggml_backend_buffer_type_t* b = get(ggml_backend_reg_dev_get(reg, 0)); *b != nullptr; ++b) {
    out.push_back(*b);
  }
  return out;
}

ggml_backend_buffer_type_t repack_buffer_type() {
  for (ggml_backend_buffer_type_t b : extra_buffer_types()) {
    if (std::strcmp(ggml_backend_buft_name(b), "CPU_REPACK") == 0) return b;
  }
  return nullptr;
}

// Whether the CPU device runs the product of weight `a` (llama.cpp's question before it places a
// weight in a buffer, and before it schedules the product on the CPU).
bool cpu_runs_product_of(ggml_tensor* a) {
  ggml_init_params params{};
  params.mem_size = 4 * ggml_tensor_overhead();
  params.no_alloc = true;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* op = ggml_mul_mat(ctx, a, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a->ne[0], 2));
  const bool supported =
      ggml_backend_dev_supports_op(ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0), op);
  ggml_free(ctx);
  return supported;
}

// Whether llama.cpp would place a weight of this type and shape in `buft`: the CPU device is asked
// about the weight's product with the weight in a dummy buffer of that type.
bool placed_in(ggml_backend_buffer_type_t buft, ggml_type type, int k, int m) {
  ggml_init_params params{};
  params.mem_size = 2 * ggml_tensor_overhead();
  params.no_alloc = true;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* w = ggml_new_tensor_2d(ctx, type, k, m);
  w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
  const bool supported = cpu_runs_product_of(w);
  ggml_backend_buffer_free(w->buffer);
  ggml_free(ctx);
  return supported;
}

// A weight tensor holding `w`: in `buft` (repacked there) when given, else in plain memory.
class PlacedWeight {
 public:
  PlacedWeight(const Weights& w, ggml_backend_buffer_type_t buft) {
    ggml_init_params params{};
    params.mem_size = 2 * ggml_tensor_overhead() + (buft == nullptr ? w.data.size() + 64 : 0);
    params.no_alloc = buft != nullptr;
    ctx_ = ggml_init(params);
    tensor_ = ggml_new_tensor_2d(ctx_, w.type, w.k, w.m);
    if (buft != nullptr) {
      buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, buft);
      EXPECT_NE(tensor_->extra, nullptr) << "the weights were not repacked";
      ggml_backend_tensor_set(tensor_, w.data.data(), 0, w.data.size());
    } else {
      std::memcpy(tensor_->data, w.data.data(), w.data.size());
    }
  }
  ~PlacedWeight() {
    if (buffer_ != nullptr) ggml_backend_buffer_free(buffer_);
    ggml_free(ctx_);
  }
  PlacedWeight(const PlacedWeight&) = delete;
  PlacedWeight& operator=(const PlacedWeight&) = delete;
  ggml_tensor* tensor() const { return tensor_; }

 private:
  ggml_context* ctx_ = nullptr;
  ggml_backend_buffer_t buffer_ = nullptr;
  ggml_tensor* tensor_ = nullptr;
};

// Columns `cols` of `x` (k floats each) times the weight `a`, in one product on `threads` threads.
Columns product(ggml_tensor* a, const std::vector<std::vector<float>>& x,
                const std::vector<int>& cols, int threads) {
  const int n = static_cast<int>(cols.size());
  const int64_t k = a->ne[0];
  const int64_t m = a->ne[1];
  ggml_init_params params{};
  params.mem_size = 64u << 20;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
  for (int j = 0; j < n; ++j) {
    std::memcpy(static_cast<float*>(b->data) + static_cast<size_t>(j) * k, x[cols[j]].data(),
                sizeof(float) * k);
  }
  ggml_tensor* out = ggml_mul_mat(ctx, a, b);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, graph, threads), GGML_STATUS_SUCCESS);
  Columns result(n, std::vector<uint32_t>(static_cast<size_t>(m)));
  for (int j = 0; j < n; ++j) {
    std::memcpy(result[j].data(), static_cast<const float*>(out->data) + static_cast<size_t>(j) * m,
                sizeof(float) * m);
  }
  ggml_free(ctx);
  return result;
}

// The same with the weights `w` placed in `buft` (repacked there) when given, else in plain memory.
Columns product(const Weights& w, const std::vector<std::vector<float>>& x,
                const std::vector<int>& cols, int threads,
                ggml_backend_buffer_type_t buft = nullptr) {
  const PlacedWeight a(w, buft);
  return product(a.tensor(), x, cols, threads);
}

bool patched() {
  return ggml_cpu_has_fa_batch_invariant != nullptr && ggml_cpu_has_fa_batch_invariant() == 1;
}

// The weight types of the models people download (F16, BF16, F32 tensors,
// the legacy and K-quants), rows in fours (llamafile's sgemm) and not
// (ggml's own dot products; for K-quants, eights and not: the one-column
// kernel's lanes), inner sizes of 768 and 2,048.
struct Shape {
  ggml_type type;
  int k;
  int m;
};
const std::vector<Shape> kShapes = {
    {GGML_TYPE_F16, 768, 96},   {GGML_TYPE_F16, 2048, 100},  {GGML_TYPE_F16, 768, 98},
    {GGML_TYPE_BF16, 768, 96},  {GGML_TYPE_F32, 768, 96},    {GGML_TYPE_Q8_0, 768, 96},
    {GGML_TYPE_Q8_0, 2048, 98}, {GGML_TYPE_Q4_0, 768, 96},   {GGML_TYPE_Q5_0, 768, 96},
    {GGML_TYPE_Q4_1, 768, 96},  {GGML_TYPE_IQ4_NL, 768, 96}, {GGML_TYPE_Q4_K, 768, 96},
    {GGML_TYPE_Q5_K, 768, 96},  {GGML_TYPE_Q6_K, 2048, 100}, {GGML_TYPE_Q4_K, 2048, 100},
    {GGML_TYPE_Q5_K, 2048, 98}, {GGML_TYPE_Q6_K, 768, 96},
};

std::string describe(const Shape& s) {
  return std::string(ggml_type_name(s.type)) + " " + std::to_string(s.k) + " x " +
         std::to_string(s.m);
}

std::vector<std::vector<float>> random_columns(int k, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(k));
  for (auto& c : x) {
    for (float& f : c) f = normal(rng);
  }
  return x;
}

// Each column alone on one thread, then among 2 to 70 columns on 1 to 3 threads: the same bits.
// (Repacked weights: gemm takes the columns in fours, gemv the rest.)
void expect_column_invariance(const Shape& s, ggml_backend_buffer_type_t buft) {
  constexpr int kColumns = 70;  // more than a 64-row tile
  const Weights w = random_weights(s.type, s.k, s.m, 11 + static_cast<uint32_t>(s.type));
  const auto x = random_columns(s.k, kColumns, 5);
  Columns alone;
  for (int j = 0; j < kColumns; ++j) alone.push_back(product(w, x, {j}, 1, buft)[0]);
  for (int n : {2, 3, 4, 5, 6, 7, 8, 9, 16, 33, kColumns}) {
    for (int threads : {1, 2, 3}) {
      std::vector<int> cols;
      for (int j = 0; j < n; ++j) cols.push_back((j * 7 + n) % kColumns);
      const Columns got = product(w, x, cols, threads, buft);
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(got[j], alone[cols[j]])
            << "column " << cols[j] << " among " << n << " on " << threads << " threads";
      }
    }
  }
}

// The weight types exact mode lets into the repack buffer, and shapes it repacks (rows in
// eights on x86, fours on ARM).
const std::vector<Shape> kRepackedShapes = {
    {GGML_TYPE_Q4_0, 768, 96}, {GGML_TYPE_Q4_0, 2048, 104}, {GGML_TYPE_IQ4_NL, 768, 96}};

TEST(MatmulKernelTest, AColumnGetsTheSameBitsInAnyProductOnAnyThreads) {
  if (!patched()) GTEST_SKIP() << "the linked ggml lacks our patches";
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    expect_column_invariance(s, nullptr);
  }
}

TEST(MatmulKernelTest, ExactModeLetsNoOtherWeightIntoTheExtraBuffers) {
  if (ggml_cpu_has_repack_batch_invariant == nullptr)
    GTEST_SKIP()
        << "the linked ggml lacks our repack patch (exact mode loads without extra buffers)";
  for (ggml_backend_buffer_type_t buft : extra_buffer_types()) {
    const bool repack = std::strcmp(ggml_backend_buft_name(buft), "CPU_REPACK") == 0;
    for (const Shape& s : kShapes) {
      if (repack && (s.type == GGML_TYPE_Q4_0 || s.type == GGML_TYPE_IQ4_NL)) continue;
      EXPECT_FALSE(placed_in(buft, s.type, s.k, s.m))
          << describe(s) << " would be placed in " << ggml_backend_buft_name(buft);
    }
  }
}

TEST(MatmulKernelTest, RepackedWeightsGiveAColumnTheSameBitsInAnyProductOnAnyThreads) {
  if (ggml_cpu_has_repack_batch_invariant == nullptr)
    GTEST_SKIP() << "the linked ggml lacks our repack patch";
  ggml_backend_buffer_type_t buft = repack_buffer_type();
  int tested = 0;
  for (const Shape& s : kRepackedShapes) {
    if (buft == nullptr || !placed_in(buft, s.type, s.k, s.m)) continue;
    SCOPED_TRACE(describe(s) + " repacked");
    expect_column_invariance(s, buft);
    ++tested;
  }
  if (tested == 0)
    GTEST_SKIP() << "this CPU repacks none of these weights (no AVX2, no dot products)";
}

// A model loaded before exact mode's switch was set (another model of the process, say) keeps the
// layout its weights were given: the CPU still runs its products, only new weights are refused.
TEST(MatmulKernelTest, AWeightRepackedBeforeTheSwitchKeepsItsKernel) {
  if (ggml_cpu_has_repack_batch_invariant == nullptr)
    GTEST_SKIP() << "the linked ggml lacks our repack patch";
  ggml_backend_buffer_type_t buft = repack_buffer_type();
  const Shape s{GGML_TYPE_Q4_K, 768, 96};
  unsetenv("GGML_CPU_SGEMM_SINGLE_ROW");
  if (buft == nullptr || !placed_in(buft, s.type, s.k, s.m)) {
    setenv("GGML_CPU_SGEMM_SINGLE_ROW", "1", /*overwrite=*/1);
    GTEST_SKIP() << "this CPU does not repack " << describe(s);
  }
  const Weights w = random_weights(s.type, s.k, s.m, 7);
  const PlacedWeight a(w, buft);
  setenv("GGML_CPU_SGEMM_SINGLE_ROW", "1", /*overwrite=*/1);

  EXPECT_FALSE(placed_in(buft, s.type, s.k, s.m)) << "a new weight is still taken";
  EXPECT_TRUE(cpu_runs_product_of(a.tensor()))
      << "the CPU refuses the product of a weight it repacked before the switch";
  const auto x = random_columns(s.k, 4, 5);
  const float got = std::bit_cast<float>(product(a.tensor(), x, {0, 1, 2, 3}, 2)[0][0]);
  double want = 0.0;
  for (int i = 0; i < s.k; ++i) want += static_cast<double>(w.decoded[i]) * x[0][i];
  EXPECT_LT(std::abs(got - want) / std::sqrt(static_cast<double>(s.k)), 5e-2)
      << "the repacked product is not the weights' (row 0, column 0)";
}

// Five columns on two threads against the product in double precision.
void expect_within_rounding(const Shape& s, ggml_backend_buffer_type_t buft) {
  const Weights w = random_weights(s.type, s.k, s.m, 11 + static_cast<uint32_t>(s.type));
  const auto x = random_columns(s.k, 5, 5);
  const Columns got = product(w, x, {0, 1, 2, 3, 4}, 2, buft);
  // The activations are rounded to the weights' vec_dot type first: F32
  // not at all, F16 (11 bits), BF16 (8 bits), else q8_0 or q8_K blocks
  // (a step of max|x| / 127). Relative to the dot product's scale,
  // sqrt(k) for N(0, 1) inputs, the worst of 500 outputs measured: < 1e-6,
  // 8e-4, 6e-3, 2.5e-2; F16 rows not in fours on ARM with fp16 arithmetic
  // (ggml's own dot product, which sums in fp16 there) 3.1e-3.
  const double bound = s.type == GGML_TYPE_F32    ? 1e-5
                       : s.type == GGML_TYPE_F16  ? 5e-3
                       : s.type == GGML_TYPE_BF16 ? 2e-2
                                                  : 5e-2;
  double worst = 0.0;
  for (int j = 0; j < 5; ++j) {
    for (int r = 0; r < s.m; ++r) {
      double want = 0.0;
      for (int i = 0; i < s.k; ++i) {
        want += static_cast<double>(w.decoded[static_cast<size_t>(r) * s.k + i]) * x[j][i];
      }
      float f;
      std::memcpy(&f, &got[j][r], sizeof f);
      worst = std::max(worst, std::abs(f - want) / std::sqrt(static_cast<double>(s.k)));
    }
  }
  EXPECT_LT(worst, bound);
  testing::Test::RecordProperty(describe(s) + (buft != nullptr ? " repacked" : ""),
                                std::to_string(worst));
}

TEST(MatmulKernelTest, EveryColumnIsWithinRoundingOfDoublePrecision) {
  if (!patched()) GTEST_SKIP() << "the linked ggml lacks our patches";
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    expect_within_rounding(s, nullptr);
  }
  ggml_backend_buffer_type_t buft = repack_buffer_type();
  if (ggml_cpu_has_repack_batch_invariant == nullptr || buft == nullptr) return;
  for (const Shape& s : kRepackedShapes) {
    if (!placed_in(buft, s.type, s.k, s.m)) continue;
    SCOPED_TRACE(describe(s) + " repacked");
    expect_within_rounding(s, buft);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // ggml logs each repacked tensor; keep warnings and errors only.
  ggml_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  setenv("GGML_CPU_SGEMM_SINGLE_ROW", "1", /*overwrite=*/1);
  // As Engine does: a ggml whose tiles are not batch-invariant keeps them off.
  if (ggml_cpu_has_tiled_batch_invariant == nullptr) setenv("GGML_CPU_TILED_MM", "0", 1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
