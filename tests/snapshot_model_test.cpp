// Snapshots on the real models: a warm run restores the store's snapshot
// and answers exactly as the cold run and the re-prefill reference; an
// edited document reuses its common prefix; damaged or foreign snapshots are
// refused precisely, and in the automatic store still end in a good run.
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "hostile_payload.h"
#include "prefix/prefix_source.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/snapshot.h"
#include "test_models.h"

namespace swarmkv {
namespace {

namespace fs = std::filesystem;
using test::TestModel;

// Agents over the first `n_chars` of the Apache License 2.0.
PipelineSpec licence_spec(size_t n_chars, int32_t max_tokens) {
  PipelineSpec spec;
  spec.name = "snapshot";
  spec.document = read_file(std::string(SWARMKV_SOURCE_DIR) + "/examples/documents/apache-2.0.txt")
                      .substr(0, n_chars);
  spec.n_threads = 2;
  for (const char* p : {"What does the Grant of Copyright License allow?",
                        "What must a person do to redistribute the Work?"}) {
    AgentSpec a;
    a.name = fmt::format("agent{}", spec.agents.size());
    a.prompt = p;
    a.max_tokens = max_tokens;
    spec.agents.push_back(a);
  }
  return spec;
}

std::string describe(const PipelineResult& r) {
  std::string out = r.document_error ? r.document_error->to_string() : "document ok";
  for (const AgentResult& a : r.agents) {
    out += fmt::format("; {}: {}", a.name, a.error ? a.error->to_string() : "ok");
  }
  return out;
}

class SnapshotModelTest : public ::testing::TestWithParam<TestModel> {
 protected:
  void SetUp() override {
    model_ = test::load_test_model(GetParam());
    if (!model_) GTEST_SKIP() << GetParam().env << " is not set";
    dir_ = fs::temp_directory_path() /
           fmt::format("swarmkv-snapshot-model-{}-{}-{}", ::getpid(), GetParam().name,
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunOptions cached(SnapshotCacheMode mode = SnapshotCacheMode::kOn) const {
    RunOptions o;
    o.snapshot.cache = mode;
    o.snapshot.cache_dir = (dir_ / "store").string();
    return o;
  }

  PipelineResult run(const PipelineSpec& spec, const RunOptions& options) const {
    PipelineResult r = run_pipeline(spec, model_, options);
    EXPECT_TRUE(r.ok()) << describe(r);
    return r;
  }

  static void expect_same_answers(const PipelineResult& a, const PipelineResult& b,
                                  const std::string& what) {
    ASSERT_EQ(a.agents.size(), b.agents.size());
    for (size_t i = 0; i < a.agents.size(); ++i) {
      EXPECT_EQ(a.agents[i].tokens, b.agents[i].tokens)
          << what << ", " << a.agents[i].name << ":\n  " << a.agents[i].answer << "\n  "
          << b.agents[i].answer;
    }
  }

  // A snapshot of `spec`'s document made here, its payload then edited by
  // `edit` and its checksums recomputed: a hostile writer's file.
  std::string hostile_snapshot(const PipelineSpec& spec, const std::string& name,
                               const std::function<void(std::vector<uint8_t>& payload,
                                                        const SnapshotHeader& h)>& edit) const {
    fs::create_directories(dir_);
    const std::string good = (dir_ / "good.swkv").string();
    prefill_document(spec, model_, RunOptions{}, good);
    const SnapshotHeader h = read_snapshot_header(good);
    std::vector<uint8_t> payload = read_snapshot_payload(good, h);
    edit(payload, h);
    const std::string path = (dir_ / name).string();
    write_snapshot(path, h.meta, payload);
    return path;
  }

  // `check` of `spec` run from the snapshot file `file` under each fork
  // that restores one.
  void for_each_restoring_fork(PipelineSpec spec, const std::string& file,
                               const std::function<void(const PipelineResult&)>& check) const {
    for (const ForkMode fork : {ForkMode::kShared, ForkMode::kHost}) {
      SCOPED_TRACE(to_string(fork));
      spec.fork = fork;
      RunOptions o;
      o.snapshot.file = file;
      check(run_pipeline(spec, model_, o));
    }
  }

  // The error a failed run reports first: the document's, else an agent's.
  static std::string first_error(const PipelineResult& r) {
    if (r.document_error) return r.document_error->to_string();
    for (const AgentResult& a : r.agents) {
      if (a.error) return a.error->to_string();
    }
    return "ok";
  }

  std::shared_ptr<const Model> model_;
  fs::path dir_;
};

// Cold, then warm from the store: the warm run prefills nothing, and both
// forks answer exactly as they did cold; host also equals the re-prefill
// reference, which never touches the store. One snapshot serves both forks.
TEST_P(SnapshotModelTest, WarmRunRestoresTheStoreAndAnswersExactlyAsCold) {
  PipelineSpec spec = licence_spec(4000, 24);
  spec.fork = ForkMode::kHost;
  const PipelineResult cold = run(spec, cached());
  ASSERT_TRUE(cold.snapshot);
  EXPECT_EQ(cold.snapshot->source, SnapshotSource::kPrefill);
  EXPECT_TRUE(cold.snapshot->published);
  EXPECT_EQ(cold.snapshot->prefilled_tokens, cold.prefix_tokens);
  EXPECT_EQ(cold.snapshot->reused_tokens, 0);
  EXPECT_EQ(cold.document_prefills, 1);
  EXPECT_TRUE(fs::exists(cold.snapshot->path)) << cold.snapshot->path;

  const PipelineResult warm = run(spec, cached());
  ASSERT_TRUE(warm.snapshot);
  EXPECT_EQ(warm.snapshot->source, SnapshotSource::kCache);
  EXPECT_EQ(warm.snapshot->key, cold.snapshot->key);
  EXPECT_EQ(warm.snapshot->reused_tokens, warm.prefix_tokens);
  EXPECT_EQ(warm.snapshot->prefilled_tokens, 0);
  EXPECT_EQ(warm.document_prefills, 0);
  EXPECT_EQ(warm.prefill_ms, 0);
  EXPECT_GT(warm.snapshot->load_ms, 0);
  EXPECT_GT(warm.snapshot->verify_ms, 0);
  EXPECT_FALSE(warm.snapshot->published);
  expect_same_answers(cold, warm, "host cold vs warm");

  spec.fork = ForkMode::kNone;
  const PipelineResult reference = run(spec, cached());
  EXPECT_FALSE(reference.snapshot);
  EXPECT_EQ(reference.document_prefills, static_cast<int32_t>(spec.agents.size()));
  expect_same_answers(reference, warm, "none vs host warm");

  spec.fork = ForkMode::kShared;
  const PipelineResult shared_warm = run(spec, cached(SnapshotCacheMode::kReadOnly));
  ASSERT_TRUE(shared_warm.snapshot);
  EXPECT_EQ(shared_warm.snapshot->source, SnapshotSource::kCache);
  EXPECT_EQ(shared_warm.snapshot->prefilled_tokens, 0);
  const PipelineResult shared_cold = run(spec, RunOptions{});
  ASSERT_TRUE(shared_cold.snapshot);
  EXPECT_EQ(shared_cold.snapshot->source, SnapshotSource::kPrefill);
  EXPECT_FALSE(shared_cold.snapshot->published);
  expect_same_answers(shared_cold, shared_warm, "shared cold vs warm");
}

// An agent that needs the document's start: the shared fork streams the
// prefill beside that agent's steps, and publishes it once it ends as the
// state a plain prefill publishes, byte for byte, so the next run restores
// it and answers the same. A sliding-window model's per-sequence export
// keeps only the window: it publishes nothing and streams again.
TEST_P(SnapshotModelTest, AStreamedPrefillPublishesAPlainPrefillsStateForTheNextRun) {
  PipelineSpec spec = licence_spec(4000, 12);
  spec.fork = ForkMode::kShared;
  spec.agents[0].needs.tokens = 64;
  const PipelineResult cold = run(spec, cached());
  ASSERT_TRUE(cold.snapshot);
  EXPECT_EQ(cold.snapshot->source, SnapshotSource::kPrefill);
  EXPECT_EQ(cold.snapshot->prefilled_tokens, cold.prefix_tokens);
  // Streamed: the agent that needs 64 tokens started before the prefill ended.
  EXPECT_LT(cold.agents[0].timings_ms.started_at, cold.prefill_done_at_ms);
  const PipelineResult warm = run(spec, cached());
  ASSERT_TRUE(warm.snapshot);
  expect_same_answers(cold, warm, "streamed cold vs warm");
  if (kv_layout(*model_, spec.context_options()).n_swa > 0) {
    EXPECT_FALSE(cold.snapshot->published);
    EXPECT_EQ(warm.snapshot->source, SnapshotSource::kPrefill);
    return;
  }
  ASSERT_TRUE(cold.snapshot->published);
  EXPECT_GT(cold.export_ms, 0);
  EXPECT_EQ(cold.snapshot_bytes, cold.snapshot->bytes);
  EXPECT_EQ(warm.snapshot->source, SnapshotSource::kCache);
  EXPECT_EQ(warm.snapshot->prefilled_tokens, 0);
  EXPECT_EQ(warm.document_prefills, 0);

  const std::string plain = (dir_ / "plain.swkv").string();
  prefill_document(spec, model_, RunOptions{}, plain);
  const SnapshotHeader streamed_h = read_snapshot_header(cold.snapshot->path);
  const SnapshotHeader plain_h = read_snapshot_header(plain);
  EXPECT_EQ(streamed_h.meta.binding, plain_h.meta.binding);
  EXPECT_EQ(streamed_h.meta.tokens, plain_h.meta.tokens);
  const std::vector<uint8_t> streamed = read_snapshot_payload(cold.snapshot->path, streamed_h);
  EXPECT_EQ(streamed.size(), cold.snapshot->bytes);
  EXPECT_TRUE(streamed == read_snapshot_payload(plain, plain_h))
      << "the streamed prefill's entry is not a plain prefill's state";
}

// An appended paragraph: the plain-attention model restores the stored
// prefix cut to whole prefill chunks and prefills only the rest; the
// sliding-window model cannot cut its state and prefills all of it. Either
// way the answers equal a cold run of the longer document.
TEST_P(SnapshotModelTest, AppendedDocumentReusesTheCommonPrefixAndAnswersAsACold) {
  PipelineSpec spec = licence_spec(4000, 24);
  spec.fork = ForkMode::kHost;
  const PipelineResult first = run(spec, cached());
  spec.document += "\n\nAPPENDIX: the parties agree that notices are sent by registered mail.";
  const PipelineResult appended = run(spec, cached());
  const PipelineResult cold = run(spec, RunOptions{});
  ASSERT_TRUE(appended.snapshot);
  const SnapshotUse& s = *appended.snapshot;
  EXPECT_EQ(s.reused_tokens + s.prefilled_tokens, appended.prefix_tokens);
  if (GetParam().name == std::string("gemma3")) {
    EXPECT_EQ(s.source, SnapshotSource::kPrefill);
    EXPECT_EQ(s.reused_tokens, 0);
  } else {
    EXPECT_EQ(s.source, SnapshotSource::kCache);
    const auto chunk = static_cast<int32_t>(spec.context_options().n_ubatch);
    EXPECT_EQ(chunk, 256);  // the automatic micro-batch of n_batch 512
    EXPECT_EQ(s.reused_tokens % chunk, 0);
    // All of the first document's whole micro-batches.
    EXPECT_EQ(s.reused_tokens, first.prefix_tokens / chunk * chunk);
    EXPECT_GT(s.prefilled_tokens, 0);
  }
  EXPECT_TRUE(s.published);
  expect_same_answers(cold, appended, "appended: cold vs reused");
}

// Every kind of damage to the store's entry: a warning, the entry replaced,
// and a run as good as a cold one. The format and the store are the same for
// every model, so one model runs the matrix.
TEST_P(SnapshotModelTest, DamagedStoreEntriesAreSkippedAndTheRunSucceeds) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "model-independent; smollm2 runs it";
  PipelineSpec spec = licence_spec(1000, 4);
  spec.fork = ForkMode::kHost;
  const PipelineResult cold = run(spec, cached());
  const std::string path = cold.snapshot->path;
  std::string good;
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  const SnapshotHeader h = read_snapshot_header(path);
  std::vector<std::pair<std::string, std::string>> damages;  // what, bytes
  for (const SnapshotSection& sec : h.sections) {
    damages.emplace_back("truncated at " + sec.name, good.substr(0, sec.offset));
    std::string flipped = good;
    flipped[sec.offset + sec.size / 2] ^= 0x10;
    damages.emplace_back("flipped in " + sec.name, flipped);
  }
  std::string header_flip = good;
  header_flip[10] ^= 0x01;  // the format version, under the header checksum
  damages.emplace_back("flipped in the header", header_flip);
  std::string meta_flip = good;
  meta_flip[40] ^= 0x01;  // inside the metadata JSON
  damages.emplace_back("flipped in the metadata", meta_flip);
  damages.emplace_back("zero-length", "");

  for (const auto& [what, bytes] : damages) {
    SCOPED_TRACE(what);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    const PipelineResult r = run(spec, cached());
    ASSERT_TRUE(r.snapshot);
    EXPECT_EQ(r.snapshot->source, SnapshotSource::kPrefill);
    ASSERT_EQ(r.snapshot->discarded.size(), 1u);
    EXPECT_EQ(r.snapshot->discarded[0].code, ErrorCode::kCorruption)
        << r.snapshot->discarded[0].to_string();
    EXPECT_NE(r.snapshot->discarded[0].message.find(path), std::string::npos);
    EXPECT_TRUE(r.snapshot->published);
    expect_same_answers(cold, r, what);
    EXPECT_NO_THROW(read_snapshot_payload(path, read_snapshot_header(path)));  // replaced
  }

  // Named explicitly, a damaged file fails the run with its precise error.
  const std::string copy = (dir_ / "named.swkv").string();
  {
    std::ofstream out(copy, std::ios::binary);
    out << good.substr(0, h.sections[1].offset + 10);
  }
  RunOptions named;
  named.snapshot.file = copy;
  const PipelineResult failed = run_pipeline(spec, model_, named);
  EXPECT_FALSE(failed.ok());
  ASSERT_TRUE(failed.document_error);
  EXPECT_EQ(
      failed.document_error->to_string(),
      fmt::format("corruption: snapshot '{}': truncated: section 'kv.0' needs bytes [{}, {}), "
                  "the file has {}",
                  copy, h.sections[1].offset, h.sections[1].offset + h.sections[1].size,
                  h.sections[1].offset + 10));
  EXPECT_EQ(failed.agents[0].status, NodeStatus::kDependencyFailed);
}

// A snapshot whose payload (checksums recomputed: a hostile writer's) gives
// its architecture name a length of 2^31 - 1: refused before llama.cpp
// reads it, without the 2 GiB it allocated and zeroed for the name (peak
// RSS rose by that much, and the restore took seconds), on both forks.
TEST_P(SnapshotModelTest, AHugeArchitectureNameInThePayloadIsRefusedBeforeAllocating) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "model-independent; smollm2 runs it";
  PipelineSpec spec = licence_spec(1000, 4);
  const std::string hostile =
      hostile_snapshot(spec, "hostile.swkv", [](std::vector<uint8_t>& payload, auto&) {
        ASSERT_EQ(payload[0], 5);  // "llama"
        payload[0] = payload[1] = payload[2] = 0xff;
        payload[3] = 0x7f;
      });
  for (const ForkMode fork : {ForkMode::kShared, ForkMode::kHost}) {
    SCOPED_TRACE(to_string(fork));
    spec.fork = fork;
    RunOptions o;
    o.snapshot.file = hostile;
    reset_peak_rss();
    const long before = peak_rss_kib();
    const PipelineResult r = run_pipeline(spec, model_, o);
    const long grew_kib = peak_rss_kib() - before;
    EXPECT_FALSE(r.ok());
    const std::string error = first_error(r);
    EXPECT_NE(error.find("the state does not begin with this model's architecture name 'llama' "
                         "(it gives a name of 2147483647 bytes)"),
              std::string::npos)
        << error;
    EXPECT_LT(grew_kib, 1024 * 1024) << "peak RSS grew by " << grew_kib << " KiB";
  }
}

// A snapshot whose cells were moved one position on (checksums recomputed):
// llama.cpp restores them as they are, and the agents answered from a
// document at the wrong positions. Refused after the restore, naming the
// file, on both forks.
TEST_P(SnapshotModelTest, ASnapshotWhoseCellsSitElsewhereIsCorruptionNamingIt) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "the payload's layout is SmolLM2's; smollm2 runs it";
  PipelineSpec spec = licence_spec(1000, 4);
  uint32_t cells = 0;
  const std::string moved = hostile_snapshot(
      spec, "moved.swkv", [&cells](std::vector<uint8_t>& payload, const SnapshotHeader& h) {
        cells = test::move_cells_one_position_on(payload);
        ASSERT_EQ(cells, h.meta.tokens.size());
      });
  const std::string expected = fmt::format(
      "corruption: snapshot '{}': its KV cell 0 holds position 1 of sequences [0], where a "
      "prefill puts position 0 of sequence 0 alone",
      moved);
  for_each_restoring_fork(spec, moved, [&](const PipelineResult& r) {
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(first_error(r), expected);
  });
}

// A snapshot left with its first and last cell only (checksums
// recomputed): llama.cpp restores it as it is, and the check after the
// restore saw its lowest and highest position where the document's are,
// so the run was "ok" with answers from a document with holes. Refused
// before the restore by its cell count, naming the file, on both forks.
TEST_P(SnapshotModelTest, ASnapshotMissingCellsIsCorruptionNamingIt) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "the payload's layout is SmolLM2's; smollm2 runs it";
  PipelineSpec spec = licence_spec(1000, 4);
  uint32_t cells = 0;
  const std::string holed = hostile_snapshot(
      spec, "holed.swkv", [&cells](std::vector<uint8_t>& payload, const SnapshotHeader& h) {
        cells = test::keep_first_and_last_cell(payload);
        ASSERT_EQ(cells, h.meta.tokens.size());
      });
  const std::string expected = fmt::format(
      "corruption: snapshot '{}': its state holds 2 KV cells, where its {} tokens need {} "
      "(positions 0..{} of sequence 0)",
      holed, cells, cells, cells - 1);
  for_each_restoring_fork(spec, holed, [&](const PipelineResult& r) {
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(first_error(r), expected);
  });
}

