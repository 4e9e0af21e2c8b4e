// The flash-attention row kernel of scripts/patches/ggml-fa-batch-invariant.patch
// on random inputs, through ggml alone (no model): a query row gets the same
// bits whatever the other rows of its call, the thread count and the
// positions of its cells, and the same bits as the unpatched one-row kernel.
// The switch is read once per process, so the unpatched kernel runs in a
// child process (this binary with --dump and GGML_CPU_FA_BATCH_INVARIANT=0).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <ggml-cpu.h>
#include <ggml.h>
#include <gtest/gtest.h>

extern "C" __attribute__((weak)) int ggml_cpu_has_fa_batch_invariant(void);

namespace {

// One attention problem: n_q query rows of n_head heads over n_kv cells of
// n_head_kv heads, each row seeing its own cells (mask 0) and not the others
// (-INF), as an agent sees the document and its own cells only.
struct Problem {
  int d = 64;
  int n_head = 6;
  int n_head_kv = 2;
  int n_kv = 0;
  int n_q = 0;
  float scale = 0.125f;
  float softcap = 0.0f;
  std::vector<float> q;           // [n_head][n_q][d]
  std::vector<ggml_fp16_t> k, v;  // [n_head_kv][n_kv][d]
  std::vector<ggml_fp16_t> mask;  // [n_q][n_kv]
};

// Rows: each row's output, n_head x d floats as raw bits.
using Rows = std::vector<std::vector<uint32_t>>;

Problem random_problem(uint32_t seed, int d, int n_kv, int n_q, float softcap) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::bernoulli_distribution sees(0.7);
  Problem p;
  p.d = d;
  p.n_kv = n_kv;
  p.n_q = n_q;
  p.softcap = softcap;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.q.resize(static_cast<size_t>(p.n_head) * n_q * d);
  for (float& x : p.q) x = 2.0f * normal(rng);
  p.k.resize(static_cast<size_t>(p.n_head_kv) * n_kv * d);
  p.v.resize(p.k.size());
  for (auto& x : p.k) x = ggml_fp32_to_fp16(normal(rng));
  for (auto& x : p.v) x = ggml_fp32_to_fp16(normal(rng));
  p.mask.resize(static_cast<size_t>(n_q) * n_kv);
  for (int r = 0; r < n_q; ++r) {
    for (int c = 0; c < n_kv; ++c) {
      p.mask[static_cast<size_t>(r) * n_kv + c] = ggml_fp32_to_fp16(sees(rng) ? 0.0f : -INFINITY);
    }
  }
  return p;
}

// The rows `rows` of `p` in one flash-attention call on `threads` threads.
Rows attend(const Problem& p, const std::vector<int>& rows, int threads) {
  const int n = static_cast<int>(rows.size());
  ggml_init_params params{};
  params.mem_size = 64u << 20;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, p.d, n, p.n_head, 1);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, p.d, p.n_kv, p.n_head_kv, 1);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, p.d, p.n_kv, p.n_head_kv, 1);
  ggml_tensor* mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, p.n_kv, n, 1, 1);
  for (int h = 0; h < p.n_head; ++h) {
    for (int i = 0; i < n; ++i) {
      std::memcpy(static_cast<float*>(q->data) + (static_cast<size_t>(h) * n + i) * p.d,
                  p.q.data() + (static_cast<size_t>(h) * p.n_q + rows[i]) * p.d,
                  sizeof(float) * p.d);
    }
  }
  std::memcpy(k->data, p.k.data(), p.k.size() * sizeof(ggml_fp16_t));
  std::memcpy(v->data, p.v.data(), p.v.size() * sizeof(ggml_fp16_t));
  for (int i = 0; i < n; ++i) {
    std::memcpy(static_cast<ggml_fp16_t*>(mask->data) + static_cast<size_t>(i) * p.n_kv,
                p.mask.data() + static_cast<size_t>(rows[i]) * p.n_kv,
                sizeof(ggml_fp16_t) * p.n_kv);
  }
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, p.scale, 0.0f, p.softcap);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, graph, threads), GGML_STATUS_SUCCESS);
  // out: [d, n_head, n, 1]
  Rows result(n, std::vector<uint32_t>(static_cast<size_t>(p.n_head) * p.d));
  for (int i = 0; i < n; ++i) {
    std::memcpy(result[i].data(),
                static_cast<const float*>(out->data) + static_cast<size_t>(i) * p.n_head * p.d,
                sizeof(float) * p.n_head * p.d);
  }
  ggml_free(ctx);
  return result;
}

// `p` with every cell that `row` does not see first garbage-filled and moved:
// `gap` foreign cells inserted before each of its cells, as another agent's
// cells lie between the document and this agent's in a shared cache.
Problem spread(const Problem& p, int row, int gap, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem s = p;
  std::vector<int> cells;  // the cells `row` sees, in order
  for (int c = 0; c < p.n_kv; ++c) {
    if (ggml_fp16_to_fp32(p.mask[static_cast<size_t>(row) * p.n_kv + c]) == 0.0f) {
      cells.push_back(c);
    }
  }
  s.n_kv = static_cast<int>(cells.size()) * (gap + 1);
  s.k.assign(static_cast<size_t>(s.n_head_kv) * s.n_kv * s.d, ggml_fp16_t{});
  s.v.assign(s.k.size(), ggml_fp16_t{});
  for (auto& x : s.k) x = ggml_fp32_to_fp16(normal(rng));
  for (auto& x : s.v) x = ggml_fp32_to_fp16(normal(rng));
  s.mask.assign(static_cast<size_t>(s.n_q) * s.n_kv, ggml_fp32_to_fp16(-INFINITY));
  for (size_t j = 0; j < cells.size(); ++j) {
    const int to = static_cast<int>(j) * (gap + 1) + gap;
    s.mask[static_cast<size_t>(row) * s.n_kv + to] = ggml_fp32_to_fp16(0.0f);
    for (int h = 0; h < s.n_head_kv; ++h) {
      const size_t from_at = (static_cast<size_t>(h) * p.n_kv + cells[j]) * p.d;
      const size_t to_at = (static_cast<size_t>(h) * s.n_kv + to) * s.d;
      std::memcpy(&s.k[to_at], &p.k[from_at], sizeof(ggml_fp16_t) * p.d);
      std::memcpy(&s.v[to_at], &p.v[from_at], sizeof(ggml_fp16_t) * p.d);
    }
  }
  return s;
}

