// The batch-invariant flash-attention kernel of
// scripts/patches/ggml-fa-batch-invariant.patch on random inputs, through
// ggml alone (no model): a query row gets the same bits whatever the other
// rows of its call (none, a few, more than ggml's 64-row tile), the thread
// count and the cells of other sequences between its own; and its result is
// within float rounding of attention computed in double precision.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <ggml-cpu.h>
#include <ggml.h>
#include <gtest/gtest.h>

extern "C" __attribute__((weak)) int ggml_cpu_has_fa_batch_invariant(void);

namespace {

struct Case {
  uint32_t seed;
  int d;        // head size
  int n_doc;    // cells every row sees first (a document), after `lead` cells none sees
  int lead;     // cells at the start that no row sees (freed or another sequence's)
  int n_own;    // cells after the document, each seen by a random ~70 % of the rows
  int n_q;      // query rows
  bool causal;  // own cells: row r sees cell j only for j <= r (one sequence's prompt)
  float softcap;
  ggml_type kv_type;
  int n_head = 6;  // query heads over 2 KV heads: a query row is 1 to 4 rows of a group
};

// One attention problem: n_q query rows of n_head heads over n_kv cells of
// n_head_kv heads; K and V as the cache holds them (kv_type rows) and as
// floats (what those rows decode to), the mask in fp16 (0 or -INF).
struct Problem {
  Case c{};
  int n_head = 6;
  int n_head_kv = 2;
  int n_kv = 0;
  float scale = 0.125f;
  size_t row_bytes = 0;           // one cell of one head, kv_type
  std::vector<float> q;           // [n_head][n_q][d]
  std::vector<uint8_t> k, v;      // [n_head_kv][n_kv] rows of row_bytes
  std::vector<float> kf, vf;      // [n_head_kv][n_kv][d]
  std::vector<ggml_fp16_t> mask;  // [n_q][n_kv]

  bool sees(int row, int cell) const {
    return ggml_fp16_to_fp32(mask[static_cast<size_t>(row) * n_kv + cell]) == 0.0f;
  }
};

// Rows: each row's output, n_head x d floats as raw bits.
using Rows = std::vector<std::vector<uint32_t>>;

// `n` values of N(0, 1) stored as one kv_type row, and what that row decodes to.
void kv_row(std::mt19937& rng, ggml_type type, int n, uint8_t* bytes, float* decoded) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = normal(rng);
  if (type == GGML_TYPE_F16) {
    auto* h = reinterpret_cast<ggml_fp16_t*>(bytes);
    for (int i = 0; i < n; ++i) {
      h[i] = ggml_fp32_to_fp16(x[i]);
      decoded[i] = ggml_fp16_to_fp32(h[i]);
    }
    return;
  }
  ggml_quantize_chunk(type, x.data(), bytes, 0, 1, n, nullptr);
  ggml_get_type_traits(type)->to_float(bytes, decoded, n);
}

Problem random_problem(const Case& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::bernoulli_distribution sees(0.7);
  Problem p;
  p.c = c;
  p.n_head = c.n_head;
  p.n_kv = c.lead + c.n_doc + c.n_own;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.row_bytes = ggml_row_size(c.kv_type, c.d);
  p.q.resize(static_cast<size_t>(p.n_head) * c.n_q * c.d);
  for (float& x : p.q) x = 2.0f * normal(rng);
  const size_t cells = static_cast<size_t>(p.n_head_kv) * p.n_kv;
  p.k.resize(cells * p.row_bytes);
  p.v.resize(cells * p.row_bytes);
  p.kf.resize(cells * c.d);
  p.vf.resize(cells * c.d);
  for (size_t i = 0; i < cells; ++i) {
    kv_row(rng, c.kv_type, c.d, &p.k[i * p.row_bytes], &p.kf[i * c.d]);
    kv_row(rng, c.kv_type, c.d, &p.v[i * p.row_bytes], &p.vf[i * c.d]);
  }
  p.mask.resize(static_cast<size_t>(c.n_q) * p.n_kv);
  for (int r = 0; r < c.n_q; ++r) {
    for (int cell = 0; cell < p.n_kv; ++cell) {
      const int own = cell - c.lead - c.n_doc;
      const bool seen = cell < c.lead ? false : own < 0 ? true : c.causal ? own <= r : sees(rng);
      p.mask[static_cast<size_t>(r) * p.n_kv + cell] = ggml_fp32_to_fp16(seen ? 0.0f : -INFINITY);
    }
  }
  return p;
}