// The same kinds of entry in the store: they pass every file check, so the
// lookup restores them and the run fails on them; then the entry is gone
// (it stayed, and every later run failed the same way, or with cells left
// out answered from a document with holes), and the next run prefills and
// answers as a cold run does. On both forks.
TEST_P(SnapshotModelTest, AStoreEntryWhoseStateFailsIsRemoved) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "the payload's layout is SmolLM2's; smollm2 runs it";
  const std::pair<uint32_t (*)(std::vector<uint8_t>&), const char*> forgeries[] = {
      {test::move_cells_one_position_on, "its KV cell 0 holds position 1 of sequences [0]"},
      {test::keep_first_and_last_cell, "its state holds 2 KV cells, where its "}};
  for (const ForkMode fork : {ForkMode::kShared, ForkMode::kHost}) {
    SCOPED_TRACE(to_string(fork));
    fs::remove_all(dir_ / "store");
    PipelineSpec spec = licence_spec(1000, 4);
    spec.fork = fork;
    const PipelineResult cold = run(spec, cached());
    ASSERT_TRUE(cold.snapshot && cold.snapshot->published);
    const std::string entry = cold.snapshot->path;
    for (const auto& [forge, refusal] : forgeries) {
      SCOPED_TRACE(refusal);
      const SnapshotHeader h = read_snapshot_header(entry);
      std::vector<uint8_t> payload = read_snapshot_payload(entry, h);
      forge(payload);
      write_snapshot(entry, h.meta, payload);

      const PipelineResult failed = run_pipeline(spec, model_, cached());
      EXPECT_FALSE(failed.ok());
      ASSERT_TRUE(failed.snapshot);
      EXPECT_EQ(failed.snapshot->source, SnapshotSource::kCache);
      ASSERT_EQ(failed.snapshot->discarded.size(), 1u);
      EXPECT_EQ(failed.snapshot->discarded[0].message.rfind(
                    fmt::format("snapshot '{}': {}", entry, refusal), 0),
                0u)
          << failed.snapshot->discarded[0];
      EXPECT_FALSE(fs::exists(entry));
      const PipelineResult again = run(spec, cached());  // publishes the entry again
      EXPECT_EQ(again.snapshot->source, SnapshotSource::kPrefill);
      expect_same_answers(cold, again, "after the damaged entry");
      ASSERT_EQ(again.snapshot->path, entry);
    }
  }
}

