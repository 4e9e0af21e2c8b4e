// The cluster's job and result entries (src/cluster/wire.h): whole messages
// survive the trip through their stream fields, the fields are the bytes
// that workers and coordinators of the previous release write and read (a
// mixed cluster), and a malformed entry gives the error the worker reports.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cluster/wire.h"
#include "spec_fixtures.h"
#include "swarmkv/error.h"
#include "swarmkv/result_json.h"

namespace swarmkv {
namespace {

using cluster::EntryFields;
using cluster::JobMessage;
using cluster::PrefillOutcome;
using cluster::ResultEntry;
using cluster::StreamEntry;

// The entry XREAD gives back for fields XADD wrote.
StreamEntry entry_of(const EntryFields& fields, std::string id = "1-0") {
  StreamEntry e{.id = std::move(id), .fields = {}};
  for (const auto& [name, value] : fields) e.fields[name] = value;
  return e;
}

StreamEntry entry_with(std::map<std::string, std::string> fields) {
  return StreamEntry{.id = "1-0", .fields = std::move(fields)};
}

JobMessage agent_job_with_every_field_set() {
  JobMessage job;
  job.id = "1-0";
  job.run = "r1";
  job.snapshot = "0123abcd";
  job.agents = {"a", "b", "c\xc3\xa9"};
  job.prompts = {{"b", "Say \"hi\" to {{a}}'s \xc3\xa9"}, {"c\xc3\xa9", "x"}};
  job.reruns = {{"a", {1, 2, 3}}};
  return job;
}

TEST(JobMessageTest, AnAgentJobSurvivesTheTripAsTheFieldsOfBefore) {
  const JobMessage job = agent_job_with_every_field_set();
  const EntryFields fields = cluster::job_fields(job);
  // What the coordinator wrote by hand before the type: a worker of either
  // release reads the other's jobs.
  const EntryFields before = {
      {"run", "r1"},
      {"snapshot", "0123abcd"},
      {"agents", "[\"a\",\"b\",\"c\xc3\xa9\"]"},
      {"prompts", "{\"b\":\"Say \\\"hi\\\" to {{a}}'s \xc3\xa9\",\"c\xc3\xa9\":\"x\"}"},
      {"rerun", "{\"a\":[1,2,3]}"}};
  EXPECT_EQ(fields, before);
  const StreamEntry entry = entry_of(fields);
  EXPECT_EQ(cluster::job_from_entry(entry), job);
  EXPECT_FALSE(cluster::is_prefill_job(entry));
  EXPECT_EQ(cluster::job_run(entry), "r1");
  EXPECT_EQ(cluster::job_agents(entry), job.agents);

  // Without prompts or reruns those fields are left out.
  JobMessage plain = job;
  plain.prompts.clear();
  plain.reruns.clear();
  EXPECT_EQ(cluster::job_fields(plain).size(), 3u);
  EXPECT_EQ(cluster::job_from_entry(entry_of(cluster::job_fields(plain))), plain);
}

TEST(JobMessageTest, APrefillJobSurvivesTheTripInBothModes) {
  for (const auto& [mode, text] : {std::pair{cluster::Publish::kIfAbsent, "if_absent"},
                                   std::pair{cluster::Publish::kReplace, "replace"}}) {
    const JobMessage job{.id = "7-1", .run = "r1", .snapshot = "k", .prefill = mode};
    const EntryFields fields = cluster::job_fields(job);
    EXPECT_EQ(fields, (EntryFields{{"run", "r1"}, {"snapshot", "k"}, {"prefill", text}}));
    const StreamEntry entry = entry_of(fields, "7-1");
    EXPECT_TRUE(cluster::is_prefill_job(entry));
    EXPECT_EQ(cluster::job_from_entry(entry), job);
  }
}

TEST(JobMessageTest, AMalformedJobGetsTheErrorTheWorkerReports) {
  const auto message = [](std::map<std::string, std::string> fields) {
    const ErrorValue e =
        fixtures::error_of([&] { cluster::job_from_entry(entry_with(std::move(fields))); });
    EXPECT_EQ(e.code, ErrorCode::kCorruption) << e.message;
    return e.message;
  };
  const std::string a = "[\"a\"]";
  // The run first, then the agents, then the rest.
  EXPECT_EQ(message({{"agents", "[1]"}, {"prompts", "7"}}), "job 1-0 has no 'run' field");
  EXPECT_EQ(message({{"run", "r"}, {"prompts", "7"}}), "job 1-0 has no 'agents' field");
  for (const std::string bad : {"not json", "{\"a\":1}", "[1,2]", "[]"}) {
    EXPECT_EQ(message({{"run", "r"}, {"agents", bad}, {"prompts", "7"}}),
              "job 1-0: 'agents' is not a JSON array of agent names (it is '" + bad + "')");
  }
  EXPECT_EQ(message({{"run", "r"}, {"agents", std::string(300, '[')}}),
            "job 1-0: 'agents' is not a JSON array of agent names (it is '" +
                std::string(200, '[') + "')");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"prompts", "not json"}, {"rerun", "[1]"}}),
            "job 1-0: 'prompts' is not a JSON object of agent names to prompts (it is 'not json')");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"prompts", "{\"zz\": \"p\"}"}}),
            "job 1-0: 'prompts' has an entry for 'zz' that is not a prompt of one of its agents");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"prompts", "{\"a\": 7}"}}),
            "job 1-0: 'prompts' has an entry for 'a' that is not a prompt of one of its agents");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"rerun", "[1]"}}),
            "job 1-0: 'rerun' is not a JSON object of agent names to token arrays");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"rerun", "{\"zz\": [1]}"}}),
            "job 1-0: 'rerun' names 'zz', which is not one of its agents");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"rerun", "{\"a\": [\"x\", -1]}"}}),
            "job 1-0: 'rerun' of 'a' holds something other than token ids");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"rerun", "{\"a\": [2147483648]}"}}),
            "job 1-0: 'rerun' of 'a' holds something other than token ids");
  EXPECT_EQ(message({{"run", "r"}, {"agents", a}, {"rerun", "{\"a\": 5}"}}),
            "job 1-0: 'rerun' of 'a' is not a token array");
  EXPECT_EQ(message({{"run", "r"}, {"prefill", "replace"}}), "job 1-0 has no 'snapshot' field");

  // An agent job may lack its snapshot until a fork mode needs it.
  const JobMessage no_snapshot = cluster::job_from_entry(entry_with({{"run", "r"}, {"agents", a}}));
  EXPECT_EQ(no_snapshot.snapshot, std::nullopt);
  EXPECT_EQ(fixtures::error_of([&] { no_snapshot.snapshot_key(); }).message,
            "job 1-0 has no 'snapshot' field");
  EXPECT_EQ(cluster::job_run_shown(entry_with({{"run", std::string(150, 'r')}})),
            std::string(100, 'r'));
  EXPECT_EQ(cluster::job_run_shown(entry_with({{"agents", a}})), "");
}