// The rows `rows` of `p` in one flash-attention call on `threads` threads.
Rows attend(const Problem& p, const std::vector<int>& rows, int threads) {
  const int n = static_cast<int>(rows.size());
  const int d = p.c.d;
  ggml_init_params params{};
  params.mem_size = 256u << 20;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, n, p.n_head, 1);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, p.c.kv_type, d, p.n_kv, p.n_head_kv, 1);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, p.c.kv_type, d, p.n_kv, p.n_head_kv, 1);
  ggml_tensor* mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, p.n_kv, n, 1, 1);
  for (int h = 0; h < p.n_head; ++h) {
    for (int i = 0; i < n; ++i) {
      std::memcpy(static_cast<float*>(q->data) + (static_cast<size_t>(h) * n + i) * d,
                  p.q.data() + (static_cast<size_t>(h) * p.c.n_q + rows[i]) * d, sizeof(float) * d);
    }
  }
  std::memcpy(k->data, p.k.data(), p.k.size());
  std::memcpy(v->data, p.v.data(), p.v.size());
  for (int i = 0; i < n; ++i) {
    std::memcpy(static_cast<ggml_fp16_t*>(mask->data) + static_cast<size_t>(i) * p.n_kv,
                p.mask.data() + static_cast<size_t>(rows[i]) * p.n_kv,
                sizeof(ggml_fp16_t) * p.n_kv);
  }
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, p.scale, 0.0f, p.c.softcap);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, graph, threads), GGML_STATUS_SUCCESS);
  // out: [d, n_head, n, 1]
  Rows result(n, std::vector<uint32_t>(static_cast<size_t>(p.n_head) * d));
  for (int i = 0; i < n; ++i) {
    std::memcpy(result[i].data(),
                static_cast<const float*>(out->data) + static_cast<size_t>(i) * p.n_head * d,
                sizeof(float) * p.n_head * d);
  }
  ggml_free(ctx);
  return result;
}