// A snapshot whose K/V values are NaN (checksums recomputed): the agents
// answered nothing (0 tokens, status ok). Now each agent fails at its first
// token with kCorruption, on both forks. The payload ends with the last
// layer's V cells (llama.cpp writes the KV cache last), F16 here.
TEST_P(SnapshotModelTest, NonFiniteKvValuesFailTheAgentsInsteadOfAnEmptyAnswer) {
  if (GetParam().name != std::string("smollm2"))
    GTEST_SKIP() << "the payload's layout is SmolLM2's; smollm2 runs it";
  PipelineSpec spec = licence_spec(1000, 4);
  spec.kv_type = KvType::kF16;  // the F16 NaN pattern below is a value of each cell's rows
  const std::string poisoned =
      hostile_snapshot(spec, "nan.swkv", [](std::vector<uint8_t>& payload, auto&) {
        ASSERT_GT(payload.size(), 65536u);
        for (size_t at = payload.size() - 65536; at + 1 < payload.size(); at += 2) {
          payload[at] = 0x00;  // F16 NaN, 0x7e00, little-endian
          payload[at + 1] = 0x7e;
        }
      });
  for_each_restoring_fork(spec, poisoned, [](const PipelineResult& r) {
    EXPECT_EQ(r.document_status, NodeStatus::kOk);
    for (const AgentResult& a : r.agents) {
      EXPECT_EQ(a.status, NodeStatus::kFailed) << a.name << ": " << a.answer;
      ASSERT_TRUE(a.error.has_value()) << a.name;
      EXPECT_EQ(a.error->code, ErrorCode::kCorruption) << *a.error;
      EXPECT_NE(a.error->message.find("non-finite logit"), std::string::npos) << *a.error;
      EXPECT_TRUE(a.tokens.empty()) << a.name;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Models, SnapshotModelTest, SWARMKV_FORK_TEST_MODELS,
                         test::test_model_name);

// A snapshot of one model offered to the other, of another engine, and of
// another document: refused before the context is touched, naming both sides.
TEST(SnapshotBindingModelTest, ForeignSnapshotsAreRefusedNamingWhatDiffers) {
  const auto smol = test::load_test_model(test::kSmolLM2);
  const auto gemma = test::load_test_model(test::kGemma3);
  if (!smol || !gemma) GTEST_SKIP() << "needs both test models";
  const fs::path dir = fs::temp_directory_path() / fmt::format("swarmkv-foreign-{}", ::getpid());
  fs::create_directories(dir);
  PipelineSpec spec = licence_spec(1200, 4);
  spec.fork = ForkMode::kHost;
  const std::string smol_file = (dir / "smol.swkv").string();
  const std::string gemma_file = (dir / "gemma.swkv").string();
  prefill_document(spec, smol, RunOptions{}, smol_file);
  prefill_document(spec, gemma, RunOptions{}, gemma_file);

  const auto document_error = [&](const std::shared_ptr<const Model>& model,
                                  const std::string& file, const PipelineSpec& s) {
    RunOptions o;
    o.snapshot.file = file;
    const PipelineResult r = run_pipeline(s, model, o);
    EXPECT_EQ(r.document_status, NodeStatus::kFailed);
    return r.document_error ? r.document_error->to_string() : std::string("ok");
  };
  const std::string smol_sha = model_fingerprint(smol->path());
  const std::string gemma_sha = model_fingerprint(gemma->path());
  EXPECT_EQ(document_error(gemma, smol_file, spec),
            fmt::format("incompatible: snapshot '{}' was made for the model with sha256 {}, this "
                        "run has {}",
                        smol_file, smol_sha, gemma_sha));
  EXPECT_EQ(document_error(smol, gemma_file, spec),
            fmt::format("incompatible: snapshot '{}' was made for the model with sha256 {}, this "
                        "run has {}",
                        gemma_file, gemma_sha, smol_sha));

  // Another engine commit: the same bytes, rebound.
  SnapshotHeader h = read_snapshot_header(smol_file);
  const std::vector<uint8_t> payload = read_snapshot_payload(smol_file, h);
  h.meta.binding.engine = "0000000+p000000000000";
  const std::string other_engine = (dir / "engine.swkv").string();
  write_snapshot(other_engine, h.meta, payload);
  EXPECT_EQ(document_error(smol, other_engine, spec),
            fmt::format("incompatible: snapshot '{}' was made for engine 0000000+p000000000000, "
                        "this run has {}",
                        other_engine, engine_id()));

  // Another document: nothing to reuse.
  PipelineSpec other = spec;
  other.document = "Completely different text. " + other.document;
  const std::string error = document_error(smol, smol_file, other);
  EXPECT_TRUE(error.starts_with(
      fmt::format("incompatible: snapshot '{}' does not fit this document: it holds {} tokens, "
                  "shares the first ",
                  smol_file, h.meta.tokens.size())))
      << error;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace swarmkv
