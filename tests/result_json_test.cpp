// The result codec both ways (swarmkv/result_json.h): a result with every
// field set reads back whole, a run going on reads back with each agent's
// phase, a result that is not one is refused by name, and the graph's
// depths. No model.
#include "swarmkv/result_json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "spec_fixtures.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {
namespace {

using nlohmann::json;

// Every field result_json writes away from its default.
PipelineResult result_with_every_field_set() {
  PipelineResult r;
  r.pipeline = "every-field";
  r.model = "/models/m.gguf";
  r.fork = ForkMode::kHost;
  r.exact = true;
  r.exact_unavailable = "a GPU";
  r.guard = GuardPolicy::kConcurrent;
  r.prefix_tokens = 321;
  r.document_prefills = 2;
  r.snapshot = SnapshotUse{SnapshotSource::kRedis,
                           "key",
                           "/snap/x",
                           300,
                           21,
                           4096,
                           1.5,
                           0.5,
                           true,
                           {ErrorValue{ErrorCode::kCorruption, "bad entry"}}};
  r.snapshot_bytes = 4096;
  r.n_ctx = 2048;
  r.n_seq_max = 5;
  r.prepare_ms = 1;
  r.prefill_done_at_ms = 2;
  r.prefill_ms = 3;
  r.export_ms = 4;
  r.restore_ms = 5;
  r.branch_buffer_ms = 6;
  r.total_ms = 7;
  r.engine.flash_attn = true;
  r.engine.type_k = r.engine.type_v = KvType::kQ8_0;
  r.engine.n_batch = 256;
  r.engine.n_ubatch = 128;
  r.engine.n_threads = 3;
  r.engine.n_threads_batch = 4;
  r.n_gpu_layers = 8;
  r.offloaded_layers = 6;
  r.contexts = 2;
  r.kv_cells_peak = 900;
  r.kv_bytes_per_cell = 1234.5;
  r.host_buffer_bytes = 777;
  r.decode_steps.resize(3);
  r.document_status = NodeStatus::kFailed;
  r.document_error = ErrorValue{ErrorCode::kIo, "disk"};
  r.agents = fixtures::results_with_every_field_set();
  r.transfer = TransferFigures{99, 1.25, 2.5, 3};
  return r;
}

TEST(ResultJsonTest, AResultWithEveryFieldSetReadsBackWhole) {
  const PipelineResult r = result_with_every_field_set();
  const json written = result_json(r);
  const ResultRead read = result_from_json(json::parse(written.dump()));
  EXPECT_FALSE(read.live);
  EXPECT_TRUE(read.has("engine"));
  EXPECT_FALSE(read.has("live"));
  EXPECT_EQ(result_json(read.result), written) << "what was read writes the same JSON";
  const PipelineResult& b = read.result;
  EXPECT_EQ(b.agents, r.agents);
  EXPECT_EQ(b.pipeline, r.pipeline);
  EXPECT_EQ(b.model, r.model);
  EXPECT_EQ(b.fork, r.fork);
  EXPECT_EQ(b.exact, r.exact);
  EXPECT_EQ(b.exact_unavailable, r.exact_unavailable);
  EXPECT_EQ(b.guard, r.guard);
  EXPECT_EQ(b.prefix_tokens, r.prefix_tokens);
  EXPECT_EQ(b.document_prefills, r.document_prefills);
  ASSERT_TRUE(b.snapshot);
  EXPECT_EQ(b.snapshot->source, r.snapshot->source);
  EXPECT_EQ(b.snapshot->key, r.snapshot->key);
  EXPECT_EQ(b.snapshot->path, r.snapshot->path);
  EXPECT_EQ(b.snapshot->reused_tokens, r.snapshot->reused_tokens);
  EXPECT_EQ(b.snapshot->prefilled_tokens, r.snapshot->prefilled_tokens);
  EXPECT_EQ(b.snapshot->bytes, r.snapshot->bytes);
  EXPECT_EQ(b.snapshot->load_ms, r.snapshot->load_ms);
  EXPECT_EQ(b.snapshot->verify_ms, r.snapshot->verify_ms);
  EXPECT_EQ(b.snapshot->published, r.snapshot->published);
  EXPECT_EQ(b.snapshot->discarded, r.snapshot->discarded);
  EXPECT_EQ(b.snapshot_bytes, r.snapshot_bytes);
  EXPECT_EQ(b.n_ctx, r.n_ctx);
  EXPECT_EQ(b.n_seq_max, r.n_seq_max);
  for (const auto member : {&PipelineResult::prepare_ms, &PipelineResult::prefill_done_at_ms,
                            &PipelineResult::prefill_ms, &PipelineResult::export_ms,
                            &PipelineResult::restore_ms, &PipelineResult::branch_buffer_ms,
                            &PipelineResult::total_ms, &PipelineResult::kv_bytes_per_cell}) {
    EXPECT_EQ(b.*member, r.*member);
  }
  EXPECT_EQ(b.engine.flash_attn, r.engine.flash_attn);
  EXPECT_EQ(b.engine.type_k, r.engine.type_k);
  EXPECT_EQ(b.engine.n_batch, r.engine.n_batch);
  EXPECT_EQ(b.engine.n_ubatch, r.engine.n_ubatch);
  EXPECT_EQ(b.engine.n_threads, r.engine.n_threads);
  EXPECT_EQ(b.engine.n_threads_batch, r.engine.n_threads_batch);
  EXPECT_EQ(b.n_gpu_layers, r.n_gpu_layers);
  EXPECT_EQ(b.offloaded_layers, r.offloaded_layers);
  EXPECT_EQ(b.contexts, r.contexts);
  EXPECT_EQ(b.kv_cells_peak, r.kv_cells_peak);
  EXPECT_EQ(b.host_buffer_bytes, r.host_buffer_bytes);
  EXPECT_EQ(b.decode_steps.size(), r.decode_steps.size()) << "a count: the steps are not written";
  EXPECT_EQ(b.document_status, r.document_status);
  EXPECT_EQ(b.document_error, r.document_error);
  ASSERT_TRUE(b.transfer);
  EXPECT_EQ(b.transfer->bytes, r.transfer->bytes);
  EXPECT_EQ(b.transfer->publish_ms, r.transfer->publish_ms);
  EXPECT_EQ(b.transfer->fetch_ms, r.transfer->fetch_ms);
  EXPECT_EQ(b.transfer->fetches, r.transfer->fetches);
}

// Before its result, a run going on shows what is known, each agent's
// phase in its status; read back, the phases and the run's state return.
TEST(ResultJsonTest, ARunGoingOnReadsBackWithEachAgentsPhase) {
  PipelineResult r;
  r.pipeline = "going";
  r.model = "m.gguf";
  r.prefix_tokens = 300;
  r.total_ms = 40;
  r.agents = fixtures::results_with_every_field_set();
  r.agents.resize(2);
  r.agents.push_back(r.agents[0]);
  r.agents[2].name = "c";
  RunProgress p;
  p.state = RunState::kRunning;
  p.agents = {AgentPhase::kRunning, AgentPhase::kDone, AgentPhase::kWaiting};
  json j = live_result_json(r, p);
  EXPECT_EQ(j["live"], (json{{"state", "running"}, {"prefill_done", 0}, {"prefill_total", 0}}));
  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"agents", "exact", "fork", "live", "model", "pipeline",
                                            "prefix_tokens", "total_ms"}))
      << "no prefill chunk yet: no prefill_ms";
  EXPECT_EQ(j["agents"][0]["status"], "running");
  EXPECT_EQ(j["agents"][0].size(), 12u) << j["agents"][0];
  EXPECT_FALSE(j["agents"][0].contains("timings_ms"));
  EXPECT_EQ(j["agents"][1], agent_json(r.agents[1])) << "a done agent is its result";
  EXPECT_EQ(j["agents"][2]["status"], "waiting");

  p.prefill_done = 128;
  p.prefill_total = 300;
  j = live_result_json(r, p);
  EXPECT_TRUE(j.contains("prefill_ms"));
  EXPECT_TRUE(j.contains("prefill_done_at_ms"));
  ResultRead read = result_from_json(json::parse(j.dump()));
  ASSERT_TRUE(read.live);
  EXPECT_EQ(*read.live, p);
  EXPECT_FALSE(read.has("engine"));
  EXPECT_EQ(read.result.agents[1], r.agents[1]);
  EXPECT_EQ(read.result.agents[0].answer, r.agents[0].answer);
  EXPECT_EQ(read.result.agents[0].tokens, r.agents[0].tokens);

  // Could not start: its error, no clock; ended with its result: all of it.
  p.state = RunState::kFailed;
  p.error = ErrorValue{ErrorCode::kBudget, "needs 9 GiB"};
  j = live_result_json(r, p);
  EXPECT_EQ(j["live"]["error"], (json{{"code", "budget"}, {"message", "needs 9 GiB"}}));
  EXPECT_FALSE(j.contains("total_ms"));
  EXPECT_EQ(*result_from_json(j).live, p);
  p = RunProgress{};
  p.state = RunState::kOk;
  p.agents.assign(3, AgentPhase::kDone);
  j = live_result_json(r, p);
  j.erase("live");
  EXPECT_EQ(j, result_json(r));
}