std::vector<int> all_rows(const Problem& p) {
  std::vector<int> all(static_cast<size_t>(p.c.n_q));
  for (int r = 0; r < p.c.n_q; ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

// `p` with `n_kv` cells of fresh random K and V (the query rows kept), every
// cell masked `fill` for every row: the start of the layouts below.
Problem with_cells(const Problem& p, int n_kv, float fill, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem s = p;
  s.n_kv = n_kv;
  const size_t n_cells = static_cast<size_t>(s.n_head_kv) * s.n_kv;
  s.k.assign(n_cells * s.row_bytes, 0);
  s.v.assign(n_cells * s.row_bytes, 0);
  s.kf.assign(n_cells * s.c.d, 0.0f);
  s.vf.assign(n_cells * s.c.d, 0.0f);
  for (size_t i = 0; i < n_cells; ++i) {
    kv_row(rng, s.c.kv_type, s.c.d, &s.k[i * s.row_bytes], &s.kf[i * s.c.d]);
    kv_row(rng, s.c.kv_type, s.c.d, &s.v[i * s.row_bytes], &s.vf[i * s.c.d]);
  }
  s.mask.assign(static_cast<size_t>(s.c.n_q) * s.n_kv, ggml_fp32_to_fp16(fill));
  return s;
}

// Cell `from` of `p` (K and V of every KV head) into cell `to` of `s`.
void copy_cell(const Problem& p, int from, Problem& s, int to) {
  for (int h = 0; h < s.n_head_kv; ++h) {
    const size_t a = static_cast<size_t>(h) * p.n_kv + from;
    const size_t b = static_cast<size_t>(h) * s.n_kv + to;
    std::memcpy(&s.k[b * s.row_bytes], &p.k[a * p.row_bytes], p.row_bytes);
    std::memcpy(&s.v[b * s.row_bytes], &p.v[a * p.row_bytes], p.row_bytes);
    std::memcpy(&s.kf[b * s.c.d], &p.kf[a * p.c.d], sizeof(float) * p.c.d);
    std::memcpy(&s.vf[b * s.c.d], &p.vf[a * p.c.d], sizeof(float) * p.c.d);
  }
}

// `p` with the cells `row` sees moved apart: `gap` cells of other data that
// `row` does not see (but every other row does) before each of its cells,
// as other agents' cells lie between the document and an agent's own in a
// shared cache.
Problem spread(const Problem& p, int row, int gap, uint32_t seed) {
  std::vector<int> cells;  // the cells `row` sees, in order
  for (int c = 0; c < p.n_kv; ++c) {
    if (p.sees(row, c)) cells.push_back(c);
  }
  Problem s = with_cells(p, static_cast<int>(cells.size()) * (gap + 1), 0.0f, seed);
  for (size_t j = 0; j < cells.size(); ++j) {
    const int to = static_cast<int>(j) * (gap + 1) + gap;
    for (int r = 0; r < s.c.n_q; ++r) {
      s.mask[static_cast<size_t>(r) * s.n_kv + to] = ggml_fp32_to_fp16(r == row ? 0.0f : -INFINITY);
      for (int g = to - gap; g < to; ++g) {
        s.mask[static_cast<size_t>(r) * s.n_kv + g] =
            ggml_fp32_to_fp16(r == row ? -INFINITY : 0.0f);
      }
    }
    copy_cell(p, cells[j], s, to);
  }
  return s;
}

// `p` with `gap` cells that no row sees before each of its cells, as the
// agents' own cells lie among the document's when a shared fork streams the
// document: the rows still share every cell they all see.
Problem interleave(const Problem& p, int gap, uint32_t seed) {
  Problem s = with_cells(p, p.n_kv * (gap + 1), -INFINITY, seed);
  for (int c = 0; c < p.n_kv; ++c) {
    const int to = c * (gap + 1) + gap;
    for (int r = 0; r < s.c.n_q; ++r) {
      s.mask[static_cast<size_t>(r) * s.n_kv + to] = p.mask[static_cast<size_t>(r) * p.n_kv + c];
    }
    copy_cell(p, c, s, to);
  }
  return s;
}

// Row `row` of `p` in double precision: softmax(q.K * scale (softcap) +
// mask) . V over the decoded K and V.
std::vector<double> reference(const Problem& p, int row) {
  const int d = p.c.d;
  std::vector<double> out(static_cast<size_t>(p.n_head) * d, 0.0);
  for (int h = 0; h < p.n_head; ++h) {
    const int hk = h / (p.n_head / p.n_head_kv);
    const float* q = p.q.data() + (static_cast<size_t>(h) * p.c.n_q + row) * d;
    std::vector<double> s(static_cast<size_t>(p.n_kv), -INFINITY);
    double top = -INFINITY;
    for (int c = 0; c < p.n_kv; ++c) {
      if (!p.sees(row, c)) continue;
      const float* k = &p.kf[(static_cast<size_t>(hk) * p.n_kv + c) * d];
      double dot = 0.0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
      dot *= p.scale;
      if (p.c.softcap != 0.0f) dot = p.c.softcap * std::tanh(dot / p.c.softcap);
      s[static_cast<size_t>(c)] = dot;
      top = std::max(top, dot);
    }
    double sum = 0.0;
    std::vector<double> o(static_cast<size_t>(d), 0.0);
    for (int c = 0; c < p.n_kv; ++c) {
      if (s[static_cast<size_t>(c)] == -INFINITY) continue;
      const double e = std::exp(s[static_cast<size_t>(c)] - top);
      const float* v = &p.vf[(static_cast<size_t>(hk) * p.n_kv + c) * d];
      sum += e;
      for (int i = 0; i < d; ++i) o[static_cast<size_t>(i)] += e * v[i];
    }
    for (int i = 0; i < d; ++i) {
      out[static_cast<size_t>(h) * d + i] = sum > 0.0 ? o[static_cast<size_t>(i)] / sum : 0.0;
    }
  }
  return out;
}

// Head sizes of SmolLM2 (64) and Gemma 3 (256) and others; generation-step
// shapes (agents over a shared document; 40 agents are more rows than one of
// the kernel's row groups holds), a prompt's causal rows, one call of more
// than 64 rows (ggml's tiled path without the patch), cells at the start
// that no row sees, a document not a multiple of the kernel's 16-cell block,
// a softcap, a q8_0 cache; 1 to 4 query heads per KV head (a kernel's tiles
// of rows then split a group in different places alone and in a batch).
const std::vector<Case> kCases = {
    {1, 64, 600, 0, 100, 9, false, 0.0f, GGML_TYPE_F16},
    {2, 256, 500, 3, 100, 5, false, 0.0f, GGML_TYPE_F16},
    {3, 64, 37, 0, 60, 63, false, 0.0f, GGML_TYPE_F16},
    {4, 40, 480, 0, 50, 3, false, 30.0f, GGML_TYPE_F16},
    {5, 128, 0, 0, 64, 17, false, 0.0f, GGML_TYPE_F16},
    {6, 64, 300, 21, 100, 100, true, 0.0f, GGML_TYPE_F16},
    {7, 64, 250, 5, 40, 12, false, 0.0f, GGML_TYPE_Q8_0},
    {8, 64, 1200, 0, 150, 40, false, 0.0f, GGML_TYPE_Q8_0},
    {9, 64, 400, 0, 60, 11, false, 0.0f, GGML_TYPE_F16, 4},
    {10, 128, 300, 2, 40, 7, true, 0.0f, GGML_TYPE_Q8_0, 8},
    {11, 64, 200, 0, 30, 5, false, 0.0f, GGML_TYPE_F16, 2},
};

std::string describe(const Case& c) {
  return "d " + std::to_string(c.d) + ", " + std::to_string(c.lead) + " + " +
         std::to_string(c.n_doc) + " + " + std::to_string(c.n_own) + " cells, " +
         std::to_string(c.n_q) + " rows of " + std::to_string(c.n_head) + " heads, " +
         ggml_type_name(c.kv_type);
}

bool patched() {
  return ggml_cpu_has_fa_batch_invariant != nullptr && ggml_cpu_has_fa_batch_invariant() == 1;
}

TEST(AttentionKernelTest, ARowGetsTheSameBitsInAnyBatchOnAnyThreadsAtAnyCells) {
  if (!patched())
    GTEST_SKIP() << "the linked ggml lacks scripts/patches/ggml-fa-batch-invariant.patch";
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p = random_problem(c);
    Rows alone;
    for (int r = 0; r < c.n_q; ++r) alone.push_back(attend(p, {r}, 1)[0]);
    for (int threads : {1, 2, 3}) {
      const Rows batch = attend(p, all_rows(p), threads);
      for (int r = 0; r < c.n_q; ++r) {
        EXPECT_EQ(batch[r], alone[r]) << "row " << r << " of all on " << threads << " threads";
      }
    }
    // Batches of 7 rows, and each row beside the next one.
    for (int first = 0; first < c.n_q; first += 7) {
      std::vector<int> some;
      for (int r = first; r < std::min(first + 7, c.n_q); ++r) some.push_back(r);
      const Rows batch = attend(p, some, 2);
      for (size_t i = 0; i < some.size(); ++i) {
        EXPECT_EQ(batch[i], alone[some[i]]) << "row " << some[i] << " in rows of 7";
      }
    }
    for (int r = 0; r < c.n_q; ++r) {
      EXPECT_EQ(attend(p, {r, (r + 1) % c.n_q}, 2)[0], alone[r]) << "row " << r << " in a pair";
    }
    for (int gap : {1, 5}) {
      for (int r : {0, c.n_q / 2}) {
        const Problem s = spread(p, r, gap, c.seed + 100);
        EXPECT_EQ(attend(s, all_rows(s), 2)[r], alone[r])
            << "row " << r << " with " << gap << " foreign cells before each of its cells";
      }
      const Problem hidden = interleave(p, gap, c.seed + 200);
      for (int threads : {1, 3}) {
        const Rows batch = attend(hidden, all_rows(hidden), threads);
        for (int r = 0; r < c.n_q; ++r) {
          EXPECT_EQ(batch[r], alone[r])
              << "row " << r << " with " << gap << " cells no row sees before each cell, "
              << threads << " threads";
        }
      }
    }
  }
}

TEST(AttentionKernelTest, EveryRowIsWithinFloatRoundingOfDoublePrecision) {
  if (!patched())
    GTEST_SKIP() << "the linked ggml lacks scripts/patches/ggml-fa-batch-invariant.patch";
  // fp32 scores and sums over at most a thousand cells of N(0, 1) values:
  // measured up to 2.2e-6 (the kernels the patch replaces, with their fp16
  // accumulators: 2.5e-3 to 1.7e-2 on the same problems).
  constexpr double kBound = 1e-5;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p = random_problem(c);
    const Rows batch = attend(p, all_rows(p), 2);
    double worst = 0.0;
    for (int r = 0; r < c.n_q; ++r) {
      const std::vector<double> want = reference(p, r);
      for (size_t i = 0; i < want.size(); ++i) {
        float got;
        std::memcpy(&got, &batch[r][i], sizeof got);
        worst = std::max(worst, std::abs(static_cast<double>(got) - want[i]));
      }
    }
    EXPECT_LT(worst, kBound);
  }
}

}  // namespace

int main(int argc, char** argv) {
  setenv("GGML_CPU_FA_BATCH_INVARIANT", "1", /*overwrite=*/1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
