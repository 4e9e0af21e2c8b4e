// The two test architectures every fork-equivalence test runs on: SmolLM2
// (plain attention, the default model) and Gemma 3 (interleaved
// sliding-window attention), as the test set-up provides them in the
// environment ($SWARMKV_TEST_MODEL, $SWARMKV_TEST_MODEL_GEMMA3).
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "swarmkv/engine.h"

namespace swarmkv::test {

struct TestModel {
  const char* name;        // "smollm2", "gemma3": the test name suffix
  const char* env;         // the variable holding its GGUF path
  const char* build_path;  // the path the build was configured with, if the variable is unset
  // The shared fork is not bit-exact with several branches (another
  // branch's cells between the document and a branch's own change the
  // rounding). The largest |logit difference| from a recompute measured by
  // EngineModelForkTest.UnifiedBatchedLogitsStayWithinBound, with headroom
  // for other CPUs' kernels: SmolLM2 F16 (the default model) 0.016-0.022
  // measured -> 0.25 (its Q4_1 file, whose activations are quantised to
  // 8 bits, moved 0.51-0.67); Gemma 3 0.88-1.91 on the AVX-512 machines,
  // 2.53 on an AVX2-only AMD EPYC (2026-12-06; its Q4_K/Q8_K dot products
  // round otherwise) -> 3.0.
  float shared_logit_bound;
  // Whether, in that batch, the branch whose cells directly follow the
  // document is bit-exact: no on either (SmolLM2 F16 1.2e-5: the batch's
  // matrix products group its rows with the other branches'; Gemma 3 0.96).
  bool first_branch_exact;
  // An instruct model ends some answers early at its end of turn (SmolLM2);
  // the base model (Gemma 3) runs to max_tokens.
  bool instruct;
};

inline const TestModel kSmolLM2{
    "smollm2", "SWARMKV_TEST_MODEL", SWARMKV_TEST_MODEL_PATH, 0.25f, false, true};
inline const TestModel kGemma3{
    "gemma3", "SWARMKV_TEST_MODEL_GEMMA3", SWARMKV_TEST_MODEL_GEMMA3_PATH, 3.0f, false, false};

inline std::ostream& operator<<(std::ostream& out, const TestModel& m) {
  return out << m.name;
}

// The model, loaded once per process and set of options (exact mode loads
// it with batch-invariant kernels); nullptr when neither its variable nor the
// build names one (the caller skips).
inline std::shared_ptr<const Model> load_test_model(const TestModel& m,
                                                    const ModelOptions& options = {}) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const Model>> loaded;
  std::lock_guard lock(mutex);
  const std::string key = std::string(m.name) + (options.batch_invariant ? "/batch-invariant" : "");
  auto it = loaded.find(key);
  if (it != loaded.end()) return it->second;
  const char* path = std::getenv(m.env);
  if (path == nullptr || *path == '\0') path = m.build_path;
  std::shared_ptr<const Model> model = *path != '\0' ? Model::load(path, options) : nullptr;
  loaded.emplace(key, model);
  return model;
}

// The test name suffix of a suite instantiated over the models.
inline std::string test_model_name(const ::testing::TestParamInfo<TestModel>& param) {
  return param.param.name;
}

// Sanitizer builds run the fork-equivalence suites on SmolLM2 only: the
// numerics are the uninstrumented engine's, identical in every preset, and the
// code paths are the same on both models.
#ifdef SWARMKV_SANITIZED
#define SWARMKV_FORK_TEST_MODELS ::testing::Values(::swarmkv::test::kSmolLM2)
#else
#define SWARMKV_FORK_TEST_MODELS \
  ::testing::Values(::swarmkv::test::kSmolLM2, ::swarmkv::test::kGemma3)
#endif

}  // namespace swarmkv::test