struct Case {
  uint32_t seed;
  int d;
  int n_kv;
  int n_q;
  float softcap;
};

// SmolLM2's head size (64, below ggml's F16 SIMD step on AVX-512 FP16
// machines, so ggml's scalar loops run), Gemma 3's (256) and a short one;
// one-row steps over 512 cells or more, where the unpatched split-KV path
// starts; up to 63 rows, the row kernel's limit (64 take the tiled path).
const std::vector<Case> kCases = {
    {1, 64, 700, 9, 0.0f},  {2, 256, 600, 5, 0.0f}, {3, 64, 97, 63, 0.0f},
    {4, 40, 530, 3, 30.0f}, {5, 128, 64, 17, 0.0f},
};

// Every row of every case alone, in a call with one other row (2 rows take
// the row kernel with or without the patch), on one thread: what --dump
// prints, one line of hex words per row.
Rows each_row_alone(const Case& c) {
  const Problem p = random_problem(c.seed, c.d, c.n_kv, c.n_q, c.softcap);
  Rows rows;
  for (int r = 0; r < c.n_q; ++r) {
    rows.push_back(attend(p, {r, (r + 1) % c.n_q}, 1)[0]);
  }
  return rows;
}

std::string hex(const std::vector<uint32_t>& row) {
  std::string s;
  char buf[9];
  for (uint32_t w : row) {
    std::snprintf(buf, sizeof buf, "%08x", w);
    s += buf;
  }
  return s;
}

int dump() {
  for (const Case& c : kCases) {
    for (const auto& row : each_row_alone(c)) std::printf("%s\n", hex(row).c_str());
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

bool patched() {
  return ggml_cpu_has_fa_batch_invariant != nullptr && ggml_cpu_has_fa_batch_invariant() == 1;
}

TEST(AttentionKernelTest, ARowGetsTheSameBitsInAnyBatchOnAnyThreadsAtAnyCells) {
  if (!patched())
    GTEST_SKIP() << "the linked ggml lacks scripts/patches/ggml-fa-batch-invariant.patch";
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message()
                 << "d " << c.d << ", " << c.n_kv << " cells, " << c.n_q << " rows");
    const Problem p = random_problem(c.seed, c.d, c.n_kv, c.n_q, c.softcap);
    const Rows alone = each_row_alone(c);
    std::vector<int> all(c.n_q);
    for (int r = 0; r < c.n_q; ++r) all[r] = r;
    for (int threads : {1, 2, 3}) {
      const Rows batch = attend(p, all, threads);
      for (int r = 0; r < c.n_q; ++r) {
        EXPECT_EQ(batch[r], alone[r]) << "row " << r << " of a batch on " << threads << " threads";
        EXPECT_EQ(attend(p, {r}, threads)[0], alone[r])
            << "row " << r << " alone on " << threads << " threads";
      }
    }
    for (int gap : {1, 5}) {
      const int r = c.n_q / 2;
      EXPECT_EQ(attend(spread(p, r, gap, c.seed + 100), {r}, 2)[0], alone[r])
          << "row " << r << " with " << gap << " foreign cells before each of its cells";
    }
  }
}

TEST(AttentionKernelTest, TheRowKernelGivesTheUnpatchedOneRowKernelsBits) {
  if (!patched())
    GTEST_SKIP() << "the linked ggml lacks scripts/patches/ggml-fa-batch-invariant.patch";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  FILE* child = popen(("GGML_CPU_FA_BATCH_INVARIANT=0 '" + self + "' --dump").c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::vector<std::string> lines;
  std::string line;
  for (int ch; (ch = std::fgetc(child)) != EOF;) {
    if (ch == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += static_cast<char>(ch);
    }
  }
  ASSERT_EQ(pclose(child), 0);
  size_t at = 0;
  for (const Case& c : kCases) {
    const Problem p = random_problem(c.seed, c.d, c.n_kv, c.n_q, c.softcap);
    std::vector<int> all(c.n_q);
    for (int r = 0; r < c.n_q; ++r) all[r] = r;
    const Rows batch = attend(p, all, 2);
    for (int r = 0; r < c.n_q; ++r, ++at) {
      ASSERT_LT(at, lines.size());
      EXPECT_EQ(hex(batch[r]), lines[at]) << "d " << c.d << ", row " << r << " of " << c.n_q;
    }
  }
  EXPECT_EQ(at, lines.size());
}

}  // namespace

int main(int argc, char** argv) {
  // This process runs the patched kernel; --dump (the child) runs what the
  // environment says.
  if (argc == 2 && std::strcmp(argv[1], "--dump") == 0) return dump();
  setenv("GGML_CPU_FA_BATCH_INVARIANT", "1", /*overwrite=*/1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