ResultEntry agent_result_with_every_field_set() {
  ResultEntry r;
  r.id = "2-0";
  r.agent = "a";
  r.worker = "w1";
  r.job = "1-0";
  r.result = fixtures::results_with_every_field_set()[0];
  r.result.worker = "w1";
  r.fetch_bytes = 123456;
  r.fetch_ms = 12.5;  // three decimals travel
  r.snapshot_unavailable = true;
  return r;
}

TEST(ResultEntryTest, AnAgentsResultSurvivesTheTripAsTheFieldsOfBefore) {
  for (const AgentResult& result : fixtures::results_with_every_field_set()) {
    ResultEntry r = agent_result_with_every_field_set();
    r.agent = result.name;
    r.result = result;
    r.result.worker = r.worker;
    const EntryFields fields = cluster::result_fields(r);
    const EntryFields before = {
        {"agent", r.agent},
        {"worker", "w1"},
        {"job", "1-0"},
        {"fetch_bytes", "123456"},
        {"fetch_ms", "12.500"},
        {"snapshot_unavailable", "1"},
        {"result",
         agent_json(r.result).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}};
    EXPECT_EQ(fields, before);
    EXPECT_EQ(cluster::result_from_entry(entry_of(fields, "2-0")), r);
  }
  ResultEntry local = agent_result_with_every_field_set();
  local.fetch_bytes = 0;
  local.fetch_ms = 0;
  local.snapshot_unavailable = false;
  EXPECT_EQ(cluster::result_from_entry(entry_of(cluster::result_fields(local), "2-0")), local);
}