TEST(ResultJsonTest, AResultThatIsNotOneIsRefusedByName) {
  const auto message = [](const json& j) {
    try {
      result_from_json(j);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption);
      return e.message();
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(message(json::array()),
            "the result is not a JSON object (not a swarmkv run --json result?)");
  EXPECT_EQ(message(json::object()),
            "the result has no 'agents' (not a swarmkv run --json result?)");
  EXPECT_EQ(message(json{{"agents", 3}}), "the result's 'agents' is not a list");
  EXPECT_EQ(message(json{{"agents", {{{"name", "a"}}}}}),
            "the result has no 'status' in agent 0 (not a swarmkv run --json result?)");
  json r = result_json(result_with_every_field_set());
  r["agents"][1]["status"] = "weird";
  EXPECT_EQ(message(r), "agent 1 of the result does not read: unknown status 'weird'");
  r = result_json(result_with_every_field_set());
  r["fork"] = "sideways";
  EXPECT_EQ(message(r), "unknown fork 'sideways'");
  r["fork"] = 3;
  EXPECT_EQ(message(r).rfind("the result does not read: ", 0), 0u) << message(r);
  // The least a reader takes: agents with a name and a status.
  const ResultRead least = result_from_json(json{{"agents", {{{"name", "a"}, {"status", "ok"}}}}});
  EXPECT_EQ(least.result.agents.at(0).name, "a");
  EXPECT_FALSE(least.has("model"));
}

TEST(ResultJsonTest, DepthsFollowDependenciesAndForks) {
  std::vector<AgentResult> agents(6);
  const char* names[] = {"a", "b", "c", "d", "x", "y"};
  for (size_t i = 0; i < agents.size(); ++i) agents[i].name = names[i];
  agents[1].depends_on = {"a"};
  agents[2].fork_from = "b";
  agents[3].depends_on = {"a", "c", "nobody"};
  // x and y wait on each other (a hand-edited file): from x, the edge back
  // to x closes the cycle and counts as the document, so y is 1 and x 2.
  agents[4].depends_on = {"y"};
  agents[5].depends_on = {"x"};
  EXPECT_EQ(agent_depths(agents), (std::vector<int>{1, 2, 3, 4, 2, 1}));
}

}  // namespace
}  // namespace swarmkv