TEST(ResultEntryTest, APrefillReportSurvivesTheTripAsTheFieldsOfBefore) {
  for (const std::optional<ErrorValue>& error :
       {std::optional<ErrorValue>(),
        std::optional<ErrorValue>(ErrorValue{ErrorCode::kIncompatible, "another model"})}) {
    const ResultEntry r{.id = "3-0",
                        .agent = "",
                        .worker = "w1",
                        .job = "1-0",
                        .prefill = PrefillOutcome{.error = error,
                                                  .prefill_ms = error ? 0 : 250.125,
                                                  .publish_ms = error ? 0 : 9.5,
                                                  .bytes = error ? 0u : 1048576u}};
    const EntryFields fields = cluster::result_fields(r);
    EXPECT_EQ(fields, (EntryFields{{"agent", ""},
                                   {"worker", "w1"},
                                   {"job", "1-0"},
                                   {"prefill", error_json(error).dump()},
                                   {"prefill_ms", error ? "0.000" : "250.125"},
                                   {"publish_ms", error ? "0.000" : "9.500"},
                                   {"bytes", error ? "0" : "1048576"}}));
    EXPECT_EQ(cluster::result_from_entry(entry_of(fields, "3-0")), r);
  }
}

// A result entry never fails the run: what does not parse fails its agent,
// a figure that is not a number counts as 0 and is named.
TEST(ResultEntryTest, AMalformedResultFailsItsAgentAndNamesItsBadFigures) {
  const ResultEntry r = cluster::result_from_entry(entry_with({{"agent", "patents"},
                                                               {"worker", "rogue"},
                                                               {"job", "x"},
                                                               {"fetch_bytes", "1"},
                                                               {"fetch_ms", "y"},
                                                               {"snapshot_unavailable", "0"},
                                                               {"result", "{}"}}));
  EXPECT_EQ(r.result.name, "patents");
  EXPECT_EQ(r.result.worker, "rogue");
  EXPECT_EQ(r.result.status, NodeStatus::kFailed);
  ASSERT_TRUE(r.result.error.has_value());
  EXPECT_EQ(r.result.error->code, ErrorCode::kCorruption);
  EXPECT_EQ(r.result.error->message.rfind("the result from worker 'rogue' does not parse: ", 0), 0u)
      << r.result.error->message;
  EXPECT_EQ(r.fetch_bytes, 1u);
  EXPECT_EQ(r.fetch_ms, 0);
  EXPECT_EQ(r.bad_figures, std::vector<std::string>{"fetch_ms 'y'"});
  EXPECT_FALSE(r.snapshot_unavailable);

  // fetch_ms is read only for a fetch.
  const ResultEntry local = cluster::result_from_entry(
      entry_with({{"agent", "a"}, {"fetch_bytes", "0"}, {"fetch_ms", "y"}, {"result", "{}"}}));
  EXPECT_TRUE(local.bad_figures.empty());

  const ResultEntry figures =
      cluster::result_from_entry(entry_with({{"agent", ""},
                                             {"job", "1-0"},
                                             {"prefill", "null"},
                                             {"prefill_ms", "-1"},
                                             {"bytes", std::string(50, 'b')},
                                             {"publish_ms", "inf"}}));
  ASSERT_TRUE(figures.prefill.has_value());
  EXPECT_EQ(figures.prefill->error, std::nullopt);
  EXPECT_EQ(figures.bad_figures,
            (std::vector<std::string>{"prefill_ms '-1'", "bytes '" + std::string(40, 'b') + "'",
                                      "publish_ms 'inf'"}));

  const ResultEntry garbled =
      cluster::result_from_entry(entry_with({{"agent", ""}, {"prefill", "<html>"}}));
  ASSERT_TRUE(garbled.prefill.has_value() && garbled.prefill->error.has_value());
  EXPECT_EQ(garbled.prefill->error->code, ErrorCode::kCorruption);
  EXPECT_EQ(garbled.prefill->error->message.rfind("its report does not parse: ", 0), 0u)
      << garbled.prefill->error->message;
  EXPECT_TRUE(garbled.bad_figures.empty());  // a failed report's figures are not read
}

TEST(DeadLetterTest, ADeadLetterCarriesTheJobsFields) {
  const StreamEntry job = entry_with({{"run", "poison"}, {"agents", "[\"a\"]"}});
  EXPECT_EQ(cluster::dead_letter_fields(job, 4, "w1", "why"),
            (EntryFields{{"job", "1-0"},
                         {"deliveries", "4"},
                         {"worker", "w1"},
                         {"reason", "why"},
                         {"job.agents", "[\"a\"]"},
                         {"job.run", "poison"}}));
}

}  // namespace
}  // namespace swarmkv
